"""Each rank's own duration of each collective, live, on gloo (whose recorder dates nothing but the
enqueue): a healthy real torchrun job (2 ranks, frscope/testing/timed_train.py: forward, backward, one
all_reduce of the gradients a step, a broadcast every 10) with frscope's zero-code bootstrap, a real
`frscope sidecar` process reading its sockets, and the operator's web UI (`LiveWindows` asking the
sidecar over HTTP). The job's trace.json must hold complete slices (`ph: "X"`) with a duration on
every rank's track, of the rank's own times, within 15 s of the ranks' worker servers answering;
`frscope analyze --perf` of the sidecar's snapshot reads durations, and the sidecar's
`frscope_collective_duration_seconds` histogram counts them.

On every torch the project supports: the test venv's 2.13 (the bootstrap wraps the Python collectives)
and, where `scripts/torch-venv` has built them, 2.14 and 2.15 (the process groups' own pre/post hooks);
a version without its venv is skipped with the command that builds it. The sidecar and the UI run on
the test venv's torch-free side, as in a pod.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from frscope.demo.live import LocalSidecar
from frscope.operator.evidence.sidecars import SidecarClient
from frscope.operator.model.objects import JobRef, PodInfo
from frscope.operator.model.store import JobStore
from frscope.operator.serve.live_windows import LiveWindows
from frscope.operator.serve.ui import OperatorJobs
from frscope.webui import create_app
from tests.browser.conftest import LiveServer
from tests.integration.test_bootstrap_launchers import Pod, launched
from tests.integration.torch_venvs import MINORS, python_for

TRAIN = Path(__file__).resolve().parents[2] / "frscope" / "testing" / "timed_train.py"
WORLD = 2
WITHIN_S = 15.0  # the bar: durations on every rank's track this soon after the ranks serve


def _ui(store: JobStore) -> Any:
    async def factory() -> web.Application:
        session = aiohttp.ClientSession()
        live = LiveWindows(store, SidecarClient(session))  # the operator's defaults
        app = create_app(OperatorJobs(store, live))

        async def close(_: web.Application) -> None:
            await live.close()
            await session.close()

        app.on_cleanup.append(close)
        return app

    return factory


def _trace(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/jobs/ml/train/trace.json", timeout=10) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]
    except OSError:
        return None  # 404 until the first window is there


def _timed_slices(trace: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The trace's complete slices of finished collectives with a duration, each of its own rank's times
    (a collective in flight at the capture is a slice up to the capture: not a duration)."""
    if trace is None:
        return []
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("dur", 0) > 0
            and e.get("args", {}).get("times") == "this rank" and not e["args"].get("in_flight_at_capture")]


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("minor", MINORS)
def test_live_trace_has_each_ranks_durations_on_gloo(minor: str, tmp_path: Path) -> None:
    python = python_for(minor)
    argv = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD), str(TRAIN),
            "--seconds", "120", "--pause", "0.02"]
    with launched([Pod("host", argv, {}, tuple(range(WORLD)))], tmp_path) as running:
        sockets = running[0].socket_dir
        deadline = time.monotonic() + 150
        while sorted(p.name for p in sockets.glob("rank-*.sock")) != [f"rank-{r}.sock" for r in range(WORLD)]:
            assert running[0].proc.poll() is None, running[0].log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the ranks never served: " + running[0].log.read_text()[-3000:]
            time.sleep(0.1)
        serving = time.monotonic()
        sidecar = LocalSidecar(sockets, stall_after_s=60.0)
        try:
            sidecar.wait_listening(time.monotonic() + 60)
            store = JobStore()
            store.upsert_job(JobRef("ml", "train", "uid-train"), world_size=WORLD,
                             conditions=[{"type": "Running", "status": "True"}])
            store.upsert_pod(PodInfo("ml", "train-master-0", "uid-pod", "train", "Master", 0, "127.0.0.1",
                                     sidecar.port, "Running", 0, (), False))
            with LiveServer(_ui(store)) as server:
                slices: list[dict[str, Any]] = []
                while {e["pid"] for e in slices} != set(range(WORLD)) and time.monotonic() < serving + WITHIN_S:
                    time.sleep(0.5)
                    slices = _timed_slices(_trace(server.port))
                seen_s = time.monotonic() - serving
                assert {e["pid"] for e in slices} == set(range(WORLD)), (
                    f"no timed slice on every rank's track {WITHIN_S:g} s after the ranks served; sidecar log:\n"
                    + sidecar.log_tail())
                # every rank's own all_reduce, each with its own start and duration, on a track per rank and group
                for rank in range(WORLD):
                    mine = [e for e in slices if e["pid"] == rank and e["args"]["op"] == "all_reduce"]
                    assert mine, (rank, slices[:5])
                    assert {e["args"]["pg"] for e in mine} == {"0"}  # the default group's track(s) of this rank
                    assert all(0 < e["dur"] < 60e6 for e in mine)  # microseconds: a real, bounded duration
                # the snapshot the window came from carries each rank's timings beside its recorder
                snapshot = sidecar.get("/v1/snapshot?entries=50")
                for piece in snapshot["ranks"]:
                    rows = piece["timings"]["rows"]
                    assert all(row[5] == 0 or row[5] >= row[4] for row in rows), piece["rank"]  # 0: running
                    assert sum(row[5] > 0 for row in rows) >= len(rows) - 2, piece["rank"]
                    assert piece["timings"]["mechanism"] == ("wrappers" if minor == "2.13" else "pg_hooks")
                # `frscope analyze --perf` of that snapshot splits each rank's time by its durations (on
                # gloo, creation times alone gave only the waits), and the sidecar's Prometheus histogram
                # counts the durations
                saved = tmp_path / "snapshot.json"
                saved.write_text(json.dumps(snapshot))
                perf = subprocess.run([sys.executable, "-m", "frscope", "analyze", str(saved), "--perf", "--format",
                                       "json"], capture_output=True, text=True, timeout=120)
                assert perf.returncode == 0, perf.stderr[-2000:]
                assert json.loads(perf.stdout)["timing"] == "durations", perf.stdout[:2000]
                with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.port}/metrics", timeout=10) as resp:
                    metrics = resp.read().decode()
                count = re.search(r'^frscope_collective_duration_seconds_count\{op="ALLREDUCE"\} (\S+)$', metrics, re.M)
                assert count is not None and float(count.group(1)) > 0, [
                    line for line in metrics.splitlines() if line.startswith("frscope_collective")]
                print(f"torch {minor}: timed slices on every rank's track {seen_s:.1f} s after the ranks served")
        finally:
            sidecar.stop()
