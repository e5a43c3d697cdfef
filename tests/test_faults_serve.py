"""Faults around `trtspec serve` (issue #20): a port another server holds, a stale or foreign pid in the
--detach state file, a virtualenv run by its path without `activate`, and loopback-only binding.

The tests that start tritonserver use the nvidia-pytriton wheel's, on the tiny baseline repository that
tests/test_serve_e2e.py also serves; the state-file tests need no server.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS

from trtspec.config import load_config
from trtspec.deploy.compose import compose
from trtspec.deploy.launch import rank_argv, serve_argv
from trtspec.errors import UsageError
from trtspec.serve import server as server_mod
from trtspec.serve.locate import find_tritonserver
from trtspec.serve.run import STATE
from trtspec.serve.server import WORKDIR_PREFIX, Ports, free_ports, start_server, wait_ready

needs_triton = pytest.mark.skipif(find_tritonserver() is None, reason="no tritonserver (install the server extra)")
NAME = "faults"


def trtspec(*args: str, cwd, env=None, python: str = sys.executable) -> subprocess.CompletedProcess:
    run = [python, "-m", "trtspec", *args]
    return subprocess.run(run, cwd=cwd, capture_output=True, text=True, env=env, timeout=400)


def port_args(http: int, grpc: int, metrics: int) -> list[str]:
    return ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The embedded baseline (the smallest repository test_serve_e2e serves), built and packaged."""
    tmp = tmp_path_factory.mktemp("faults")
    data = yaml.safe_load((CONFIGS / "tiny-baseline.yaml").read_text())
    data["name"] = NAME
    config = tmp / f"{NAME}.yaml"
    config.write_text(yaml.safe_dump(data))
    for step in ("build", "package"):
        res = trtspec(step, str(config), cwd=tmp)
        assert res.returncode == 0, res.stderr
    return config


@contextmanager
def plain_listener(port: int, host: str = "127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, port))
        s.listen()
        yield


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@contextmanager
def foreign_ready_server(port: int):
    """Another server on the port that answers /v2/health/ready with 200, as a second Triton would."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Ready)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        httpd.shutdown()
        httpd.server_close()


# ---- 8: a port already in use


@needs_triton
@pytest.mark.parametrize("taken", ["http", "grpc", "metrics"])
def test_a_port_in_use_is_one_line_naming_port_and_option(tiny, taken):
    ports = dict(zip(("http", "grpc", "metrics"), free_ports(3), strict=True))
    with plain_listener(ports[taken]):
        res = trtspec("serve", str(tiny), *port_args(*ports.values()), "--detach", "--timeout", "60", cwd=tiny.parent)
    option = f"--{taken}-port or serve.{taken}_port"
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr == (
        f"trtspec: error: {taken} port {ports[taken]} is already in use on 127.0.0.1: choose another with {option}\n"
    )
    assert "ready" not in res.stdout
    assert not (tiny.parent / "model_repository" / NAME / STATE).exists()


@pytest.mark.e2e
@needs_triton
def test_another_server_answering_ready_is_not_taken_for_ours(tiny):
    """The reported fault: a server already on the HTTP port answers ready; --detach said "ready", exited 0
    and left a pid file for its own tritonserver, which died seconds later (Socket already in use)."""
    http, grpc, metrics = free_ports(3)
    with foreign_ready_server(http):
        res = trtspec(
            "serve", str(tiny), *port_args(http, grpc, metrics), "--detach", "--timeout", "60", cwd=tiny.parent
        )
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith(f"trtspec: error: http port {http} is already in use on 127.0.0.1")
    assert res.stderr.count("\n") == 1 and "ready" not in res.stdout
    assert not (tiny.parent / "model_repository" / NAME / STATE).exists()


@pytest.mark.e2e
@needs_triton
def test_a_port_taken_after_the_check_is_caught_while_waiting(tiny, monkeypatch):
    """The race between the bind check and tritonserver's own bind: the foreign server comes up after the
    check; the wait must see the child exit and report the log's reason, not the foreign 200."""
    monkeypatch.setattr(server_mod, "check_ports", lambda ports: None)
    repository = tiny.parent / "model_repository" / NAME
    ports = Ports(*free_ports(3))
    with foreign_ready_server(ports.http):
        server = start_server(repository, ports, tiny.parent / "race.tritonserver.log")
        try:
            with pytest.raises(UsageError) as caught:
                wait_ready(server, 120)
        finally:
            server.stop()
    assert str(caught.value) == (
        f"http port {ports.http} is already in use on 127.0.0.1: choose another with --http-port or serve.http_port"
    )
    assert server.process.returncode not in (None, 0)


# ---- 8: --stop and a stale state file


@pytest.fixture
def unrelated():
    """A live process that is no tritonserver (its own process group, killed by that group at the end)."""
    sleep = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield sleep
    os.killpg(sleep.pid, signal.SIGKILL)
    sleep.wait()


def _start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("with_start_time", [False, True], ids=["old-format", "matching-start-time"])
def test_stop_refuses_a_state_file_naming_an_unrelated_process(tmp_path, unrelated, with_start_time):
    state = {"pid": unrelated.pid, "workdir": "", "log": ""}
    if with_start_time:  # even the right start time: the process is no tritonserver of this repository
        state["start_time"] = _start_ticks(unrelated.pid)
    (tmp_path / STATE).write_text(json.dumps(state))
    res = trtspec("serve", str(tmp_path), "--stop", cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stderr == (
        f"trtspec: error: pid {unrelated.pid} in {tmp_path / STATE} is not a tritonserver of {tmp_path} (the pid"
        " now belongs to another process): removed the stale state file, signalled nothing\n"
    )
    assert unrelated.poll() is None, "the unrelated process was signalled"
    assert not (tmp_path / STATE).exists()


def test_stop_of_a_server_that_died_removes_its_files_and_succeeds(tmp_path):
    """Idempotent teardown (systemd ExecStop, CI clean-up): a server already gone is not an error."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    workdir = tmp_path / f"{WORKDIR_PREFIX}gone"
    (workdir / "backends").mkdir(parents=True)
    state = {"pid": gone.pid, "start_time": 1, "workdir": str(workdir), "log": ""}
    (tmp_path / STATE).write_text(json.dumps(state))
    res = trtspec("serve", str(tmp_path), "--stop", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"tritonserver pid {gone.pid} was not running: removed its state file" in res.stdout
    assert not (tmp_path / STATE).exists() and not workdir.exists()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_stop_finds_a_live_server_from_a_state_file_without_a_start_time(tmp_path):
    """A state file written before start times were recorded still stops its server (checked by its
    command line), instead of orphaning it. A python process named tritonserver plays the server."""
    fake = tmp_path / "bin" / "tritonserver"
    fake.parent.mkdir()
    fake.symlink_to(sys.executable)
    repo = tmp_path / "repo"
    repo.mkdir()
    server = subprocess.Popen(
        [str(fake), "-c", "import time; time.sleep(120)", f"--model-repository={repo.resolve()}"],
        start_new_session=True,
    )
    try:
        deadline = time.time() + 10
        while not Path(f"/proc/{server.pid}/cmdline").read_bytes().startswith(str(fake).encode()):
            assert time.time() < deadline
            time.sleep(0.05)
        (repo / STATE).write_text(json.dumps({"pid": server.pid, "workdir": "", "log": ""}))
        res = trtspec("serve", str(repo), "--stop", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert f"stopped tritonserver pid {server.pid}" in res.stdout
        assert server.wait(timeout=30) == -signal.SIGTERM
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert not (repo / STATE).exists()


# ---- 13 and loopback: a virtualenv run by its path, bound to loopback


def non_loopback_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def unactivated_env() -> dict[str, str]:
    """As systemd, cron or an entrypoint run it: no VIRTUAL_ENV, the virtualenv's bin not on PATH."""
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"}}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != Path(venv_bin).resolve()]
    env["PATH"] = os.pathsep.join(path or ["/usr/bin", "/bin"])
    return env


@pytest.mark.e2e
@needs_triton
def test_unactivated_virtualenv_serves_on_loopback_only(tiny):
    http, grpc, metrics = free_ports(3)
    started = trtspec(
        "serve", str(tiny), *port_args(http, grpc, metrics), "--detach", "--timeout", "240",
        cwd=tiny.parent, env=unactivated_env(),
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    state = json.loads((tiny.parent / "model_repository" / NAME / STATE).read_text())
    try:
        body = {"text_input": "ROMEO:", "sampling_param_max_tokens": 4, "streaming": False}
        request = urllib.request.Request(
            f"http://127.0.0.1:{http}/v2/models/tensorrt_llm/generate", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200 and json.loads(response.read())["text_output"]
        argv = Path(f"/proc/{state['pid']}/cmdline").read_bytes().decode().split("\0")
        for name, port in (("http", http), ("grpc", grpc), ("metrics", metrics)):
            assert f"--{name}-address=127.0.0.1" in argv and f"--{name}-port={port}" in argv
        address = non_loopback_address()
        if address is not None:
            control = socket.socket()  # the control: that address reaches a listener on all interfaces
            control.bind(("0.0.0.0", 0))
            control.listen()
            with control, socket.create_connection((address, control.getsockname()[1]), timeout=5):
                pass
            for port in (http, grpc, metrics):
                with pytest.raises(OSError):
                    socket.create_connection((address, port), timeout=5).close()
    finally:
        stopped = trtspec("serve", str(tiny), "--stop", cwd=tiny.parent, env=unactivated_env())
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == f"stopped tritonserver pid {state['pid']}\n"
    assert not Path(f"/proc/{state['pid']}").exists() or "Z" in Path(f"/proc/{state['pid']}/stat").read_text()
    if address is None:
        pytest.skip("no non-loopback address on this machine: only the argv's loopback addresses were checked")


def test_the_port_check_uses_the_address_the_server_binds(tmp_path):
    """The check binds what tritonserver will bind: a loopback listener blocks the default, and the wildcard
    bind that --host 0.0.0.0 asks for."""
    port = free_ports(1)[0]
    with plain_listener(port):
        for host in ("127.0.0.1", "0.0.0.0"):
            with pytest.raises(UsageError, match=f"http port {port} is already in use on {host}"):
                server_mod.check_ports(Ports(port, *free_ports(2), host=host))
    server_mod.check_ports(Ports(port, *free_ports(2)))  # free again once the listener closed
    with foreign_ready_server(port):  # SO_REUSEADDR on both sides: the wildcard bind may share the port
        for host in ("127.0.0.1", "0.0.0.0"):
            with pytest.raises(UsageError, match=f"http port {port} is already in use on {host}"):
                server_mod.check_ports(Ports(port, *free_ports(2), host=host))


@pytest.mark.parametrize("host", ["localhost", "::1", "0.0.0.0; rm -rf /", ""])
def test_a_host_that_is_not_an_ipv4_address_is_refused_before_start(host):
    with pytest.raises(UsageError, match=r"--host takes an IPv4 address"):
        server_mod.check_ports(Ports(*free_ports(3), host=host))


def test_containers_bind_all_interfaces_and_compose_publishes_on_loopback(tmp_path, monkeypatch):
    monkeypatch.delenv("TRTSPEC_SERVE_HOST", raising=False)
    cfg = load_config(CONFIGS / "tiny-draft-target.yaml")
    triton = compose(cfg, tmp_path)["services"]["triton"]
    assert triton["ports"] == ["127.0.0.1:8000:8000", "127.0.0.1:8001:8001", "127.0.0.1:8002:8002"]
    assert triton["environment"]["TRTSPEC_SERVE_HOST"] == "0.0.0.0"
    argv, _ = serve_argv(cfg, tmp_path / "c.yaml", tmp_path / "repo", 60)
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    rank = rank_argv(0, Path("/r"), Ports(host="0.0.0.0"), ["tensorrt_llm"], False)
    assert {f"--{n}-address=0.0.0.0" for n in ("http", "grpc", "metrics")} <= set(rank)
    for entrypoint in ("Dockerfile", "Dockerfile.cpu", "entrypoint.sh"):
        assert "TRTSPEC_SERVE_HOST" in (CONFIGS.parent / "docker" / entrypoint).read_text()


def test_serve_takes_its_address_from_the_variable_the_images_set(runner, tmp_path, monkeypatch):
    """A container whose own command runs `trtspec serve` gets the images' TRTSPEC_SERVE_HOST."""
    import trtspec.serve.run as run_mod
    from trtspec.cli import cli

    seen = {}
    monkeypatch.setattr(run_mod, "serve_forever", lambda *args, host, **kwargs: seen.setdefault("host", host))
    monkeypatch.setenv("TRTSPEC_SERVE_HOST", "0.0.0.0")
    assert runner.invoke(cli, ["serve", str(tmp_path)]).exit_code == 0
    assert seen["host"] == "0.0.0.0"
    monkeypatch.delenv("TRTSPEC_SERVE_HOST")
    seen.clear()
    assert runner.invoke(cli, ["serve", str(tmp_path)]).exit_code == 0
    assert seen["host"] == "127.0.0.1"


SLOW_TO_EXIT = """import signal, sys, time
def term(*_):
    open(sys.argv[1], "w").write(str(time.monotonic()))
    time.sleep(2.0)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("ready", flush=True)
time.sleep(60)
"""
DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def test_servers_stop_together_and_one_deaf_to_sigterm_is_killed(tmp_path):
    """Every server gets SIGTERM before any has finished unloading (one at a time, each would wait two
    seconds for the one before it); one that ignores SIGTERM is killed at the timeout; scratch folders go."""
    marks = [tmp_path / f"term-{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", SLOW_TO_EXIT, str(m)], stdout=subprocess.PIPE) for m in marks]
    procs.append(subprocess.Popen([sys.executable, "-c", DEAF], stdout=subprocess.PIPE))
    for proc in procs:
        assert proc.stdout.readline().strip() == b"ready"  # handlers installed
    workdir = tmp_path / "scratch"
    workdir.mkdir()
    servers = [server_mod.Server(p, Ports(), tmp_path / "log", None) for p in procs]
    servers[0].workdir = workdir
    codes = server_mod.stop_all(servers, timeout=4.0)
    assert codes == [0, 0, 0, -signal.SIGKILL]
    termed = [float(m.read_text()) for m in marks]
    assert max(termed) - min(termed) < 1.0, termed  # stopped one at a time, they would be two seconds apart
    assert not workdir.exists()


def test_serving_a_config_says_when_its_repository_was_packaged_from_another(runner, tmp_path, monkeypatch):
    """serve runs model_repository/NAME whichever config packaged it; package records which (the digest the
    deployed servers wait on), so serve warns on stderr when the config is not the one, and serves anyway."""
    import trtspec.serve.run as run_mod
    from trtspec.cli import cli
    from trtspec.repository.package import config_digest_path, repository_dir_for

    monkeypatch.chdir(tmp_path)
    config = tmp_path / "tiny.yaml"
    config.write_text((CONFIGS / "tiny-draft-target.yaml").read_text())
    repository = repository_dir_for(load_config(config))
    repository.mkdir(parents=True)

    def refuse_to_start(repo, ports, log):
        raise UsageError(f"stopped before starting {repo.name}")

    monkeypatch.setattr(run_mod, "start_server", refuse_to_start)

    def serve_warnings() -> list[str]:
        res = runner.invoke(cli, ["serve", str(config)])
        assert res.exit_code != 0 and "stopped before starting" in res.output  # it went on to serve
        return [line for line in res.stderr.splitlines() if line.startswith("warning:")]

    assert serve_warnings() == []  # no record (a repository written by hand): nothing to compare
    config_digest_path(repository).write_text(load_config(config).serving_digest() + "\n")
    assert serve_warnings() == []
    config.write_text(config.read_text().replace("num_draft_tokens: 2", "num_draft_tokens: 3"))
    (warning,) = serve_warnings()
    assert "packaged from another config" in warning and f"trtspec package {config}" in warning
    assert run_mod.packaged_from_another_config(repository, repository) is None  # a directory is served as is
