"""The in-container launcher: `entrypoint.sh build|serve|all|leader|worker` lands here.

tritonserver command lines follow TensorRT-LLM's scripts/launch_triton_server.py (shared reference,
triton-model-repository-and-k8s.md §1.12): one `-n 1 tritonserver ... :` block per MPI rank, ranks
other than 0 loading only the TensorRT-LLM models in explicit mode, a python-backend shared-memory
prefix per rank, and `trtllm-llmapi-launch` in front of each rank for the LLM API flavour. Compiled
draft-target engines run in orchestrator mode (`--multi-model`), which spawns its own workers and
only works on one node. A multi-node group starts its ranks over `kubessh` (`kubectl exec`), as
NVIDIA's LeaderWorkerSet guide does. One rank on one node is plain `trtspec serve`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from trtspec.config import DeploymentConfig, load_config
from trtspec.deploy.topology import CONFIG_PATH, orchestrated, topology
from trtspec.errors import TrtspecError, UsageError
from trtspec.serve.server import Ports

TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"


def trtllm_model_names(cfg: DeploymentConfig) -> list[str]:
    """The models ranks other than 0 load: TensorRT-LLM's own, in the repository contract's names."""
    if cfg.serve.flavour == "llmapi":
        return ["tensorrt_llm"]
    return ["tensorrt_llm", "tensorrt_llm_draft"] if cfg.mode == "draft-target" else ["tensorrt_llm"]


def rank_argv(
    rank: int, repository: Path, ports: Ports, models: Sequence[str], llmapi: bool, binary: str = TRITONSERVER
) -> list[str]:
    """One rank's block of launch_triton_server.py's mpirun command, without the trailing ':'."""
    argv = ["-n", "1", *(["trtllm-llmapi-launch"] if llmapi else []), binary, f"--model-repository={repository}"]
    if rank != 0:
        argv.append("--model-control-mode=explicit")
        argv += [f"--load-model={name}" for name in models]
    argv += [
        f"--grpc-port={ports.grpc}",
        f"--http-port={ports.http}",
        f"--metrics-port={ports.metrics}",
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
    ]
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
    models, llmapi = trtllm_model_names(cfg), cfg.serve.flavour == "llmapi"
    for rank in range(topo.mpi_ranks):
        argv += [*rank_argv(rank, repository, ports, models, llmapi, binary), ":"]
    return argv[:-1]


def orchestrator_argv(cfg: DeploymentConfig, repository: Path, ports: Ports, binary: str = TRITONSERVER) -> list[str]:
    """launch_triton_server.py --multi-model (spawning on): one tritonserver, no per-GPU CUDA pools."""
    gpus = topology(cfg).gpus_per_pod
    argv = rank_argv(0, repository, ports, trtllm_model_names(cfg), False, binary)[2:]  # no "-n 1"
    argv += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"]
    argv += [f"--cuda-memory-pool-byte-size={j}:0" for j in range(gpus)]
    return argv


ORCHESTRATOR_ENV = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}


def _ports(cfg: DeploymentConfig) -> Ports:
    return Ports(cfg.serve.http_port, cfg.serve.grpc_port, cfg.serve.metrics_port)


def _repository(cfg: DeploymentConfig) -> Path:
    from trtspec.repository.package import repository_dir_for

    return repository_dir_for(cfg)


def wait_for_repository(cfg: DeploymentConfig, timeout: float) -> Path:
    """The build Job writes the repository; serving pods may start first and must wait, not crash-loop.
    `trtspec package` renames a finished staging directory into place, so existing means complete."""
    repository = _repository(cfg)
    deadline = time.monotonic() + timeout
    while not repository.is_dir():
        if time.monotonic() > deadline:
            raise TrtspecError(f"{repository}: no model repository after {timeout:.0f}s (has the build Job finished?)")
        time.sleep(5)
    return repository


def build(cfg: DeploymentConfig, config_path: Path) -> int:
    """`trtspec build` is resumable and a no-op when nothing changed, so a restarted Job is safe."""
    return subprocess.call([sys.executable, "-m", "trtspec", "build", str(config_path)])


def serve(cfg: DeploymentConfig, config_path: Path, wait_s: float) -> int:
    topo = topology(cfg)
    if topo.multi_node:
        raise UsageError("this deployment spans nodes: run `leader` in the leader pod and `worker` in the others")
    repository = wait_for_repository(cfg, wait_s)
    if orchestrated(cfg):
        argv = orchestrator_argv(cfg, repository, _ports(cfg))
        os.execvpe(argv[0], argv, {**os.environ, **ORCHESTRATOR_ENV})
    if topo.mpi_ranks > 1:
        argv = mpirun_argv(cfg, repository, _ports(cfg))
        os.execvp(argv[0], argv)
    argv = [sys.executable, "-m", "trtspec", "serve", str(config_path)]
    os.execv(argv[0], argv)  # trtspec serve stops tritonserver cleanly on SIGTERM
    return 0  # not reached


def worker_pods(leader_pod: str, group_size: int) -> list[str]:
    """LeaderWorkerSet names a group's pods <lws>-<group> (leader) and <lws>-<group>-<i>, i = 1..size-1."""
    return [leader_pod, *(f"{leader_pod}-{i}" for i in range(1, group_size))]


def _running_workers(group_key: str) -> int:
    out = subprocess.run(
        [
            "kubectl",
            "get",
            "pods",
            "-l",
            f"{GROUP_KEY_LABEL}={group_key}",
            "--field-selector=status.phase=Running",
            "--no-headers",
            "-o",
            "name",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return len([ln for ln in out.stdout.splitlines() if ln.strip()])


def leader(cfg: DeploymentConfig, wait_s: float) -> int:
    """Wait until every pod of the group runs, then start all ranks from here (rank 0 serves)."""
    topo = topology(cfg)
    size = int(os.environ.get("LWS_GROUP_SIZE", topo.pods_per_replica))
    if size != topo.pods_per_replica:
        raise UsageError(f"LWS_GROUP_SIZE is {size} but tp x pp / gpus_per_node is {topo.pods_per_replica}")
    group_key = os.environ.get("GROUP_KEY", "")
    deadline = time.monotonic() + wait_s
    while _running_workers(group_key) < size:
        if time.monotonic() > deadline:
            raise TrtspecError(f"only {_running_workers(group_key)} of {size} pods running after {wait_s:.0f}s")
        time.sleep(5)
    repository = wait_for_repository(cfg, wait_s)
    argv = mpirun_argv(cfg, repository, _ports(cfg), hosts=worker_pods(os.environ["HOSTNAME"], size))
    os.execvp(argv[0], argv)
    return 0  # not reached


def worker() -> int:
    """Workers only host ranks that the leader starts through kubessh; they wait for SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "all"
    config_path = Path(os.environ.get("TRTSPEC_CONFIG", str(CONFIG_PATH)))
    wait_s = float(os.environ.get("TRTSPEC_WAIT_S", "3600"))
    if command == "worker":
        return worker()
    if command not in {"build", "serve", "all", "leader"}:
        print(f"trtspec launcher: unknown command {command!r} (build, serve, all, leader, worker)", file=sys.stderr)
        return 2
    try:
        cfg = load_config(config_path)
        if command in {"build", "all"}:
            code = build(cfg, config_path)
            if code or command == "build":
                return code
        if command == "leader":
            return leader(cfg, wait_s)
        return serve(cfg, config_path, wait_s)
    except TrtspecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
