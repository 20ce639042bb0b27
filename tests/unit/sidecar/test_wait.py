"""frscope_collective_wait_seconds: how long each rank spent inside collectives, the sidecar half of the
dashboard's step-boundary lateness panel (the cross-rank half is PromQL: tests/integration/test_lateness_promql.py
runs it in a real Prometheus against a real straggler job).

The ranks here are small aiohttp servers on unix sockets that answer like torch's worker server. They
stand in for NCCL ranks with TORCH_NCCL_ENABLE_TIMING=1, whose recorders carry `duration_ms`: no GPU
here, so no real rank can record one. The gloo path (sampling at each poll) uses the same stand-in
for control over when a collective is in flight; the real gloo job is in the integration test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from frscope.sidecar.app import Sidecar
from frscope.sidecar.config import SidecarConfig
from tests.unit.builders import T0, dump, entry

pytestmark = pytest.mark.timeout(60)
MS = 1_000_000
STEP_LATE_MS = 400.0  # rank 1 reaches every step's first all_reduce this much after rank 0
LAYER_MS = 2.0  # what every all_reduce takes once both ranks are in


class Rank:
    """One rank's worker server: a recorder of `steps` steps of two all_reduces each, and a progress
    probe that answers `inflight`."""

    def __init__(self, path: Path, rank: int, *, timed: bool, probe: bool = True) -> None:
        self.path, self.rank, self.timed, self.probe = path, rank, timed, probe
        self.steps = 0
        self.inflight = False
        self.runner: web.AppRunner | None = None

    def entries(self) -> list[dict[str, Any]]:
        out = []
        for step in range(self.steps):
            for layer in range(2):
                seq = 2 * step + layer + 1
                waited = STEP_LATE_MS if (layer == 0 and self.rank == 0) else 0.0
                out.append(entry(seq, created_ns=T0 + seq * 1000 * MS,
                                 duration_ms=(waited + LAYER_MS) if self.timed else None,
                                 backend="nccl" if self.timed else "gloo", state="completed"))
        if self.inflight:
            seq = 2 * self.steps + 1
            out.append(entry(seq, created_ns=T0 + seq * 1000 * MS, state="scheduled", retired=False,
                             backend="nccl" if self.timed else "gloo"))
        return out

    async def fr_trace_json(self, request: web.Request) -> web.Response:
        return web.json_response(dump(self.entries(), world=2))

    async def progress(self, request: web.Request) -> web.Response:
        if not self.probe:
            return web.Response(status=404, text="Handler not found")
        done = 2 * self.steps
        status = {"0": {"last_enqueued_collective": str(done + (1 if self.inflight else 0)),
                        "last_started_collective": "-1", "last_completed_collective": str(done)}}
        return web.json_response({"frscope_progress": 1, "recorders": {"fr": {"pg_status": status}}})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/handler/fr_trace_json", self.fr_trace_json)
        app.router.add_post("/handler/frscope_progress", self.progress)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.UnixSite(self.runner, str(self.path)).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


@asynccontextmanager
async def ranks(tmp_path: Path, **kw: Any) -> AsyncIterator[list[Rank]]:
    out = [Rank(tmp_path / f"rank-{r}.sock", r, **kw) for r in range(2)]
    for r in out:
        await r.start()
    try:
        yield out
    finally:
        for r in out:
            await r.stop()


@asynccontextmanager
async def sidecar(tmp_path: Path, **kw: Any) -> AsyncIterator[Sidecar]:
    values: dict[str, Any] = {"socket_dir": tmp_path, "evidence_dir": None, "poll_interval_s": 0.5,
                              "stall_after_s": 60.0, **kw}
    sc = Sidecar(SidecarConfig(**values), CollectorRegistry())
    try:
        yield sc
    finally:
        await sc.poller.close()


def waited(sc: Sidecar, rank: int) -> float | None:
    return sc.registry.get_sample_value("frscope_collective_wait_seconds_total", {"rank": str(rank)})


async def test_recorded_durations_are_summed_from_the_first_fetch_on(tmp_path: Path) -> None:
    async with ranks(tmp_path, timed=True) as rs, sidecar(tmp_path, full_poll_every=1) as sc:
        for r in rs:
            r.steps = 5
        await sc.poll_once()
        # What the recorder held when the sidecar first saw it happened before it watched: not counted.
        assert (waited(sc, 0), waited(sc, 1)) == (0.0, 0.0)
        for r in rs:
            r.steps = 8
        await sc.poll_once()
        await sc.poll_once()  # nothing new: nothing added twice
        # Three more steps: rank 0 waited 400 ms at each step's first all_reduce; both 2 ms per all_reduce.
        assert waited(sc, 0) == pytest.approx(3 * (STEP_LATE_MS + 2 * LAYER_MS) / 1000)
        assert waited(sc, 1) == pytest.approx(3 * 2 * LAYER_MS / 1000)
        # What the dashboard computes: the highest minus each rank's = how long the others waited for it.
        most = max(waited(sc, r) or 0.0 for r in (0, 1))
        assert most - (waited(sc, 1) or 0.0) == pytest.approx(3 * STEP_LATE_MS / 1000)
        assert most - (waited(sc, 0) or 0.0) == 0.0


async def test_durations_stop_the_sampling(tmp_path: Path) -> None:
    async with ranks(tmp_path, timed=True) as rs, sidecar(tmp_path, full_poll_every=1) as sc:
        for r in rs:
            r.steps, r.inflight = 1, True
        for _ in range(3):
            await sc.poll_once()
        assert (waited(sc, 0), waited(sc, 1)) == (0.0, 0.0)  # in flight, but its durations are what counts


async def test_without_durations_a_poll_in_flight_counts_the_time_since_the_previous_poll(tmp_path: Path) -> None:
    async with ranks(tmp_path, timed=False) as rs, sidecar(tmp_path, full_poll_every=6) as sc:
        for r in rs:
            r.steps = 1
        rs[0].inflight = True
        await sc.poll_once()  # the first poll has no interval to count
        assert (waited(sc, 0), waited(sc, 1)) == (0.0, 0.0)
        polls = 4
        for _ in range(polls):
            before = sc.ranks[0].wait_sampled_ns
            await sc.poll_once()
            assert before is not None and sc.ranks[0].wait_sampled_ns is not None
        # Each poll added the time since the one before (capped at two poll intervals): the probe said in flight.
        total = waited(sc, 0) or 0.0
        assert 0.0 < total <= polls * 2 * 0.5
        assert waited(sc, 1) == 0.0  # never in flight
        # A rank that stops answering counts nothing until it answers twice again.
        await rs[0].stop()
        await sc.poll_once()
        assert sc.ranks[0].wait_sampled_ns is None and waited(sc, 0) == total
        await rs[0].start()
        await sc.poll_once()
        assert waited(sc, 0) == total


async def test_without_a_probe_the_fresh_recorder_says_what_is_in_flight(tmp_path: Path) -> None:
    async with ranks(tmp_path, timed=False, probe=False) as rs, sidecar(tmp_path) as sc:
        for r in rs:
            r.steps = 1
        rs[1].inflight = True
        for _ in range(3):
            await sc.poll_once()
        assert sc.ranks[1].probe == ("", "")  # full recorder at every poll
        assert (waited(sc, 1) or 0.0) > 0.0 and waited(sc, 0) == 0.0
