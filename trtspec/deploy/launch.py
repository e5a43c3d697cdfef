"""The in-container launcher: `entrypoint.sh prepare|build|wait|serve|all|leader|worker` lands here.

Which stage runs where (and why that cannot deadlock on GPUs) is trtspec/deploy/stages.py's.

tritonserver command lines follow TensorRT-LLM's triton_backend/scripts/launch_triton_server.py
(https://github.com/NVIDIA/TensorRT-LLM/blob/main/triton_backend/scripts/launch_triton_server.py):
one `-n 1 tritonserver ... :` block per MPI rank, ranks
other than 0 loading only the TensorRT-LLM models in explicit mode, a python-backend shared-memory
prefix per rank, and `trtllm-llmapi-launch` in front of each rank for the LLM API flavour. Compiled
draft-target engines run in orchestrator mode (`--multi-model`), which spawns its own workers and
only works on one node. A multi-node group starts its ranks over `kubessh` (`kubectl exec`), as
NVIDIA's LeaderWorkerSet guide does. One rank on one node is plain `trtspec serve`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from trtspec.config import DeploymentConfig, load_config
from trtspec.deploy.stages import FETCHED_MARKER, PREPARE_FAILED, Fetch, job_builds
from trtspec.deploy.topology import CONFIG_PATH, orchestrated, topology
from trtspec.errors import TrtspecError, UsageError
from trtspec.modes import get_mode
from trtspec.serve.server import ALL_INTERFACES, Ports

TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"


def trtllm_model_names(cfg: DeploymentConfig) -> list[str]:
    """The models ranks other than 0 load: TensorRT-LLM's own, in the repository contract's names."""
    if cfg.serve.flavour == "llmapi":
        return ["tensorrt_llm"]
    return ["tensorrt_llm", "tensorrt_llm_draft"] if get_mode(cfg.mode).draft_engine else ["tensorrt_llm"]


def rank_argv(
    rank: int, repository: Path, ports: Ports, models: Sequence[str], llmapi: bool, binary: str = TRITONSERVER
) -> list[str]:
    """One rank's block of launch_triton_server.py's mpirun command, without the trailing ':'."""
    argv = ["-n", "1", *(["trtllm-llmapi-launch"] if llmapi else []), binary, f"--model-repository={repository}"]
    if rank != 0:
        argv.append("--model-control-mode=explicit")
        argv += [f"--load-model={name}" for name in models]
    argv += [
        f"--grpc-address={ports.host}",
        f"--grpc-port={ports.grpc}",
        f"--http-address={ports.host}",
        f"--http-port={ports.http}",
        f"--metrics-address={ports.host}",
        f"--metrics-port={ports.metrics}",
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
    ]
    # trtspec's one addition: the TTFT histogram (nv_inference_first_response_histogram_ms) the dashboard reads
    if rank == 0:
        argv.append("--metrics-config=histogram_latencies=true")
    return argv


def mpirun_argv(
    cfg: DeploymentConfig, repository: Path, ports: Ports, hosts: Sequence[str] = (), binary: str = TRITONSERVER
) -> list[str]:
    """mpirun over every rank; `hosts` (pod names, leader first) makes it multi-node over kubessh."""
    topo = topology(cfg)
    argv = ["mpirun", "--allow-run-as-root"]
    if hosts:
        slots = ",".join(f"{h}:{topo.gpus_per_pod}" for h in hosts)
        argv += ["--report-bindings", "-mca", "plm_rsh_agent", "kubessh", "--host", slots]
    # trtllm-llmapi-launch only across nodes: on one node the LLM API spawns its own workers, and NVIDIA's
    # documented single-node launch (launch_triton_server.py --model_repo=...) does not add it.
    models, llmapi = trtllm_model_names(cfg), cfg.serve.flavour == "llmapi" and topo.multi_node
    for rank in range(topo.mpi_ranks):
        argv += [*rank_argv(rank, repository, ports, models, llmapi, binary), ":"]
    return argv[:-1]


def orchestrator_argv(cfg: DeploymentConfig, repository: Path, ports: Ports, binary: str = TRITONSERVER) -> list[str]:
    """launch_triton_server.py --multi-model (spawning on): one rank under mpirun, no per-GPU CUDA pools;
    its workers are spawned with MPI_Comm_spawn, which is why mpirun stays in front."""
    gpus = topology(cfg).gpus_per_pod
    argv = ["mpirun", "--allow-run-as-root", *rank_argv(0, repository, ports, trtllm_model_names(cfg), False, binary)]
    argv += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"]
    argv += [f"--cuda-memory-pool-byte-size={j}:0" for j in range(gpus)]
    return argv


ORCHESTRATOR_ENV = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}


def serve_host() -> str:
    """Inside a container the ports must be reachable from outside it: all interfaces, explicitly (the
    manifests and the compose file also set TRTSPEC_SERVE_HOST=0.0.0.0), where `trtspec serve` run on a
    machine binds loopback only."""
    return os.environ.get("TRTSPEC_SERVE_HOST") or ALL_INTERFACES


def _ports(cfg: DeploymentConfig) -> Ports:
    return Ports(cfg.serve.http_port, cfg.serve.grpc_port, cfg.serve.metrics_port, host=serve_host())


def _repository(cfg: DeploymentConfig) -> Path:
    from trtspec.repository.package import repository_dir_for

    return repository_dir_for(cfg)


def _failures() -> tuple[int, str]:
    """How often this pod's prepare Job (TRTSPEC_JOB) has failed, and its last reason (0 if never)."""
    job = os.environ.get("TRTSPEC_JOB")
    try:
        name, count, message = PREPARE_FAILED.read_text(encoding="utf-8").split("\n", 2)
        return (int(count), message.strip()) if job and name == job else (0, "")
    except (OSError, ValueError):
        return 0, ""


def _prepare_failed() -> str | None:
    """The prepare Job's reason once its last attempt (TRTSPEC_JOB_ATTEMPTS) has failed; None before."""
    count, message = _failures()
    if count < _env_number("TRTSPEC_JOB_ATTEMPTS", 1, int) or not count:
        return None
    job = os.environ.get("TRTSPEC_JOB")
    return f"the prepare Job {job} failed: {message}; fix it, `kubectl delete job {job}` and apply again"


def _wait(ready: Callable[[], bool], timeout: float, late: str, deadline: float | None = None) -> None:
    """Poll until `ready`; a failed prepare Job ends the wait at once, with its reason, not at the deadline.
    `deadline` (time.monotonic()) is one that several waits share; by default `timeout` from now."""
    if deadline is None:
        deadline = time.monotonic() + timeout
    while not ready():
        if (failed := _prepare_failed()) is not None:
            raise TrtspecError(failed)
        if time.monotonic() > deadline:
            raise TrtspecError(f"{late} after {timeout:.0f}s (is the prepare Job done?)")
        time.sleep(5)


def _repository_current(repository: Path, cfg: DeploymentConfig) -> bool:
    from trtspec.repository.package import config_digest_path

    try:
        recorded = config_digest_path(repository).read_text(encoding="utf-8").strip()
        return recorded == cfg.serving_digest() and repository.is_dir()
    except OSError:
        return False


def wait_for_repository(cfg: DeploymentConfig, timeout: float) -> Path:
    """The prepare Job (or a build init container) writes the repository; whoever waits must not crash-loop.
    `trtspec package` renames a finished staging directory into place, so existing means complete; it
    records the config it serves, so after a config change the servers wait for the new one."""
    repository = _repository(cfg)
    _wait(lambda: _repository_current(repository, cfg), timeout, f"{repository}: no model repository of this config")
    return repository


def fetch(items: Sequence[Fetch]) -> None:
    """Download hub checkpoints into the volume (resumable: huggingface_hub skips finished files); the
    marker says a directory is complete, so a build never starts on half a checkpoint."""
    from huggingface_hub import snapshot_download

    for item in items:
        local = Path(item.local)
        if (local / FETCHED_MARKER).is_file():
            continue
        print(f"trtspec launcher: downloading {item.repo_id} into {local}", file=sys.stderr, flush=True)
        try:
            # Llama repositories also carry the original (consolidated) weights: not what anything here loads
            snapshot_download(item.repo_id, local_dir=str(local), ignore_patterns=["original/*"])
            (local / FETCHED_MARKER).write_text(item.repo_id + "\n", encoding="utf-8")
        except Exception as exc:  # hub, network and disk errors alike: one line, and the Job retries
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise TrtspecError(f"downloading {item.repo_id}: {first}") from None


def wait_for_fetches(items: Sequence[Fetch], timeout: float) -> None:
    """A build in the server pod waits for the Job's downloads (it holds its GPUs meanwhile, but the
    Job needs none, so it always gets to run). One deadline for all of them: `timeout` is the budget of
    the whole download, not of each checkpoint in turn."""
    deadline = time.monotonic() + timeout
    for item in items:
        marker = Path(item.local) / FETCHED_MARKER
        _wait(marker.is_file, timeout, f"{item.repo_id} not downloaded", deadline)


def prepare(items: Sequence[Fetch], config_path: Path) -> int:
    """The Job: downloads, then the build where it needs no GPU. Each failed attempt is counted where the
    waiting pods read it; after the last one they stop with its reason instead of waiting out their
    budget (and a success clears the count)."""
    job = os.environ.get("TRTSPEC_JOB", "")
    try:
        fetch(items)
        cfg = load_config(config_path)
        code = build(cfg, config_path) if job_builds(cfg) else 0
        if code:
            raise TrtspecError(f"trtspec build exited {code} (see this Job's log)")
        if job and _failures()[0]:
            PREPARE_FAILED.unlink(missing_ok=True)
        return 0
    except TrtspecError as exc:
        if job:
            with contextlib.suppress(OSError):
                PREPARE_FAILED.write_text(f"{job}\n{_failures()[0] + 1}\n{exc}\n", encoding="utf-8")
        raise


def build(cfg: DeploymentConfig, config_path: Path) -> int:
    """`trtspec build` is resumable and a no-op when nothing changed, so a restarted pod is safe; replicas
    that start together on one volume take turns (--wait) instead of failing."""
    return subprocess.call([sys.executable, "-m", "trtspec", "build", str(config_path), "--wait"])


def serve_argv(cfg: DeploymentConfig, config_path: Path, repository: Path, load_s: float) -> tuple[list[str], dict]:
    """NVIDIA's backends start as launch_triton_server.py starts them (under mpirun, even one rank);
    trtspec's torch backend, which needs no MPI, through `trtspec serve` (it finds the wheel's server)."""
    if orchestrated(cfg):
        return orchestrator_argv(cfg, repository, _ports(cfg)), ORCHESTRATOR_ENV
    if cfg.build.backend != "torch":
        return mpirun_argv(cfg, repository, _ports(cfg)), {}
    argv = [sys.executable, "-m", "trtspec", "serve", str(config_path), "--host", serve_host()]
    return [*argv, "--timeout", str(int(load_s))], {}


def _exec(argv: list[str], env: dict[str, str]) -> int:
    try:
        os.execvpe(argv[0], argv, {**os.environ, **env})
    except OSError as exc:
        raise TrtspecError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
    return 0  # not reached


def serve(cfg: DeploymentConfig, config_path: Path, wait_s: float) -> int:
    if topology(cfg).multi_node:
        raise UsageError("this deployment spans nodes: run `leader` in the leader pod and `worker` in the others")
    repository = wait_for_repository(cfg, wait_s)
    return _exec(*serve_argv(cfg, config_path, repository, wait_s))


def worker_pods(leader_pod: str, group_size: int) -> list[str]:
    """LeaderWorkerSet names a group's pods <lws>-<group> (leader) and <lws>-<group>-<i>, i = 1..size-1."""
    return [leader_pod, *(f"{leader_pod}-{i}" for i in range(1, group_size))]


def _running_pods(group_key: str) -> int:
    argv = ["kubectl", "get", "pods", "-l", f"{GROUP_KEY_LABEL}={group_key}",
            "--field-selector=status.phase=Running", "--no-headers", "-o", "name"]  # fmt: skip
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TrtspecError(f"kubectl get pods failed: {exc}") from None
    if out.returncode:  # RBAC "forbidden" must say so, not wait an hour
        lines = out.stderr.strip().splitlines() or ["no output"]
        raise TrtspecError(f"kubectl get pods failed: {lines[-1]}")
    return len([ln for ln in out.stdout.splitlines() if ln.strip()])


def leader(cfg: DeploymentConfig, wait_s: float) -> int:
    """Wait until every pod of the group runs, then start all ranks from here (rank 0 serves)."""
    topo = topology(cfg)
    size = _env_number("LWS_GROUP_SIZE", topo.pods_per_replica, int)
    if size != topo.pods_per_replica:
        raise UsageError(f"LWS_GROUP_SIZE is {size} but tp x pp / gpus_per_node is {topo.pods_per_replica}")
    group_key, pod = os.environ.get("GROUP_KEY"), os.environ.get("HOSTNAME")
    if not group_key or not pod:
        raise UsageError("leader needs GROUP_KEY and HOSTNAME (set by the LeaderWorkerSet manifest trtspec renders)")
    deadline = time.monotonic() + wait_s
    while (running := _running_pods(group_key)) < size:
        if time.monotonic() > deadline:
            raise TrtspecError(f"only {running} of {size} pods of the group running after {wait_s:.0f}s")
        time.sleep(5)
    repository = wait_for_repository(cfg, wait_s)
    return _exec(mpirun_argv(cfg, repository, _ports(cfg), hosts=worker_pods(pod, size)), {})


def _env_number(name: str, default, kind):
    raw = os.environ.get(name)
    try:
        return default if raw is None else kind(raw)
    except ValueError:
        raise UsageError(f"{name} must be a number, got {raw!r}") from None


def worker() -> int:
    """Workers only host ranks that the leader starts through kubessh; they wait for SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


COMMANDS = ("prepare", "build", "wait", "serve", "all", "leader", "worker")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command, rest = (args[0], args[1:]) if args else ("all", [])
    config_path = Path(os.environ.get("TRTSPEC_CONFIG", str(CONFIG_PATH)))
    if command == "worker":
        return worker()
    if command not in COMMANDS:
        print(f"trtspec launcher: unknown command {command!r} ({', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    try:
        wait_s = _env_number("TRTSPEC_WAIT_S", 3600.0, float)
        items = [Fetch.parse(arg) for arg in rest]
        if command == "prepare":
            return prepare(items, config_path)
        # the config names the downloaded directories, and loading it checks that they exist
        started = time.monotonic()
        wait_for_fetches(items, wait_s)
        cfg = load_config(config_path)
        if command == "wait":  # a server's init container while the Job builds: one budget for both waits
            wait_for_repository(cfg, max(wait_s - (time.monotonic() - started), 0.0))
            return 0
        if command in {"build", "all"}:  # a server's init container where the build needs its GPUs
            code = build(cfg, config_path)
            if code or command == "build":
                return code
        if command == "leader":
            return leader(cfg, wait_s)
        return serve(cfg, config_path, wait_s)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TrtspecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
