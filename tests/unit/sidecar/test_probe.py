"""The cheap progress probe: the full recorder only every --full-poll-every polls, at once when progress
stops with a collective in flight, and a stall still flagged within --stall-after + one poll interval."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from frscope.sidecar.app import Sidecar
from frscope.sidecar.client import parse_probe
from frscope.sidecar.config import SidecarConfig
from tests.unit.builders import dump, entry

S = 1_000_000_000


def test_parse_probe_bootstrap_and_nccl_shapes() -> None:
    body = {"frscope_progress": 1, "recorders": {"fr": {"pg_status": {
        "0": {"last_enqueued_collective": "7", "last_started_collective": "-1", "last_completed_collective": "6"},
        "1": {"last_enqueued_collective": "1", "last_started_collective": "-1", "last_completed_collective": "1"},
    }}}}
    fp, inflight = parse_probe(json.dumps(body).encode())
    assert inflight and fp == (("fr", "0", 7, -1, 6), ("fr", "1", 1, -1, 1))
    fp, inflight = parse_probe(b'{"pg_status": {}, "version": "2.10"}')
    assert fp == () and not inflight
    for bad in (b"[]", b"nope", b'{"recorders": {"fr": {}}}'):
        with pytest.raises(ValueError):
            parse_probe(bad)


class Worker:
    """One rank: `done` retired all_reduces, then one in flight if `hung`; counts full fetches."""

    def __init__(self, path: Path, probe: bool = True) -> None:
        self.path, self.probe = path, probe
        self.done, self.hung, self.hung_at_ns = 0, False, 0
        self.full = 0
        self.runner: web.AppRunner | None = None

    def entries(self) -> list[dict[str, Any]]:
        now = time.time_ns()
        out = []
        for seq in range(1, self.done + (2 if self.hung else 1)):
            e = entry(seq, backend="gloo", state="scheduled", retired=seq <= self.done,
                      created_ns=self.hung_at_ns if seq > self.done else now - S)
            e["timeout_ms"] = 1_800_000
            out.append(e)
        return out

    async def fr_trace_json(self, request: web.Request) -> web.Response:
        self.full += 1
        return web.json_response(dump(self.entries(), world=1))

    async def progress(self, request: web.Request) -> web.Response:
        if not self.probe:
            return web.Response(status=404, text="Handler not found")
        enq = self.done + (1 if self.hung else 0)
        status = {"0": {"last_enqueued_collective": str(enq), "last_started_collective": "-1",
                        "last_completed_collective": str(self.done)}}
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


@asynccontextmanager
async def worker(tmp_path: Path, **kw: Any) -> AsyncIterator[Worker]:
    w = Worker(tmp_path / "rank-0.sock", **kw)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


def sidecar(tmp_path: Path, **kw: Any) -> Sidecar:
    values: dict[str, Any] = {"socket_dir": tmp_path, "evidence_dir": None, "poll_interval_s": 0.2,
                              "stall_after_s": 1.0, "full_poll_every": 6, **kw}
    return Sidecar(SidecarConfig(**values), CollectorRegistry())


def fetches(sc: Sidecar, cause: str) -> float:
    value = sc.registry.get_sample_value("frscope_recorder_fetches_total", {"cause": cause})
    return value or 0.0


async def test_progressing_rank_gets_the_full_recorder_every_n_polls(tmp_path: Path) -> None:
    async with worker(tmp_path) as w:
        sc = sidecar(tmp_path)
        for _ in range(13):
            w.done += 5
            await sc.poll_once()
        assert w.full == 3  # the first poll, then every 6th
        assert (fetches(sc, "first"), fetches(sc, "periodic"), fetches(sc, "suspect")) == (1, 2, 0)
        st = sc.status()["ranks"]["0"]
        assert st["progress_probe"] == "frscope_progress" and st["up"]
        assert st["groups"]["0"]["inflight_op"] is None and not st["groups"]["0"]["stalled"]
        await sc.poll_once(stacks=False, full=True)
        assert w.full == 4 and fetches(sc, "refresh") == 1
        for state in sc.ranks.values():
            await state.client.close()


async def test_the_first_progress_after_an_empty_recorder_is_read_at_once(tmp_path: Path) -> None:
    """A rank found just after joining has an empty recorder; its first collectives are read at the
    next poll that sees the probe move (once), not a minute later: a rank that crashes a few steps in
    then leaves them (else a quick crash leaves only empty recorders)."""
    async with worker(tmp_path) as w:
        sc = sidecar(tmp_path)
        await sc.poll_once()  # joined, nothing recorded yet
        assert w.full == 1 and fetches(sc, "first") == 1
        w.done = 3
        await sc.poll_once()
        assert w.full == 2 and fetches(sc, "started") == 1
        assert sc.ranks[0].samples, "the kept recorder has the first collectives"
        for _ in range(3):
            w.done += 1
            await sc.poll_once()
        assert w.full == 2 and fetches(sc, "started") == 1  # once: the probe is enough from then on
        for state in sc.ranks.values():
            await state.client.close()


async def test_stall_found_in_time_with_the_probe(tmp_path: Path) -> None:
    async with worker(tmp_path) as w:
        sc = sidecar(tmp_path)
        w.done = 10
        await sc.poll_once()
        await sc.poll_once()
        w.hung, w.hung_at_ns = True, time.time_ns()
        first_full = w.full
        stalled_at = None
        for _ in range(20):
            await sc.poll_once()
            group = sc.tracker.groups[(0, "0")]
            if group.stalled:
                stalled_at = group.stalled_since_ns
                break
            time.sleep(0.2)
        assert stalled_at is not None
        assert (stalled_at - w.hung_at_ns) / S <= 1.0 + 0.2 + 0.3
        group = sc.tracker.groups[(0, "0")]
        assert group.sample.inflight_op == "all_reduce" and group.sample.inflight_seq == 11
        # One suspect fetch while the rank is wedged, not one per poll; the capture has the stall.
        assert fetches(sc, "suspect") == 1 and w.full - first_full <= 2
        assert sc.current_capture() is not None
        # Progress resumes: the stalled group is refetched at once and clears.
        w.hung, w.done = False, 12
        await sc.poll_once()
        assert fetches(sc, "resumed") == 1 and not sc.tracker.groups[(0, "0")].stalled
        for state in sc.ranks.values():
            await state.client.close()


async def test_rank_without_probe_gets_full_polls(tmp_path: Path) -> None:
    async with worker(tmp_path, probe=False) as w:
        sc = sidecar(tmp_path)
        for _ in range(4):
            await sc.poll_once()
        assert w.full == 4 and fetches(sc, "no_probe") == 3
        assert sc.status()["ranks"]["0"]["progress_probe"] is None
        for state in sc.ranks.values():
            await state.client.close()


def test_slots_are_the_wall_clocks_the_same_in_every_pod() -> None:
    from frscope.sidecar.schedule import next_slot

    # Two sidecars that started at other moments poll at the same instants, and read in full together.
    a, b = next_slot(1_000_003.2, 10.0, 6), next_slot(1_000_007.9, 10.0, 6)
    assert a.index == b.index == 100_001 and not a.periodic
    assert a.wait_s == pytest.approx(6.8) and b.wait_s == pytest.approx(2.1)
    full = next_slot(1_000_011.0, 10.0, 6)
    assert full.index == 100_002 and full.periodic  # 6 x 16,667
    assert next_slot(1_000_060.0, 10.0, 6).index == 100_007  # strictly after: an overrun skips a slot
    assert next_slot(5.0, 10.0, 1).periodic  # --full-poll-every 1: every slot


async def test_the_periodic_read_takes_every_rank_in_the_same_round(tmp_path: Path) -> None:
    """On the schedule's periodic slot every rank is read in full in one round, whatever each rank's
    own count since its last read; between, the probe serves; a rank that missed the slot catches up
    after twice the period."""
    async with worker(tmp_path) as w0:
        w1 = Worker(tmp_path / "rank-1.sock")
        await w1.start()
        try:
            sc = sidecar(tmp_path, full_poll_every=3)
            await sc.poll_once()  # first sight: both read
            w0.done += 1
            await sc.poll_once(periodic=False)  # rank 0's first progress after an empty read
            assert (w0.full, w1.full) == (2, 1)
            for _ in range(2):
                w0.done += 1
                w1.done += 1
                await sc.poll_once(periodic=False)
            assert (w0.full, w1.full) == (2, 2)  # rank 1's first progress; no periodic read yet
            w0.done += 1
            w1.done += 1
            await sc.poll_once(periodic=True)
            assert (w0.full, w1.full) == (3, 3) and fetches(sc, "periodic") == 2
            for _ in range(6):  # the slot is missed (rounds overran): 2 x 3 rounds later, each catches up
                w0.done += 1
                w1.done += 1
                await sc.poll_once(periodic=False)
            assert (w0.full, w1.full) == (4, 4) and fetches(sc, "periodic") == 4
            for state in sc.ranks.values():
                await state.client.close()
        finally:
            await w1.stop()
