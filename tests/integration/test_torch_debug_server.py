"""A job that starts torch's own debug server (`torch.distributed.debug.start_debug_server()`: a `_WorkerServer`
on a TCP port in every rank) is read there: the bootstrap points the sidecar at that port
(`rank-<r>.debug-server`) and serves no socket of its own for the rank, and the sidecar collects every rank's
Flight Recorder and stacks through torch's server.

A real 2-rank gloo job on loopback with frscope's bootstrap on its PYTHONPATH, for each torch the tests know
(2.13 here; 2.14 and 2.15 from `make torch-venvs`); skipped, saying why, where the version has no debug server
or its venv is missing. Each rank starts the debug server, makes its group, runs three all_reduces; then rank 1
sleeps and rank 0 waits in the fourth (a hang). Two ways the bootstrap meets it:
- `torchrun`'s workers (its environment): the bootstrap served its socket from the import of torch.distributed
  on, and withdraws it once the debug server runs;
- plain processes whose debug server starts before their process group: the bootstrap never starts its own.
torch's debug server imports `tabulate` (and Jinja2) in rank 0, which the torch wheel does not require:
FRSCOPE_TEST_DEBUG_SERVER_DEPS names a folder that has them (`pip install --target`), by default the one
`make torch-venvs` fills (<torch venv cache>/debug-server-deps); without, the test is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from frscope.sidecar.client import DebugServerPort
from tests.integration.test_bootstrap_launchers import base_env
from tests.integration.test_sidecar_support import config, decode, free_port, get, running, wait_until
from tests.integration.torch_venvs import MINORS, python_for

pytestmark = [pytest.mark.torch, pytest.mark.timeout(240)]

WORLD = 2
# Where `make torch-venvs` puts what torch's debug server imports besides torch (the Makefile's DEBUG_SERVER_DEPS).
DEBUG_SERVER_DEPS = Path(os.environ.get("FRSCOPE_TORCH_CACHE")
                         or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "frscope-torch"
                         ) / "debug-server-deps"
JOB = """
import datetime, os, sys, time, torch, torch.distributed as dist
import torch.distributed.debug as debug
rank = int(os.environ["RANK"])
store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), 2, is_master=rank == 0,
                      timeout=datetime.timedelta(seconds=60))
debug.start_debug_server(port=int(sys.argv[1]), start_method="spawn")
print("worker_port", debug._WORKER_SERVER.port, flush=True)
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
print("three done", flush=True)
if rank == 1:
    time.sleep(300)  # never joins the fourth
dist.all_reduce(t)
"""
# torchrun's worker environment (the bootstrap serves at import: frscope/sidecar/bootstrap/sitecustomize.py).
TORCHRUN_WORKER = {"TORCHELASTIC_RUN_ID": "debug-server-test", "TORCHELASTIC_RESTART_COUNT": "0"}


def _env(python: str, tmp_path: Path, rank: int, master_port: int, torchrun: bool) -> dict[str, str]:
    env = {**base_env(tmp_path), "RANK": str(rank), "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(master_port)}
    if torchrun:
        env.update(TORCHRUN_WORKER, LOCAL_RANK=str(rank))
    extra = os.environ.get("FRSCOPE_TEST_DEBUG_SERVER_DEPS") or str(DEBUG_SERVER_DEPS)
    if Path(extra).is_dir():
        env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{extra}"
    return env


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """The rank and what it started: rank 0's debug-server frontend (a daemon process that a killed rank
    leaves behind) and multiprocessing's resource tracker, all in the rank's own session."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _skip_without_debug_server(python: str, env: dict[str, str]) -> None:
    probe = subprocess.run(
        [python, "-W", "ignore", "-c", "import torch, torch.distributed.debug as d; d.start_debug_server; "
         "import torch.distributed.debug._debug_handlers; print(torch.__version__)"],
        env={**env, "FRSCOPE_BOOTSTRAP": "0"}, capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        last = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "import failed"
        if "start_debug_server" in last or "torch.distributed.debug'" in last:
            pytest.skip(f"this torch has no torch.distributed.debug.start_debug_server ({last})")
        pytest.skip(f"torch's debug server cannot be imported here ({last}): `make torch-venvs` installs what it "
                    f"needs in {DEBUG_SERVER_DEPS}, or set FRSCOPE_TEST_DEBUG_SERVER_DEPS to a folder with tabulate "
                    "and Jinja2 (pip install --target DIR tabulate jinja2)")


@pytest.mark.parametrize("minor", MINORS)
@pytest.mark.parametrize("torchrun", [True, False], ids=["torchrun-worker", "plain-process"])
async def test_the_sidecar_reads_torchs_debug_server_instead_of_its_own(minor: str, torchrun: bool,
                                                                        tmp_path: Path) -> None:
    python = python_for(minor)
    master_port = free_port()
    envs = {rank: _env(python, tmp_path, rank, master_port, torchrun) for rank in range(WORLD)}
    _skip_without_debug_server(python, envs[0])
    procs: dict[int, subprocess.Popen[bytes]] = {}
    logs = {rank: tmp_path / f"rank-{rank}.log" for rank in range(WORLD)}
    try:
        for rank in range(WORLD):
            with logs[rank].open("wb") as log:
                procs[rank] = subprocess.Popen([python, "-W", "ignore", "-c", JOB, str(free_port())], env=envs[rank],
                                               stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                               start_new_session=True)
        ports = {}
        for rank, proc in procs.items():
            assert proc.stdout is not None
            line = proc.stdout.readline().decode().split()
            assert line[:1] == ["worker_port"], logs[rank].read_text()
            ports[rank] = int(line[1])
        for rank, proc in procs.items():
            assert proc.stdout is not None
            assert proc.stdout.readline().decode().strip() == "three done", logs[rank].read_text()

        # The bootstrap pointed the sidecar at torch's worker servers, and serves no socket of its own.
        for rank in range(WORLD):
            pointer = json.loads((tmp_path / f"rank-{rank}.debug-server").read_text())
            assert pointer == {"port": ports[rank], "pid": procs[rank].pid}
            assert not (tmp_path / f"rank-{rank}.sock").exists()
            meta = json.loads((tmp_path / f".rank-{rank}.json").read_text())
            assert meta["debug_server_port"] == ports[rank] and meta["pid"] == procs[rank].pid
        said = logs[0].read_text()
        assert f"torch's debug server serves rank 0 on port {ports[0]}" in said, said
        assert ("frscope's own socket" in said) is torchrun, said  # withdrawn only where it had started one

        async with running(config(tmp_path)) as sidecar:
            await wait_until(lambda: sidecar.current_capture() is not None, 90, "a stall capture")
            endpoints = {r: s.endpoint for r, s in sidecar.ranks.items()}
            assert endpoints == {r: DebugServerPort(p) for r, p in ports.items()}
            assert sidecar.tracker.groups[(0, "0")].stalled and not sidecar.tracker.groups[(1, "0")].stalled
            status, headers, body = await get(sidecar, "/v1/snapshot", **{"Accept-Encoding": "gzip"})
            assert status == 200
            snap = decode(headers, body)
        pieces = {p["rank"]: p for p in snap["ranks"]}
        assert sorted(pieces) == [0, 1] and snap["errors"] == []
        for rank, piece in pieces.items():
            assert piece["source"] == f"torch-debug-server:127.0.0.1:{ports[rank]}"
            # The recorder, through torch's server: the three all_reduces, and rank 0's fourth in flight.
            seqs = [e["collective_seq_id"] for e in piece["trace"]["entries"]
                    if e["profiling_name"] == "gloo:all_reduce"]
            assert seqs == ([1, 2, 3, 4] if rank == 0 else [1, 2, 3]), seqs
            # The stacks, through torch's server (dump_traceback): each rank's main thread in the job's script.
            assert "in <module>" in piece["stacks"], piece["stacks"]
        assert "in all_reduce" in pieces[0]["stacks"] and "in all_reduce" not in pieces[1]["stacks"]
    finally:
        for proc in procs.values():
            _kill(proc)
        for proc in procs.values():
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()


STOPPING_JOB = """
import datetime, os, sys, time, torch, torch.distributed as dist
import torch.distributed.debug as debug
store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), 1, is_master=True,
                      timeout=datetime.timedelta(seconds=60))
debug.start_debug_server(port=int(sys.argv[1]), start_method="spawn")
print("worker_port", debug._WORKER_SERVER.port, flush=True)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
sys.stdin.readline()  # the test says when
debug.stop_debug_server()
print("stopped", flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("minor", MINORS)
async def test_after_stop_debug_server_the_bootstraps_own_socket_serves_the_rank(minor: str, tmp_path: Path) -> None:
    """The job stops torch's debug server: the rank is not lost (no trainer exit), its own socket serves it."""
    python = python_for(minor)
    env = {**_env(python, tmp_path, 0, free_port(), torchrun=False), "WORLD_SIZE": "1"}
    _skip_without_debug_server(python, env)
    with (tmp_path / "rank-0.log").open("wb") as log:
        proc = subprocess.Popen([python, "-W", "ignore", "-c", STOPPING_JOB, str(free_port())], env=env,
                                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        line = proc.stdout.readline().decode().split()
        assert line[:1] == ["worker_port"], (tmp_path / "rank-0.log").read_text()
        port = int(line[1])
        async with running(config(tmp_path)) as sidecar:
            await wait_until(lambda: 0 in sidecar.ranks and sidecar.ranks[0].up and sidecar.ranks[0].raw_z is not None,
                             60, "rank 0 read at torch's debug server")
            assert sidecar.ranks[0].endpoint == DebugServerPort(port)
            assert not (tmp_path / "rank-0.sock").exists()
            proc.stdin.write(b"stop\n")
            proc.stdin.flush()
            assert proc.stdout.readline().decode().strip() == "stopped", (tmp_path / "rank-0.log").read_text()
            socket_path = tmp_path / "rank-0.sock"
            assert socket_path.exists() and not (tmp_path / "rank-0.debug-server").exists()
            await sidecar.poll_once(full=True)
            state = sidecar.ranks[0]
            assert state.endpoint == socket_path and state.up and state.ever_up
            status, headers, body = await get(sidecar, "/v1/snapshot")
            assert status == 200
            (piece,) = decode(headers, body)["ranks"]
            assert piece["source"] == f"socket:{socket_path}"
            assert [e["profiling_name"] for e in piece["trace"]["entries"]] == ["gloo:all_reduce"]
        said = (tmp_path / "rank-0.log").read_text()
        assert "frscope's own socket" not in said  # it never had one before the stop
    finally:
        _kill(proc)
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stdin.close()
