"""What a deployment is watched with: Prometheus recording rules and alerts, and a Grafana dashboard.

Every series is selected by the deployment's instance label, which the PodMonitor copies from the
pods (podTargetLabels), so two deployments in one Prometheus never mix. Which figures exist depends
on who serves: trtspec's python models (the torch backend) export the speculative-decoding families
of trtspec.repository.spec_metrics; NVIDIA's models export none (acceptance is per request only), so
their dashboard says so instead of drawing an empty panel.
"""

from __future__ import annotations

from typing import Any

from trtspec.config import DeploymentConfig
from trtspec.deploy.topology import topology
from trtspec.repository import spec_metrics as m

INSTANCE_LABEL = "app_kubernetes_io_instance"  # the pods' app.kubernetes.io/instance, as Prometheus names it
QUEUE_COMPUTE_RATIO = "triton:queue_compute:ratio"
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


def _sel(cfg: DeploymentConfig, **extra: str) -> str:
    labels = {INSTANCE_LABEL: cfg.name, **extra}
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _ratio(num: str, den: str, by: str, window: str) -> str:
    return f"sum by ({by}) (rate({num}[{window}])) / sum by ({by}) (rate({den}[{window}]))"


def recording_rules(cfg: DeploymentConfig) -> list[dict[str, str]]:
    """5-minute rates per model; with no drafts in the window the ratios are NaN, so idle never alerts.

    The queue-to-compute ratio keeps every label of its series (per pod), as the HPA reads it through
    prometheus-adapter; its expression is NVIDIA's autoscaling tutorial's, scoped to this deployment.
    """
    by, s = f"namespace, {INSTANCE_LABEL}, model, mode", _sel(cfg)  # namespace: set by the PodMonitor
    queue = (
        f"rate(nv_inference_queue_duration_us{s}[1m])/clamp_min(rate(nv_inference_compute_infer_duration_us{s}[1m]),1)"
    )
    rules = [{"record": QUEUE_COMPUTE_RATIO, "expr": queue}]
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
        _panel("KV-cache use", kv, "percentunit", 12, y, min=0, max=1),
    ]
    if not topology(cfg).cpu_only:
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
