"""The rules and dashboard `trtspec deploy` writes: promtool checks and unit-tests them, alerts included.

The unit tests feed promtool series that grow as a live server's counters do; the e2e module
(test_monitoring_e2e.py) derives the same from a real tritonserver with a deliberately poor draft.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS, require_tool

from trtspec.config import load_config
from trtspec.deploy import k8s, monitoring
from trtspec.repository import spec_metrics as m

ALL_CONFIGS = sorted(CONFIGS.glob("*.yaml"))


def promtool() -> str:
    return require_tool("promtool", "apt-get install prometheus; .ci/run does")


def write_rules(cfg, path: Path) -> Path:
    path.write_text(yaml.safe_dump({"groups": monitoring.rule_groups(cfg)}, sort_keys=False))
    return path


def humanize_percentage(value: float) -> str:
    """Prometheus's template function: %.4g of the percentage."""
    return f"{value * 100:.4g}%"


def promtool_test(tmp_path: Path, cfg, tests: list[dict]) -> subprocess.CompletedProcess:
    write_rules(cfg, tmp_path / "rules.yml")
    doc = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run([promtool(), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)


def spec_series(cfg, drafted_per_min: int, accepted_per_min: int, minutes: int = 30) -> list[dict]:
    """Counters as one model's would grow under steady load, labelled as the PodMonitor labels them."""
    labels = f'{monitoring.INSTANCE_LABEL}="{cfg.name}",model="tensorrt_llm",mode="draft-target",version="1"'
    steps = max(drafted_per_min // 3, 1)
    return [
        {"series": f"{m.DRAFT_TOKENS}{{{labels}}}", "values": f"0+{drafted_per_min}x{minutes}"},
        {"series": f"{m.ACCEPTED_TOKENS}{{{labels}}}", "values": f"0+{accepted_per_min}x{minutes}"},
        {"series": f"{m.STEPS}{{{labels}}}", "values": f"0+{steps}x{minutes}"},
    ]


def acceptance_alert(cfg, rate: float) -> dict:
    mon = cfg.deploy.monitoring
    return {
        "exp_labels": {
            "severity": "warning",
            monitoring.INSTANCE_LABEL: cfg.name,
            "model": "tensorrt_llm",
            "mode": "draft-target",
        },
        "exp_annotations": {
            "summary": f"Draft acceptance on tensorrt_llm ({cfg.name}) is {humanize_percentage(rate)},"
            f" below {mon.min_acceptance:.0%}",
            "description": monitoring.alert_rules(cfg)[0]["annotations"]["description"],
        },
    }


def acceptance_alert_tests(cfg, drafted: int, accepted: int) -> list[dict]:
    """Below the threshold: pending (silent) until alert_for has passed, then firing; above it: never."""
    rate = accepted / drafted
    low = rate < cfg.deploy.monitoring.min_acceptance
    return [
        {
            "interval": "1m",
            "input_series": spec_series(cfg, drafted, accepted),
            "alert_rule_test": [
                {"eval_time": "9m", "alertname": monitoring.ACCEPTANCE_ALERT, "exp_alerts": []},
                {
                    "eval_time": "16m",
                    "alertname": monitoring.ACCEPTANCE_ALERT,
                    "exp_alerts": [acceptance_alert(cfg, rate)] if low else [],
                },
            ],
        }
    ]


@pytest.fixture(scope="module")
def tiny():
    return load_config(CONFIGS / "tiny-draft-target.yaml")


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda p: p.stem)
def test_promtool_accepts_every_configs_rules(path, tmp_path):
    cfg = load_config(path)
    rules = write_rules(cfg, tmp_path / "rules.yml")
    res = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert k8s.prometheus_rule(cfg)["spec"]["groups"] == monitoring.rule_groups(cfg)
    alerts = {r["alert"] for g in monitoring.rule_groups(cfg) for r in g["rules"] if "alert" in r}
    # NVIDIA's models export no acceptance family: an alert on it could never fire, so there is none
    want = {monitoring.QUEUE_ALERT} | ({monitoring.ACCEPTANCE_ALERT} if monitoring.trtspec_models(cfg) else set())
    assert alerts == want


def test_promtool_rejects_a_broken_rule(tiny, tmp_path):
    groups = monitoring.rule_groups(tiny)
    groups[0]["rules"][1]["expr"] = groups[0]["rules"][1]["expr"].replace(") /", ") / (", 1)
    (tmp_path / "bad.yml").write_text(yaml.safe_dump({"groups": groups}))
    res = subprocess.run([promtool(), "check", "rules", str(tmp_path / "bad.yml")], capture_output=True, text=True)
    assert res.returncode != 0


def test_recording_rules_compute_acceptance_tokens_per_step_and_queue_ratio(tiny, tmp_path):
    labels = f'{monitoring.INSTANCE_LABEL}="{tiny.name}",model="tensorrt_llm",mode="draft-target"'
    other = 'app_kubernetes_io_instance="someone-else",model="tensorrt_llm",mode="draft-target",version="1"'
    queue = f'{monitoring.INSTANCE_LABEL}="{tiny.name}",model="tensorrt_llm",version="1"'
    series = [
        *spec_series(tiny, 300, 225),
        # another deployment's series in the same Prometheus must not leak into this one's figures
        {"series": f"{m.DRAFT_TOKENS}{{{other}}}", "values": "0+1000x30"},
        {"series": f"{m.ACCEPTED_TOKENS}{{{other}}}", "values": "0+0x30"},
        {"series": f"nv_inference_queue_duration_us{{{queue}}}", "values": "0+600000x30"},
        {"series": f"nv_inference_compute_infer_duration_us{{{queue}}}", "values": "0+200000x30"},
    ]
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                # rounded to 1e-6: rate() extrapolates, so the ratios are exact only to the last bits
                {
                    "expr": f"round({monitoring.ACCEPTANCE} * 1e6)",
                    "eval_time": "10m",
                    "exp_samples": [{"labels": f"{{{labels}}}", "value": 0.75e6}],
                },
                {
                    "expr": f"round({monitoring.TOKENS_PER_STEP} * 1e6)",
                    "eval_time": "10m",
                    "exp_samples": [{"labels": f"{{{labels}}}", "value": (1 + 225 / 100) * 1e6}],
                },
                {
                    "expr": f"round({monitoring.QUEUE_COMPUTE_RATIO} * 1e6)",
                    "eval_time": "10m",
                    "exp_samples": [{"labels": f"{{{queue}}}", "value": 3e6}],
                },
            ],
            "alert_rule_test": [
                {
                    "eval_time": "16m",
                    "alertname": monitoring.QUEUE_ALERT,
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "severity": "warning",
                                monitoring.INSTANCE_LABEL: tiny.name,
                                "model": "tensorrt_llm",
                            },
                            "exp_annotations": {
                                "summary": f"tensorrt_llm on {tiny.name} queues 3x its compute time",
                                "description": monitoring.alert_rules(tiny)[1]["annotations"]["description"],
                            },
                        }
                    ],
                }
            ],
        }
    ]
    res = promtool_test(tmp_path, tiny, tests)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(("drafted", "accepted"), [(300, 60), (300, 210)], ids=["poor-draft", "good-draft"])
def test_acceptance_alert_fires_only_after_ten_minutes_below_the_threshold(tiny, tmp_path, drafted, accepted):
    res = promtool_test(tmp_path, tiny, acceptance_alert_tests(tiny, drafted, accepted))
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_alert_test_itself_fails_when_the_expectation_is_wrong(tiny, tmp_path):
    """A good draft expected to alert: promtool must say the test failed (the tests above can fail)."""
    tests = acceptance_alert_tests(tiny, 300, 210)
    tests[0]["alert_rule_test"][1]["exp_alerts"] = [acceptance_alert(tiny, 0.7)]
    res = promtool_test(tmp_path, tiny, tests)
    assert res.returncode != 0 and "FAILED" in res.stdout + res.stderr


def test_the_threshold_and_duration_come_from_the_config(tmp_path):
    data = yaml.safe_load((CONFIGS / "tiny-draft-target.yaml").read_text())
    data["deploy"]["monitoring"] = {"min_acceptance": 0.8, "alert_for": "30m"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(tmp_path / "c.yaml")
    alert = monitoring.alert_rules(cfg)[0]
    assert alert["for"] == "30m" and alert["expr"].endswith("< 0.8")
    tests = acceptance_alert_tests(cfg, 300, 210)  # 0.7 is below 0.8 now
    tests[0]["alert_rule_test"][1]["eval_time"] = "36m"
    tests[0]["input_series"] = spec_series(cfg, 300, 210, minutes=60)
    res = promtool_test(tmp_path, cfg, tests)
    assert res.returncode == 0, res.stdout + res.stderr


def dashboard_exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """Every selector in trtspec's dashboards is written name{...}, so the names are what precedes a brace."""
    return set(re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{", expr))


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda p: p.stem)
def test_dashboard_has_the_panels_the_issue_lists(path):
    cfg = load_config(path)
    board = monitoring.dashboard(cfg)
    titles = {p["title"] for p in board["panels"]}
    assert {"Queue time vs compute time", "KV-cache use"} <= titles
    assert ("GPU memory used (DCGM)" in titles) != (cfg.build.device == "cpu")
    if monitoring.trtspec_models(cfg):
        assert {"Draft acceptance rate", "Tokens per target step", "Inter-token latency"} <= titles
    else:
        assert "Speculative decoding" in titles  # says why there is no acceptance panel
    for expr in dashboard_exprs(board):
        assert metric_names(expr), expr
        for name, matchers in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", expr):
            if not name.startswith("DCGM_"):  # the exporter's series carry no deployment label
                assert f'{monitoring.INSTANCE_LABEL}="{cfg.name}"' in matchers, expr
    configmap = k8s.dashboard_config_map(cfg)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert yaml.safe_load(configmap["data"][k8s.dashboard_file(cfg)]) == board


# What NVIDIA documents for its own models (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/metrics.md
# and the tensorrtllm_backend README's "Triton Metrics"):
# Triton's core counters, the TTFT histogram behind --metrics-config histogram_latencies=true, the
# TensorRT-LLM backend's families; and dcgm-exporter's default counters for GPU memory.
NVIDIA_DOCUMENTED = {
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
    "nv_inference_exec_count", "nv_inference_pending_request_count", "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us",
    "nv_inference_first_response_histogram_ms_bucket", "nv_trt_llm_kv_cache_block_metrics",
    "nv_trt_llm_request_metrics", "nv_trt_llm_runtime_memory_metrics",
    monitoring.DCGM_FB_USED, monitoring.DCGM_FB_FREE,
}  # fmt: skip


@pytest.mark.parametrize(
    "path", [p for p in ALL_CONFIGS if not monitoring.trtspec_models(load_config(p))], ids=lambda p: p.stem
)
def test_nvidia_dashboards_name_only_families_nvidia_documents(path):
    """These cannot be served here (no TensorRT-LLM): checked against the documented names instead."""
    board = monitoring.dashboard(load_config(path))
    for expr in dashboard_exprs(board):
        assert metric_names(expr) <= NVIDIA_DOCUMENTED, expr
    assert not any(m.PREFIX in e or "trtspec_" in e for e in dashboard_exprs(board))
