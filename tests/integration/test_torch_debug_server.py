"""A job that starts torch's own debug server (`torch.distributed.debug.start_debug_server()`, torch 2.15) keeps
frscope's bootstrap working beside it: the bootstrap's unix socket and torch's per-rank TCP worker server both
answer, and from the same process-wide handlers, so they show the same recorder. (The sidecar does not read
torch's server yet: docs/sidecar.md, "Limits".) Real torch 2.15, one gloo rank on loopback; skipped, naming the
command that builds it, where the torch 2.15 venv is missing."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.test_bootstrap_launchers import base_env, post
from tests.integration.test_sidecar_support import free_port
from tests.integration.torch_venvs import python_for

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

JOB = """
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
import torch.distributed.debug as debug
debug.start_debug_server(port=int(sys.argv[1]), start_method="spawn")
print("worker_port", debug._WORKER_SERVER.port, flush=True)
time.sleep(300)
"""


def _entries(raw: bytes) -> list[tuple[int, int, str]]:
    return [(e["record_id"], e["collective_seq_id"], e["profiling_name"]) for e in json.loads(raw)["entries"]]


def test_the_bootstrap_and_torchs_debug_server_serve_the_same_recorder(tmp_path: Path) -> None:
    python = python_for("2.15")
    env = {**base_env(tmp_path), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    # torch's debug handlers import packages the torch wheel does not require (tabulate; Jinja2 and aiohttp for
    # the frontend): FRSCOPE_TEST_DEBUG_SERVER_DEPS names a folder that has them (`pip install --target`).
    extra = os.environ.get("FRSCOPE_TEST_DEBUG_SERVER_DEPS")
    if extra:
        env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{extra}"
    probe = subprocess.run([python, "-W", "ignore", "-c", "import torch.distributed.debug._debug_handlers"], env=env,
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        missing = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "import failed"
        pytest.skip(f"torch.distributed.debug cannot be imported in the torch 2.15 venv ({missing}): set "
                    "FRSCOPE_TEST_DEBUG_SERVER_DEPS to a folder with tabulate and Jinja2")
    with open(tmp_path / "job.log", "wb") as log:
        proc = subprocess.Popen([python, "-W", "ignore", "-c", JOB, str(free_port())], env=env,
                                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().split()
        assert line[:1] == ["worker_port"], (tmp_path / "job.log").read_text()
        worker_port = int(line[1])
        socket_path = tmp_path / "rank-0.sock"
        deadline = time.monotonic() + 30
        while not socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        status, ours = post(socket_path, "fr_trace_json")
        assert status == 200
        conn = http.client.HTTPConnection("127.0.0.1", worker_port, timeout=30)
        try:
            conn.request("POST", "/handler/fr_trace_json", body=b"")
            resp = conn.getresponse()
            theirs = resp.read()
            assert resp.status == 200
        finally:
            conn.close()
        assert _entries(ours) == _entries(theirs) == [(i, i + 1, "gloo:all_reduce") for i in range(3)]
    finally:
        proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
