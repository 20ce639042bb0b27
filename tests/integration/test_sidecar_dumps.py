"""Torch's on-timeout dump files, picked up from the dump dir of a real job.

Gloo writes no dump on timeout (DESIGN.md), so the demo job's ranks write what torch's NCCL watchdog
would: `_dump_fr_trace()` bytes (torch's own pickle) at `<dump dir>/nccl_trace_rank_<rank>`, while
they are blocked. The sidecar parses each once it stops growing, through the allow-list unpickler;
a file still being written in place is not misread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from frscope.demo.launcher import DUMP_REQUEST, LocalJob, start_job
from tests.integration.test_sidecar_support import config, decode, get, rank_dumps, running, wait_until

WORLD = 3
PREFIX = "nccl_trace_rank_"
pytestmark = pytest.mark.torch


@pytest.fixture
def job_with_dumps(tmp_path: Path) -> Iterator[LocalJob]:
    with start_job("hang", WORLD, lifetime_s=150, pickle_dir=tmp_path / "dumps", pickle_prefix=PREFIX) as job:
        deadline = time.monotonic() + 90
        while not all(job.socket_path(r).exists() for r in job.ranks()):
            assert all(job.alive(r) for r in job.ranks()), {r: job.log_tail(r) for r in job.ranks()}
            assert time.monotonic() < deadline
            time.sleep(0.2)
        yield job


@pytest.mark.timeout(180)
async def test_dump_files_are_picked_up_and_partial_ones_are_not_misread(job_with_dumps: LocalJob) -> None:
    job = job_with_dumps
    dump_dir = job.pickle_dir
    assert dump_dir is not None
    registry = CollectorRegistry()
    cfg = config(job.work_dir, dump_dir=dump_dir, dump_settle_s=1.0, dump_scan_interval_s=0.2)
    async with running(cfg, registry) as sidecar:
        assert sidecar.dumps is not None
        await wait_until(lambda: sidecar.current_capture() is not None, 60, "the stall capture")
        # The ranks are blocked: ask them for torch's dump (what the watchdog would write on timeout).
        (dump_dir / DUMP_REQUEST).touch()
        files = [dump_dir / f"{PREFIX}{r}" for r in range(WORLD)]
        await wait_until(lambda: all(f.exists() for f in files), 60, "the ranks' dump files")
        (dump_dir / DUMP_REQUEST).unlink()

        # A copy of rank 0's dump, written in place the way torch writes: half now, the rest later.
        real = files[0].read_bytes()
        partial = dump_dir / f"{PREFIX}7"
        partial.write_bytes(real[: len(real) // 2])
        await wait_until(lambda: registry.get_sample_value("frscope_dumps_collected_total", {"kind": "dump_file"})
                         == WORLD, 30, "the three complete dumps")
        by_rank = sidecar.dumps.by_rank()
        assert sorted(by_rank) == [0, 1, 2]
        assert all(by_rank[r].entries >= 4 for r in range(WORLD))
        # The half file has settled (older than --dump-settle) and is neither parsed nor rejected.
        time_left = time.monotonic() + 3 * cfg.dump_settle_s
        while time.monotonic() < time_left:
            item = sidecar.dumps.files.get(str(partial))
            assert item is None or (item.state == "pending" and item.piece is None)
            await asyncio.sleep(0.1)
        assert registry.get_sample_value("frscope_dump_files_rejected_total", {"reason": "truncated"}) is None
        partial.write_bytes(real)
        await wait_until(lambda: 7 in sidecar.dumps.by_rank(), 30, "the completed file")

        # The dumps are newer than the stall capture: they are the evidence /v1/snapshot serves.
        status, headers, body = await get(sidecar, "/v1/snapshot")
        snap = decode(headers, body)
        sources = {p["rank"]: p["source"] for p in snap["ranks"]}
        assert sources == {r: f"file:{dump_dir / f'{PREFIX}{r}'}" for r in (0, 1, 2, 7)}
        dumps = rank_dumps(snap)
        assert dumps[1].backend == "gloo" and dumps[1].entries[-1].collective_seq_id == 3  # rank 1 never got to #4
        assert dumps[0].entries[-1].collective_seq_id == 4 and not dumps[0].entries[-1].completed
        status, headers, body = await get(sidecar, "/v1/status")
        files_state = {Path(f["path"]).name: f["state"] for f in decode(headers, body)["dump_dir"]["files"]}
        assert files_state == dict.fromkeys([f"{PREFIX}{r}" for r in (0, 1, 2, 7)], "parsed")
