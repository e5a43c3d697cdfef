"""Faults and races on files (issue #20): a checkpoint whose config.json does not fit its weights, a full
disk under safetensors, outputs that cannot be written or must not be replaced, two builds at once,
hostile config values. Each gets one line naming the file and what to do, and loses nothing.

Read-only directories are real (mode 0500) for a normal user; root ignores modes, so as root the same
directory is made read-only by failing every open and mkdir under it with EROFS, as a read-only mount
would, and the tests run either way.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS
from tiny_models import make_checkpoint

from trtspec.build import builder
from trtspec.build.manifest import Manifest
from trtspec.cli import cli
from trtspec.errors import UsageError

LOCK = ".build.lock"  # builder.LOCK_FILE: the engine directory's build lock
EMIT_CONFIG = str(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml")  # hub ids: --emit-script needs nothing local


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("trtspec: error:")]


def one_line_error(res, code: int) -> str:
    """The CLI's contract: exit `code`, exactly one `trtspec: error:` line, no traceback."""
    assert res.exit_code == code, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    lines = error_lines(res.output)
    assert len(lines) == 1, res.output
    return lines[0]


def torch_pair(tmp: Path, draft_vocab: int | None = None, vocab: int = 32) -> Path:
    """A tiny target/draft pair on the torch backend; `draft_vocab` overrides the draft's config.json only."""
    make_checkpoint(tmp / "target", vocab=vocab, seed=1)
    draft = make_checkpoint(tmp / "draft", vocab=vocab, seed=2)
    if draft_vocab is not None:
        hf = json.loads((draft / "config.json").read_text())
        hf["vocab_size"] = draft_vocab
        (draft / "config.json").write_text(json.dumps(hf))
    data = {
        "name": "pair",
        "target": {"checkpoint": "./target", "dtype": "float32"},
        "draft": {"checkpoint": "./draft", "dtype": "float32"},
        "speculation": {"mode": "draft-target", "num_draft_tokens": 2, "sampling": {"max_tokens": 16}},
        "build": {"backend": "torch", "device": "cpu", "max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
        "deploy": {"gpus_per_node": 1},
    }
    config = tmp / "pair.yaml"
    config.write_text(yaml.safe_dump(data))
    return config


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under an engine directory but the logs (a failed step's log is meant to change)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.parts[len(root.parts)] != "logs" and p.name != LOCK
    }


@pytest.fixture
def read_only(tmp_path, monkeypatch) -> Path:
    """A directory nothing can be created in: mode 0500, or for root (which ignores modes) EROFS from every
    os.open and os.mkdir below it."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o500)
        yield ro
        ro.chmod(0o700)
        return
    real_open, real_mkdir = os.open, os.mkdir

    def under(path) -> bool:
        return Path(os.fsdecode(path)).absolute().is_relative_to(ro)

    def fake_open(path, flags, *args, **kwargs):
        if under(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):
        if under(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    yield ro


REFUSED = ("permission denied", "read-only file system")


# --- 1. config.json's vocab_size over an embedding of another size --------------------------------


def test_vocab_size_over_fewer_embedding_rows_is_a_check_error_and_a_one_line_build_refusal(
    runner, tmp_path, monkeypatch
):
    from trtspec.speculative.model import load_transformer

    monkeypatch.chdir(tmp_path)
    config = torch_pair(tmp_path, draft_vocab=4096, vocab=2048)
    draft_config = tmp_path / "draft" / "config.json"

    res = runner.invoke(cli, ["check", str(config), "--json"])
    assert res.exit_code == 1, res.output
    report = json.loads(res.output)
    (finding,) = [f for f in report["findings"] if f["code"] == "vocab-weights-mismatch"]
    assert finding["severity"] == "error" and "\n" not in finding["message"]
    assert str(draft_config) in finding["message"] and "4096" in finding["message"] and "2048" in finding["message"]
    assert runner.invoke(cli, ["check", str(config)]).exit_code == 1

    line = one_line_error(runner.invoke(cli, ["build", str(config)]), 2)
    assert str(draft_config) in line and "4096" in line and "2048" in line
    assert not (tmp_path / "engines" / "pair" / "target").exists()  # refused before the first step

    with pytest.raises(UsageError, match=r"vocab_size 4096 .* 2048 rows"):
        load_transformer(tmp_path / "draft")


def test_the_weight_loader_names_any_shape_config_json_does_not_describe(tmp_path):
    from trtspec.speculative.model import load_transformer

    path = make_checkpoint(tmp_path / "m", vocab=32)
    hf = json.loads((path / "config.json").read_text())
    hf["intermediate_size"] = 48
    (path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(UsageError, match=r"gate_up.weight has shape \[64, 16\] but config.json implies \[96, 16\]"):
        load_transformer(path)


# --- 2. a full disk while safetensors writes an engine ------------------------------------------


def safetensors_full(*args, **kwargs):
    from safetensors import SafetensorError

    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def quota_exceeded(*args, **kwargs):
    raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))


@pytest.mark.parametrize("fault", [safetensors_full, quota_exceeded], ids=["safetensors-enospc", "oserror-edquot"])
def test_full_disk_under_safetensors_is_one_line_and_keeps_the_previous_build(runner, tmp_path, monkeypatch, fault):
    import trtspec.speculative.model as weights_io

    monkeypatch.chdir(tmp_path)
    config = torch_pair(tmp_path)
    assert runner.invoke(cli, ["build", str(config), "--no-package"]).exit_code == 0
    engines = tmp_path / "engines" / "pair"
    before = snapshot(engines)
    assert {"manifest.json", "target/model.safetensors", "draft/model.safetensors"} <= set(before)

    monkeypatch.setattr(weights_io, "save_file", fault)
    line = one_line_error(runner.invoke(cli, ["build", str(config), "--force", "--no-package"]), 1)
    assert "no space left" in line or "quota" in line
    assert "engines/pair/target" in line and "nothing was left half-written" in line
    assert not list(engines.glob(".staging-*")) and not (engines / ".work").exists()
    assert snapshot(engines) == before  # the earlier engines and manifest, byte for byte


# --- 3-5. outputs that cannot be written -----------------------------------------------------------


def test_deploy_into_a_non_directory_is_one_line(runner, tmp_path):
    fifo = tmp_path / "full"
    os.mkfifo(fifo)  # stands in for /dev/full: exists, is no directory, must not be replaced
    line = one_line_error(
        runner.invoke(cli, ["deploy", str(CONFIGS / "tiny-draft-target.yaml"), "--out", str(fifo)]), 2
    )
    assert str(fifo) in line and "not a directory" in line
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    res = runner.invoke(cli, ["deploy", str(CONFIGS / "tiny-draft-target.yaml"), "--out", str(fifo / "sub")])
    assert str(fifo / "sub") in one_line_error(res, 2)


def test_deploy_into_a_read_only_directory_is_one_line(runner, read_only):
    out = read_only / "k8s"
    line = one_line_error(runner.invoke(cli, ["deploy", str(CONFIGS / "tiny-draft-target.yaml"), "--out", str(out)]), 2)
    assert str(out) in line and any(r in line.lower() for r in REFUSED)
    assert list(read_only.iterdir()) == []


def test_emit_script_into_a_read_only_directory_is_one_line(runner, tmp_path, monkeypatch, read_only):
    monkeypatch.chdir(tmp_path)
    script = read_only / "build.sh"
    res = runner.invoke(cli, ["build", EMIT_CONFIG, "--emit-script", str(script), "--no-package"])
    line = one_line_error(res, 2)
    assert str(script) in line and any(r in line.lower() for r in REFUSED)
    assert list(read_only.iterdir()) == []


def test_init_into_a_read_only_directory_is_one_line(runner, read_only):
    out = read_only / "tiny.yaml"
    line = one_line_error(runner.invoke(cli, ["init", "--target", "embedded:tiny-target", "--out", str(out)]), 2)
    assert str(out) in line and any(r in line.lower() for r in REFUSED)
    assert list(read_only.iterdir()) == []


def test_an_os_error_no_stage_worded_is_still_one_line_naming_the_file():
    from trtspec.fsutil import path_error

    error = path_error(PermissionError(errno.EACCES, "Permission denied", "/x/plan.json"))
    assert str(error) == "/x/plan.json: permission denied" and error.exit_code == 2
    assert path_error(OSError(errno.ENOSPC, "No space left on device", "/x/a")).exit_code == 1
    assert path_error(OSError(errno.EPIPE, "Broken pipe")) is None  # no file: not a user's problem to word


# --- 6. a single-file output replaces a file only with --force, and never anything else -------------


def test_emit_script_overwrites_only_with_force(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "build.sh"
    script.write_text("# mine\n")
    line = one_line_error(runner.invoke(cli, ["build", EMIT_CONFIG, "--emit-script", str(script), "--no-package"]), 2)
    assert str(script) in line and "--force" in line
    assert script.read_text() == "# mine\n"
    res = runner.invoke(cli, ["build", EMIT_CONFIG, "--emit-script", str(script), "--no-package", "--force"])
    assert res.exit_code == 0, res.output
    assert script.read_text().startswith("#!/usr/bin/env bash")


@pytest.mark.parametrize("force", [[], ["--force"]], ids=["plain", "force"])
def test_emit_script_and_init_never_replace_a_device_or_fifo(runner, tmp_path, monkeypatch, force):
    monkeypatch.chdir(tmp_path)
    fifo = tmp_path / "null"
    os.mkfifo(fifo)  # like /dev/null or /dev/full: not a regular file, which root could otherwise replace
    res = runner.invoke(cli, ["build", EMIT_CONFIG, "--emit-script", str(fifo), "--no-package", *force])
    line = one_line_error(res, 2)
    assert str(fifo) in line and "not a regular file" in line
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    line = one_line_error(
        runner.invoke(cli, ["init", "--target", "embedded:tiny-target", "--out", str(fifo), *force]), 2
    )
    assert str(fifo) in line and "not a regular file" in line
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


# --- 7. two builds of one config at once ---------------------------------------------------------


def test_a_build_refuses_while_another_holds_the_engine_directory(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = torch_pair(tmp_path)
    engines = tmp_path / "engines" / "pair"
    engines.mkdir(parents=True)
    fd = os.open(engines / LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"424242\n")
        line = one_line_error(runner.invoke(cli, ["build", str(config), "--no-package"]), 1)
        assert "engines/pair: another build (pid 424242)" in line
        assert not (engines / "target").exists()
        dry = runner.invoke(cli, ["build", str(config), "--dry-run"])  # reads only: needs no lock
        assert dry.exit_code == 0 and "target (would build)" in dry.output
    finally:
        os.close(fd)
    assert runner.invoke(cli, ["build", str(config), "--no-package"]).exit_code == 0  # the lock left with its holder


def test_build_wait_takes_its_turn_after_the_holder(runner, tmp_path, monkeypatch):
    """Server pods that each build on start share one volume: with --wait the second build waits for the
    lock instead of failing its init container, then finds the engines built."""
    import threading

    monkeypatch.chdir(tmp_path)
    config = torch_pair(tmp_path)
    engines = tmp_path / "engines" / "pair"
    engines.mkdir(parents=True)
    fd = os.open(engines / LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    released = threading.Event()

    def release():
        time.sleep(1.0)
        released.set()
        os.close(fd)

    threading.Thread(target=release, daemon=True).start()
    res = runner.invoke(cli, ["build", str(config), "--no-package", "--wait"])
    assert res.exit_code == 0, res.output
    assert released.is_set()  # it ran only after the holder let go
    assert Manifest.load(engines).steps.keys() == {"target", "draft"}


def test_a_second_build_during_a_running_one_refuses_and_the_first_completes(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = torch_pair(tmp_path)
    engines = tmp_path / "engines" / "pair"
    env = {**os.environ, builder.HOLD_ENV: "3"}
    first = subprocess.Popen(
        [sys.executable, "-m", "trtspec", "build", str(config), "--no-package"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while not list(engines.glob(".staging-target-*/engine.json")):
            assert first.poll() is None, first.communicate()
            assert time.time() < deadline, "the first build never reached its first step"
            time.sleep(0.05)
        line = one_line_error(runner.invoke(cli, ["build", str(config), "--no-package"]), 1)
        assert f"pid {first.pid}" in line
        out, err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    assert "built target, draft" in out
    manifest = Manifest.load(engines)
    assert manifest is not None and manifest.steps.keys() == {"target", "draft"}
    assert not list(engines.glob(".staging-*"))
    for role in ("target", "draft"):
        assert (engines / role / "model.safetensors").is_file() and (engines / role / "engine.json").is_file()


@pytest.mark.parametrize("stage", ["target", "draft"])
def test_a_build_killed_at_each_step_resumes_to_the_same_bytes(tmp_path, stage):
    """SIGKILL while a step's output is staged (the draft's: after the target is in place and recorded);
    the next build redoes only what was not finished and ends byte-identical to an uninterrupted one.
    Every step holds its staging for HOLD_ENV seconds; 5 s is enough to catch the draft's, and lets the
    target's pass first."""
    reference = torch_pair(tmp_path / "reference")
    done = subprocess.run(
        [sys.executable, "-m", "trtspec", "build", str(reference), "--no-package"],
        cwd=reference.parent, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = torch_pair(tmp_path / "killed")
    engines = config.parent / "engines" / "pair"
    killed = subprocess.Popen(
        [sys.executable, "-m", "trtspec", "build", str(config), "--no-package"],
        cwd=config.parent, env={**os.environ, builder.HOLD_ENV: "60" if stage == "target" else "5"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 240
        while not list(engines.glob(f".staging-{stage}-*/engine.json")):
            assert killed.poll() is None, "the build ended before it could be killed"
            assert time.time() < deadline, f"the build never reached its {stage} step"
            time.sleep(0.05)
        os.killpg(killed.pid, 9)
        killed.wait(timeout=30)
    finally:
        if killed.poll() is None:
            os.killpg(killed.pid, 9)
            killed.wait()
    before = Manifest.load(engines)
    recorded = set(before.steps) if before else set()
    assert recorded == ({"target"} if stage == "draft" else set())
    resumed = subprocess.run(
        [sys.executable, "-m", "trtspec", "build", str(config), "--no-package", "--json"],
        cwd=config.parent, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert report["built"] == (["draft"] if stage == "draft" else ["target", "draft"])
    assert not list(engines.glob(".staging-*"))

    def engine_files(root: Path) -> dict[str, bytes]:
        return {k: v for k, v in snapshot(root).items() if k != "manifest.json"}

    assert engine_files(engines) == engine_files(reference.parent / "engines" / "pair")


# --- hostile config values ------------------------------------------------------------------------


def test_booleans_are_not_numbers_in_a_config(runner, tmp_path):
    data = yaml.safe_load((CONFIGS / "tiny-draft-target.yaml").read_text())
    data["speculation"]["num_draft_tokens"] = True
    config = tmp_path / "bool.yaml"
    config.write_text(yaml.safe_dump(data))
    line = one_line_error(runner.invoke(cli, ["validate", str(config)]), 2)
    assert "speculation.num_draft_tokens" in line and "got True" in line
    data["speculation"]["num_draft_tokens"] = 3
    data["build"]["max_batch_size"] = False
    config.write_text(yaml.safe_dump(data))
    assert "build.max_batch_size: must be an integer" in one_line_error(
        runner.invoke(cli, ["validate", str(config)]), 2
    )
    data["build"]["max_batch_size"] = 4
    data["speculation"]["sampling"]["temperature"] = True
    config.write_text(yaml.safe_dump(data))
    assert "temperature: must be a number" in one_line_error(runner.invoke(cli, ["validate", str(config)]), 2)
    # YAML integers (and an integer where a float goes) still load
    text = (CONFIGS / "tiny-draft-target.yaml").read_text().replace("temperature: 0.0", "temperature: 1")
    config.write_text(text)
    res = runner.invoke(cli, ["validate", str(config), "--json"])
    assert res.exit_code == 0, res.output
    resolved = json.loads(res.output)
    assert resolved["speculation"]["num_draft_tokens"] == 2 and resolved["speculation"]["sampling"]["temperature"] == 1


def test_errors_do_not_echo_a_huge_path_or_value(runner, tmp_path):
    huge_path = tmp_path / ("c" * 10_000_000 + ".yaml")
    line = one_line_error(runner.invoke(cli, ["validate", str(huge_path)]), 2)
    assert len(line) < 1000 and "characters" in line
    data = yaml.safe_load((CONFIGS / "tiny-draft-target.yaml").read_text())
    data["name"] = "N" * 1_000_000
    data["deploy"]["image"] = None
    config = tmp_path / "huge.yaml"
    config.write_text(yaml.safe_dump(data))
    line = one_line_error(runner.invoke(cli, ["validate", str(config)]), 2)
    assert len(line) < 1000 and "name: must be a DNS-1123 label" in line


def test_a_filesystem_without_locks_builds_with_a_warning(runner, tmp_path, monkeypatch):
    """NFS without lockd or a FUSE volume answers flock with ENOLCK: the build goes on, unguarded, and says so."""
    monkeypatch.chdir(tmp_path)
    config = torch_pair(tmp_path)

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(builder.fcntl, "flock", no_locks)
    res = runner.invoke(cli, ["build", str(config), "--no-package"])
    assert res.exit_code == 0, res.output
    assert "this filesystem has no file locks" in res.output
    assert Manifest.load(tmp_path / "engines" / "pair").steps.keys() == {"target", "draft"}


def test_another_users_lock_file_still_locks(runner, tmp_path, monkeypatch):
    """A lock file left by another user of a shared engine directory is not writable here; flock on a
    read-only descriptor still excludes a second build, and the build itself runs."""
    monkeypatch.chdir(tmp_path)
    config = torch_pair(tmp_path)
    real_open = os.open

    def foreign(path, flags, *args):
        if str(path).endswith(LOCK) and flags & os.O_RDWR:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args)

    engines = tmp_path / "engines" / "pair"
    engines.mkdir(parents=True)
    (engines / LOCK).write_text("4242\n")
    monkeypatch.setattr(builder.os, "open", foreign)
    holder = real_open(engines / LOCK, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        line = one_line_error(runner.invoke(cli, ["build", str(config), "--no-package"]), 1)
        assert "another build (pid 4242)" in line
    finally:
        os.close(holder)
    res = runner.invoke(cli, ["build", str(config), "--no-package"])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(
    ("section", "field", "value", "words"),
    [
        ("sampling", "seed", 10**30, "must be <= 18446744073709551615"),
        ("sampling", "seed", -5, "must be >= 0"),
        ("build", "max_seq_len", 10**12, "must be <= 2147483647"),
        ("build", "gpu_memory_gb", float("inf"), "finite number"),
    ],
)
def test_config_numbers_the_runtime_cannot_take_are_refused(runner, tmp_path, section, field, value, words):
    """A seed torch cannot take failed every served request; lengths past int32 or an infinite memory size
    passed validation and failed later."""
    data = yaml.safe_load((CONFIGS / "tiny-draft-target.yaml").read_text())
    (data["speculation"]["sampling"] if section == "sampling" else data[section])[field] = value
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(data))
    line = one_line_error(runner.invoke(cli, ["validate", str(config)]), 2)
    assert words in line and field in line


def test_a_full_disk_under_the_bench_records_is_one_line_and_keeps_earlier_records(tmp_path):
    """requests.jsonl is appended, not staged: the error must not claim nothing was half-written, and
    the records already flushed stay whole."""
    from trtspec.bench.records import RecordWriter, RequestRecord, read_records
    from trtspec.errors import TrtspecError

    def record(index: int) -> RequestRecord:
        return RequestRecord(index, "A", "c=1", "measure", 0, None, 8, 16, 0.0)

    path = tmp_path / "requests.jsonl"
    writer = RecordWriter(path)
    writer.write(record(0))

    class FullDisk:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")  # no filename, as a file object raises it

        def flush(self):
            pass

    writer._fh, real = FullDisk(), writer._fh
    with pytest.raises(TrtspecError) as caught:
        writer.write(record(1))
    real.close()
    assert str(caught.value) == f"no space left on the device while writing {path}: free space and re-run"
    assert caught.value.exit_code == 1
    assert [r.index for r in read_records(path)] == [0]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_checkpoints_take_the_umask_as_a_plain_open_would(tmp_path, umask):
    """Weights and folders trtspec writes are for others to read (a container's user): safetensors and
    mkdtemp make theirs private, so each writer applies the umask as open() and mkdir do."""
    from trtspec.assets import EMBEDDED_CHECKPOINTS
    from trtspec.checkpoints.inspect import read_hf_config
    from trtspec.checkpoints.self_draft import cut_checkpoint
    from trtspec.fsutil import atomic_write_text, current_umask
    from trtspec.speculative.eagle import load_eagle3
    from trtspec.speculative.heads import load_heads
    from trtspec.speculative.model import load_transformer

    before = os.umask(umask)
    try:
        assert current_umask() == umask
        cut_checkpoint(EMBEDDED_CHECKPOINTS["tiny-target"], [0], tmp_path / "cut")
        heads = load_heads(EMBEDDED_CHECKPOINTS["tiny-medusa"])  # trained tied to the target's lm_head
        heads.tie(load_transformer(EMBEDDED_CHECKPOINTS["tiny-target"]).lm_head.weight)
        heads.save(tmp_path / "medusa", tied=True)
        target_config = read_hf_config(EMBEDDED_CHECKPOINTS["tiny-target"])
        load_eagle3(EMBEDDED_CHECKPOINTS["tiny-eagle3"]).save(tmp_path / "eagle3", target_config)
        atomic_write_text(tmp_path / "note.txt", "x")
    finally:
        os.umask(before)
    written = [p for p in tmp_path.rglob("*")]
    assert {p.relative_to(tmp_path).parts[0] for p in written} == {"cut", "medusa", "eagle3", "note.txt"}
    assert any(p.suffix == ".safetensors" for p in written)
    for path in written:
        want = (0o777 if path.is_dir() else 0o666) & ~umask
        assert stat.S_IMODE(path.stat().st_mode) == want, (path, oct(path.stat().st_mode))


def test_deploy_force_keeps_the_compose_workspace_and_never_deletes_the_config_or_cwd(runner, tmp_path, monkeypatch):
    """--force replaces the files deploy wrote; the compose build's engines and repository under workspace/
    stay, and a --out holding the current directory or the config is refused before anything is touched."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text((CONFIGS / "tiny-draft-target.yaml").read_text())
    out = tmp_path / "dc"
    assert runner.invoke(cli, ["deploy", str(config), "--target", "docker", "--out", str(out)]).exit_code == 0
    built = out / "workspace" / "engines" / "tiny-draft-target" / "manifest.json"
    built.parent.mkdir(parents=True)
    built.write_text("{}")
    (out / "compose.yaml").write_text("edited")
    res = runner.invoke(cli, ["deploy", str(config), "--target", "docker", "--out", str(out), "--force"])
    assert res.exit_code == 0, res.output
    assert built.read_text() == "{}" and "services" in (out / "compose.yaml").read_text()
    assert not list(tmp_path.glob(".*old")) and not list(tmp_path.glob(".staging-*"))
    (tmp_path / "precious.txt").write_text("mine")
    before = snapshot(tmp_path)
    for where, says in ((".", "holds the current directory"), (str(tmp_path.parent), "holds the current directory")):
        line = one_line_error(
            runner.invoke(cli, ["deploy", str(config), "--target", "docker", "--out", where, "--force"]), 2
        )
        assert says in line
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)  # even an empty current directory cannot be renamed into place
    line = one_line_error(runner.invoke(cli, ["deploy", str(config), "--target", "docker", "--out", "."]), 2)
    assert "holds the current directory" in line
    empty.rmdir()
    monkeypatch.chdir(tmp_path.parent)  # not inside --out: the config is what it holds
    res = runner.invoke(cli, ["deploy", str(config), "--target", "docker", "--out", str(tmp_path), "--force"])
    line = one_line_error(res, 2)
    assert "holds the config" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("head", ["medusa", "eagle3"])
def test_heads_given_as_a_draft_model_are_one_line_everywhere(runner, tmp_path, monkeypatch, head):
    """Heads under draft-target are no decoder: init refuses the pair, and where a hand edit makes it, check says
    what the heads are as a finding, deploy sizes them as files, build and generate refuse naming the heads and
    their mode (the EAGLE-3 head's config.json names LlamaForCausalLM), never a staging folder or a KeyError."""
    from trtspec.modes import get_mode

    role, name = get_mode(head).draft_role, f"tiny-{head}"
    monkeypatch.chdir(tmp_path)
    args = ["init", "--target", "embedded:tiny-target", "--backend", "torch", "--out", "c.yaml", "--draft"]
    line = one_line_error(runner.invoke(cli, [*args, f"embedded:{name}", "--mode", "draft-target"]), 2)
    assert f"use --mode {head}" in line and not (tmp_path / "c.yaml").exists()
    assert runner.invoke(cli, [*args, "embedded:tiny-draft"]).exit_code == 0
    config = tmp_path / "c.yaml"
    config.write_text(config.read_text().replace("embedded:tiny-draft", f"embedded:{name}"))
    res = runner.invoke(cli, ["check", "c.yaml", "--json"])
    found = {f["code"]: f for f in json.loads(res.output)["findings"]}
    assert res.exit_code != 0 and f"is {role}" in found["draft-kind"]["message"]
    res = runner.invoke(cli, ["deploy", "c.yaml", "--check"])
    assert isinstance(res.exception, SystemExit | None) and "smallest cluster" in res.output, res.output
    for command in (["build", "c.yaml"], ["generate", "c.yaml", "--prompt", "hi"]):
        line = one_line_error(runner.invoke(cli, command), 2)
        assert f"{name} is {role}, not a draft for mode draft-target: use mode {head}" in line, line
        assert ".staging" not in line, line
    assert not (tmp_path / "engines" / "tiny-target" / "draft").exists()


def test_a_broken_tokenizer_or_a_refused_prompt_is_one_line_without_the_prompt(runner, tmp_path):
    from trtspec.assets import EMBEDDED_CHECKPOINTS

    shutil.copytree(EMBEDDED_CHECKPOINTS["tiny-target"], tmp_path / "t")
    config = tmp_path / "c.yaml"
    args = ["init", "--target", str(tmp_path / "t"), "--mode", "ngram", "--backend", "torch", "--out", str(config)]
    assert runner.invoke(cli, args).exit_code == 0
    long_prompt = "word " * 400
    line = one_line_error(runner.invoke(cli, ["generate", str(config), "--prompt", long_prompt]), 2)
    assert (
        "max_input_len" in line
        and "word word" not in runner.invoke(cli, ["generate", str(config), "--prompt", long_prompt]).output
    )
    shutil.copytree(tmp_path / "t", tmp_path / "broken")  # another path: a process loads a tokenizer once
    (tmp_path / "broken" / "tokenizer.json").write_text("garbage{")
    config.write_text(config.read_text().replace(str(tmp_path / "t"), str(tmp_path / "broken")))
    line = one_line_error(runner.invoke(cli, ["generate", str(config), "--prompt", "hi"]), 2)
    assert "cannot load a tokenizer" in line
