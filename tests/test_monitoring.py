"""The rules and dashboard `trtspec deploy` writes: promtool checks and unit-tests them, alerts included.

The unit tests feed promtool series that grow as a live server's counters do; the e2e module
(test_monitoring_e2e.py) derives the same from a real tritonserver with a deliberately poor draft.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from conftest import CONFIGS, require_tool

from trtspec.config import load_config
from trtspec.deploy import k8s, monitoring, sizing
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


# ---- the autoscaling signal (issue #21): one value per pod, served to the HPA by prometheus-adapter

SIGNALS = {  # one config per kind of signal
    "batch": "tiny-draft-target.yaml",  # torch backend: trtspec's batch gauges
    "executor": "llama-3.3-70b-1b-draft-h200.yaml",  # compiled engines: TensorRT-LLM's executor
    "queue": "deepseek-r1-mtp-8gpu.yaml",  # NVIDIA's LLM API model: the queue-to-compute fallback
}
MODELS = ["tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_bls", "preprocessing", "postprocessing"]


def pod_labels(cfg, pod: str, model: str | None = None, **extra: str) -> str:
    """A series as the PodMonitor labels it (namespace and pod are Prometheus Operator's target labels)."""
    labels = {"namespace": cfg.deploy.namespace, "pod": pod, monitoring.INSTANCE_LABEL: cfg.name}
    labels |= {"model": model, "version": "1"} if model else {}
    return "{" + ",".join(f'{k}="{v}"' for k, v in {**labels, **extra}.items()) + "}"


def pod_series(cfg, pod: str, target: int, drafting: int = 0) -> list[dict]:
    """One pod serving five models, each queueing 0.3 s per second of compute: what a per-model signal
    sums to 1.5. `target` requests are in tensorrt_llm and `drafting` in tensorrt_llm_draft (the BLS
    calls one, then the other), each of 4 slots (the executor's maximum). The other three models carry
    full batch figures they never export in reality, to show that no selector picks them up."""
    series = []
    for model in MODELS:
        labels = pod_labels(cfg, pod, model)
        series.append({"series": f"nv_inference_queue_duration_us{labels}", "values": "0+18000000x30"})
        series.append({"series": f"nv_inference_compute_infer_duration_us{labels}", "values": "0+60000000x30"})
        n = {"tensorrt_llm": target, "tensorrt_llm_draft": drafting}.get(model, 4)
        running, waiting = min(n, 4), max(n - 4, 0)  # trtspec's engine: waiting = queued for a slot
        for state, value in (("running", running), ("waiting", waiting)):
            labelled = pod_labels(cfg, pod, model, state=state)
            series.append({"series": f"{m.RUNNING}{labelled}", "values": f"{value}+0x30"})
        # TensorRT-LLM's backend: at most `max` active (more wait in the executor's queue, not exported);
        # its `waiting` is active - scheduled, a part of active
        scheduled = max(running - 1, 0)
        kinds = {"active": running, "scheduled": scheduled, "waiting": running - scheduled, "max": 4}
        for kind, value in kinds.items():
            labelled = pod_labels(cfg, pod, model, request_type=kind)
            series.append({"series": f"nv_trt_llm_request_metrics{labelled}", "values": f"{value}+0x30"})
    return series


def adapter_query(cfg, pods: list[str]) -> str:
    """The query prometheus-adapter sends for the HPA's pods: its rule's template, filled as the adapter fills it."""
    rule = monitoring.adapter_rule()
    matchers = f'namespace="{cfg.deploy.namespace}",pod=~"{"|".join(pods)}"'
    query = rule["metricsQuery"].replace("<<.Series>>", monitoring.LOAD).replace("<<.LabelMatchers>>", matchers)
    return query.replace("<<.GroupBy>>", "pod")


def expected_load(kind: str, target: int, drafting: int = 0) -> float:
    if kind == "queue":  # the entry model's own ratio, not the sum over five
        return 0.3
    if kind == "executor":  # active requests over the maximum: tops out at 1.0
        return (min(target, 4) + min(drafting, 4)) / 4
    return (target + drafting) / 4  # running and waiting over the slots


@pytest.mark.parametrize("kind", sorted(SIGNALS))
def test_the_hpa_input_is_one_load_value_per_pod_not_a_sum_over_models(kind, tmp_path):
    cfg = load_config(CONFIGS / SIGNALS[kind])
    assert monitoring.load_signal(cfg).kind == kind
    pod = f"{cfg.name}-0"
    only = pod_labels(cfg, pod)
    tests = [
        {
            "interval": "1m",
            "input_series": pod_series(cfg, pod, target=2, drafting=1),
            "promql_expr_test": [
                # five models per pod: the per-model ratio, summed per pod, reads 1.5 ...
                {
                    "expr": f"round(sum by (pod) ({monitoring.QUEUE_COMPUTE_RATIO}) * 1e6)",
                    "eval_time": "10m",
                    "exp_samples": [{"labels": f'{{pod="{pod}"}}', "value": 1.5e6}],
                },
                # ... the recorded load is one series for the pod: the requests its batch holds
                {
                    "expr": f"round({monitoring.LOAD} * 1e6)",
                    "eval_time": "10m",
                    "exp_samples": [{"labels": only, "value": expected_load(kind, 2, 1) * 1e6}],
                },
                # and that is what prometheus-adapter hands the HPA
                {
                    "expr": f"round({adapter_query(cfg, [pod])} * 1e6)",
                    "eval_time": "10m",
                    "exp_samples": [{"labels": f'{{pod="{pod}"}}', "value": expected_load(kind, 2, 1) * 1e6}],
                },
            ],
        }
    ]
    res = promtool_test(tmp_path, cfg, tests)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("kind", sorted(SIGNALS))
def test_two_pods_give_two_series_each_its_own_load(kind, tmp_path):
    cfg = load_config(CONFIGS / SIGNALS[kind])
    pods = {f"{cfg.name}-a": (1, 1), f"{cfg.name}-b": (6, 0)}  # 6 requests for 4 slots: 2 of them wait
    series = [s for pod, busy in pods.items() for s in pod_series(cfg, pod, *busy)]
    load = [{"labels": pod_labels(cfg, pod), "value": expected_load(kind, *b) * 1e6} for pod, b in pods.items()]
    adapter = [{"labels": f'{{pod="{pod}"}}', "value": expected_load(kind, *b) * 1e6} for pod, b in pods.items()]
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": f"round({monitoring.LOAD} * 1e6)", "eval_time": "10m", "exp_samples": load},
                {"expr": f"round({adapter_query(cfg, list(pods))} * 1e6)", "eval_time": "10m", "exp_samples": adapter},
            ],
        }
    ]
    res = promtool_test(tmp_path, cfg, tests)
    assert res.returncode == 0, res.stdout + res.stderr


def test_another_deployments_pods_do_not_count(tmp_path):
    cfg = load_config(CONFIGS / SIGNALS["batch"])
    other = cfg.model_copy(update={"name": "someone-else"})
    pod = f"{cfg.name}-0"
    tests = [
        {
            "interval": "1m",
            "input_series": pod_series(cfg, pod, 1) + pod_series(other, "someone-else-0", 4),
            "promql_expr_test": [
                {
                    "expr": f"round({monitoring.LOAD} * 1e6)",
                    "eval_time": "10m",
                    "exp_samples": [{"labels": pod_labels(cfg, pod), "value": 0.25e6}],
                }
            ],
        }
    ]
    res = promtool_test(tmp_path, cfg, tests)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda p: p.stem)
def test_every_configs_hpa_reads_the_recorded_per_pod_load_through_the_shipped_adapter_rule(path, tmp_path):
    from trtspec.config import validate_config
    from trtspec.deploy.write import rendered_files

    cfg = load_config(path)
    if not cfg.deploy.autoscaling.enabled:  # no HPA, so no adapter rule; the signal is checked with one on
        written = rendered_files(cfg, "k8s", tmp_path / "off")
        assert "hpa.yaml" not in written and monitoring.ADAPTER_VALUES not in written
        data = yaml.safe_load(path.read_text())
        data["deploy"]["autoscaling"]["enabled"] = True
        cfg = validate_config(data, source=path)
    files = k8s.render(cfg)
    (hpa,) = files["hpa.yaml"]
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    recorded = {
        r["record"]: r["expr"] for g in monitoring.rule_groups(cfg) for r in g.get("rules", []) if "record" in r
    }
    assert name == monitoring.LOAD and recorded[name] == monitoring.load_signal(cfg).expr
    assert recorded[name].startswith(f"sum by ({monitoring.POD}) ")  # one series per pod
    # paced by the pods' start: sizing's load budget (the startup probe's), within the API's bounds
    start_s = sizing.budgets(cfg).load_s
    assert hpa["spec"]["behavior"] == k8s.autoscaler(cfg, k8s.topology(cfg), start_s)["spec"]["behavior"]
    assert hpa["spec"]["behavior"]["scaleUp"]["policies"][0]["periodSeconds"] == min(start_s, 1800)
    assert metric["pods"]["target"] == {
        "type": "AverageValue",
        "averageValue": f"{round(monitoring.hpa_target(cfg) * 1000)}m",
    }
    # the rule `trtspec deploy` writes beside the manifests serves that series under that name
    written = rendered_files(cfg, "k8s", tmp_path)
    values = yaml.safe_load(written[monitoring.ADAPTER_VALUES])
    (rule,) = values["rules"]["custom"]
    assert re.fullmatch(rule["name"]["matches"], name) and rule["name"]["as"] == name
    assert rule["seriesQuery"].startswith(name + "{")
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "by (<<.GroupBy>>)" in rule["metricsQuery"]
    # helm values, not a Kubernetes object: kustomize must not apply it
    (kustomization,) = files["kustomization.yaml"]
    assert monitoring.ADAPTER_VALUES not in kustomization["resources"] and monitoring.ADAPTER_VALUES not in files
    assert "helm upgrade --install prometheus-adapter" in written[monitoring.ADAPTER_VALUES]


def test_the_pod_monitor_keeps_the_labels_the_load_is_grouped_by():
    """Prometheus Operator gives every PodMonitor target `namespace` and `pod`; the instance label comes
    from podTargetLabels. The recorded load is grouped by exactly these."""
    cfg = load_config(CONFIGS / SIGNALS["batch"])
    monitor = k8s.pod_monitor(cfg, k8s.topology(cfg))
    (kept,) = monitor["spec"]["podTargetLabels"]
    assert re.sub(r"[^A-Za-z0-9_]", "_", kept) == monitoring.INSTANCE_LABEL  # as Prometheus sanitizes it
    assert [x.strip() for x in monitoring.POD.split(",")] == ["namespace", "pod", monitoring.INSTANCE_LABEL]


@pytest.mark.parametrize(("start_s", "up", "down"), [(1800, 1800, 1800), (120, 120, 300), (5400, 1800, 3600)])
def test_hpa_behavior_is_paced_by_the_pods_start_time(start_s, up, down):
    cfg = load_config(CONFIGS / SIGNALS["executor"])
    behavior = k8s.autoscaler(cfg, k8s.topology(cfg), start_s=start_s)["spec"]["behavior"]
    # one pod per start time up (the API caps a period at 30 minutes), one pod at a time down, after a
    # window of at least the start time and 5 minutes (the API caps a window at an hour)
    assert behavior["scaleUp"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": up}]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == down
    assert [(p["type"], p["value"]) for p in behavior["scaleDown"]["policies"]] == [("Pods", 1)]
    assert k8s.autoscaler(cfg, k8s.topology(cfg)) == k8s.autoscaler(cfg, k8s.topology(cfg), k8s.DEFAULT_START_S)


def test_target_load_comes_from_the_config_and_the_old_field_says_what_replaced_it(tmp_path):
    from trtspec.config import validate_config
    from trtspec.errors import ConfigError

    data = yaml.safe_load((CONFIGS / SIGNALS["executor"]).read_text())
    data["deploy"]["autoscaling"] = {"target_load": 0.65}
    cfg = validate_config(data)
    assert k8s.autoscaler(cfg, k8s.topology(cfg))["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "650m"
    default = load_config(CONFIGS / SIGNALS["queue"])
    assert (
        monitoring.hpa_target(default) == 1.0 and monitoring.hpa_target(load_config(CONFIGS / "tiny-mtp.yaml")) == 0.8
    )
    data["deploy"]["autoscaling"] = {"queue_compute_ratio": 1.5}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "old.yaml")
    message = str(err.value)
    assert "deploy.autoscaling.queue_compute_ratio: replaced by target_load" in message and "\n" not in message
    # the executor's signal tops out at 1.0: a target there would never scale out
    assert monitoring.load_signal(cfg).ceiling == 1.0
    data["deploy"]["autoscaling"] = {"target_load": 1.0}
    with pytest.raises(ConfigError, match=r"deploy\.autoscaling\.target_load: the executor's .* set it below 1"):
        validate_config(data)
    tiny = yaml.safe_load((CONFIGS / SIGNALS["batch"]).read_text())
    tiny["deploy"]["autoscaling"] = {"target_load": 1.2}  # the batch's reads above 1.0 when requests queue
    assert monitoring.load_signal(validate_config(tiny)).ceiling is None
    data["deploy"]["autoscaling"] = {"target_load": 0}
    with pytest.raises(ConfigError, match=r"deploy\.autoscaling\.target_load: must be >= 0\.01, got 0"):
        validate_config(data)
    assert "queue_compute_ratio" not in cfg.model_dump(mode="json")["deploy"]["autoscaling"]  # not in digests


def test_no_adapter_rule_without_an_hpa(tmp_path):
    from trtspec.config import validate_config
    from trtspec.deploy.write import rendered_files

    data = yaml.safe_load((CONFIGS / SIGNALS["batch"]).read_text())
    data["deploy"]["autoscaling"] = {"enabled": False}
    written = rendered_files(validate_config(data), "k8s", tmp_path)
    assert "hpa.yaml" not in written and monitoring.ADAPTER_VALUES not in written


def test_the_kv_panel_shows_what_each_stack_exports():
    def kv_panel(name: str) -> dict:
        return next(
            p for p in monitoring.dashboard(load_config(CONFIGS / name))["panels"] if p["title"] == "KV-cache use"
        )

    assert m.KV_POSITIONS in kv_panel("tiny-mtp.yaml")["targets"][0]["expr"]
    assert "nv_trt_llm_kv_cache_block_metrics" in kv_panel("llama-3.3-70b-1b-draft-h200.yaml")["targets"][0]["expr"]
    note = kv_panel("deepseek-r1-mtp-8gpu.yaml")  # NVIDIA's LLM API model: no family to draw
    assert note["type"] == "text" and "exports no KV-cache metric" in note["options"]["content"]
    for name in SIGNALS.values():
        cfg = load_config(CONFIGS / name)
        panel = next(p for p in monitoring.dashboard(cfg)["panels"] if p["title"].startswith("Load per pod"))
        assert panel["targets"][0]["expr"] == monitoring.load_signal(cfg).expr
        assert panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == monitoring.hpa_target(cfg)


class _FakeFamily:
    """triton_python_backend_utils.MetricFamily as the server holds it: one value per label set, shared
    by every instance (stub process) of a model."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    values: ClassVar[dict] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: dict, buckets=None):  # pb_utils's name
        family, key = self, (self.name, tuple(sorted(labels.items())))
        family.values.setdefault(key, 0)  # a metric is exported, at 0, from its creation

        class _Metric:
            def increment(self, by: float) -> None:
                family.values[key] = family.values.get(key, 0) + by

            def set(self, value: float) -> None:
                family.values[key] = value

            def observe(self, value: float) -> None:
                pass

        return _Metric()


def test_batch_gauges_sum_the_instances_and_show_an_idle_batch_before_the_first_step(monkeypatch):
    """The torch signal divides by max_batch_size x instances: the gauges must be the instances' sum,
    and exist (at 0) from the start, or an idle pod would give the HPA no value."""
    import sys
    import types

    from trtspec.repository.engine_loop import BatchSnapshot
    from trtspec.repository.spec_metrics import SpecMetrics

    _FakeFamily.values = {}
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.SimpleNamespace(MetricFamily=_FakeFamily))

    def gauge(state: str) -> float:
        return sum(
            v for (name, labels), v in _FakeFamily.values.items() if name == m.RUNNING and ("state", state) in labels
        )

    a, b = (SpecMetrics("tensorrt_llm", "1", "draft-target", 2) for _ in range(2))
    a.start(100), b.start(100)
    assert (gauge("running"), gauge("waiting")) == (0, 0)
    assert any(name == m.RUNNING for name, _ in _FakeFamily.values)  # present, at 0
    a.batch(BatchSnapshot(running=4, waiting=2, k=2, kv_used=10, kv_capacity=100))
    b.batch(BatchSnapshot(running=3, waiting=0, k=2, kv_used=5, kv_capacity=100))
    assert (gauge("running"), gauge("waiting")) == (7, 2)
    a.batch(BatchSnapshot(running=1, waiting=0, k=2, kv_used=3, kv_capacity=100))
    assert (gauge("running"), gauge("waiting")) == (4, 0)
    b.close()
    assert (gauge("running"), gauge("waiting")) == (1, 0)
