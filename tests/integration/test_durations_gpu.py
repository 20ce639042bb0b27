"""The NCCL side of each rank's own durations, on a real GPU (skipped without one: this machine has none;
run it where a GPU is lent: `.venv/bin/pytest tests/integration/test_durations_gpu.py`).

The same path as gloo's (tests/integration/test_live_durations.py): a real torchrun job
(frscope/testing/timed_train.py --backend nccl, one rank per GPU, at most 2) with frscope's bootstrap,
a real `frscope sidecar`, the operator's live window and trace.json. What differs on a GPU, and is
checked here: the bootstrap dates each collective's start but no end (a CUDA Work's future completes at
launch, not when the kernel ends), NCCL's own recorder dates the collective (started / completed, and
`duration_ms` with TORCH_NCCL_ENABLE_TIMING=1), and those times are what the trace's slices carry.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from frscope.demo.live import LocalSidecar
from frscope.operator.model.objects import JobRef, PodInfo
from frscope.operator.model.store import JobStore
from frscope.records import normalize_dump
from tests.browser.conftest import LiveServer
from tests.integration.test_bootstrap_launchers import Pod, launched
from tests.integration.test_live_durations import TRAIN, _timed_slices, _trace, _ui


def _gpus() -> int:
    try:
        done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                              capture_output=True, text=True, timeout=120)
        return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else 0
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return 0


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nccl_durations_come_from_the_recorder_and_starts_from_the_ranks(tmp_path: Path) -> None:
    gpus = _gpus()
    if gpus == 0:
        pytest.skip("no CUDA GPU here: the NCCL path is checked where one is lent")
    world = min(2, gpus)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world), str(TRAIN),
            "--backend", "nccl", "--seconds", "120", "--pause", "0.02"]
    with launched([Pod("gpu", argv, {"TORCH_NCCL_ENABLE_TIMING": "1"}, tuple(range(world)))], tmp_path) as running:
        sockets = running[0].socket_dir
        deadline = time.monotonic() + 150
        while len(list(sockets.glob("rank-*.sock"))) < world:
            assert running[0].proc.poll() is None and time.monotonic() < deadline, running[0].log.read_text()[-3000:]
            time.sleep(0.1)
        sidecar = LocalSidecar(sockets, stall_after_s=60.0)
        try:
            sidecar.wait_listening(time.monotonic() + 60)
            store = JobStore()
            store.upsert_job(JobRef("ml", "train", "uid-train"), world_size=world,
                             conditions=[{"type": "Running", "status": "True"}])
            store.upsert_pod(PodInfo("ml", "train-master-0", "uid-pod", "train", "Master", 0, "127.0.0.1",
                                     sidecar.port, "Running", 0, (), False))
            with LiveServer(_ui(store)) as server:
                slices: list[dict[str, Any]] = []
                until = time.monotonic() + 30
                while {e["pid"] for e in slices} != set(range(world)) and time.monotonic() < until:
                    time.sleep(0.5)
                    slices = _timed_slices(_trace(server.port))
                assert {e["pid"] for e in slices} == set(range(world)), sidecar.log_tail()
                snapshot = sidecar.get("/v1/snapshot?entries=50")
                for piece in snapshot["ranks"]:
                    rows = piece["timings"]["rows"]
                    assert rows and all(row[5] == 0 for row in rows), rows[:3]  # GPU: no end from the host
                    dump = normalize_dump(piece, "piece", None)
                    done = [e for e in dump.entries if e.completed and e.op == "all_reduce"]
                    assert done and all(e.duration_ms is not None and e.time_started_ns for e in done), done[:2]
        finally:
            sidecar.stop()
