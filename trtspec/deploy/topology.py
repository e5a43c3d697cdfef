"""How a config's parallelism maps onto pods, nodes and MPI ranks.

One place decides this so that the manifests, the compose file and the in-container launcher can
never disagree about how many GPUs a pod asks for or how many ranks the leader starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from trtspec import __version__
from trtspec.config import DeploymentConfig
from trtspec.modes import get_mode
from trtspec.versions import container_tag

# Inside every container trtspec starts: the config, and the volume holding engines and repository.
CONFIG_PATH = PurePosixPath("/etc/trtspec/trtspec.yaml")
WORKSPACE = PurePosixPath("/workspace")
IMAGE_REPOSITORY = "trtspec"  # what docs/deploying.md and the compose file tag the builds as


@dataclass(frozen=True)
class Topology:
    world_size: int  # tp x pp: GPUs one model replica needs
    gpus_per_pod: int  # 0 on the CPU variant
    pods_per_replica: int  # > 1: a LeaderWorkerSet group
    mpi_ranks: int  # tritonserver processes the launcher starts (1: plain tritonserver)
    cpu_only: bool

    @property
    def multi_node(self) -> bool:
        return self.pods_per_replica > 1


def orchestrated(cfg: DeploymentConfig) -> bool:
    """Compiled draft + target engines: NVIDIA launches them with --multi-model (orchestrator mode),
    one tritonserver that spawns the engines' workers itself, on one node only."""
    return cfg.serve.flavour == "engine" and get_mode(cfg.mode).draft_engine and cfg.build.backend == "tensorrt"


def topology(cfg: DeploymentConfig) -> Topology:
    """Compiled engines need one tritonserver rank per GPU (leader mode) unless orchestrated; the LLM API
    spawns its own workers on one node, and needs ranks (under trtllm-llmapi-launch) only across nodes."""
    world = cfg.build.tp * cfg.build.pp
    cpu_only = cfg.build.backend == "torch" and cfg.build.device == "cpu"
    if cpu_only:
        return Topology(world, 0, 1, 1, True)
    per_node = cfg.deploy.gpus_per_node
    pods = max(1, world // per_node) if world > per_node else 1
    gpus = per_node if pods > 1 else world
    leader_mode = cfg.serve.flavour == "engine" and not orchestrated(cfg)
    ranks = world if (leader_mode or pods > 1) else 1
    return Topology(world, gpus, pods, ranks, False)


def image_for(cfg: DeploymentConfig) -> str:
    """The image the pods run: the config's, else trtspec's build on the matching Triton release.
    Tags are fixed (never `latest`) so a rollout is reproducible."""
    if cfg.deploy.image:
        return cfg.deploy.image
    if topology(cfg).cpu_only:
        return f"{IMAGE_REPOSITORY}:{__version__}-cpu"
    return f"{IMAGE_REPOSITORY}:{__version__}-triton{container_tag(cfg.build.tensorrt_llm_version)}"
