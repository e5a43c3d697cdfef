"""What a deployment is watched with: Prometheus recording rules and alerts, and a Grafana dashboard.

Every series is selected by the deployment's instance label, which the PodMonitor copies from the
pods (podTargetLabels), so two deployments in one Prometheus never mix. Which figures exist depends
on who serves: trtspec's python models (the torch backend) export the speculative-decoding families
of trtspec.repository.spec_metrics; NVIDIA's models export none (acceptance is per request only), so
their dashboard says so instead of drawing an empty panel.

The HPA reads one load value per pod (`load_signal`), recorded as LOAD and served to it by
prometheus-adapter with the rule `adapter_values` writes: a per-model series would be summed per pod
by the adapter, so five models each at 0.3 would read 1.5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from trtspec.config import DeploymentConfig
from trtspec.deploy.topology import topology
from trtspec.repository import spec_metrics as m

INSTANCE_LABEL = "app_kubernetes_io_instance"  # the pods' app.kubernetes.io/instance, as Prometheus names it
QUEUE_COMPUTE_RATIO = "triton:queue_compute:ratio"
LOAD = "trtspec:pod_load:ratio"  # the HPA's input: one series per pod
POD = f"namespace, pod, {INSTANCE_LABEL}"  # namespace and pod: the target labels the PodMonitor sets
ENTRY_MODEL = "tensorrt_llm"  # the target model in both flavours
BATCH_MODELS = (ENTRY_MODEL, "tensorrt_llm_draft")  # the models that run a batch (a draft only in the engine flavour)
ADAPTER_VALUES = "prometheus-adapter-values.yaml"
ACCEPTANCE = "trtspec:spec_decode_acceptance:ratio_rate5m"
TOKENS_PER_STEP = "trtspec:spec_decode_tokens_per_step:rate5m"
DRAFT_PER_STEP = "trtspec:spec_decode_draft_seconds_per_step:rate5m"
VERIFY_PER_STEP = "trtspec:spec_decode_verify_seconds_per_step:rate5m"
SPECULATED_SHARE = "trtspec:spec_decode_speculated_requests:ratio_rate5m"
ACCEPTANCE_ALERT = "SpeculationAcceptanceLow"
QUEUE_ALERT = "TritonQueueComputeHigh"
# dcgm-exporter's default counters (etc/default-counters.csv): framebuffer memory in MiB
DCGM_FB_USED, DCGM_FB_FREE = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"


def trtspec_models(cfg: DeploymentConfig) -> bool:
    """Whether trtspec's own python models serve (and so export the speculative-decoding families)."""
    return cfg.build.backend == "torch"


def _sel(cfg: DeploymentConfig, **extra: str | tuple[str, ...]) -> str:
    """This deployment's series; a tuple of values matches any of them."""
    labels: dict[str, str | tuple[str, ...]] = {INSTANCE_LABEL: cfg.name, **extra}
    matchers = (f'{k}=~"{"|".join(v)}"' if isinstance(v, tuple) else f'{k}="{v}"' for k, v in labels.items())
    return "{" + ",".join(matchers) + "}"


def _ratio(num: str, den: str, by: str, window: str) -> str:
    return f"sum by ({by}) (rate({num}[{window}])) / sum by ({by}) (rate({den}[{window}]))"


@dataclass(frozen=True)
class LoadSignal:
    """What the HPA scales on: `expr` gives one series per pod (labels namespace, pod and the instance)."""

    kind: Literal["batch", "executor", "queue"]
    expr: str
    default_target: float
    ceiling: float | None  # the most the signal can read (a target at or above it never scales out)
    meaning: str


def load_signal(cfg: DeploymentConfig) -> LoadSignal:
    """The per-pod load of this config's serving stack, from the best figure it exports.

    The models that hold a batch are tensorrt_llm and, for a draft-target repository of the engine
    flavour, tensorrt_llm_draft: the BLS calls them one after the other for each request, so a request
    in flight is in one of them at a time and their counts add up to the requests in flight. The BLS,
    ensemble and pre/post-processing models hold none of the batch and never count.

    - torch backend: trtspec's batch gauges, requests running + waiting for a slot, over the slots
      (max_batch_size per instance); 1.0 is a full batch, above it requests queue for a slot.
    - compiled engines (engine flavour): TensorRT-LLM's executor, active requests over the target's
      maximum (nv_trt_llm_request_metrics). With in-flight batching requests wait inside the executor,
      where Triton's queue time never sees them. The backend's `waiting` is active - scheduled (a
      subset of active, so not added), and requests beyond the maximum wait in the executor's queue,
      which it does not export: the signal tops out at 1.0, so its target must stay below that.
    - the LLM API on TensorRT-LLM: NVIDIA's llmapi model exports no executor metric, so the weak
      fallback: queue time over compute time, each summed over the entry model per pod (NVIDIA's
      tutorial's ratio, per pod not per model). Requests waiting inside the LLM API are invisible to it.
    """
    if cfg.build.backend == "torch":
        slots = cfg.build.max_batch_size * cfg.serve.instances
        running = m.RUNNING + _sel(cfg, model=BATCH_MODELS, state=("running", "waiting"))
        return LoadSignal(
            "batch",
            f"sum by ({POD}) ({running}) / {slots}",
            0.8,
            None,
            f"requests running and waiting for a slot, over the batch's {slots} slots",
        )
    if cfg.serve.flavour == "engine":
        request = "nv_trt_llm_request_metrics"
        active = request + _sel(cfg, model=BATCH_MODELS, request_type="active")
        most = request + _sel(cfg, model=ENTRY_MODEL, request_type="max")
        return LoadSignal(
            "executor",
            f"sum by ({POD}) ({active}) / clamp_min(sum by ({POD}) ({most}), 1)",
            0.8,
            1.0,
            "the executor's active requests over its maximum (at 1.0 further requests wait in its queue)",
        )
    s = _sel(cfg, model=ENTRY_MODEL)
    queued, computing = (
        f"rate({n}{s}[1m])" for n in ("nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us")
    )
    return LoadSignal(
        "queue",
        f"sum by ({POD}) ({queued}) / clamp_min(sum by ({POD}) ({computing}), 1)",
        1.0,
        None,
        "time queued in Triton per unit of compute time (no executor metric exists for the LLM API model)",
    )


def hpa_target(cfg: DeploymentConfig) -> float:
    """The per-pod load the HPA holds replicas at: the config's target_load, else the signal's default."""
    target = cfg.deploy.autoscaling.target_load
    return load_signal(cfg).default_target if target is None else target


def adapter_rule() -> dict[str, Any]:
    """prometheus-adapter's custom-metrics rule serving LOAD to the HPA as a Pods metric of the same
    name; one rule serves every trtspec deployment (the HPA asks for its own pods)."""
    return {
        "seriesQuery": f'{LOAD}{{namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{LOAD}$", "as": LOAD},
        "metricsQuery": "sum by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>})",
    }


def adapter_values(cfg: DeploymentConfig) -> dict[str, Any]:
    """A helm values snippet for prometheus-community/prometheus-adapter (append to rules.custom if you
    have rules of your own: helm replaces lists, it does not merge them)."""
    return {"rules": {"custom": [adapter_rule()]}}


def recording_rules(cfg: DeploymentConfig) -> list[dict[str, str]]:
    """5-minute rates per model; with no drafts in the window the ratios are NaN, so idle never alerts.

    The queue-to-compute ratio is NVIDIA's autoscaling tutorial's, per model, for the alert; the HPA
    reads LOAD, one series per pod (load_signal).
    """
    by, s = f"namespace, {INSTANCE_LABEL}, model, mode", _sel(cfg)  # namespace: set by the PodMonitor
    queue = (
        f"rate(nv_inference_queue_duration_us{s}[1m])/clamp_min(rate(nv_inference_compute_infer_duration_us{s}[1m]),1)"
    )
    rules = [{"record": QUEUE_COMPUTE_RATIO, "expr": queue}, {"record": LOAD, "expr": load_signal(cfg).expr}]
    if not trtspec_models(cfg):
        return rules
    ratios = {
        ACCEPTANCE: (m.ACCEPTED_TOKENS, m.DRAFT_TOKENS),
        TOKENS_PER_STEP: (m.ACCEPTED_TOKENS, m.STEPS),
        DRAFT_PER_STEP: (m.DRAFT_SECONDS + "_sum", m.DRAFT_SECONDS + "_count"),
        VERIFY_PER_STEP: (m.VERIFY_SECONDS + "_sum", m.VERIFY_SECONDS + "_count"),
    }
    for record, (num, den) in ratios.items():
        expr = _ratio(num + s, den + s, by, "5m")
        rules.append({"record": record, "expr": "1 + " + expr if record == TOKENS_PER_STEP else expr})
    speculated = _ratio(m.REQUESTS + _sel(cfg, speculative="true"), m.REQUESTS + s, by, "5m")
    rules.append({"record": SPECULATED_SHARE, "expr": speculated})
    return rules


def _alert(cfg: DeploymentConfig, name: str, expr: str, summary: str, description: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": cfg.deploy.monitoring.alert_for,
        "labels": {"severity": "warning"},
        "annotations": {"summary": summary, "description": description},
    }


def alert_rules(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    mon, s = cfg.deploy.monitoring, _sel(cfg)
    queue = _alert(
        cfg,
        QUEUE_ALERT,
        f"avg by (namespace, {INSTANCE_LABEL}, model) ({QUEUE_COMPUTE_RATIO}{s}) > {mon.max_queue_compute_ratio}",
        "{{ $labels.model }} on " + cfg.name + " queues {{ $value | humanize }}x its compute time",
        "Requests wait longer than they run: add replicas (check the HPA is not at maxReplicas), or lower"
        " the load; at high concurrency speculation itself stops paying off.",
    )
    if not trtspec_models(cfg):
        return [queue]
    acceptance = _alert(
        cfg,
        ACCEPTANCE_ALERT,
        f"{ACCEPTANCE}{s} < {mon.min_acceptance}",
        "Draft acceptance on {{ $labels.model }} (" + cfg.name + ") is {{ $value | humanizePercentage }},"
        f" below {mon.min_acceptance:.0%}",
        "Below about 0.5 speculation costs more than it saves. Check that the draft suits this traffic"
        " (trtspec check), lower num_draft_tokens, or redeploy with speculation.mode: none.",
    )
    return [acceptance, queue]


def rule_groups(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    """The same groups for the PrometheusRule and for a plain rules file (promtool, compose)."""
    return [
        {"name": f"{cfg.name}.recording", "rules": recording_rules(cfg)},
        {"name": f"{cfg.name}.alerts", "rules": alert_rules(cfg)},
    ]


def _panel(title: str, targets: list[tuple[str, str]], unit: str, x: int, y: int, **extra: Any) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit, **extra}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def _note(title: str, text: str, x: int, y: int) -> dict[str, Any]:
    return {
        "type": "text",
        "title": title,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "options": {"mode": "markdown", "content": text},
    }


def _quantiles(bucket: str, scale: str = "") -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({q}, sum by (le, model) (rate({bucket}[$__rate_interval]))){scale}",
            f"p{q[2:]} {{{{model}}}}",
        )
        for q in ("0.50", "0.95")
    ]


def dashboard(cfg: DeploymentConfig) -> dict[str, Any]:
    """A Grafana dashboard (schema 39) for this deployment; the datasource is picked when it is imported."""
    s, w = _sel(cfg), "$__rate_interval"
    ours = trtspec_models(cfg)
    panels: list[dict[str, Any]] = []
    if ours:
        threshold = {
            "thresholds": {
                "mode": "absolute",
                "steps": [
                    {"color": "red", "value": None},
                    {"color": "green", "value": cfg.deploy.monitoring.min_acceptance},
                ],
            },
            "custom": {"thresholdsStyle": {"mode": "line"}},
            "min": 0,
            "max": 1,
        }
        accepted, drafted, steps = (f"{n}{s}" for n in (m.ACCEPTED_TOKENS, m.DRAFT_TOKENS, m.STEPS))
        panels += [
            _panel(
                "Draft acceptance rate",
                [(_ratio(accepted, drafted, "model", w), "{{model}}")],
                "percentunit",
                0,
                0,
                **threshold,
            ),
            _panel(
                "Tokens per target step", [("1 + " + _ratio(accepted, steps, "model", w), "{{model}}")], "none", 12, 0
            ),
            _panel(
                "Draft and verify time per step",
                [
                    (_ratio(f"{m.DRAFT_SECONDS}_sum{s}", f"{m.DRAFT_SECONDS}_count{s}", "model", w), "draft {{model}}"),
                    (
                        _ratio(f"{m.VERIFY_SECONDS}_sum{s}", f"{m.VERIFY_SECONDS}_count{s}", "model", w),
                        "verify {{model}}",
                    ),
                ],
                "s",
                0,
                8,
            ),
            _panel(
                "Requests speculated vs not",
                [(f"sum by (speculative) (rate({m.REQUESTS}{s}[{w}]))", "speculative={{speculative}}")],
                "reqps",
                12,
                8,
            ),
            _panel("Time to first token (in the model)", _quantiles(f"{m.TTFT_SECONDS}_bucket{s}"), "s", 0, 16),
            _panel("Inter-token latency", _quantiles(f"{m.ITL_SECONDS}_bucket{s}"), "s", 12, 16),
        ]
        kv = [
            (
                f"sum by (model) ({m.KV_POSITIONS}{_sel(cfg, state='used')})"
                f" / sum by (model) ({m.KV_POSITIONS}{_sel(cfg, state='capacity')})",
                "{{model}}",
            )
        ]
    else:
        panels += [
            _note(
                "Speculative decoding",
                "NVIDIA's TensorRT-LLM models export no speculative-decoding metric family: acceptance comes back"
                " per request only (`return_perf_metrics`). `trtspec bench` aggregates it; see docs/monitoring.md.",
                0,
                0,
            ),
            _panel(
                "Time to first token",
                _quantiles(f"nv_inference_first_response_histogram_ms_bucket{s}", " / 1000"),
                "s",
                12,
                0,
            ),
        ]
        kv = [
            (
                f"sum by (model) (nv_trt_llm_kv_cache_block_metrics{_sel(cfg, kv_cache_block_type='used')})"
                f" / sum by (model) (nv_trt_llm_kv_cache_block_metrics{_sel(cfg, kv_cache_block_type='max')})",
                "{{model}}",
            )
        ]
        if cfg.serve.flavour == "llmapi":  # NVIDIA's llmapi model: no nv_trt_llm_* family at all
            kv = []
    y = 24 if ours else 8
    panels += [
        _panel(
            "Queue time vs compute time",
            [
                (f"sum by (model) (rate(nv_inference_queue_duration_us{s}[{w}])) / 1e6", "queued s/s {{model}}"),
                (
                    f"sum by (model) (rate(nv_inference_compute_infer_duration_us{s}[{w}])) / 1e6",
                    "computing s/s {{model}}",
                ),
            ],
            "none",
            0,
            y,
        ),
        _panel("KV-cache use", kv, "percentunit", 12, y, min=0, max=1)
        if kv
        else _note(
            "KV-cache use",
            "NVIDIA's LLM API model exports no KV-cache metric (no `nv_trt_llm_*` family at all); the LLM API"
            " keeps its KV statistics inside the process. See docs/monitoring.md.",
            12,
            y,
        ),
    ]
    gpu = not topology(cfg).cpu_only
    if gpu:
        used, free = f"{DCGM_FB_USED}{{}}", f"{DCGM_FB_FREE}{{}}"
        panels.append(
            _panel(
                "GPU memory used (DCGM)",
                [(f"{used} / ({used} + {free})", "GPU {{gpu}} {{Hostname}}")],
                "percentunit",
                0,
                y + 8,
            )
        )
    signal, target = load_signal(cfg), hpa_target(cfg)
    line = {
        "thresholds": {
            "mode": "absolute",
            "steps": [{"color": "green", "value": None}, {"color": "red", "value": target}],
        },
        "custom": {"thresholdsStyle": {"mode": "line"}},
        "min": 0,
    }
    load = _panel("Load per pod (the HPA's input)", [(signal.expr, "{{pod}}")], "none", 12 if gpu else 0, y + 8, **line)
    load["description"] = f"{signal.meaning}; the line is the HPA's target ({target:g})."
    panels.append(load)
    for number, panel in enumerate(panels, 1):
        panel["id"] = number
    return {
        "title": f"trtspec: {cfg.name}",
        "uid": f"trtspec-{cfg.name}"[:40],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "tags": ["trtspec", "triton", "speculative-decoding"],
        "templating": {
            "list": [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}]
        },
        "panels": panels,
    }


def prometheus_config(cfg: DeploymentConfig, target: str, rules: str = "rules.yml") -> dict[str, Any]:
    """A Prometheus scrape config for a server outside Kubernetes, labelled as the PodMonitor would label it."""
    return {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "rule_files": [rules],
        "scrape_configs": [
            {
                "job_name": cfg.name,
                "static_configs": [{"targets": [target], "labels": {INSTANCE_LABEL: cfg.name}}],
            }
        ],
    }
