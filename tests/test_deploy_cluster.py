"""The rendered objects read as a cluster runs them: bring-up order, controller names, exec RBAC.

Schemas (tests/test_deploy.py) say the manifests are well-formed; these say they come up: every pod
bound and ready on the smallest cluster a config allows, in every arrival order, with no name taken
from a controller. The simulator is shown to fail on the arrangement that deadlocked before (a build
Job asking for the GPUs the waiting servers hold).
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import CONFIGS

from trtspec.cli import cli
from trtspec.config import load_config, validate_config
from trtspec.deploy import cluster_check, k8s, launch, stages
from trtspec.deploy.topology import topology
from trtspec.errors import ConfigError

ALL_CONFIGS = sorted(p.name for p in CONFIGS.glob("*.yaml"))
GPU = "nvidia.com/gpu"


def docs(files: dict, kind: str) -> list[dict]:
    return [d for d in cluster_check.objects(files) if d["kind"] == kind]


def gpus(container: dict) -> int:
    return int(container["resources"]["requests"].get(GPU, 0))


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_every_example_comes_up_on_its_smallest_cluster_in_every_order(name):
    cfg = load_config(CONFIGS / name)
    files = k8s.render(cfg)
    findings = cluster_check.check(cfg, files)
    assert [f.what for f in findings if f.level == "error"] == []
    pods, nodes = cluster_check.pods(files), cluster_check.smallest_cluster(cfg)
    assert sum(n.gpus for n in nodes) == cfg.build.tp * cfg.build.pp * (0 if topology(cfg).cpu_only else 1)
    assert cluster_check.deadlocks(pods, nodes) == []
    # nothing a server waits for holds a GPU: the Job asks for none
    for job in docs(files, "Job"):
        assert all(gpus(c) == 0 for c in job["spec"]["template"]["spec"]["containers"])


@pytest.mark.parametrize("name", [n for n in ALL_CONFIGS if not n.startswith("tiny")])
def test_the_old_arrangement_deadlocks_and_the_simulator_says_so(name):
    """Before: a build Job asking for a server pod's GPUs, applied with servers that wait for its repository.
    On exactly the GPUs the config needs, a server bound first holds them and the Job never runs."""
    cfg = load_config(CONFIGS / name)
    files = copy.deepcopy(k8s.render(cfg))
    server = next(d for d in cluster_check.objects(files) if d["kind"] in ("Deployment", "LeaderWorkerSet"))
    template = server["spec"]["template"] if server["kind"] == "Deployment" else None
    template = template or server["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    gpu_job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "old-build"},
        "spec": {"template": {"spec": copy.deepcopy(template["spec"])}},
    }
    files["old-build.yaml"] = [gpu_job]
    problems = cluster_check.deadlocks(cluster_check.pods(files), cluster_check.smallest_cluster(cfg))
    assert problems and "never get ready" in problems[0]


def test_a_build_that_needs_gpus_runs_in_the_server_pod_on_its_own_gpus():
    """Compiled engines: the build is the server's init container, asking for exactly the pod's GPUs (the
    device plugin hands an init container's devices on to the app container); the Job only downloads."""
    cfg = load_config(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml")
    files = k8s.render(cfg)
    pod = docs(files, "Deployment")[0]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["args"][0] == "build" and gpus(init) == gpus(pod["containers"][0]) == cfg.build.tp * cfg.build.pp
    job = docs(files, "Job")[0]["spec"]["template"]["spec"]["containers"][0]
    assert job["args"][0] == "prepare" and gpus(job) == 0
    fetched = [stages.Fetch.parse(a).repo_id for a in job["args"][1:]]
    assert fetched == [cfg.target.checkpoint, cfg.draft.checkpoint]
    assert init["args"][1:] == job["args"][1:]  # the build waits for exactly what the Job downloads
    # the pods read the downloaded directories, never the hub: the build needs local checkpoints
    config = yaml.safe_load(docs(files, "ConfigMap")[0]["data"]["trtspec.yaml"])
    assert config["target"]["checkpoint"] == str(stages.Fetch.parse(job["args"][1]).local)


@pytest.mark.parametrize("name", ["deepseek-r1-mtp-2x8-h100.yaml", "tiny-draft-target.yaml"])
def test_a_build_that_needs_no_gpu_runs_in_the_job_and_servers_wait(name):
    """A multi-node LLM API group skips the warm-up load (one pod cannot hold it) and the torch backend
    needs no GPU: the Job builds, without GPUs, and the leader (or server) waits for its repository."""
    cfg = load_config(CONFIGS / name)
    assert stages.job_builds(cfg)
    files = k8s.render(cfg)
    server = (docs(files, "Deployment") or docs(files, "LeaderWorkerSet"))[0]["spec"]
    template = server["template"] if "template" in server else server["leaderWorkerTemplate"]["leaderTemplate"]
    (init,) = template["spec"]["initContainers"]
    assert init["args"] == ["wait", *(f.arg for f in stages.fetches(cfg))] and gpus(init) == 0
    if "leaderWorkerTemplate" in server:  # workers only host ranks: nothing to wait for or build
        assert "initContainers" not in server["leaderWorkerTemplate"]["workerTemplate"]["spec"]


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_wait_and_probe_budgets_cover_each_phase_and_the_job_outlives_them(name):
    from trtspec.deploy import sizing

    cfg = load_config(CONFIGS / name)
    files = k8s.render(cfg)
    b = sizing.budgets(cfg)
    server = (docs(files, "Deployment") or docs(files, "LeaderWorkerSet"))[0]["spec"]
    template = server["template"] if "template" in server else server["leaderWorkerTemplate"]["leaderTemplate"]
    main, init = template["spec"]["containers"][0], template["spec"]["initContainers"][0]
    probe = main["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= b.load_s  # loading only: the build is done
    wait_s = int(next(e["value"] for e in init["env"] if e["name"] == "TRTSPEC_WAIT_S"))
    # a waiter outlasts every attempt the Job may make (a failed Job ends the wait sooner, with its reason)
    attempts = k8s.JOB_ATTEMPTS
    assert wait_s == (attempts * b.download_s if init["args"][0] == "build" else k8s.job_deadline_s(b))
    for job in docs(files, "Job"):
        assert job["spec"]["activeDeadlineSeconds"] == attempts * (b.download_s + b.build_s)
        assert job["spec"]["backoffLimit"] == attempts - 1


def test_names_never_collide_with_what_the_controllers_create():
    """LWS (subdomainPolicy Shared) creates a headless Service and a StatefulSet named like itself: our
    Service has its own name; putting it back on the LWS's name is caught."""
    cfg = load_config(CONFIGS / "deepseek-r1-mtp-2x8-h100.yaml")
    files = k8s.render(cfg)
    (lws,) = docs(files, "LeaderWorkerSet")
    (service,) = docs(files, "Service")
    assert service["metadata"]["name"] != lws["metadata"]["name"]
    made = cluster_check.controller_objects(files)
    assert ("Service", lws["metadata"]["name"]) in made and ("StatefulSet", f"{lws['metadata']['name']}-0") in made
    assert cluster_check.name_problems(files) == []
    clash = copy.deepcopy(files)
    docs(clash, "Service")[0]["metadata"]["name"] = lws["metadata"]["name"]
    assert cluster_check.name_problems(clash) == [f"Service {lws['metadata']['name']} is also created by a controller"]
    long = copy.deepcopy(files)
    docs(long, "LeaderWorkerSet")[0]["metadata"]["name"] = "x" * 50
    assert "too long" in cluster_check.name_problems(long)[0]


def test_the_launcher_may_exec_over_websocket_too():
    """kubectl exec over WebSocket (the default since Kubernetes 1.30) is authorized as `get` on pods/exec."""
    files = k8s.render(load_config(CONFIGS / "deepseek-r1-mtp-2x8-h100.yaml"))
    (role,) = docs(files, "Role")
    exec_rule = next(r for r in role["rules"] if r["resources"] == ["pods/exec"])
    assert set(exec_rule["verbs"]) == {"create", "get"}


def test_deploy_check_and_deploy_refuse_what_would_not_come_up(runner, tmp_path):
    good = CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml"
    res = runner.invoke(cli, ["deploy", str(good), "--check"])
    assert res.exit_code == 0, res.output
    assert "come up in every arrival order" in res.output and "error:" not in res.output
    data = yaml.safe_load(good.read_text())
    data["deploy"]["storage"].pop("storage_class")
    bad = tmp_path / "rwx.yaml"
    bad.write_text(yaml.safe_dump(data))
    res = runner.invoke(cli, ["deploy", str(bad), "--check"])
    assert res.exit_code == 1 and "error: the volume is ReadWriteMany" in res.output
    out = tmp_path / "out"
    res = runner.invoke(cli, ["deploy", str(bad), "--out", str(out)])
    assert res.exit_code != 0 and not out.exists()
    assert "ReadWriteMany" in res.output and "Traceback" not in res.output
    assert runner.invoke(cli, ["deploy", str(bad), "--target", "docker", "--out", str(out)]).exit_code == 0


def test_launcher_stages(monkeypatch, tmp_path, capsys):
    """prepare downloads then builds (when the Job builds); build waits for the downloads with a budget."""
    data = yaml.safe_load((CONFIGS / "tiny-draft-target.yaml").read_text())
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("TRTSPEC_CONFIG", str(config))
    calls: list[str] = []
    monkeypatch.setattr(launch, "fetch", lambda items: calls.append(f"fetch {len(items)}"))
    monkeypatch.setattr(launch, "build", lambda cfg, path: calls.append("build") or 0)
    item = f"org/model={tmp_path / 'ckpt'}"
    assert launch.main(["prepare", item]) == 0 and calls == ["fetch 1", "build"]
    monkeypatch.setenv("TRTSPEC_WAIT_S", "0")
    assert launch.main(["build", item]) == 2
    assert "org/model not downloaded after 0s" in capsys.readouterr().err
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / stages.FETCHED_MARKER).write_text("org/model\n")
    calls.clear()
    assert launch.main(["build", item]) == 0 and calls == ["build"]
    assert launch.main(["prepare", "no-equals-sign"]) == 2
    assert "expected HUB_ID=/ABSOLUTE/DIR" in capsys.readouterr().err


def test_waiting_for_several_downloads_takes_one_budget_not_one_each(monkeypatch, tmp_path):
    """TRTSPEC_WAIT_S is the budget of all downloads together: a target that arrives just in time leaves
    the draft the rest of it, not a budget of its own (a fake clock: each poll's sleep moves it on)."""
    monkeypatch.delenv("TRTSPEC_JOB", raising=False)
    budget, clock = 60.0, [0.0]
    target, draft = stages.Fetch("org/target", tmp_path / "target"), stages.Fetch("org/draft", tmp_path / "draft")

    def sleep(seconds: float) -> None:
        clock[0] += seconds
        if clock[0] >= budget - 5:  # the target's download finishes just before the budget is spent
            (tmp_path / "target").mkdir(exist_ok=True)
            (tmp_path / "target" / stages.FETCHED_MARKER).write_text("org/target\n")

    monkeypatch.setattr(launch, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=sleep))
    with pytest.raises(launch.TrtspecError, match="org/draft not downloaded after 60s"):
        launch.wait_for_fetches([target, draft], budget)
    assert (tmp_path / "target" / stages.FETCHED_MARKER).is_file()
    assert clock[0] <= budget + 5 < 2 * budget  # one poll past the one deadline, not a second budget


def test_cluster_config_points_hub_ids_at_the_downloaded_directories():
    cfg = load_config(CONFIGS / "deepseek-r1-mtp-2x8-h100.yaml")
    data = k8s.cluster_config(cfg)
    (item,) = stages.fetches(cfg)
    assert data["target"]["checkpoint"] == str(item.local) and Path(str(item.local)).is_absolute()
    # loading it checks the directory exists, so every launcher command waits for the download first
    with pytest.raises(ConfigError, match="no such checkpoint directory"):
        validate_config(data)


def test_a_failed_prepare_job_ends_the_wait_with_its_reason(monkeypatch, tmp_path, capsys):
    """After the Job's last attempt fails (a 401 on a gated model), the servers' init containers stop with
    its reason instead of waiting out their budget; a marker left by another Job is not theirs."""
    marker = tmp_path / ".trtspec-prepare-failed"
    monkeypatch.setattr(launch, "PREPARE_FAILED", marker)
    monkeypatch.setenv("TRTSPEC_CONFIG", str(CONFIGS / "tiny-draft-target.yaml"))
    monkeypatch.setenv("TRTSPEC_JOB", "demo-prepare-1234")
    monkeypatch.setenv("TRTSPEC_WAIT_S", "0")

    def fail(items):
        raise launch.TrtspecError("downloading org/gated: 401 Client Error")

    monkeypatch.setattr(launch, "fetch", fail)
    monkeypatch.setenv("TRTSPEC_JOB_ATTEMPTS", "2")
    item = f"org/gated={tmp_path / 'gated'}"
    assert launch.main(["prepare", item]) == 2
    assert marker.read_text().startswith("demo-prepare-1234\n1\n")
    assert launch.main(["wait", item]) == 2  # one attempt failed, the Job retries: keep waiting
    assert "not downloaded after 0s" in capsys.readouterr().err
    assert launch.main(["prepare", item]) == 2  # the last attempt fails too
    assert marker.read_text().startswith("demo-prepare-1234\n2\n")
    capsys.readouterr()
    monkeypatch.setenv("TRTSPEC_WAIT_S", "3600")
    assert launch.main(["wait", item]) == 2  # at once, not after an hour
    err = capsys.readouterr().err
    assert "the prepare Job demo-prepare-1234 failed: downloading org/gated: 401" in err
    assert "kubectl delete job demo-prepare-1234" in err
    monkeypatch.setenv("TRTSPEC_JOB", "demo-prepare-5678")  # another config's Job: not this failure
    monkeypatch.setenv("TRTSPEC_WAIT_S", "0")
    assert launch.main(["wait", item]) == 2
    assert "not downloaded after 0s" in capsys.readouterr().err
    monkeypatch.setenv("TRTSPEC_JOB", "demo-prepare-1234")  # fixed and re-run: a success clears the count
    monkeypatch.setattr(launch, "fetch", lambda items: None)
    monkeypatch.setattr(launch, "build", lambda cfg, path: 0)
    assert launch.main(["prepare", item]) == 0 and not marker.exists()


def test_servers_wait_for_the_repository_of_their_own_config(monkeypatch, tmp_path):
    """After a config change the rolled servers find the old repository in place: it records the config it
    was packaged from, and they wait for theirs."""
    from trtspec.repository.package import config_digest_path

    data = yaml.safe_load((CONFIGS / "tiny-draft-target.yaml").read_text())
    data["serve"]["repository"] = str(tmp_path / "repos")
    cfg = validate_config(data)
    repository = tmp_path / "repos" / cfg.name
    repository.mkdir(parents=True)
    config_digest_path(repository).write_text("an-older-config\n")
    with pytest.raises(launch.TrtspecError, match="no model repository of this config after 0s"):
        launch.wait_for_repository(cfg, 0)
    config_digest_path(repository).write_text(cfg.serving_digest() + "\n")
    assert launch.wait_for_repository(cfg, 0) == repository


def test_compiled_engines_stay_on_the_architecture_they_were_built_for():
    """TensorRT engines do not load on another GPU architecture: an H200-built engine may not land on a
    B200 replica, while the LLM API (no engines) may take any GPU that holds the weights."""
    from trtspec.deploy import sizing

    cfg = load_config(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml")
    products = sizing.gpu_products(cfg)
    assert products and {sizing.architecture(p) for p in products} == {"hopper"}
    llmapi = load_config(CONFIGS / "deepseek-r1-mtp-8gpu.yaml")
    assert len({sizing.architecture(p) for p in sizing.gpu_products(llmapi)}) > 1


def test_the_job_tolerates_the_gpu_taint_without_asking_for_gpus():
    """deploy.node_selector applies to the Job too; if it picks tainted GPU nodes, the Job must tolerate
    the taint or it stays Pending while every server waits for it."""
    cfg = load_config(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml")
    job = docs(k8s.render(cfg), "Job")[0]["spec"]["template"]["spec"]
    assert job["tolerations"] == [t.model_dump(exclude_none=True) for t in cfg.deploy.tolerations]
    assert "affinity" not in job and gpus(job["containers"][0]) == 0


def test_fetch_marks_a_finished_download_and_fails_in_one_line(monkeypatch, tmp_path):
    """The marker is written only after huggingface_hub returns, so a build never starts on half a
    checkpoint; a hub error (a 401 on a gated model, a full disk) is one line naming the model."""
    import huggingface_hub

    calls = []

    def download(repo_id, local_dir, ignore_patterns):
        calls.append((repo_id, ignore_patterns))
        Path(local_dir).mkdir(parents=True)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    item = stages.Fetch("org/model", tmp_path / "org--model")
    launch.fetch([item])
    assert (tmp_path / "org--model" / stages.FETCHED_MARKER).read_text() == "org/model\n"
    assert calls == [("org/model", ["original/*"])]
    launch.fetch([item])  # done: not downloaded again
    assert len(calls) == 1

    def refused(repo_id, local_dir, ignore_patterns):
        raise OSError("401 Client Error: Unauthorized for url: https://huggingface.co/api/models/org/gated\nmore")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refused)
    gated = stages.Fetch("org/gated", tmp_path / "org--gated")
    with pytest.raises(launch.TrtspecError) as err:
        launch.fetch([gated])
    assert (
        str(err.value)
        == "downloading org/gated: 401 Client Error: Unauthorized for url: https://huggingface.co/api/models/org/gated"
    )
    assert not (tmp_path / "org--gated" / stages.FETCHED_MARKER).exists()
