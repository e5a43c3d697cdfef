"""A real Prometheus (Debian's package) scraping real tritonservers and evaluating trtspec's rules.

Two deployments of the embedded pair: the trained draft, and a deliberately poor one (the same
draft with its output head shifted by one token id, so it almost never proposes what the target
picks). Prometheus's recorded acceptance must equal the servers' own counts, the acceptance alert
must fire for the poor draft only, and every dashboard query must name a metric the live server
exposes (or dcgm-exporter's documented counters, for the GPU panel).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml
from conftest import CONFIGS, REPO, require_tool
from safetensors.torch import load_file, save_file
from test_monitoring import acceptance_alert_tests, dashboard_exprs, metric_names, promtool_test

from trtspec.bench.server_metrics import SpecCounters, scrape
from trtspec.config import load_config
from trtspec.deploy import monitoring
from trtspec.serve.locate import find_tritonserver
from trtspec.serve.server import free_ports

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_tritonserver() is None, reason="no tritonserver (install the server extra)"),
]
PROMPTS = [f"ROMEO:\nBut soft, what light {i}" for i in range(6)]
MIN_ACCEPTANCE = 0.2  # the trained tiny draft is above it on these prompts, the shifted one far below


def trtspec(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtspec", *args], cwd=cwd, capture_output=True, text=True)


def poor_draft(out: Path) -> Path:
    """The embedded draft with an untied output head whose rows are shifted by one token id."""
    shutil.copytree(REPO / "trtspec/assets/tiny-draft", out)
    tensors = load_file(out / "model.safetensors")
    tensors["lm_head.weight"] = torch.roll(tensors["model.embed_tokens.weight"], shifts=1, dims=0).contiguous()
    save_file(tensors, out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    return out


def prometheus_binary() -> str:
    return require_tool("prometheus", "apt-get install prometheus; .ci/run does")


def query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]["result"]


def wait_for(predicate, timeout: float = 60.0, what: str = ""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Both deployments served, and one Prometheus scraping both with their rules loaded."""
    prometheus = prometheus_binary()
    tmp = tmp_path_factory.mktemp("monitoring")
    drafts = {"mon-good": "embedded:tiny-draft", "mon-poor": str(poor_draft(tmp / "poor-draft"))}
    served, scrape_configs, rule_files = {}, [], []
    for name, draft in drafts.items():
        data = yaml.safe_load((CONFIGS / "tiny-draft-target.yaml").read_text())
        data["name"], data["draft"]["checkpoint"] = name, draft
        # a fixed K: the adaptive policy may serve the poor draft without a single draft (a timing decision
        # on a busy machine), and these tests count what each deployment drafted
        data["speculation"]["policy"] = "fixed"
        data["deploy"]["monitoring"] = {"min_acceptance": MIN_ACCEPTANCE, "alert_for": "2s"}
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        for step in ("build", "package"):
            res = trtspec(step, str(path), cwd=tmp)
            assert res.returncode == 0, res.stderr
        http, grpc, metrics = free_ports(3)
        ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
        res = trtspec("serve", str(path), *ports, "--detach", cwd=tmp)
        assert res.returncode == 0, res.stdout + res.stderr
        cfg = load_config(path)
        served[name] = (cfg, path, http, f"http://localhost:{metrics}/metrics")
        job = monitoring.prometheus_config(cfg, f"localhost:{metrics}")["scrape_configs"][0]
        scrape_configs.append({**job, "scrape_interval": "1s"})
        (tmp / f"rules-{name}.yml").write_text(yaml.safe_dump({"groups": monitoring.rule_groups(cfg)}))
        rule_files.append(f"rules-{name}.yml")
    (port,) = free_ports(1)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": rule_files,
        "scrape_configs": scrape_configs,
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        cwd=tmp,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        # every counter scraped at its starting value before any request, so rate() sees the whole run
        for name in served:
            series = f'{monitoring.m.DRAFT_TOKENS}{{{monitoring.INSTANCE_LABEL}="{name}"}}'
            wait_for(lambda s=series: _answers(base, s), what=f"Prometheus to scrape {name}")
        yield base, served
    finally:
        process.terminate()
        process.wait(30)
        with ThreadPoolExecutor(len(served)) as pool:  # together: each takes seconds to unload its models
            list(pool.map(lambda entry: trtspec("serve", str(entry[1]), "--stop", cwd=tmp), served.values()))


def _answers(base: str, expr: str) -> list[dict] | None:
    try:
        return query(base, expr)
    except OSError:
        return None


def generate(http: int, prompt: str) -> dict:
    body = {"text_input": prompt, "sampling_param_max_tokens": 32, "sampling_param_return_perf_metrics": True}
    request = urllib.request.Request(
        f"http://localhost:{http}/v2/models/tensorrt_llm/generate", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def traffic(stack):
    """The same prompts to both deployments; per deployment, the sums of the per-request perf outputs."""
    _base, served = stack
    sums = {}
    for name, (_cfg, _path, http, _metrics) in served.items():
        answers = [generate(http, p) for p in PROMPTS]
        sums[name] = (
            sum(a["total_draft_tokens"] for a in answers),
            sum(a["total_accepted_draft_tokens"] for a in answers),
        )
    return sums


def test_prometheus_records_the_acceptance_the_servers_counted(stack, traffic):
    base, served = stack
    for name, (drafted, accepted) in traffic.items():
        live = SpecCounters.read(scrape(served[name][3]))
        assert (live.draft_tokens, live.accepted_tokens) == (drafted, accepted)
        expr = f'{monitoring.ACCEPTANCE}{{{monitoring.INSTANCE_LABEL}="{name}"}}'

        def recorded(expr=expr, want=accepted / drafted):
            result = _answers(base, expr) or []
            return result and abs(float(result[0]["value"][1]) - want) < 1e-9 and result

        result = wait_for(recorded, what=f"{expr} == {accepted}/{drafted}")
        assert result[0]["metric"]["model"] == "tensorrt_llm" and result[0]["metric"]["mode"] == "draft-target"
    good, poor = (a / d for d, a in (traffic["mon-good"], traffic["mon-poor"]))
    assert poor < MIN_ACCEPTANCE < good, (good, poor)


def test_the_acceptance_alert_fires_for_the_poor_draft_only(stack, traffic):
    base, _served = stack
    firing = f'ALERTS{{alertname="{monitoring.ACCEPTANCE_ALERT}",alertstate="firing"}}'

    def poor_fires():
        result = _answers(base, firing) or []
        names = {r["metric"][monitoring.INSTANCE_LABEL] for r in result}
        return "mon-poor" in names and names

    assert wait_for(poor_fires, what="the acceptance alert to fire for mon-poor") == {"mon-poor"}
    time.sleep(4)  # twice alert_for: a false alert for the trained draft would be firing by now
    assert {r["metric"][monitoring.INSTANCE_LABEL] for r in _answers(base, firing) or []} == {"mon-poor"}


def test_promtool_fires_the_ten_minute_alert_on_the_poor_drafts_live_rates(stack, traffic, tmp_path):
    """Counters growing in the proportions each draft measured: the shipped rule (10 minutes below 0.5)
    fires for the poor draft; the test's threshold (0.2) stays silent for the trained one."""
    shipped = load_config(CONFIGS / "tiny-draft-target.yaml")
    served = stack[1]
    drafted, accepted = traffic["mon-poor"]
    assert accepted / drafted < shipped.deploy.monitoring.min_acceptance
    tests = acceptance_alert_tests(shipped, drafted, accepted)
    assert tests[0]["alert_rule_test"][1]["exp_alerts"], "the poor draft must be expected to alert"
    res = promtool_test(tmp_path, shipped, tests)
    assert res.returncode == 0, res.stdout + res.stderr
    good = served["mon-good"][0]
    drafted, accepted = traffic["mon-good"]
    tests = acceptance_alert_tests(good, drafted, accepted)
    assert not tests[0]["alert_rule_test"][1]["exp_alerts"], "the trained draft must be expected not to alert"
    res = promtool_test(tmp_path, good, tests)
    assert res.returncode == 0, res.stdout + res.stderr


def test_prometheus_records_one_load_value_for_the_served_pod(stack, traffic):
    """The HPA's input from a live server: one series (no pod label outside Kubernetes), the target
    model's batch over its slots; 0 once the requests are done, never absent (the gauges exist from
    the start)."""
    base, served = stack
    cfg = served["mon-good"][0]
    live = scrape(served["mon-good"][3])
    assert {dict(labels).get("state") for name, labels in live if name == monitoring.m.RUNNING} == {
        "running",
        "waiting",
    }
    expr = f'{monitoring.LOAD}{{{monitoring.INSTANCE_LABEL}="{cfg.name}"}}'

    def idle():
        result = _answers(base, expr) or []
        return len(result) == 1 and float(result[0]["value"][1]) == 0.0 and result

    (series,) = wait_for(idle, what=f"{expr} == 0 after the requests")
    assert series["metric"] == {monitoring.INSTANCE_LABEL: cfg.name, "__name__": monitoring.LOAD}


def test_every_dashboard_query_names_a_metric_the_live_server_exposes(stack, traffic):
    _base, served = stack
    cfg, _path, _http, metrics_url = served["mon-good"]
    exposed = {name for name, _labels in scrape(metrics_url)}
    dcgm = {monitoring.DCGM_FB_USED, monitoring.DCGM_FB_FREE}  # dcgm-exporter's default counters
    on_gpu = cfg.model_copy(update={"build": cfg.build.model_copy(update={"device": "cuda"})})
    for board in (monitoring.dashboard(cfg), monitoring.dashboard(on_gpu)):
        for expr in dashboard_exprs(board):
            missing = metric_names(expr) - exposed - dcgm
            assert not missing, f"{expr}: {missing} not on the live server"
    assert any(metric_names(e) & dcgm for e in dashboard_exprs(monitoring.dashboard(on_gpu)))
