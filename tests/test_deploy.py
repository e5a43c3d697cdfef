"""`trtspec deploy`: manifests valid against the Kubernetes schemas, policy-clean under checkov, goldens
for the single-node, multi-node and CPU variants, and the launcher's command lines against NVIDIA's.

Built-in kinds are validated with kubernetes-validate (official schemas, strict: unknown fields fail)
for the config's cluster version; custom resources against tests/crd_schemas.py, with a
LeaderWorkerSet's pod templates validated as core/v1 PodTemplateSpec.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import CONFIGS, REPO
from crd_schemas import CUSTOM

from trtspec.config import DeploymentConfig, load_config, validate_config
from trtspec.deploy import k8s, monitoring, sizing
from trtspec.deploy.compose import compose
from trtspec.deploy.launch import mpirun_argv, orchestrator_argv, rank_argv, serve_argv, worker_pods
from trtspec.deploy.topology import orchestrated, topology
from trtspec.deploy.write import rendered_files, write_deployment
from trtspec.errors import ConfigError, TrtspecError, UsageError
from trtspec.serve.server import Ports
from trtspec.versions import DEFAULT_TRTLLM_VERSION, container_tag

GOLDEN = Path(__file__).parent / "golden" / "deploy"
VARIANTS = {
    "single-node": "llama-3.3-70b-1b-draft-h200.yaml",
    "multi-node": "deepseek-r1-mtp-2x8-h100.yaml",
    "cpu": "tiny-draft-target.yaml",
}
ALL_CONFIGS = sorted(p.name for p in CONFIGS.glob("*.yaml"))


def validate_manifest(doc: dict, version: str) -> None:
    """Raise on any schema violation; an unknown built-in kind raises SchemaNotFoundError (never a pass)."""
    schema = CUSTOM.get((doc["apiVersion"], doc["kind"]))
    if schema is None:
        kubernetes_validate.validate(doc, version, strict=True)
        return
    jsonschema.validate(doc, schema)
    if doc["kind"] == "LeaderWorkerSet":
        for role in ("leaderTemplate", "workerTemplate"):
            template = doc["spec"]["leaderWorkerTemplate"][role]
            pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role}, "template": template}
            kubernetes_validate.validate(pod_template, version, strict=True)


def manifests(cfg: DeploymentConfig) -> dict[str, list[dict]]:
    return k8s.render(cfg)


def by_kind(cfg: DeploymentConfig) -> dict[str, dict]:
    return {doc["kind"]: doc for docs in manifests(cfg).values() for doc in docs}


def variant(base: str, **changes: dict) -> DeploymentConfig:
    """A config from configs/ with sections changed, validated as a user's would be."""
    data = yaml.safe_load((CONFIGS / base).read_text())
    for section, values in changes.items():
        data.setdefault(section, {}).update(values)
    return validate_config(data, source=CONFIGS / base)


def containers(doc: dict) -> list[dict]:
    """Every container of a workload's pods, init containers included."""
    if doc["kind"] == "LeaderWorkerSet":
        t = doc["spec"]["leaderWorkerTemplate"]
        specs = [t["leaderTemplate"]["spec"], t["workerTemplate"]["spec"]]
    else:
        specs = [doc["spec"]["template"]["spec"]]
    return [c for spec in specs for c in [*spec.get("initContainers", []), *spec["containers"]]]


# ---- schemas


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_every_rendered_manifest_validates_for_the_configured_cluster_version(name):
    cfg = load_config(CONFIGS / name)
    files = manifests(cfg)
    for file, docs in files.items():
        for doc in docs:
            if doc["kind"] == "Kustomization":
                assert doc["resources"] == [f for f in files if f != "kustomization.yaml"]
                continue
            validate_manifest(doc, cfg.deploy.kubernetes_version)
            assert doc["metadata"].get("namespace", cfg.deploy.namespace) == cfg.deploy.namespace, file


def test_schema_validation_rejects_mistakes():
    """The validators are strict: a misplaced field in a built-in kind, a custom resource or a pod
    template inside a LeaderWorkerSet each fails."""
    kinds = by_kind(load_config(CONFIGS / VARIANTS["multi-node"]))
    bad_service = copy.deepcopy(kinds["Service"])
    bad_service["spec"]["ports"][0]["containerPort"] = 8000  # a Pod field, not a ServicePort one
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_manifest(bad_service, "1.30")
    bad_lws = copy.deepcopy(kinds["LeaderWorkerSet"])
    bad_lws["spec"]["leaderWorkerTemplate"]["groupSize"] = 2
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(bad_lws, "1.30")
    bad_pod = copy.deepcopy(kinds["LeaderWorkerSet"])
    bad_pod["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["gpus"] = 8
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_manifest(bad_pod, "1.30")
    bad_monitor = copy.deepcopy(kinds["PodMonitor"])
    bad_monitor["spec"]["podMetricsEndpoints"][0]["paht"] = "/metrics"
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(bad_monitor, "1.30")
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate_manifest({"apiVersion": "apps/v1", "kind": "Deploymnet", "metadata": {"name": "x"}}, "1.30")


# ---- shape


@pytest.mark.parametrize(
    ("tp", "pp", "per_node", "pods", "gpus"),
    [(1, 1, 8, 1, 1), (4, 1, 8, 1, 4), (8, 1, 8, 1, 8), (16, 1, 8, 2, 8), (8, 2, 8, 2, 8), (32, 1, 8, 4, 8)],
)
def test_gpus_per_pod_and_group_size_follow_tp_x_pp(tp, pp, per_node, pods, gpus):
    cfg = variant(VARIANTS["multi-node"], build={"tp": tp, "pp": pp}, deploy={"gpus_per_node": per_node})
    kinds = by_kind(cfg)
    if pods == 1:
        assert "LeaderWorkerSet" not in kinds
        server = kinds["Deployment"]
    else:
        server = kinds["LeaderWorkerSet"]
        assert server["spec"]["leaderWorkerTemplate"]["size"] == pods
    for c in containers(server):
        if c["args"][0] == "wait":  # waits for the Job's build: holds nothing beyond its pod's GPUs
            assert "nvidia.com/gpu" not in c["resources"]["limits"]
            continue
        assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus == c["resources"]["requests"]["nvidia.com/gpu"]
    # the Job never asks for a GPU: servers holding theirs wait for it (tests/test_deploy_cluster.py)
    assert "nvidia.com/gpu" not in kinds["Job"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]


def test_a_group_that_does_not_fill_whole_nodes_is_refused():
    with pytest.raises(ConfigError, match=r"deploy.gpus_per_node: tp x pp = 12 spans nodes"):
        variant(VARIANTS["multi-node"], build={"tp": 12})


def test_single_node_deployment_follows_nvidias_chart():
    cfg = load_config(CONFIGS / VARIANTS["single-node"])
    kinds = by_kind(cfg)
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (init,) = pod["initContainers"]
    assert [p["containerPort"] for p in c["ports"]] == [8000, 8001, 8002]
    assert c["startupProbe"]["httpGet"]["path"] == c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert c["args"] == ["serve"] and init["args"][0] == "build"  # compiled engines: built on the pod's GPUs
    assert kinds["Job"]["spec"]["template"]["spec"]["containers"][0]["args"][0] == "prepare"  # downloads
    assert kinds["Service"]["spec"]["selector"] == kinds["Deployment"]["spec"]["selector"]["matchLabels"]
    endpoint = {"port": "metrics", "path": "/metrics", "interval": "15s"}
    assert kinds["PodMonitor"]["spec"]["podMetricsEndpoints"] == [endpoint]
    hpa = kinds["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": cfg.name}
    metric = hpa["metrics"][0]["pods"]
    assert metric["metric"]["name"] == monitoring.LOAD  # one value per pod (tests/test_monitoring.py)
    assert metric["metric"]["name"] in [r["record"] for r in kinds["PrometheusRule"]["spec"]["groups"][0]["rules"]]


def test_hugging_face_token_is_referenced_never_inlined(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", "hf_NotARealTokenButSecret")
    cfg = load_config(CONFIGS / VARIANTS["multi-node"])
    one_host = variant(VARIANTS["multi-node"], build={"tp": 8})
    for target, c in (("k8s", cfg), ("docker", one_host)):
        text = "".join(rendered_files(c, target, tmp_path).values())
        assert "hf_NotARealTokenButSecret" not in text and "HF_TOKEN_PATH" in text
    kinds = by_kind(cfg)
    volumes = kinds["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["volumes"]
    secret = next(v["secret"] for v in volumes if "secret" in v)
    assert secret == {"secretName": "hf-token", "items": [{"key": "HF_TOKEN", "path": "token"}]}
    assert all(doc["kind"] != "Secret" for doc in kinds.values())


def test_multi_node_group_serves_from_the_leader_with_exec_rbac():
    cfg = load_config(CONFIGS / VARIANTS["multi-node"])
    kinds = by_kind(cfg)
    t = kinds["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    leader, worker = t["leaderTemplate"], t["workerTemplate"]
    assert leader["spec"]["containers"][0]["args"] == ["leader"]
    assert worker["spec"]["containers"][0]["args"] == ["worker"]
    assert "ports" not in worker["spec"]["containers"][0]
    role = {"trtspec.dev/role": "leader"}
    assert kinds["Service"]["spec"]["selector"].items() >= role.items()
    assert kinds["PodMonitor"]["spec"]["selector"]["matchLabels"].items() >= role.items()
    assert leader["metadata"]["labels"].items() >= kinds["Service"]["spec"]["selector"].items()
    assert not worker["metadata"]["labels"].items() >= kinds["Service"]["spec"]["selector"].items()
    assert kinds["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["kind"] == "LeaderWorkerSet"
    rules = kinds["Role"]["rules"]
    assert {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]} in rules
    assert leader["spec"]["serviceAccountName"] == kinds["ServiceAccount"]["metadata"]["name"]
    env = {e["name"]: e for e in leader["spec"]["containers"][0]["env"]}
    assert "group-key" in env["GROUP_KEY"]["valueFrom"]["fieldRef"]["fieldPath"]
    job_env = {e["name"] for e in kinds["Job"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "TRTSPEC_SKIP_WARM_UP" in job_env  # one build pod cannot load a model that spans nodes
    assert kinds["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]


def test_cpu_variant_asks_for_no_gpu():
    kinds = by_kind(load_config(CONFIGS / VARIANTS["cpu"]))
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"]
    assert "tolerations" not in pod and "affinity" not in pod
    assert pod["containers"][0]["image"].endswith("-cpu")


def test_pods_run_non_root_with_a_read_only_root_filesystem():
    for name in VARIANTS.values():
        for doc in by_kind(load_config(CONFIGS / name)).values():
            if doc["kind"] not in {"Deployment", "Job", "LeaderWorkerSet"}:
                continue
            for c in containers(doc):
                sc = c["securityContext"]
                assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
                assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


# ---- goldens


def _rendered(name: str, target: str, tmp_path: Path) -> dict[str, str]:
    cfg = load_config(CONFIGS / name)
    return rendered_files(cfg, target, tmp_path / "out")  # type: ignore[arg-type]


@pytest.mark.parametrize("key", sorted(VARIANTS))
def test_k8s_goldens(key, tmp_path):
    rendered = _rendered(VARIANTS[key], "k8s", tmp_path)
    golden = GOLDEN / key
    if os.environ.get("TRTSPEC_UPDATE_GOLDEN") == "1":
        shutil.rmtree(golden, ignore_errors=True)
        for file, text in rendered.items():
            (golden / file).parent.mkdir(parents=True, exist_ok=True)
            (golden / file).write_text(text)
    assert sorted(rendered) == sorted(str(p.relative_to(golden)) for p in golden.rglob("*") if p.is_file())
    for file, text in rendered.items():
        assert text == (golden / file).read_text(), f"{key}/{file} differs (TRTSPEC_UPDATE_GOLDEN=1 rewrites)"


# ---- launcher command lines


def test_ranks_follow_launch_triton_server_py():
    """The per-rank blocks of TensorRT-LLM's scripts/launch_triton_server.py (reference §1.12)."""
    ports = Ports(8000, 8001, 8002, host="0.0.0.0")  # what the in-container launcher passes
    assert rank_argv(0, Path("/r"), ports, ["tensorrt_llm"], False) == [
        "-n", "1", "/opt/tritonserver/bin/tritonserver", "--model-repository=/r",
        "--grpc-address=0.0.0.0", "--grpc-port=8001", "--http-address=0.0.0.0", "--http-port=8000",
        "--metrics-address=0.0.0.0", "--metrics-port=8002",
        "--disable-auto-complete-config", "--backend-config=python,shm-region-prefix-name=prefix0_",
        "--metrics-config=histogram_latencies=true",  # trtspec's addition, for the dashboard's TTFT panel
    ]  # fmt: skip
    assert rank_argv(2, Path("/r"), ports, ["tensorrt_llm"], True) == [
        "-n", "1", "trtllm-llmapi-launch", "/opt/tritonserver/bin/tritonserver", "--model-repository=/r",
        "--model-control-mode=explicit", "--load-model=tensorrt_llm",
        "--grpc-address=0.0.0.0", "--grpc-port=8001", "--http-address=0.0.0.0", "--http-port=8000",
        "--metrics-address=0.0.0.0", "--metrics-port=8002",
        "--disable-auto-complete-config", "--backend-config=python,shm-region-prefix-name=prefix2_",
    ]  # fmt: skip


def test_compiled_engines_at_tp2_start_one_rank_per_gpu():
    cfg = variant("llama-3.1-405b-3b-draft-tp4.yaml", speculation={"mode": "none"}, build={"tp": 2})
    cfg.draft = None
    argv = mpirun_argv(cfg, Path("/r"), Ports())
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    assert argv.count(":") == 1 and argv.count("/opt/tritonserver/bin/tritonserver") == 2
    assert argv[argv.index(":") + 1 :].count("--load-model=tensorrt_llm") == 1


def test_compiled_draft_target_runs_in_orchestrator_mode_on_one_node():
    cfg = load_config(CONFIGS / "llama-3.1-405b-3b-draft-tp4.yaml")
    assert orchestrated(cfg) and topology(cfg).mpi_ranks == 1
    argv = orchestrator_argv(cfg, Path("/r"), Ports())
    assert argv[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]
    assert argv.count(":") == 0  # one rank: the orchestrator spawns the engines' workers itself
    assert "--pinned-memory-pool-byte-size=0" in argv and "--enable-peer-access=false" in argv
    assert [a for a in argv if a.startswith("--cuda-memory-pool-byte-size")] == [
        f"--cuda-memory-pool-byte-size={j}:0" for j in range(4)
    ]
    wide = variant("llama-3.1-405b-3b-draft-tp4.yaml", build={"tp": 8}, deploy={"gpus_per_node": 4})
    with pytest.raises(UsageError, match="orchestrator mode, which works on one node only"):
        rendered_files(wide, "k8s", Path("/tmp/x"))


def test_multi_node_leader_starts_every_rank_over_kubessh():
    cfg = load_config(CONFIGS / VARIANTS["multi-node"])
    hosts = worker_pods("deepseek-r1-mtp-2node-0", 2)
    assert hosts == ["deepseek-r1-mtp-2node-0", "deepseek-r1-mtp-2node-0-1"]
    argv = mpirun_argv(cfg, Path("/workspace/model_repository/x"), Ports(), hosts)
    i = argv.index("plm_rsh_agent")
    assert argv[i + 1] == "kubessh"
    assert argv[argv.index("--host") + 1] == "deepseek-r1-mtp-2node-0:8,deepseek-r1-mtp-2node-0-1:8"
    assert argv.count("trtllm-llmapi-launch") == 16 and argv.count(":") == 15


def test_serve_dispatch_per_backend(tmp_path):
    """NVIDIA's backends under mpirun (as launch_triton_server.py), the torch backend through trtspec serve
    with the launcher's load budget, never the CLI's 300 s default."""
    repo = Path("/workspace/model_repository/x")
    llmapi = load_config(CONFIGS / "deepseek-r1-mtp-8gpu.yaml")  # 8 GPUs, one rank: the LLM API spawns workers
    argv, env = serve_argv(llmapi, tmp_path / "c.yaml", repo, 3600)
    assert argv[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]
    assert ":" not in argv and env == {}
    argv, env = serve_argv(load_config(CONFIGS / "llama-3.1-405b-3b-draft-tp4.yaml"), tmp_path / "c.yaml", repo, 60)
    assert env == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    argv, env = serve_argv(load_config(CONFIGS / VARIANTS["cpu"]), tmp_path / "c.yaml", repo, 1800)
    assert argv[1:5] == ["-m", "trtspec", "serve", str(tmp_path / "c.yaml")] and argv[-2:] == ["--timeout", "1800"]
    assert argv[5:7] == ["--host", "0.0.0.0"]  # in a container: all interfaces (trtspec serve alone: loopback)


def test_launcher_errors_are_one_line(monkeypatch, capsys, tmp_path):
    from trtspec.deploy import launch

    config = tmp_path / "c.yaml"
    config.write_text((CONFIGS / VARIANTS["multi-node"]).read_text())
    monkeypatch.setenv("TRTSPEC_CONFIG", str(config))
    monkeypatch.setenv("TRTSPEC_WAIT_S", "soon")
    assert launch.main(["serve"]) == 2
    assert capsys.readouterr().err == "error: TRTSPEC_WAIT_S must be a number, got 'soon'\n"
    monkeypatch.setenv("TRTSPEC_WAIT_S", "1")
    assert launch.main(["serve"]) == 2
    assert "run `leader` in the leader pod" in capsys.readouterr().err
    monkeypatch.delenv("HOSTNAME", raising=False)
    monkeypatch.delenv("GROUP_KEY", raising=False)
    assert launch.main(["leader"]) == 2
    assert "leader needs GROUP_KEY and HOSTNAME" in capsys.readouterr().err
    monkeypatch.setenv("GROUP_KEY", "abc")
    monkeypatch.setenv("HOSTNAME", "pod-0")
    monkeypatch.setenv("PATH", str(tmp_path))  # no kubectl
    assert launch.main(["leader"]) == 2
    assert capsys.readouterr().err.startswith("error: kubectl get pods failed:")
    tiny = tmp_path / "tiny.yaml"
    data = yaml.safe_load((CONFIGS / VARIANTS["cpu"]).read_text())
    data["serve"]["repository"] = str(tmp_path / "none")
    tiny.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("TRTSPEC_CONFIG", str(tiny))
    monkeypatch.setenv("TRTSPEC_WAIT_S", "0")
    assert launch.main(["serve"]) == 2
    assert "no model repository of this config after 0s (is the prepare Job done?)" in capsys.readouterr().err


def test_config_change_rolls_the_pods_and_makes_a_new_build_job():
    a = by_kind(load_config(CONFIGS / VARIANTS["single-node"]))
    b = by_kind(variant(VARIANTS["single-node"], speculation={"num_draft_tokens": 3}))
    digest = "trtspec.dev/config-digest"
    assert a["Job"]["metadata"]["name"] != b["Job"]["metadata"]["name"]
    assert len(a["Job"]["metadata"]["name"]) <= 63
    ta, tb = a["Deployment"]["spec"]["template"], b["Deployment"]["spec"]["template"]
    assert ta["metadata"]["annotations"][digest] != tb["metadata"]["annotations"][digest]
    assert "replicas" not in a["Deployment"]["spec"]  # the HPA owns it
    # an alert threshold or the HPA's bounds change no pod and no build: nothing served changed
    c = by_kind(variant(VARIANTS["single-node"], deploy={"autoscaling": {"max_replicas": 7}}))
    assert c["Job"]["metadata"]["name"] == a["Job"]["metadata"]["name"]
    assert (
        c["Deployment"]["spec"]["template"]["metadata"]["annotations"][digest] == ta["metadata"]["annotations"][digest]
    )
    fixed = by_kind(variant(VARIANTS["single-node"], deploy={"replicas": 2, "autoscaling": {"enabled": False}}))
    assert fixed["Deployment"]["spec"]["replicas"] == 2 and "HorizontalPodAutoscaler" not in fixed


def test_pull_policy_and_bad_quantities():
    cpu = by_kind(load_config(CONFIGS / VARIANTS["cpu"]))["Deployment"]
    assert cpu["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert cpu["metadata"]["annotations"]["checkov.io/skip1"].startswith("CKV_K8S_15=")
    pushed = by_kind(variant(VARIANTS["cpu"], deploy={"image": "ghcr.io/acme/trtspec:0.1.0-cpu"}))["Deployment"]
    assert pushed["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Always"
    assert "checkov.io/skip1" not in pushed["metadata"]["annotations"]
    with pytest.raises(ConfigError, match=r"deploy.memory: must be a Kubernetes quantity such as 16Gi"):
        variant(VARIANTS["cpu"], deploy={"memory": "64GB"})


# ---- docker


def test_dockerfile_default_tag_is_the_default_trtllm_version():
    text = (REPO / "docker" / "Dockerfile").read_text()
    assert f"ARG TRITON_TAG={container_tag(DEFAULT_TRTLLM_VERSION)}\n" in text
    assert "FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}-trtllm-python-py3" in text
    for name in ("Dockerfile", "Dockerfile.cpu"):
        body = (REPO / "docker" / name).read_text()
        assert "\nUSER 1000:1000\n" in body and "HEALTHCHECK" in body and "/v2/health/ready" in body


def test_compose_builds_the_image_for_the_configured_version(tmp_path):
    cfg = variant(VARIANTS["single-node"], build={"tensorrt_llm_version": "1.1.0"})
    doc = compose(cfg, tmp_path)
    build = doc["services"]["build"]["build"]
    assert build["args"] == {"TRITON_TAG": "26.02"} and build["dockerfile"] == "docker/Dockerfile"
    assert (tmp_path / build["context"]).resolve() == REPO
    assert doc["services"]["triton"]["depends_on"] == {"build": {"condition": "service_completed_successfully"}}
    gpu = doc["services"]["triton"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["count"] == topology(cfg).gpus_per_pod
    cpu = compose(load_config(CONFIGS / VARIANTS["cpu"]), tmp_path)
    assert cpu["services"]["build"]["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert "deploy" not in cpu["services"]["triton"]
    # /dev/shm from sizing: within the memory a CPU pod gets (docker counts it as the container's memory)
    assert cpu["services"]["triton"]["shm_size"] == sizing.quantity_bytes(
        sizing.shm_size(load_config(CONFIGS / VARIANTS["cpu"]))
    )
    assert cpu["services"]["triton"]["shm_size"] < sizing.quantity_bytes(
        sizing.memory_limit(load_config(CONFIGS / VARIANTS["cpu"]), "serve")
    )
    with pytest.raises(UsageError, match="compose runs one host: use --target k8s"):
        rendered_files(load_config(CONFIGS / VARIANTS["multi-node"]), "docker", tmp_path)


# ---- CLI


def test_deploy_cli_writes_and_refuses_to_overwrite(runner, tmp_path):
    from trtspec.cli import cli

    out = tmp_path / "k8s"
    res = runner.invoke(cli, ["deploy", str(CONFIGS / VARIANTS["multi-node"]), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "2 pod(s) x 8 GPU(s)" in res.output and (out / "leaderworkerset.yaml").is_file()
    before = (out / "service.yaml").read_text()
    res = runner.invoke(cli, ["deploy", str(CONFIGS / VARIANTS["cpu"]), "--out", str(out)])
    assert res.exit_code == 2 and "not empty (use --force" in res.output and len(res.output.strip().splitlines()) == 1
    assert (out / "service.yaml").read_text() == before
    res = runner.invoke(cli, ["deploy", str(CONFIGS / VARIANTS["cpu"]), "--out", str(out), "--force"])
    assert res.exit_code == 0 and not (out / "leaderworkerset.yaml").exists()
    res = runner.invoke(cli, ["deploy", str(CONFIGS / VARIANTS["cpu"]), "--target", "docker", "--out", str(out)])
    assert res.exit_code == 2  # still not empty
    docker = tmp_path / "d"
    res = runner.invoke(cli, ["deploy", str(CONFIGS / VARIANTS["cpu"]), "--target", "docker", "--out", str(docker)])
    assert res.exit_code == 0, res.output
    in_container = yaml.safe_load((docker / "trtspec.yaml").read_text())
    assert in_container["serve"]["repository"] == "/workspace/model_repository"


def test_write_failure_leaves_the_old_directory(tmp_path, monkeypatch):
    cfg = load_config(CONFIGS / VARIANTS["cpu"])
    out = tmp_path / "k8s"
    write_deployment(cfg, "k8s", out)
    before = {p: p.read_text() for p in out.rglob("*") if p.is_file()}

    def broken(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("trtspec.deploy.write.replace_dir", broken)
    with pytest.raises(TrtspecError, match="no space left") as err:  # a full disk: exit 1, not bad input
        write_deployment(cfg, "k8s", out, force=True)
    assert err.value.exit_code == 1
    assert {p: p.read_text() for p in out.rglob("*") if p.is_file()} == before
    assert not list(tmp_path.glob(".staging-*"))


# ---- checkov


def _checkov() -> str:
    found = os.environ.get("CHECKOV") or shutil.which("checkov")
    if not found:
        if os.environ.get("CI"):
            pytest.fail("checkov is not installed (.ci/run installs it into .venv-checkov)")
        pytest.skip("checkov is not installed (pip install checkov in a separate venv; set CHECKOV)")
    return found


def _run_checkov(*dirs: Path) -> subprocess.CompletedProcess:
    argv = [_checkov(), "--config-file", str(REPO / ".checkov.yaml")]
    for d in dirs:
        argv += ["-d", str(d)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_checkov_passes_every_rendered_manifest_and_the_dockerfiles(tmp_path):
    for name in ALL_CONFIGS:
        write_deployment(load_config(CONFIGS / name), "k8s", tmp_path / name.removesuffix(".yaml"))
    res = _run_checkov(tmp_path, REPO / "docker")
    summary = [ln for ln in res.stdout.splitlines() if ln.startswith("Passed checks")]
    assert res.returncode == 0, res.stdout[-3000:]
    assert len(summary) >= 2 and all("Failed checks: 0" in ln for ln in summary), summary
    assert all(int(ln.split(",")[0].split(": ")[1]) > 0 for ln in summary)


def test_checkov_fails_an_insecure_deployment_and_dockerfile(tmp_path):
    kinds = by_kind(load_config(CONFIGS / VARIANTS["cpu"]))
    deployment = kinds["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    del pod["securityContext"], pod["containers"][0]["securityContext"]
    (tmp_path / "deployment.yaml").write_text(yaml.safe_dump(deployment))
    (tmp_path / "Dockerfile").write_text('FROM python:3.11-slim\nCMD ["python"]\n')
    res = _run_checkov(tmp_path)
    assert res.returncode != 0
    for check in ("CKV_K8S_20", "CKV_K8S_23", "CKV_DOCKER_2", "CKV_DOCKER_3"):
        assert check in res.stdout, check


def test_local_checkpoints_are_expected_on_the_volume(tmp_path):
    from trtspec.assets import EMBEDDED_CHECKPOINTS

    shutil.copytree(EMBEDDED_CHECKPOINTS["tiny-target"], tmp_path / "my-target")
    data = yaml.safe_load((CONFIGS / "tiny-baseline.yaml").read_text())
    data["target"]["checkpoint"] = str(tmp_path / "my-target")
    cfg = validate_config(data)
    assert k8s.cluster_config(cfg)["target"]["checkpoint"] == "/workspace/checkpoints/my-target"
    volumes = compose(cfg, tmp_path)["services"]["build"]["volumes"]
    assert f"{tmp_path / 'my-target'}:/workspace/checkpoints/my-target:ro" in volumes


def test_two_local_checkpoints_of_one_folder_name_get_two_places_on_the_volume(runner, tmp_path):
    """.../target/hf and .../draft/hf (a model and the self-draft cut beside it) must not land on one path:
    the pods would run the target as its own draft."""
    from trtspec.assets import EMBEDDED_CHECKPOINTS
    from trtspec.cli import cli

    for role, name in (("target", "tiny-target"), ("draft", "tiny-draft")):
        shutil.copytree(EMBEDDED_CHECKPOINTS[name], tmp_path / role / "hf")
    data = yaml.safe_load((CONFIGS / "tiny-draft-target.yaml").read_text())
    data["target"]["checkpoint"], data["draft"]["checkpoint"] = str(tmp_path / "target/hf"), str(tmp_path / "draft/hf")
    cluster = k8s.cluster_config(validate_config(data))
    assert cluster["target"]["checkpoint"] == "/workspace/checkpoints/hf"
    assert cluster["draft"]["checkpoint"] == "/workspace/checkpoints/hf-draft"
    volumes = compose(validate_config(data), tmp_path)["services"]["build"]["volumes"]
    assert {
        f"{tmp_path / 'target/hf'}:/workspace/checkpoints/hf:ro",
        f"{tmp_path / 'draft/hf'}:/workspace/checkpoints/hf-draft:ro",
    } <= set(volumes)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**data, "deploy": {**data.get("deploy", {}), "autoscaling": {"enabled": False}}}))
    res = runner.invoke(cli, ["deploy", str(config), "--out", str(tmp_path / "k")])
    assert res.exit_code == 0, res.output  # and it says where each goes
    assert f"copy:  {tmp_path / 'draft/hf'} onto the volume as /workspace/checkpoints/hf-draft" in res.output
    data["draft"]["checkpoint"] = data["target"]["checkpoint"]  # one folder for both: one place
    assert k8s.cluster_config(validate_config(data))["draft"]["checkpoint"] == "/workspace/checkpoints/hf"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"speculation": {"mode": "self-draft", "num_draft_tokens": 2}}, "export-self-draft"),
        ({"speculation": {"mode": "draft-target", "num_draft_tokens": "auto"}}, "no deployed stage plans"),
    ],
)
def test_deploy_refuses_what_the_deployed_build_would_refuse(runner, tmp_path, change, says):
    """The build in the cluster (or compose) runs `trtspec build`: a config it refuses is refused before
    manifests that could only fail are written."""
    from trtspec.cli import cli

    data = yaml.safe_load((CONFIGS / "tiny-draft-target.yaml").read_text())
    for section, values in change.items():
        data[section] = {**data[section], **values}
    if data["speculation"]["mode"] == "self-draft":
        data.pop("draft")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(data))
    for kind in ("k8s", "docker"):
        res = runner.invoke(cli, ["deploy", str(config), "--target", kind, "--out", str(tmp_path / kind)])
        assert res.exit_code == 2 and says in res.output and "Traceback" not in res.output, res.output
        assert not (tmp_path / kind).exists()
