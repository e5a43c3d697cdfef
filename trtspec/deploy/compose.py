"""A compose file for one GPU host (or the CPU variant): a one-shot build service, then the server.

The images are built from a trtspec source checkout (docker/Dockerfile, docker/Dockerfile.cpu); the
Triton release in the tag follows build.tensorrt_llm_version, like the Kubernetes manifests.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import trtspec
from trtspec.config import DeploymentConfig
from trtspec.deploy.k8s import HF_TOKEN_DIR, local_checkpoints
from trtspec.deploy.sizing import quantity_bytes, shm_size
from trtspec.deploy.topology import CONFIG_PATH, WORKSPACE, image_for, topology
from trtspec.errors import UsageError
from trtspec.versions import container_tag

WORKSPACE_DIR = "workspace"  # beside compose.yaml: the volume its build writes engines and the repository into


def source_root() -> Path:
    """The checkout the images build from: Dockerfiles copy trtspec's sources, not an installed wheel."""
    root = Path(trtspec.__file__).resolve().parents[1]
    if not (root / "docker" / "Dockerfile").is_file():
        raise UsageError(f"--target docker needs a trtspec source checkout (no docker/Dockerfile under {root})")
    return root


def compose_bytes(quantity: str) -> int:
    """A Kubernetes quantity (validated by the config) as the byte count compose's shm_size takes."""
    return int(quantity_bytes(quantity))


def compose(cfg: DeploymentConfig, out: Path) -> dict[str, Any]:
    topo = topology(cfg)
    root = source_root()
    build: dict[str, Any] = {
        "context": os.path.relpath(root, out.resolve()),
        "dockerfile": "docker/Dockerfile.cpu" if topo.cpu_only else "docker/Dockerfile",
    }
    if not topo.cpu_only:
        build["args"] = {"TRITON_TAG": container_tag(cfg.build.tensorrt_llm_version)}
    volumes = [f"./{CONFIG_PATH.name}:{CONFIG_PATH}:ro", f"./{WORKSPACE_DIR}:{WORKSPACE}"]
    volumes += [f"{local}:{inside}:ro" for moved in local_checkpoints(cfg).values() for local, inside in moved.items()]
    common: dict[str, Any] = {
        "image": image_for(cfg),
        "volumes": volumes,
        "environment": {"TRTSPEC_CONFIG": str(CONFIG_PATH), "TRTSPEC_HTTP_PORT": str(cfg.serve.http_port)},
        "shm_size": compose_bytes(shm_size(cfg)),  # the manifests' size: derived from the same memory limit
    }
    if not topo.cpu_only:
        devices = [{"driver": "nvidia", "count": topo.gpus_per_pod, "capabilities": ["gpu"]}]
        common["deploy"] = {"resources": {"reservations": {"devices": devices}}}
        common["ulimits"] = {"memlock": -1, "stack": 67108864}  # NVIDIA's docker run flags
    secrets: dict[str, Any] = {}
    if cfg.deploy.hf_token_secret:
        common["secrets"] = [{"source": "hf_token", "target": f"{HF_TOKEN_DIR}/token"}]
        common["environment"]["HF_TOKEN_PATH"] = f"{HF_TOKEN_DIR}/token"
        secrets["hf_token"] = {"file": "./hf_token"}
    s = cfg.serve
    services = {
        "build": {**copy.deepcopy(common), "build": build, "command": ["build"], "restart": "no"},
        "triton": {
            **copy.deepcopy(common),
            "command": ["serve"],
            # the server binds all interfaces inside the container; the host publishes on loopback only
            "environment": {**common["environment"], "TRTSPEC_SERVE_HOST": "0.0.0.0"},
            "ports": [f"127.0.0.1:{p}:{p}" for p in (s.http_port, s.grpc_port, s.metrics_port)],
            "depends_on": {"build": {"condition": "service_completed_successfully"}},
            "restart": "unless-stopped",
        },
    }
    doc: dict[str, Any] = {"name": cfg.name, "services": services}
    if secrets:
        doc["secrets"] = secrets
    return doc
