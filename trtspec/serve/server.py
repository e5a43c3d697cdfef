"""Start, wait for and stop a real tritonserver on a model repository.

With the nvidia-pytriton wheel, the python backend needs this interpreter's stub copied into
backends/python and LD_LIBRARY_PATH on this interpreter's libpython (the stub must load it); PYTHONPATH
carries this environment's site-packages so trtspec's python models import trtspec and torch.

The stub embeds Python, which finds its prefix from the first `python3` on PATH: a virtualenv's
interpreter run by its path (systemd, cron, an entrypoint) without `activate` would give the stub the
base installation, which lacks the virtualenv's packages (and its .pth files, such as an editable
install's finder). So the child's PATH starts with this interpreter's bin directory, as `activate` does.

Local servers bind loopback (127.0.0.1) unless told otherwise; containers pass 0.0.0.0. Every port is
checked free on that address before starting, and readiness counts only once this server's own log
says its HTTP service started, so another server answering on the port is never taken for this one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trtspec.errors import TrtspecError, UsageError, shorten
from trtspec.serve.locate import TritonInstall, find_tritonserver

LOOPBACK = "127.0.0.1"
ALL_INTERFACES = "0.0.0.0"

# where each port comes from, for a one-line "port in use" message
PORT_OPTIONS = {
    "http": "--http-port or serve.http_port",
    "grpc": "--grpc-port or serve.grpc_port",
    "metrics": "--metrics-port or serve.metrics_port",
}

WORKDIR_PREFIX = "trtspec-triton-"  # the server's scratch copy of the backends (removed when it stops)


@dataclass
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002
    host: str = LOOPBACK  # the address all three bind (tritonserver's --http/--grpc/--metrics-address)

    @property
    def client_host(self) -> str:
        """Where a client on this machine reaches them: loopback for a wildcard bind."""
        host = {"0.0.0.0": LOOPBACK, "::": "::1", "": LOOPBACK}.get(self.host, self.host)
        return f"[{host}]" if ":" in host else host

    def named(self) -> dict[str, int]:
        return {"http": self.http, "grpc": self.grpc, "metrics": self.metrics}


@dataclass
class Server:
    process: subprocess.Popen
    ports: Ports
    log: Path
    workdir: Path | None

    @property
    def http_url(self) -> str:
        return f"{self.ports.client_host}:{self.ports.http}"

    def stop(self, timeout: float | None = 30.0) -> int:
        """SIGTERM (tritonserver unloads models and exits), then SIGKILL if it does not."""
        return stop_all([self], timeout)[0]


def stop_all(servers: Iterable[Server], timeout: float | None = 30.0) -> list[int]:
    """Stop servers together: each unloads its models at once rather than after the one before it has
    (several seconds each), SIGKILL for any still up `timeout` seconds after its SIGTERM (None: wait).
    Every server is waited for and its scratch folder removed even when another one fails to stop."""
    servers = list(servers)
    for server in servers:
        if server.process.poll() is None:
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to signal: the wait below settles it
                server.process.send_signal(signal.SIGTERM)
    deadline = None if timeout is None else time.monotonic() + timeout
    for server in servers:
        try:
            server.process.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
        finally:
            if server.workdir is not None:
                shutil.rmtree(server.workdir, ignore_errors=True)
    return [server.process.returncode for server in servers]


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


def port_in_use(ports: Ports, name: str, port: int) -> UsageError:
    option = PORT_OPTIONS[name]
    return UsageError(f"{name} port {port} is already in use on {ports.host}: choose another with {option}")


def check_ports(ports: Ports) -> None:
    """Each port can be bound on the address the server will use, or a one-line error naming it.

    SO_REUSEADDR as servers set it: a port left in TIME_WAIT is free, one with a listener is not. Where
    both sides set it, some kernels (gVisor) let a wildcard bind share a port with a listener on one
    address, so a port that accepts a connection on the address clients use counts as taken too."""
    import ipaddress
    import socket

    try:
        ipv4 = ipaddress.ip_address(ports.host).version == 4
    except ValueError:
        ipv4 = False
    if not ipv4:  # a name or an IPv6 address would reach tritonserver's flags unchecked
        raise UsageError(
            f"--host takes an IPv4 address (127.0.0.1, 0.0.0.0 or one of this host's), got {shorten(ports.host)!r}"
        )
    named = ports.named()
    if len(set(named.values())) < len(named):
        raise UsageError(f"the http, grpc and metrics ports must differ, got {named}")
    family = socket.AF_INET6 if ":" in ports.host else socket.AF_INET
    for name, port in named.items():
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ports.host, port))
            except PermissionError:
                raise UsageError(
                    f"{name} port {port} on {ports.host} needs privileges: choose another with {PORT_OPTIONS[name]}"
                ) from None
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise port_in_use(ports, name, port) from None
                raise UsageError(f"cannot bind {name} port {port} on {ports.host}: {exc.strerror or exc}") from None
        try:
            socket.create_connection((ports.client_host.strip("[]"), port), timeout=1).close()
        except OSError:
            continue
        raise port_in_use(ports, name, port)


def server_env(install: TritonInstall) -> dict[str, str]:
    env = dict(os.environ)
    # as `activate` does: the stub's embedded Python takes its prefix from the first python3 on PATH
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH")) if p)
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
        env.pop("PYTHONHOME", None)
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
    check_ports(ports)
    workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX)) if install.backends_dir else None
    argv = [
        str(install.binary),
        f"--model-repository={repository.resolve()}",
        "--model-control-mode=none",
        f"--http-address={ports.host}",
        f"--http-port={ports.http}",
        f"--grpc-address={ports.host}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-address={ports.host}",
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


# tritonserver's line once its HTTP endpoint listens ("Started HTTPService at 127.0.0.1:8000")
HTTP_STARTED = "Started HTTPService at"


def _http_started(log: Path) -> bool:
    try:
        return HTTP_STARTED in log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def _listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on `port` (/proc/net/tcp and tcp6); None where /proc cannot tell."""
    inodes: set[str] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()  # sl local_address rem_address st ... uid timeout inode
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes if readable else None


def owns_listener(pid: int, port: int) -> bool | None:
    """Whether process `pid` holds the socket listening on `port`; None where /proc cannot tell."""
    inodes = _listening_inodes(port)
    try:
        fds = os.listdir(f"/proc/{pid}/fd") if inodes is not None else None
    except OSError:
        fds = None
    if fds is None:
        return None
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def _exited(server: Server) -> TrtspecError:
    """Why the child exited, in one line; a port taken between the check and the bind names its option."""
    text = server.log.read_text(encoding="utf-8", errors="replace") if server.log.exists() else ""
    # "failed to start HTTP service: Unavailable - Socket '127.0.0.1:8000' already in use"
    for line in (ln for ln in text.splitlines() if "already in use" in ln):
        for name, port in server.ports.named().items():
            if re.search(rf":{port}\b", line):
                return port_in_use(server.ports, name, port)
    return TrtspecError(f"tritonserver exited ({server.process.returncode}): {load_errors(server.log)}")


def wait_ready(server: Server, timeout: float = 180.0) -> None:
    """Ready means this server's own HTTP endpoint started and answers ready while the process lives: its
    log says the HTTP service started (tritonserver logs that just before binding, so on Linux the process
    must also hold the listening socket). A 200 from another server holding the port is not this one."""
    url = f"http://{server.http_url}/v2/health/ready"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.process.poll() is not None:
            server.stop()
            raise _exited(server)
        try:
            if _http_started(server.log):
                with urllib.request.urlopen(url, timeout=2) as response:
                    ours = owns_listener(server.process.pid, server.ports.http) is not False
                    if response.status == 200 and ours and server.process.poll() is None:
                        return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    server.stop()
    raise TrtspecError(f"tritonserver was not ready after {timeout:.0f}s: {load_errors(server.log)}")
