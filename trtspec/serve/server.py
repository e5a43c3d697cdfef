"""Start, wait for and stop a real tritonserver on a model repository.

With the nvidia-pytriton wheel, the python backend needs this interpreter's stub copied into
backends/python and LD_LIBRARY_PATH on this interpreter's libpython (the stub must load it); PYTHONPATH
carries this environment's site-packages so trtspec's python models import trtspec and torch.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from trtspec.errors import TrtspecError, UsageError
from trtspec.serve.locate import TritonInstall, find_tritonserver


@dataclass
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002


@dataclass
class Server:
    process: subprocess.Popen
    ports: Ports
    log: Path
    workdir: Path | None

    @property
    def http_url(self) -> str:
        return f"localhost:{self.ports.http}"

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (tritonserver unloads models and exits), then SIGKILL if it does not."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.process.returncode


def free_ports(count: int) -> list[int]:
    """Distinct free ports: every socket stays bound until all are chosen, so none repeats."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def backends_for(install: TritonInstall, workdir: Path) -> Path | None:
    """A backends/ tree whose python backend has the stub for this Python (the wheel ships one per version)."""
    if install.backends_dir is None:
        return None
    if install.python_stub is None:
        raise UsageError(f"nvidia-pytriton has no python backend stub for Python {sys.version_info[:2]}")
    backends = workdir / "backends"
    shutil.copytree(install.backends_dir, backends, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(install.python_stub, backends / "python" / "triton_python_backend_stub")
    return backends


def server_env(install: TritonInstall) -> dict[str, str]:
    env = dict(os.environ)
    libs = (install.libpython_dir, install.bundled_libs, env.get("LD_LIBRARY_PATH"))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in libs if p)
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", str(max(1, os.cpu_count() or 1)))
    return env


def start_server(repository: Path, ports: Ports, log: Path) -> Server:
    install = find_tritonserver()
    if install is None:
        raise UsageError("no tritonserver found: install trtspec with the server extra (pip install 'trtspec[server]')")
    if not repository.is_dir():
        raise UsageError(f"{repository}: no such model repository (run `trtspec package` first)")
    workdir = Path(tempfile.mkdtemp(prefix="trtspec-triton-")) if install.backends_dir else None
    argv = [
        str(install.binary),
        f"--model-repository={repository.resolve()}",
        "--model-control-mode=none",
        f"--http-port={ports.http}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-port={ports.metrics}",
        "--exit-timeout-secs=10",
    ]
    if workdir is not None:
        argv.append(f"--backend-directory={backends_for(install, workdir)}")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as fh:
        process = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=server_env(install))
    return Server(process, ports, log, workdir)


def load_errors(log: Path) -> str:
    """The server's own words on why it did not come up: failed model loads first, else its last line."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.exists() else []
    failed = [ln for ln in lines if "failed to load" in ln or "UNAVAILABLE" in ln or "error:" in ln.lower()]
    picked = failed or lines[-1:]
    return " | ".join(ln.strip() for ln in picked[:3]) or "no output"


def wait_ready(server: Server, timeout: float = 180.0) -> None:
    url = f"http://{server.http_url}/v2/health/ready"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.process.poll() is not None:
            server.stop()
            raise TrtspecError(f"tritonserver exited ({server.process.returncode}): {load_errors(server.log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    server.stop()
    raise TrtspecError(f"tritonserver was not ready after {timeout:.0f}s: {load_errors(server.log)}")
