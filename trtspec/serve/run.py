"""`trtspec serve`: a config's repository (or any repository) on a real tritonserver, in the foreground
until Ctrl-C/SIGTERM, or detached with a pid file for `--stop`."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from trtspec.errors import UsageError
from trtspec.fsutil import atomic_write_text
from trtspec.serve.server import Ports, start_server, wait_ready

STATE = ".trtspec-serve.json"


def _resolve(target: Path) -> tuple[Path, Ports]:
    """A YAML config -> its packaged repository and ports; a directory -> itself and the defaults."""
    if target.is_dir():
        return target, Ports()
    from trtspec.config import load_config
    from trtspec.repository.package import repository_dir_for

    cfg = load_config(target)
    return repository_dir_for(cfg), Ports(cfg.serve.http_port, cfg.serve.grpc_port, cfg.serve.metrics_port)


def serve_forever(
    target: Path, ports: tuple[int | None, int | None, int | None], timeout: float, detach: bool, echo: Callable
) -> None:
    repository, defaults = _resolve(target)
    fallback = (defaults.http, defaults.grpc, defaults.metrics)
    chosen = Ports(*(p if p is not None else d for p, d in zip(ports, fallback, strict=True)))
    log = repository.parent / f"{repository.name}.tritonserver.log"
    server = start_server(repository, chosen, log)
    wait_ready(server, timeout)
    if detach:  # before any output: a closed stdout must not leave a server that --stop cannot find
        state = {"pid": server.process.pid, "workdir": str(server.workdir or ""), "log": str(log)}
        atomic_write_text(repository / STATE, json.dumps(state))
    echo(f"tritonserver ready on {repository} (pid {server.process.pid}, log {log})")
    echo(f"  HTTP    http://localhost:{chosen.http}/v2/models/<model>/generate (and generate_stream)")
    echo(f"  gRPC    localhost:{chosen.grpc}")
    echo(f"  metrics http://localhost:{chosen.metrics}/metrics")
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
    repository, _ = _resolve(target)
    state_file = repository / STATE
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UsageError(f"no server started with --detach for {repository}") from None
    pid = int(state["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(60):
            os.kill(pid, 0)
            time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if state.get("workdir"):
        import shutil

        shutil.rmtree(state["workdir"], ignore_errors=True)
    state_file.unlink(missing_ok=True)
    return f"stopped tritonserver pid {pid}"
