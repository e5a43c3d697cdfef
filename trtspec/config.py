"""The deployment config: one YAML file per deployment, read by every stage.

Field rules live on the models; rules that relate several fields live in `_cross_field_rules`, the
one place a reader needs to look to know what combinations trtspec refuses and why. Every error
names the file and the dotted field, on one line, so a user never reads a pydantic dump.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, Field, ValidationError, create_model

from trtspec.assets import EMBEDDED_CHECKPOINTS
from trtspec.config_types import INT32_MAX, Float, Fraction, Int, Port, PositiveInt
from trtspec.config_types import Section as _Section
from trtspec.errors import ConfigError, shorten
from trtspec.modes import BACKENDS, MODE_NAMES, MODES, REGISTRY, get_mode
from trtspec.speculative.requests import TreeShape
from trtspec.versions import DEFAULT_TRTLLM_VERSION, TRTLLM_CONTAINERS, at_least, minor

MAX_DRAFT_TOKENS = 16
Mode = Literal[MODE_NAMES]  # type: ignore[valid-type]  # the registry's names, trtspec.modes
Backend = Literal[BACKENDS]  # type: ignore[valid-type]  # trtspec.modes.BACKENDS
Flavour = Literal["llmapi", "engine"]
Dtype = Literal["auto", "float32", "float16", "bfloat16"]
Quantization = Literal["none", "fp8", "int8_weight_only", "int4_weight_only", "int4_awq", "nvfp4"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(f"must be a DNS-1123 label (lowercase letters, digits and '-', at most 63), got {value!r}")
    return value


def _tree_shape(value: str) -> str:
    return str(TreeShape.parse(value))


def _trtllm_version(value: str) -> str:
    if value not in TRTLLM_CONTAINERS:
        known = ", ".join(TRTLLM_CONTAINERS)
        raise ValueError(f"must be one of {known} (compiled engines end with 1.2.x), got {value!r}")
    return value


class ModelSection(_Section):
    """A checkpoint: a local directory, an `embedded:<name>`, or a Hugging Face id for the GPU host."""

    checkpoint: str
    dtype: Dtype = "auto"
    quantization: Quantization = "none"


class SamplingSection(_Section):
    """Defaults for requests that do not say; temperature 0 means greedy."""

    temperature: Float = Field(default=0.0, ge=0.0, le=100.0)
    top_k: Int = Field(default=0, ge=0, le=INT32_MAX)
    top_p: Fraction = 1.0
    max_tokens: PositiveInt = 128
    seed: Annotated[Int, Field(ge=0, le=2**64 - 1)] | None = None  # a UINT64, as the served models take it


class SpeculationSection(_Section):
    mode: Mode = "draft-target"
    num_draft_tokens: Annotated[Int, Field(ge=1, le=MAX_DRAFT_TOKENS)] | Literal["auto"] = 4
    use_draft_logits: bool = Field(
        default=False, description="engine flavour: pass draft logits to the target (needs gathered logits)"
    )
    policy: Literal["auto", "fixed", "adaptive"] = Field(
        default="auto",
        description="drafts per step: fixed K, or adaptive (K per running batch from measured acceptance and step"
        " costs; torch backend only); auto is adaptive on the torch backend, fixed on TensorRT-LLM and for a tree"
        " (speculation.tree, medusa.choices, lookahead's W, N, G), where adaptive is refused",
    )
    max_concurrency: PositiveInt | None = Field(
        default=None,
        description="no speculation above this many running requests (TensorRT-LLM 1.2+ pytorch backend, and torch)",
    )
    tree: Annotated[str, AfterValidator(_tree_shape)] | None = Field(
        default=None,
        description="torch backend: verify a token tree DEPTHxWIDTH (e.g. 4x3) per step instead of a chain of K",
    )
    sampling: SamplingSection = SamplingSection()

    def resolved_policy(self, backend: str, *, own_tree: bool) -> str:
        """fixed or adaptive: what `auto` means on `backend` (a tree, speculation.tree or the one the mode's own
        settings give, `own_tree`, is its own shape: fixed)."""
        if self.policy != "auto":
            return self.policy
        if self.tree is not None or own_tree:
            return "fixed"
        return "adaptive" if backend == "torch" and get_mode(self.mode).speculates() else "fixed"


class BuildSection(_Section):
    backend: Backend = "torch"
    tensorrt_llm_version: Annotated[str, AfterValidator(_trtllm_version)] = DEFAULT_TRTLLM_VERSION
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    max_batch_size: Int = Field(default=8, ge=1, le=4096)
    max_input_len: PositiveInt = 1024
    max_seq_len: PositiveInt = 2048
    max_num_tokens: PositiveInt | None = Field(default=None, description="default: TensorRT-LLM's own")
    kv_cache_free_gpu_mem_fraction: Fraction = 0.9
    gpu_memory_gb: Float | None = Field(
        default=None, ge=1.0, description="memory per GPU; default: detected at check time"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="torch backend only")
    output_dir: str = "engines"


class ServeSection(_Section):
    flavour: Flavour = "llmapi"
    instances: Int = Field(default=1, ge=1, le=64)
    http_port: Port = 8000
    grpc_port: Port = 8001
    metrics_port: Port = 8002
    streaming: bool = True
    repository: str = "model_repository"


def _quantity(value: str) -> str:
    if not _QUANTITY.match(value):
        raise ValueError(f"must be a Kubernetes quantity such as 16Gi, 500Mi or 4, got {value!r}")
    return value


_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
Quantity = Annotated[str, AfterValidator(_quantity)]


class StorageSection(_Section):
    size: Quantity = "200Gi"
    storage_class: str | None = None


class Toleration(_Section):
    key: str
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


def _renamed_target(value: Any) -> Any:
    if value is not None:
        raise ValueError(
            "replaced by target_load: the HPA now reads one load value per pod (batch slots in use, or the"
            " queue-to-compute ratio where no executor metric exists; docs/deploying.md, Autoscaling)"
        )
    return value


class AutoscalingSection(_Section):
    """An HPA on one load value per pod (trtspec.deploy.monitoring.load_signal); needs prometheus-adapter
    with the rule `trtspec deploy` writes beside the manifests."""

    enabled: bool = True
    min_replicas: Int = Field(default=1, ge=1, le=1000)
    max_replicas: Int = Field(default=4, ge=1, le=1000)
    target_load: Float | None = Field(
        default=None,
        ge=0.01,
        le=100.0,
        description="the per-pod load the HPA holds replicas at; default: the signal's own (0.8 of the batch's"
        " slots, or a queue-to-compute ratio of 1.0 for the LLM API on TensorRT-LLM)",
    )
    # the field before target_load: set, it fails with the reason instead of a bare "unknown key"
    queue_compute_ratio: Annotated[Any, AfterValidator(_renamed_target)] = Field(default=None, exclude=True)


class MonitoringSection(_Section):
    """Alert thresholds for the PrometheusRule `trtspec deploy` writes."""

    min_acceptance: Float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="alert when draft acceptance stays below this (below ~0.5 speculation costs more)",
    )
    max_queue_compute_ratio: Float = Field(
        default=2.0, ge=0.001, description="alert when time queued per unit of compute time stays above this"
    )
    alert_for: Annotated[str, Field(pattern=r"^[1-9][0-9]*[smh]$")] = Field(
        default="10m", description="how long a condition must hold before its alert fires"
    )


class DeploySection(_Section):
    image: str | None = Field(default=None, description="default: the Triton TRT-LLM image for the version")
    gpus_per_node: Int = Field(default=8, ge=1, le=64)
    replicas: Int = Field(default=1, ge=1, le=1000)
    namespace: Annotated[str, AfterValidator(_dns_label)] = "trtspec"
    kubernetes_version: Annotated[str, AfterValidator(lambda v: _k8s_version(v))] = "1.30"
    storage: StorageSection = StorageSection()
    hf_token_secret: str | None = Field(default=None, description="a Secret name; never the token itself")
    gpu_product: str | None = Field(default=None, description="nvidia.com/gpu.product label to require")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")]
    )
    cpu: Quantity | None = Field(default=None, description="CPU per pod; default max(4, GPUs), as NVIDIA's chart")
    memory: Quantity | None = Field(
        default=None,
        description="memory per pod; default: what the weights need while loading (serving) or the checkpoint"
        " while converting (build), at least NVIDIA's chart's 8Gi per CPU (trtspec/deploy/sizing.py)",
    )
    shm_size: Quantity | None = Field(
        default=None,
        description="/dev/shm (a memory emptyDir, so within the memory limit) for the python backend and NCCL;"
        " default: a quarter of the memory limit, at most 16Gi (GPU pods) or 1Gi (CPU pods)",
    )
    weights_gb: Float | None = Field(
        default=None,
        gt=0.0,
        description="size of the target (+ draft) checkpoints as published, in GB: sizes downloads, host memory,"
        " time budgets and the GPUs to require for hub ids trtspec knows no architecture of (overrides its own)",
    )
    monitoring_labels: dict[str, str] = Field(
        default_factory=dict, description="labels Prometheus selects PodMonitors and rules by (release: ...)"
    )
    image_pull_secret: str | None = None
    service_type: Literal["ClusterIP", "LoadBalancer"] = "ClusterIP"
    autoscaling: AutoscalingSection = AutoscalingSection()
    monitoring: MonitoringSection = MonitoringSection()


def _k8s_version(value: str) -> str:
    if not re.fullmatch(r"1\.\d{2}", value):
        raise ValueError(f"must look like '1.30', got {value!r}")
    return value


class _Deployment(_Section):
    name: Annotated[str, AfterValidator(_dns_label)]
    target: ModelSection
    draft: ModelSection | None = None
    # then each mode's section, speculation, build, serve and deploy: see DeploymentConfig below

    # Set by load_config: where relative paths are resolved from and what the file was.
    source: Path | None = Field(default=None, exclude=True)

    @property
    def mode(self) -> Mode:
        return self.speculation.mode

    @property
    def policy(self) -> str:
        """The K policy the served torch models run: fixed or adaptive."""
        own = get_mode(self.mode).own_tree(self) is not None
        return self.speculation.resolved_policy(self.build.backend, own_tree=own)

    @property
    def base_dir(self) -> Path:
        return self.source.parent if self.source else Path.cwd()

    def checkpoint_path(self, section: ModelSection) -> Path | None:
        """The local directory of a checkpoint, or None for a hub id (fetched on the GPU host)."""
        return resolve_checkpoint(section.checkpoint, self.base_dir)

    def _unused(self) -> dict[str, Any]:
        """Left out of the hashes: mode sections the config does not use and an unset speculation.tree. A
        mode or option added to trtspec must not change the hash of configs that never name it (their pods
        would roll, their builds rerun, for nothing)."""
        out: dict[str, Any] = {
            m.section: True for m in REGISTRY.values() if m.section and getattr(self, m.section) is None
        }
        if self.speculation.tree is None:
            out["speculation"] = {"tree": True}
        return out

    def digest(self) -> str:
        """A stable hash of the effective settings, for build manifests."""
        text = json.dumps(self.model_dump(mode="json", exclude=self._unused()), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def serving_digest(self) -> str:
        """A hash of what the served repository is made from (everything but `deploy`): pods roll, and a
        repository is rebuilt, when it changes, not when an alert threshold or the HPA's bounds do."""
        text = json.dumps(self.model_dump(mode="json", exclude={"deploy": True, **self._unused()}), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


# Each mode's own settings, declared by the mode (trtspec/modes), as an optional top-level section after
# the checkpoints, in the registry's order; adding a mode adds its section here without touching this file.
DeploymentConfig = create_model(
    "DeploymentConfig",
    __base__=_Deployment,
    __doc__="A deployment: the checkpoints, the speculative mode and its section, build, serve and deploy.",
    **{m.section: (m.settings_model | None, None) for m in MODES if m.section and m.settings_model},
    speculation=(SpeculationSection, SpeculationSection()),
    build=(BuildSection, BuildSection()),
    serve=(ServeSection, ServeSection()),
    deploy=(DeploySection, DeploySection()),
)


def resolve_checkpoint(ref: str, base_dir: Path) -> Path | None:
    """Map a checkpoint reference to a local directory; None means a Hugging Face id.

    A reference that exists on disk, or that looks like a path (./, ../, /, ~), is local; one shaped
    like `org/name` that does not exist locally is a hub id.
    """
    if ref.startswith("embedded:"):
        name = ref.removeprefix("embedded:")
        if name not in EMBEDDED_CHECKPOINTS:
            raise ValueError(f"unknown embedded checkpoint {name!r} (have: {', '.join(EMBEDDED_CHECKPOINTS)})")
        return EMBEDDED_CHECKPOINTS[name]
    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    looks_like_path = ref.startswith(("/", "./", "../", "~")) or not _HUB_ID.match(ref)
    if path.exists() or looks_like_path:
        return path.resolve()
    return None


def _cross_field_rules(cfg: DeploymentConfig) -> list[tuple[str, str]]:
    """Combinations trtspec refuses, each with the field to change and the fix."""
    errors: list[tuple[str, str]] = []
    mode, backend, flavour = cfg.speculation.mode, cfg.build.backend, cfg.serve.flavour
    b = cfg.build
    spec = get_mode(mode)
    if spec.needs_draft and cfg.draft is None:
        errors.append(("draft", f"required when speculation.mode is {mode} (add draft.checkpoint)"))
    if spec.refuses_draft and cfg.draft is not None:
        errors.append(("draft", f"not used with speculation.mode {mode} (it drafts without a second model)"))
    for other in REGISTRY.values():
        if other.section and other.section != spec.section and getattr(cfg, other.section) is not None:
            errors.append((other.section, f"only used with speculation.mode {other.name}, got mode {mode}"))
    row = spec.row(backend)
    if not row.exists:
        errors.append(("build.backend", f"mode {mode} does not exist on backend {backend}; use backend {spec.where()}"))
    elif row.versions is not None and minor(b.tensorrt_llm_version) not in row.versions:
        errors.append(
            (
                "build.tensorrt_llm_version",
                f"mode {mode} on backend {backend} does not exist in TensorRT-LLM {b.tensorrt_llm_version};"
                f" it exists on {spec.where()}",
            )
        )
    errors += spec.validate(cfg)
    if cfg.speculation.tree is not None and (backend != "torch" or not spec.runner_trees):
        where = "the torch backend" if backend != "torch" else f"a mode whose drafter proposes trees, not {mode}"
        errors.append(("speculation.tree", f"token trees run on {where}; remove it"))
    elif cfg.speculation.tree is not None and flavour == "engine":
        errors.append(("speculation.tree", "the engine flavour's BLS loop verifies chains; use serve.flavour llmapi"))
    elif cfg.speculation.tree is not None and cfg.speculation.policy == "adaptive":
        errors.append(("speculation.policy", "adaptive chooses K for chains; a tree's shape is fixed: use fixed"))
    elif cfg.speculation.policy == "adaptive" and (tree := spec.own_tree(cfg)) is not None:
        errors.append(
            ("speculation.policy", f"adaptive chooses K for chains; {mode}'s settings fix its tree ({tree}): use fixed")
        )
    if backend == "torch" and flavour == "engine" and spec.speculates() and spec.torch_engine_mode is None:
        errors.append(
            (
                "serve.flavour",
                f"the engine flavour stands in for compiled engines, where mode {mode} does not exist; use llmapi",
            )
        )
    if backend == "pytorch" and flavour == "engine":
        errors.append(("serve.flavour", "backend pytorch is served by flavour llmapi (engine needs compiled engines)"))
    if backend == "tensorrt" and flavour == "llmapi":
        errors.append(("serve.flavour", "backend tensorrt (compiled engines) is served by flavour engine"))
    if flavour == "engine" and not spec.engine_streams and cfg.serve.streaming:
        errors.append(
            (
                "serve.streaming",
                "the engine flavour speculates through the BLS model, which does not stream; set streaming: false"
                " or use flavour llmapi",
            )
        )
    if cfg.speculation.policy == "adaptive" and backend != "torch":
        errors.append(
            (
                "speculation.policy",
                "adaptive is trtspec's torch backend; TensorRT-LLM's K is fixed at build time (use max_concurrency"
                " on the pytorch backend to turn speculation off under load)",
            )
        )
    if cfg.speculation.max_concurrency is not None and backend == "tensorrt":
        errors.append(("speculation.max_concurrency", "TensorRT-LLM honours it on the pytorch backend only"))
    if (
        cfg.speculation.max_concurrency is not None
        and backend == "pytorch"
        and not at_least(b.tensorrt_llm_version, "1.2")
    ):
        errors.append(("speculation.max_concurrency", f"needs TensorRT-LLM 1.2+, got {b.tensorrt_llm_version}"))
    if cfg.speculation.use_draft_logits and not (flavour == "engine" and spec.draft_engine):
        errors.append(
            ("speculation.use_draft_logits", "only applies to flavour engine with a draft engine (draft-target)")
        )
    if backend in ("tensorrt", "pytorch") and cfg.serve.instances > 1:
        errors.append(
            (
                "serve.instances",
                "NVIDIA's models would need GPUs per instance (gpu_device_ids) that a pod of tp x pp GPUs does not"
                " have; set instances: 1 and scale with deploy.replicas",
            )
        )
    if backend == "torch" and b.tp * b.pp != 1:
        errors.append(("build.tp", f"the torch runner uses one device; set tp and pp to 1, got tp={b.tp} pp={b.pp}"))
    if b.max_input_len >= b.max_seq_len:
        errors.append(("build.max_input_len", f"must be below max_seq_len ({b.max_seq_len}), got {b.max_input_len}"))
    k = spec.drafts_per_step(cfg)
    if k and b.max_seq_len < b.max_input_len + k + 1:
        errors.append(
            (
                "build.max_seq_len",
                f"must leave room for the prompt, {k} draft tokens and one output token: >= {b.max_input_len + k + 1},"
                f" got {b.max_seq_len}",
            )
        )
    a = cfg.deploy.autoscaling
    if a.min_replicas > a.max_replicas:
        errors.append(("deploy.autoscaling.min_replicas", f"must not exceed max_replicas ({a.max_replicas})"))
    if backend == "tensorrt" and a.target_load is not None and a.target_load >= 1.0:
        errors.append(
            (
                "deploy.autoscaling.target_load",
                "the executor's active requests over its maximum never read above 1.0 (requests beyond it wait"
                f" in a queue the backend does not export), so the HPA would never scale out: set it below 1, got"
                f" {a.target_load:g}",
            )
        )
    world, per_node = b.tp * b.pp, cfg.deploy.gpus_per_node
    if world > per_node and world % per_node:
        errors.append(
            (
                "deploy.gpus_per_node",
                f"tp x pp = {world} spans nodes, so it must be a multiple of gpus_per_node, got {per_node}",
            )
        )
    ports = [cfg.serve.http_port, cfg.serve.grpc_port, cfg.serve.metrics_port]
    if len(set(ports)) != 3:
        errors.append(("serve.http_port", f"http, grpc and metrics ports must differ, got {ports}"))
    for field, section in (("target", cfg.target), ("draft", cfg.draft)):
        if section is None:
            continue
        try:
            path = cfg.checkpoint_path(section)
        except ValueError as exc:
            errors.append((f"{field}.checkpoint", str(exc)))
            continue
        if path is not None and not path.is_dir():
            errors.append((f"{field}.checkpoint", f"no such checkpoint directory: {path}"))
        elif path is not None and not (path / "config.json").is_file():
            errors.append((f"{field}.checkpoint", f"not a Hugging Face checkpoint (no config.json in {path})"))
    return errors


_TYPE_WORDS = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}

# Union members and constrained types show up in `loc` as type tags; users know only fields.
_TYPE_TAG = re.compile(r"^(int|str|float|bool|none|constrained-\w+|function-\w+\[.*\]|literal\[.*\])$")


def _describe(err: dict[str, Any]) -> tuple[str, str, str]:
    """One pydantic error as (dotted field, what it must be or the whole message, the value given or "")."""
    loc = [str(p) for p in err["loc"] if not _TYPE_TAG.match(str(p))]
    field = ".".join(loc) or "(top level)"
    kind, got, ctx = err["type"], shorten(repr(err.get("input"))), err.get("ctx") or {}
    if kind == "missing":
        return field, "required", ""
    if kind == "extra_forbidden":
        return field, "unknown key", ""
    if kind == "literal_error":
        expected = ctx["expected"]
        return field, f"must be {'one of ' if ' or ' in expected else ''}{expected}", got
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()))  # {"ge": 1}
        return field, f"must be {_BOUNDS[kind]} {f'{bound:g}' if isinstance(bound, float) else bound}", got
    if kind in _TYPE_WORDS:
        return field, f"must be {_TYPE_WORDS[kind]}", got
    if kind == "string_pattern_mismatch":
        return field, f"must match {ctx['pattern']}", got
    if kind == "value_error":
        return field, shorten(ctx["error"], 500), ""
    return field, err["msg"], ""


def _one_line(errors: list[dict[str, Any]]) -> str:
    """Each field once, in order; a field that failed every member of a union gets them as alternatives
    ("must be >= 1 or 'auto', got 0")."""
    wants: dict[str, list[str]] = {}
    given: dict[str, str] = {}
    for field, want, got in map(_describe, errors):
        wants.setdefault(field, []).append(want)
        given.setdefault(field, got)
    parts = []
    for field, options in wants.items():
        if len(options) > 1 and all(w.startswith("must be ") for w in options):
            message = "must be " + " or ".join(w.removeprefix("must be ") for w in options)
        else:
            message = options[0]
        parts.append(f"{field}: {message}" + (f", got {given[field]}" if given[field] else ""))
    return "; ".join(parts)


def load_config(path: str | Path) -> DeploymentConfig:
    """Read and validate a deployment config; raise ConfigError with one line naming file and field."""
    path = Path(path)
    where = shorten(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such config file") from None
    except OSError as exc:  # its str() repeats the (possibly huge) file name
        raise ConfigError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: cannot read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: invalid YAML: {at}{problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a YAML mapping with at least name and target, got {type(data).__name__}")
    return validate_config(data, source=path)


def validate_config(data: dict[str, Any], source: Path | None = None) -> DeploymentConfig:
    where = shorten(source) if source else "<config>"
    if "source" in data:
        raise ConfigError(f"{where}: source: unknown key")
    try:
        cfg = DeploymentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_one_line(exc.errors())}") from None
    cfg.source = source.resolve() if source else None
    problems = _cross_field_rules(cfg)
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(f"{f}: {shorten(m, 500)}" for f, m in problems))
    return cfg
