"""Find a tritonserver binary and the python backend it needs.

In NVIDIA's containers tritonserver is on PATH (or under /opt/tritonserver). On a CPU machine the
nvidia-pytriton wheel carries one, with a python-backend stub per Python version; the stub for the
running interpreter must be copied into backends/python and LD_LIBRARY_PATH must point at this
interpreter's libpython, or the stub loads the system's and imports fail (undefined symbol errors).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

CONTAINER_BINARY = Path("/opt/tritonserver/bin/tritonserver")


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    source: str  # "PATH", "container" or "nvidia-pytriton"
    backends_dir: Path | None  # the wheel's backends; None means the binary's own default
    python_stub: Path | None  # the wheel's stub for this Python, to copy into backends/python
    libpython_dir: str | None  # goes on LD_LIBRARY_PATH for the stub
    bundled_libs: str | None = None  # the wheel's vendored shared libraries (the stub links libcudart from there)


def _pytriton_root() -> Path | None:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def find_tritonserver() -> TritonInstall | None:
    """PATH first (a container or a system install), then the nvidia-pytriton wheel."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(Path(on_path), "PATH", None, None, None)
    if CONTAINER_BINARY.is_file():
        return TritonInstall(CONTAINER_BINARY, "container", None, None, None)
    root = _pytriton_root()
    if root is None or not (root / "bin" / "tritonserver").is_file():
        return None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    return TritonInstall(
        binary=root / "bin" / "tritonserver",
        source="nvidia-pytriton",
        backends_dir=root / "backends",
        python_stub=stub if stub.is_file() else None,
        libpython_dir=sysconfig.get_config_var("LIBDIR"),
        bundled_libs=str(root.parents[1] / "nvidia_pytriton.libs"),
    )
