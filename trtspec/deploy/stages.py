"""Where each stage of a cluster deployment runs, so that the stages cannot deadlock on GPUs.

A server pod holds its GPUs from the moment it is bound, however long it waits. So nothing a server
waits for may ask for GPUs of its own: downloads run in a Job that holds none, and a build that needs
a GPU (compiling engines, the LLM API's warm-up load) runs as an init container of the server pod
itself (the leader of a group), on the GPUs that pod already holds. A build that needs none
(packaging, trtspec's torch backend, an LLM API group too large for one pod's warm-up) runs in the
Job after the downloads, and the servers wait for its repository.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trtspec.build.builder import warm_up_fits_one_host
from trtspec.config import DeploymentConfig
from trtspec.deploy.topology import WORKSPACE

CHECKPOINTS = WORKSPACE / "checkpoints"
FETCHED_MARKER = ".trtspec-fetched"  # written into a checkpoint directory once its download completed
PREPARE_FAILED = Path(os.environ.get("TRTSPEC_WORKSPACE", str(WORKSPACE))) / ".trtspec-prepare-failed"


@dataclass(frozen=True)
class Fetch:
    """A hub checkpoint and the directory on the volume it is downloaded into."""

    repo_id: str
    local: PurePosixPath

    @property
    def arg(self) -> str:  # how the launcher takes it on its command line
        return f"{self.repo_id}={self.local}"

    @classmethod
    def parse(cls, arg: str) -> Fetch:
        repo_id, sep, local = arg.partition("=")
        if not sep or not repo_id or not local.startswith("/"):
            raise ValueError(f"expected HUB_ID=/ABSOLUTE/DIR, got {arg!r}")
        return cls(repo_id, PurePosixPath(local))


def fetches(cfg: DeploymentConfig) -> list[Fetch]:
    """The config's hub checkpoints (target, draft), each into its own directory on the volume."""
    out = []
    for role in ("target", "draft"):
        section = getattr(cfg, role)
        if section is None or cfg.checkpoint_path(section) is not None:
            continue  # embedded, or a local directory the README step copies onto the volume
        out.append(Fetch(section.checkpoint, CHECKPOINTS / section.checkpoint.replace("/", "--")))
    return out


def build_needs_gpu(cfg: DeploymentConfig) -> bool:
    """Compiling engines needs the GPUs; so does the LLM API's warm-up load where one pod can hold it."""
    if cfg.build.backend == "tensorrt":
        return True
    return cfg.build.backend == "pytorch" and warm_up_fits_one_host(cfg)


def job_builds(cfg: DeploymentConfig) -> bool:
    return not build_needs_gpu(cfg)


def needs_job(cfg: DeploymentConfig) -> bool:
    """A Job runs when there is something to download or a build that needs no GPU."""
    return bool(fetches(cfg)) or job_builds(cfg)
