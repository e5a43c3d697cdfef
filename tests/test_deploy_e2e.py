"""The CPU image's entrypoint, run directly on this machine (there is no Docker engine here).

`docker/entrypoint.sh all` is what Dockerfile.cpu runs: it builds and packages the embedded pair into
the working directory, serves it on a real tritonserver, answers a request with exactly the text the
in-process runner produces, and stops cleanly on SIGTERM, as `docker stop` sends it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import yaml
from conftest import CONFIGS, REPO

from trtspec.serve.locate import find_tritonserver
from trtspec.serve.server import free_ports

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_tritonserver() is None, reason="no tritonserver (install the server extra)"),
]
PROMPT = "KING HENRY:\nWhat news"


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://localhost:{port}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def test_cpu_entrypoint_builds_serves_and_answers(tmp_path):
    http, grpc, metrics = free_ports(3)
    config = yaml.safe_load((CONFIGS / "tiny-draft-target.yaml").read_text())
    config["serve"].update(http_port=http, grpc_port=grpc, metrics_port=metrics)
    (tmp_path / "trtspec.yaml").write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "TRTSPEC_CONFIG": str(tmp_path / "trtspec.yaml"),
        "TRTSPEC_PYTHON": sys.executable,
        "TRTSPEC_WAIT_S": "120",
    }
    log = (tmp_path / "entrypoint.log").open("w")
    proc = subprocess.Popen(
        ["sh", str(REPO / "docker" / "entrypoint.sh"), "all"],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not _ready(http):
            assert proc.poll() is None, (tmp_path / "entrypoint.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "not ready after 300 s"
            time.sleep(1)
        assert (tmp_path / "model_repository" / "tiny-draft-target").is_dir()  # built where the image's WORKDIR is
        body = {"text_input": PROMPT, "sampling_param_max_tokens": 24}
        request = urllib.request.Request(
            f"http://localhost:{http}/v2/models/tensorrt_llm/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            served = json.loads(response.read())["text_output"]
        local = subprocess.run(
            [sys.executable, "-m", "trtspec", "generate", str(tmp_path / "trtspec.yaml"), "--prompt", PROMPT,
             "--max-tokens", "24", "--json"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert served and served == json.loads(local.stdout)["text"]
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not _ready(http)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_entrypoint_rejects_an_unknown_command_and_a_bad_config(tmp_path):
    env = {**os.environ, "TRTSPEC_PYTHON": sys.executable, "TRTSPEC_CONFIG": str(tmp_path / "missing.yaml")}
    script = str(REPO / "docker" / "entrypoint.sh")
    res = subprocess.run(["sh", script, "bogus"], env=env, capture_output=True, text=True)
    assert res.returncode == 2 and "unknown command 'bogus'" in res.stderr
    res = subprocess.run(["sh", script, "serve"], env=env, capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"error: {tmp_path}/missing.yaml: no such config file"]
