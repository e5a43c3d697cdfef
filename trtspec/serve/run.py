"""`trtspec serve`: a config's repository (or any repository) on a real tritonserver, in the foreground
until Ctrl-C/SIGTERM, or detached with a pid file for `--stop`.

The state file records the pid with the process's start time (/proc/PID/stat) and the repository; `--stop`
signals only a live tritonserver started for this repository at that time, so a server that died and a
pid the system has since given to another process are never signalled (the stale file is removed)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

from trtspec.errors import TrtspecError, UsageError
from trtspec.fsutil import atomic_write_text
from trtspec.serve.server import LOOPBACK, WORKDIR_PREFIX, Ports, start_server, wait_ready

STATE = ".trtspec-serve.json"


def _resolve(target: Path) -> tuple[Path, Ports]:
    """A YAML config -> its packaged repository and ports; a directory -> itself and the defaults."""
    if target.is_dir():
        return target, Ports()
    from trtspec.config import load_config
    from trtspec.repository.package import repository_dir_for

    cfg = load_config(target)
    return repository_dir_for(cfg), Ports(cfg.serve.http_port, cfg.serve.grpc_port, cfg.serve.metrics_port)


def packaged_from_another_config(target: Path, repository: Path) -> str | None:
    """Serving a config serves the repository under its name, whichever config packaged it (package records
    which: the digest deploy's servers wait on). A repository made from another config, or from this one
    before an edit, still serves; the user hears that it may not be what the config says."""
    if target.is_dir():
        return None
    from trtspec.config import load_config
    from trtspec.repository.package import config_digest_path

    try:
        recorded = config_digest_path(repository).read_text(encoding="utf-8").strip()
    except OSError:
        return None  # written by hand or by an older trtspec: nothing to compare
    if recorded == load_config(target).serving_digest():
        return None
    return (
        f"{repository} was packaged from another config than {target} (or from it before an edit): serving "
        f"it as it is; run `trtspec package {target}` to serve what the config says"
    )


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if it is gone
    or a zombie (exited, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name in parentheses may hold spaces
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _is_our_server(state: dict, repository: Path) -> bool:
    """A live tritonserver serving this repository, started when the state file says."""
    pid = state.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    started = start_time(pid)
    if started is None or ("start_time" in state and started != state["start_time"]):
        return False  # gone, or the pid was reused (a state file from before 0.x has no start time)
    argv = _cmdline(pid)
    return bool(argv) and Path(argv[0]).name == "tritonserver" and f"--model-repository={repository.resolve()}" in argv


def serve_forever(
    target: Path,
    ports: tuple[int | None, int | None, int | None],
    timeout: float,
    detach: bool,
    echo: Callable,
    host: str = LOOPBACK,
) -> None:
    repository, defaults = _resolve(target)
    if why := packaged_from_another_config(target, repository):
        echo(f"warning: {why}", err=True)
    fallback = (defaults.http, defaults.grpc, defaults.metrics)
    chosen = Ports(*(p if p is not None else d for p, d in zip(ports, fallback, strict=True)), host=host)
    log = repository.parent / f"{repository.name}.tritonserver.log"
    server = start_server(repository, chosen, log)
    wait_ready(server, timeout)
    if detach:  # before any output: a closed stdout must not leave a server that --stop cannot find
        pid = server.process.pid
        state = {"pid": pid, "start_time": start_time(pid), "repository": str(repository.resolve())}
        state |= {"workdir": str(server.workdir or ""), "log": str(log)}
        atomic_write_text(repository / STATE, json.dumps(state))
    where = chosen.client_host
    echo(f"tritonserver ready on {repository} (pid {server.process.pid}, log {log}, listening on {chosen.host})")
    echo(f"  HTTP    http://{where}:{chosen.http}/v2/models/<model>/generate (and generate_stream)")
    echo(f"  gRPC    {where}:{chosen.grpc}")
    echo(f"  metrics http://{where}:{chosen.metrics}/metrics")
    if detach:
        return
    stopping = []

    def on_signal(signum, _frame):
        stopping.append(signum)

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stopping and server.process.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        code = server.stop()
    echo(f"tritonserver stopped (exit {code})")


def stop_detached(target: Path) -> str:
    """Stop the server --detach started, only if the state file's pid is still that server; a server that is
    gone is fine (exit 0, its files removed); a pid now held by another process is refused, untouched."""
    repository, _ = _resolve(target)
    state_file = repository / STATE
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UsageError(f"no server started with --detach for {repository}") from None
    if not isinstance(state, dict):
        state_file.unlink(missing_ok=True)
        raise TrtspecError(f"{state_file} is not a state file trtspec wrote: removed it, signalled nothing")
    pid = state.get("pid")
    if not _is_our_server(state, repository):
        _remove_state(state, state_file)
        if isinstance(pid, int) and pid > 0 and start_time(pid) is not None:
            raise TrtspecError(
                f"pid {pid} in {state_file} is not a tritonserver of {repository} (the pid now belongs to another "
                "process): removed the stale state file, signalled nothing"
            )
        return f"tritonserver pid {pid} was not running: removed its state file"
    started = start_time(pid)
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(60):
            if start_time(pid) != started:  # exited (a zombie counts: None), or the pid was reused
                break
            time.sleep(0.5)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _remove_state(state, state_file)
    return f"stopped tritonserver pid {pid}"


def _remove_state(state: dict, state_file: Path) -> None:
    """The state file and the server's scratch directory (only one `start_server` made)."""
    workdir = state.get("workdir")
    if isinstance(workdir, str) and Path(workdir).name.startswith(WORKDIR_PREFIX):
        shutil.rmtree(workdir, ignore_errors=True)
    state_file.unlink(missing_ok=True)
