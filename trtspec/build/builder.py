"""`trtspec build`: the steps a config needs, run so that a re-run, an interrupt or a full disk is safe.

Each step writes into a staging directory beside its output and is renamed into place only when it
has finished and its engine passed verification; the manifest is then rewritten atomically. So a
killed build leaves at most a `.staging-*` directory, which the next run removes before resuming
from the first step whose inputs changed.
"""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trtspec.build.manifest import (
    CommandRecord,
    Manifest,
    StepRecord,
    fingerprint,
    output_files,
    step_key,
    tool_versions,
)
from trtspec.build.recipes import (
    Command,
    convert_command,
    engine_expectations,
    llm_api_options,
    missing_flags,
    trt_dtype,
    trtllm_build_command,
    trtllm_serve_command,
)
from trtspec.checkpoints.inspect import read_checkpoint, read_hf_config, refuse_vocab_rows_mismatch
from trtspec.config import DeploymentConfig, ModelSection
from trtspec.errors import TrtspecError, UsageError, shorten
from trtspec.families import ENGINE_FAMILIES, Family, convert_family
from trtspec.fsutil import replace_dir, write_error, writing
from trtspec.modes import get_mode

LLM_API_DIR = "llm-api"
LLM_API_YAML = "extra_llm_api_options.yaml"
HOLD_ENV = "TRTSPEC_BUILD_HOLD_S"  # test hook: seconds to wait before a finished step is renamed into place
LOCK_FILE = ".build.lock"  # in the engine directory: flock'ed by the running build, holding its pid

Progress = Callable[[str], None]


@dataclass
class Step:
    """One output directory of a build and everything it is made from."""

    name: str
    output: str
    inputs: dict[str, Any]
    commands: list[Command]
    describe: str
    run: Callable[[Path, Path], list[CommandRecord]] = field(repr=False)  # (staging dir, log file) -> records

    @property
    def key(self) -> str:
        return step_key(self.inputs)


@dataclass
class BuildResult:
    engine_dir: Path
    built: list[str]
    skipped: list[str]
    num_draft_tokens: int


def engine_dir_for(cfg: DeploymentConfig) -> Path:
    return Path(cfg.build.output_dir) / cfg.name


def trtllm_available() -> bool:
    """find_spec, not import: tensorrt_llm's import needs libcuda, which a build host may lack."""
    return importlib.util.find_spec("tensorrt_llm") is not None


def resolve_num_draft_tokens(cfg: DeploymentConfig, engine_dir: Path) -> int:
    """The K to build for; `auto` takes plan.json's recommendation (`trtspec plan` writes it there)."""
    spec = get_mode(cfg.mode)
    if not spec.speculates():
        return 0
    if (fixed := spec.fixed_draft_len(cfg)) is not None:
        return fixed
    k = cfg.speculation.num_draft_tokens
    if isinstance(k, int):
        return k
    plan = engine_dir / "plan.json"
    try:
        return int(json.loads(plan.read_text(encoding="utf-8"))["recommended_num_draft_tokens"])
    except FileNotFoundError:
        raise UsageError(
            f"speculation.num_draft_tokens is auto but {plan} does not exist: run `trtspec plan` first"
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{plan}: no usable recommended_num_draft_tokens ({exc})") from None


def _checkpoint(cfg: DeploymentConfig, section: ModelSection) -> tuple[str, Path | None]:
    """(what the build host is given: a local path or a hub id, the local path if any)."""
    path = cfg.checkpoint_path(section)
    return (str(path) if path else section.checkpoint), path


def _limits(cfg: DeploymentConfig) -> dict[str, Any]:
    b = cfg.build
    return {
        "max_batch_size": b.max_batch_size,
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
        "max_num_tokens": b.max_num_tokens,
    }


def _roles(cfg: DeploymentConfig) -> list[tuple[str, ModelSection]]:
    roles = [("target", cfg.target)]
    if get_mode(cfg.mode).draft_engine and cfg.draft is not None:
        roles.append(("draft", cfg.draft))
    return roles


def torch_roles(cfg: DeploymentConfig) -> list[tuple[str, ModelSection]]:
    """The torch engine carries every checkpoint the runner loads: a draft model, or a head (EAGLE-3's),
    which a compiled build folds into the target or leaves to the LLM API to read from its own folder."""
    heads = _heads(cfg)
    return _roles(cfg) + ([("draft", heads)] if heads is not None else [])


def _torch_steps(cfg: DeploymentConfig, k: int, fingerprints: dict[str, Any]) -> list[Step]:
    from trtspec.build.torch_engine import write_torch_engine
    from trtspec.speculative.factory import resolve_device, resolve_dtype

    if why := get_mode(cfg.mode).torch_deploy_refusal(cfg):
        raise UsageError(why)
    device = resolve_device(cfg.build.device)
    spec = get_mode(cfg.mode)
    steps = []
    for role, section in torch_roles(cfg):
        ref, path = _checkpoint(cfg, section)
        if path is None:
            raise UsageError(f"{role}.checkpoint {ref} is a hub id; the torch backend needs a local checkpoint")
        dtype = resolve_dtype(section.dtype, device)
        speculating = role == "target" and spec.speculates()
        build = {
            **_limits(cfg),
            "max_draft_len": spec.engine_draft_len(cfg, k) if speculating else 0,
            "speculative_decoding_mode": spec.torch_engine_mode if speculating else "none",
        }
        if role == "target":
            build.update(spec.torch_engine_settings(cfg))
        inputs = {"backend": "torch", "role": role, "checkpoint": fingerprints[role]["digest"], "dtype": str(dtype)}
        inputs["build"] = build

        head = role == "draft" and spec.draft_head  # a head loads only beside its target: loaded, not run
        if head:  # trained for one target: a new target is a new fit to check
            inputs["target"] = fingerprints["target"]["digest"]

        def run(
            staging: Path, log: Path, path=path, dtype=dtype, role=role, build=build, head=head
        ) -> list[CommandRecord]:
            t0 = time.perf_counter()
            if head:
                refuse_unfit_head(cfg, path)
            else:  # named by the checkpoint, before its engine is staged
                from trtspec.speculative.model import refuse_unsupported_architecture

                refuse_unsupported_architecture(path, read_hf_config(path), cfg.mode if role == "draft" else None)
            load = (lambda out: spec.load_draft(out, dtype, "cpu", build["max_seq_len"])) if head else None
            write_torch_engine(path, staging, dtype, role, build, load)
            seconds = time.perf_counter() - t0
            log.write_text(f"cast {path} to {dtype} and loaded it: {seconds:.2f}s\n", encoding="utf-8")
            argv = ["trtspec:torch-engine", str(path), str(dtype)]
            return [CommandRecord(argv, 0, round(seconds, 3), str(log.name))]

        steps.append(Step(role, role, inputs, [], f"cast {ref} to {dtype}, write engine.json, warm-up load", run))
    return steps


def refuse_unfit_head(cfg: DeploymentConfig, head: Path) -> None:
    """A head reads the target's states: the mode's own check (widths, vocabulary, captured layers) in one
    line, so a head for another target fails the build rather than the server's first load."""
    from trtspec.check import Report

    target = cfg.checkpoint_path(cfg.target)
    report = Report()
    get_mode(cfg.mode).check(cfg, read_checkpoint(target) if target else None, read_checkpoint(head), report)
    if errors := [f for f in report.findings if f.severity == "error"]:
        raise UsageError(f"{head}: {errors[0].message} ({errors[0].fix})")


def _hf_dtype(path: Path | None) -> str | None:
    if path is None:
        return None
    cfg = read_hf_config(path)
    return cfg.get("torch_dtype") or cfg.get("dtype")


def _family(path: Path | None) -> Family | None:
    if path is None:
        return None  # resolved on the build host from the downloaded config.json
    arch = (read_hf_config(path).get("architectures") or ["?"])[0]
    family = convert_family(arch)
    if family is None:
        known = ", ".join(ENGINE_FAMILIES)
        raise UsageError(f"{path}: no TensorRT-LLM convert_checkpoint.py known for {arch} (have {known})")
    return family


def tensorrt_commands(
    cfg: DeploymentConfig,
    role: str,
    section: ModelSection,
    model_dir: str,
    k: int,
    work: str,
    out: str,
    heads_dir: str | None = None,
) -> list[Command]:
    """convert (or quantize) then trtllm-build, for one model; a mode whose heads are folded into the
    target (Medusa) converts the target with its own script, given the heads' directory."""
    path = cfg.checkpoint_path(section)
    dtype = trt_dtype(section, _hf_dtype(path))
    ckpt = f"{work}/{role}-ckpt"
    family = _family(path)
    own = get_mode(cfg.mode).convert_command(cfg, section, model_dir, heads_dir, ckpt, family, dtype)
    if own is None or role != "target":
        own = convert_command(cfg, section, model_dir, ckpt, family, dtype)
    return [own, trtllm_build_command(cfg, section, ckpt, out, dtype, role, k)]


def _run_logged(argv: list[str], log: Path, cwd: Path | None = None) -> CommandRecord:
    t0 = time.perf_counter()
    with log.open("a", encoding="utf-8") as fh:
        fh.write("$ " + " ".join(argv) + "\n")
        fh.flush()
        rc = subprocess.call(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd)
    record = CommandRecord(argv, rc, round(time.perf_counter() - t0, 3), str(log.name))
    if rc != 0:
        raise TrtspecError(f"{argv[0]} exited with {rc}; see {log}")
    return record


def _examples_dir(version: str) -> Path:
    env = os.environ.get("TRTLLM_EXAMPLES")
    if not env or not Path(env).is_dir():
        raise UsageError(
            f"set TRTLLM_EXAMPLES to the examples/ folder of a TensorRT-LLM v{version} checkout "
            "(convert_checkpoint.py lives there, not in the wheel)"
        )
    return Path(env)


def convert_script_path(examples: Path, command: Command) -> Path:
    """convert_checkpoint.py moved from examples/<family>/ (0.x) to examples/models/core/<family>/ (1.x)."""
    if not command.is_script or command.family is None:
        return examples / command.program
    for candidate in (examples / "models" / "core" / command.family, examples / command.family):
        if (candidate / command.program).is_file():
            return candidate / command.program
    raise UsageError(f"no convert_checkpoint.py for {command.family} under {examples}")


def _tensorrt_steps(cfg: DeploymentConfig, k: int, fingerprints: dict[str, Any], engine_dir: Path) -> list[Step]:
    steps = []
    work = engine_dir / ".work"
    for role, section in _roles(cfg):
        ref, _ = _checkpoint(cfg, section)
        inputs = {
            "backend": "tensorrt",
            "tensorrt_llm": cfg.build.tensorrt_llm_version,
            "role": role,
            "checkpoint": fingerprints[role]["digest"],
            "section": section.model_dump(mode="json"),
            "build": {**_limits(cfg), "tp": cfg.build.tp, "pp": cfg.build.pp},
            "mode": cfg.mode,
            "num_draft_tokens": k if role == "target" else None,
            "use_draft_logits": cfg.speculation.use_draft_logits,
        }
        heads = _heads(cfg)
        if role == "target" and heads is not None:  # folded into the target: new heads, new engine
            inputs["heads"] = fingerprints["draft"]["digest"]

        def run(staging: Path, log: Path, role=role, section=section, ref=ref) -> list[CommandRecord]:
            heads = _heads(cfg) if role == "target" else None
            for name, needed in ((role, section), ("draft", heads)):
                if needed is not None and cfg.checkpoint_path(needed) is None:
                    raise UsageError(
                        f"{name}.checkpoint {needed.checkpoint} is a hub id: download it (huggingface-cli download)"
                        " and point the config at the directory, or use --emit-script, which downloads it"
                    )
            heads_dir = str(cfg.checkpoint_path(heads)) if heads is not None else None
            examples = _examples_dir(cfg.build.tensorrt_llm_version)
            records = []
            for command in tensorrt_commands(cfg, role, section, ref, k, str(work), str(staging), heads_dir):
                program = convert_script_path(examples, command)
                argv = (["python3", str(program)] if command.is_script else [command.program]) + list(command.args)
                records.append(_run_logged(argv, log))
            shutil.rmtree(work / f"{role}-ckpt", ignore_errors=True)
            verify_engine(staging, cfg, role, k, "tensorrt")
            return records

        heads_ref = _checkpoint(cfg, heads)[0] if role == "target" and heads is not None else None
        commands = tensorrt_commands(cfg, role, section, ref, k, "$WORK", f"{engine_dir}/{role}", heads_ref)
        steps.append(Step(role, role, inputs, commands, f"convert and build the {role} engine", run))
    return steps


def refuse_unapplied_quantization(cfg: DeploymentConfig) -> None:
    """Backend pytorch takes quantization from the checkpoint: a local one that carries none would
    silently load unquantized (hub ids are checked on the build host by the LLM API itself)."""
    from trtspec.checkpoints.inspect import pre_quantized

    for role in ("target", "draft"):
        section = getattr(cfg, role)
        path = cfg.checkpoint_path(section) if section is not None else None
        if path is None or section.quantization == "none" or pre_quantized(read_checkpoint(path)):
            continue
        raise UsageError(
            f"{role}.quantization {section.quantization}: backend pytorch takes quantization from the checkpoint and "
            f"{path} is not quantized: use a pre-quantized checkpoint (ModelOpt) or backend tensorrt"
        )


def _pytorch_steps(cfg: DeploymentConfig, k: int, fingerprints: dict[str, Any]) -> list[Step]:
    refuse_unapplied_quantization(cfg)
    target, _ = _checkpoint(cfg, cfg.target)
    draft = _checkpoint(cfg, cfg.draft)[0] if get_mode(cfg.mode).needs_draft and cfg.draft else None
    options = llm_api_options(cfg, k, draft)
    inputs = {
        "backend": "pytorch",
        "tensorrt_llm": cfg.build.tensorrt_llm_version,
        "options": options,
        "checkpoints": {r: f["digest"] for r, f in fingerprints.items()},
    }

    def run(staging: Path, log: Path) -> list[CommandRecord]:
        staging.mkdir(parents=True, exist_ok=True)
        (staging / LLM_API_YAML).write_text(yaml.safe_dump(options, sort_keys=False), encoding="utf-8")
        (staging / "model").write_text(target + "\n", encoding="utf-8")
        if not warm_up_fits_one_host(cfg) or os.environ.get(SKIP_WARM_UP_ENV) == "1":
            return []  # one process cannot load a model that spans nodes: the group's start proves it
        argv = ["python3", "-c", WARM_UP, target, str(staging / LLM_API_YAML)]
        return [_run_logged(argv, log)]

    describe = f"write {LLM_API_DIR}/{LLM_API_YAML} and prove TensorRT-LLM's LLM API loads {target} with it"
    serve = trtllm_serve_command(target, f"{LLM_API_DIR}/{LLM_API_YAML}")
    return [Step(LLM_API_DIR, LLM_API_DIR, inputs, [serve], describe, run)]


SKIP_WARM_UP_ENV = "TRTSPEC_SKIP_WARM_UP"


def serving_decisions(cfg: DeploymentConfig, k: int) -> dict[str, Any]:
    """The trade-offs the engines and repository are made with, written into manifest.json and shown by check."""
    from trtspec.build.shared_gpu import shared_gpu_plan

    decisions: dict[str, Any] = {}
    spec = get_mode(cfg.mode)
    if spec.draft_engine and cfg.build.backend in ("tensorrt", "torch"):
        decisions["target_max_draft_len"] = {
            "value": spec.engine_draft_len(cfg, k),
            "num_draft_tokens": k,
            "why": "room for NVIDIA's documented num_draft_tokens 10; requests above it are refused",
        }
    if (plan := shared_gpu_plan(cfg)) is not None:
        decisions["shared_gpu"] = plan.as_dict()
    return decisions


def warm_up_fits_one_host(cfg: DeploymentConfig) -> bool:
    """The warm-up loads the model in one process on one host: not for tp x pp beyond a node's GPUs."""
    return cfg.build.tp * cfg.build.pp <= cfg.deploy.gpus_per_node


# python3 -c WARM_UP MODEL OPTIONS_YAML: load the LLM API with the options the way trtllm-serve reads
# --extra_llm_api_options (update_llm_args_with_extra_dict), and generate a few tokens.
WARM_UP = """\
import sys, yaml
from tensorrt_llm import LLM, SamplingParams
try:
    from tensorrt_llm.llmapi.llm_args import update_llm_args_with_extra_dict
except ImportError:
    from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict
options = yaml.safe_load(open(sys.argv[2]))
llm = LLM(**update_llm_args_with_extra_dict({"model": sys.argv[1]}, options))
out = llm.generate(["Hello"], SamplingParams(max_tokens=4))
print("warm-up output:", out[0].outputs[0].text)
"""


def _heads(cfg: DeploymentConfig) -> ModelSection | None:
    """A draft checkpoint that is not an engine of its own (EAGLE-3's head, Medusa's heads)."""
    spec = get_mode(cfg.mode)
    return cfg.draft if spec.needs_draft and not spec.draft_engine else None


def plan_steps(cfg: DeploymentConfig, engine_dir: Path, k: int) -> tuple[list[Step], dict[str, Any]]:
    fingerprints = {}
    for role, section in _roles(cfg):
        if (path := cfg.checkpoint_path(section)) is not None:
            refuse_vocab_rows_mismatch(path)  # a traceback in the weight loader (or the converter) otherwise
        fingerprints[role] = fingerprint(section.checkpoint, path)
    if (heads := _heads(cfg)) is not None:  # its vocabulary rows are the draft vocabulary's: not compared
        fingerprints["draft"] = fingerprint(heads.checkpoint, cfg.checkpoint_path(heads))
    if cfg.build.backend == "torch":
        return _torch_steps(cfg, k, fingerprints), fingerprints
    if cfg.build.backend == "tensorrt":
        return _tensorrt_steps(cfg, k, fingerprints, engine_dir), fingerprints
    return _pytorch_steps(cfg, k, fingerprints), fingerprints


def verify_engine(engine: Path, cfg: DeploymentConfig, role: str, k: int, backend: str) -> None:
    """Fail, naming the flag, when an engine lacks something serving depends on."""
    from trtspec.build.torch_engine import read_engine_config

    section = cfg.target if role == "target" else cfg.draft
    path = cfg.checkpoint_path(section) if section else None
    vocab = read_hf_config(path).get("vocab_size") if path else None
    problems = missing_flags(read_engine_config(engine), engine_expectations(cfg, role, k, vocab, backend))
    if problems:
        raise TrtspecError(f"{engine}: the {role} engine cannot serve this config: " + "; ".join(problems))


def _clean_stale(engine_dir: Path) -> None:
    for stale in [*engine_dir.glob(".staging-*"), *engine_dir.glob(".*.old")]:
        shutil.rmtree(stale, ignore_errors=True)
    shutil.rmtree(engine_dir / ".work", ignore_errors=True)


@contextmanager
def build_lock(engine_dir: Path, wait: bool = False) -> Iterator[None]:
    """One build at a time per engine directory: a second refuses at once, naming the holder's pid,
    instead of removing the first one's staging directories under it; with `wait`, it waits its turn
    (server pods that each build on start, sharing one volume). The lock is the kernel's (flock), so
    it goes away with the process, however it ends; the file stays."""
    path = engine_dir / LOCK_FILE
    with writing(path):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # group-shared engine dirs: the umask decides
            writable = True
        except PermissionError:  # another user's lock file: flock works on a read-only descriptor too
            fd, writable = os.open(path, os.O_RDONLY), False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            who = f"pid {holder}" if holder.isdigit() else "another process"
            raise TrtspecError(
                f"{shorten(engine_dir)}: another build ({who}) is building this engine directory; "
                "wait for it to finish, or stop it, and re-run"
            ) from None
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise write_error(exc, path) from None
            # a filesystem without locks (NFS without lockd, some FUSE volumes): build unguarded, as before
            print(f"trtspec: warning: {shorten(path)}: this filesystem has no file locks; "
                  "two builds of this directory at once are not prevented", file=sys.stderr)  # fmt: skip
        if writable:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def run_build(
    cfg: DeploymentConfig, force: bool = False, progress: Progress = lambda _msg: None, wait: bool = False
) -> BuildResult:
    engine_dir = engine_dir_for(cfg)
    if cfg.build.backend in ("tensorrt", "pytorch"):
        if not trtllm_available():
            raise UsageError(
                f"backend {cfg.build.backend} needs TensorRT-LLM, which is not installed here: "
                "run `trtspec build --emit-script build.sh` and run that script in the TensorRT-LLM container"
            )
        installed = tool_versions()["tensorrt_llm"]
        if installed != cfg.build.tensorrt_llm_version:
            raise UsageError(
                f"TensorRT-LLM {installed} is installed but build.tensorrt_llm_version is "
                f"{cfg.build.tensorrt_llm_version}: engines only load in the version that built them"
            )
    try:
        (engine_dir / "logs").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(exc, engine_dir) from None
    with build_lock(engine_dir, wait):
        return _run_build_locked(cfg, engine_dir, force, progress)


def _run_build_locked(cfg: DeploymentConfig, engine_dir: Path, force: bool, progress: Progress) -> BuildResult:
    k = resolve_num_draft_tokens(cfg, engine_dir)
    try:
        steps, fingerprints = plan_steps(cfg, engine_dir, k)
    except OSError as exc:
        raise UsageError(f"cannot read a checkpoint: {exc}") from None
    _clean_stale(engine_dir)
    manifest = Manifest.load(engine_dir) or Manifest(cfg.name, cfg.build.backend, cfg.mode)
    if (manifest.backend, manifest.mode) != (cfg.build.backend, cfg.mode):
        manifest = Manifest(cfg.name, cfg.build.backend, cfg.mode)
    manifest.config_sha256 = cfg.digest()
    manifest.config_path = str(cfg.source) if cfg.source else None
    manifest.tools = tool_versions()
    manifest.inputs = fingerprints
    manifest.num_draft_tokens = k
    manifest.serving = serving_decisions(cfg, k)
    for stale in set(manifest.steps) - {s.name for s in steps}:
        shutil.rmtree(engine_dir / manifest.steps.pop(stale).output, ignore_errors=True)
    built, skipped = [], []
    for step in steps:
        if not force and manifest.current(step.name, step.key, engine_dir):
            skipped.append(step.name)
            progress(f"{step.name}: up to date")
            continue
        progress(f"{step.name}: {step.describe}")
        staging = engine_dir / f".staging-{step.name}-{os.getpid()}"
        log = engine_dir / "logs" / f"{step.name}.log"
        t0 = time.perf_counter()
        try:
            log.write_text("", encoding="utf-8")
            records = step.run(staging, log)
            if cfg.build.backend == "torch":
                verify_engine(staging, cfg, step.name, k, "torch")
            hold = float(os.environ.get(HOLD_ENV, "0") or 0)
            if hold:
                time.sleep(hold)
            replace_dir(staging, engine_dir / step.output)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(engine_dir / ".work", ignore_errors=True)
            raise write_error(exc, engine_dir / step.output) from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(engine_dir / ".work", ignore_errors=True)
            raise
        seconds = round(time.perf_counter() - t0, 3)
        files = output_files(engine_dir / step.output)
        manifest.record(step.name, StepRecord(step.key, step.output, step.inputs, records, seconds, files=files))
        _save(manifest, engine_dir)
        built.append(step.name)
        progress(f"{step.name}: built in {seconds:.1f}s")
    _save(manifest, engine_dir)
    return BuildResult(engine_dir, built, skipped, k)


def _save(manifest: Manifest, engine_dir: Path) -> None:
    try:
        manifest.save(engine_dir)
    except OSError as exc:
        raise write_error(exc, engine_dir / "manifest.json") from None


def describe_plan(cfg: DeploymentConfig) -> list[str]:
    """--dry-run: each step, whether it is current, and the commands it would run."""
    engine_dir = engine_dir_for(cfg)
    k = resolve_num_draft_tokens(cfg, engine_dir)
    steps, _ = plan_steps(cfg, engine_dir, k)
    manifest = Manifest.load(engine_dir)
    drafts = get_mode(cfg.mode).drafts_label(cfg, k)
    lines = [f"build {cfg.name}: backend {cfg.build.backend}, mode {cfg.mode}, {drafts} -> {engine_dir}"]
    for step in steps:
        state = "up to date" if manifest and manifest.current(step.name, step.key, engine_dir) else "would build"
        lines.append(f"  {step.name} ({state}): {step.describe}")
        for command in step.commands:
            lines.append("    " + " ".join([command.program, *command.args]))
    return lines
