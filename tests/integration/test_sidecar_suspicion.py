"""Suspected stalls on real gloo jobs through the zero-code bootstrap, with the sidecar's default
timing (a probe every 2 s, suspected after 4-15 s by each group's rhythm): a hang is suspected long
before --stall-after and its capture names the culprit; pauses with nothing in flight are never
suspected; a collective that waits for one rank's lone checkpoint is suspected, then resumed, never
confirmed. No timed assertions: bench/detection.py measures how fast."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from frscope import wire
from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.analysis.context import DEFAULT_CLOCK_SKEW_MS
from frscope.analysis.pod_lateness import PodClock, PodLateness
from frscope.operator.engine.job_arrivals import JobArrivals
from frscope.operator.engine.pod_stragglers import compare
from frscope.records import assemble
from frscope.sidecar.config import SidecarConfig
from frscope.testing.rhythm_launch import start_rhythm_job
from tests.integration.test_sidecar_support import decode, get, rank_dumps, running, wait_until

pytestmark = pytest.mark.torch

STALL_AFTER_S = 600.0  # far away: whatever is flagged here is a suspicion


def default_config(socket_dir: Path, **overrides: object) -> SidecarConfig:
    """The sidecar's defaults (SidecarConfig's), on loopback with a stall threshold out of reach."""
    values: dict[str, object] = {"socket_dir": socket_dir, "evidence_dir": None, "host": "127.0.0.1", "port": 0,
                                 "stall_after_s": STALL_AFTER_S, "pod": "trainer-worker-0", "namespace": "ml"}
    values.update(overrides)
    return SidecarConfig(**values)  # type: ignore[arg-type]


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


@pytest.mark.timeout(240)
async def test_hang_is_suspected_and_its_capture_names_the_culprit() -> None:
    with start_rhythm_job(3, 3, ["--steps", "400", "--step-s", "0.25", "--hang-step", "30", "--culprit", "1"],
                          lifetime_s=200) as job:
        job.wait_for_sockets()
        registry = CollectorRegistry()
        async with running(default_config(job.pods[0]), registry) as sidecar:
            await wait_until(lambda: bool(sidecar.tracker.suspected), 150, "a suspected stall", step_s=0.2)
            assert job.hang_started_ns() is not None, "suspected before the culprit stopped"
            waiting = {rank for (rank, _pg), g in sidecar.tracker.groups.items() if g.suspected}
            assert waiting == {0, 2}  # the ranks waiting in the all_reduce; the culprit has nothing in flight
            for rank in (0, 2):
                group = sidecar.tracker.groups[(rank, "0")]
                assert group.sample.inflight_op == "all_reduce" and not group.stalled
                assert group.suspect_threshold_s < STALL_AFTER_S
            assert not sidecar.tracker.groups[(1, "0")].sample.inflight
            # (the gauges are set when the poll round ends: the tracker is seen mid-round, while the round
            # waits for the ranks' other answers)
            await wait_until(lambda: value(registry, "frscope_collective_suspected") == 1, 10,
                             "the suspected gauge (the pod's, the default series)", step_s=0.1)
            assert value(registry, "frscope_collective_stalled") == 0

            # The suspicion was captured (recorders and stacks of that moment) and is what is served.
            await wait_until(lambda: sidecar.current_capture() is not None, 30, "the suspicion's capture")
            capture = sidecar.current_capture()
            assert capture is not None and capture.reason == "suspect"
            status, headers, body = await get(sidecar, "/v1/snapshot")
            assert status == 200
            snap = decode(headers, body)
            assert snap["reason"] == "suspect"
            stacks = {p["rank"]: p["stacks"] for p in snap["ranks"]}
            assert "stuck_in_python" in stacks[1]
            age = min(sidecar.tracker.groups[(r, "0")].inflight_age_s(snap["captured_at_ns"]) or 0.0 for r in (0, 2))
            report = analyze(assemble(rank_dumps(snap).values(), []), AnalysisOptions(stall_after_s=age / 2))
            root = report.findings[0]
            assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (1,)
            assert any(f.name == "stuck_in_python" for f in root.culprit_stacks[1])

            status, headers, body = await get(sidecar, "/v1/status")
            st = decode(headers, body)
            assert st["suspected"] is True and st["stalled"] is False
            g0 = st["ranks"]["0"]["groups"]["0"]
            assert g0["suspected"] and not g0["stalled"] and g0["suspected_since_ns"] is not None
            assert g0["suspect_threshold_s"] <= 15.0


@pytest.mark.timeout(300)
async def test_pauses_with_nothing_in_flight_are_never_suspected() -> None:
    # Every 20 steps every rank "writes a checkpoint" for 17 s (longer than --suspect-after): nothing
    # is in flight, so nothing is suspected; the steps between have their own quick collectives.
    args = ["--steps", "61", "--step-s", "0.2", "--jitter-s", "0.1", "--pause-every", "20", "--pause-s", "17"]
    with start_rhythm_job(2, 2, args, lifetime_s=250) as job:
        job.wait_for_sockets()
        registry = CollectorRegistry()
        async with running(default_config(job.pods[0]), registry) as sidecar:
            while not job.finished():
                assert not sidecar.tracker.suspected, {k: g.sample for k, g in sidecar.tracker.groups.items()}
                await asyncio.sleep(0.2)
            assert all(proc.returncode == 0 for proc in job.procs.values()), job.log_tail(0)
            assert sidecar.poller.polls_done > 30
            assert value(registry, "frscope_suspected_stalls_total", outcome="resumed") == 0
            assert value(registry, "frscope_suspected_stalls_total", outcome="confirmed") == 0
            assert sidecar.current_capture() is None


@pytest.mark.timeout(300)
async def test_a_lone_checkpoint_is_suspected_then_resumed_and_learned() -> None:
    # Rank 0 alone "writes a checkpoint" for 9 s at steps 40 and 80; the others wait in the next
    # all_reduce: a straggler at that step, suspected, then resumed; never a confirmed stall. The wait
    # is learned: the second one is suspected later (or not at all).
    args = ["--steps", "90", "--step-s", "0.2", "--lone-every", "40", "--lone-s", "9"]
    with start_rhythm_job(2, 2, args, lifetime_s=250) as job:
        job.wait_for_sockets()
        registry = CollectorRegistry()
        async with running(default_config(job.pods[0]), registry) as sidecar:
            await wait_until(lambda: bool(sidecar.tracker.suspected), 150, "the first lone checkpoint's suspicion")
            assert {rank for (rank, _pg), g in sidecar.tracker.groups.items() if g.suspected} == {1}
            await wait_until(lambda: value(registry, "frscope_suspected_stalls_total", outcome="resumed") >= 1, 60,
                             "the suspicion resumed")
            learned = sidecar.tracker.groups[(1, "0")]
            assert learned.rhythm.usual_wait_s >= 4.0 and learned.suspect_threshold_s > 4.0
            await wait_until(job.finished, 150, "the job's end", step_s=0.5)
            assert all(proc.returncode == 0 for proc in job.procs.values()), job.log_tail(0)
            assert value(registry, "frscope_suspected_stalls_total", outcome="confirmed") == 0
            assert value(registry, "frscope_suspected_stalls_total", outcome="resumed") == 1
            assert value(registry, "frscope_stalls_total") == 0


@pytest.mark.timeout(300)
async def test_a_persistent_straggler_is_reported_with_its_cost() -> None:
    # Rank 2 computes 1.2 x as long as the others at every step, from step 20 on.
    args = ["--steps", "600", "--step-s", "0.25", "--jitter-s", "0.02", "--culprit", "2", "--slow-factor", "1.2",
            "--slow-from-step", "20"]
    with start_rhythm_job(3, 3, args, lifetime_s=250) as job:
        job.wait_for_sockets()
        registry = CollectorRegistry()
        async with running(default_config(job.pods[0]), registry) as sidecar:
            await wait_until(lambda: 2 in sidecar.poller.lateness and sidecar.poller.lateness[2].straggler, 180,
                             "rank 2 reported as a straggler", step_s=0.5)
            found = sidecar.poller.lateness
            assert not found[0].straggler and not found[1].straggler
            assert 0.1 <= found[2].share <= 0.3 and found[2].lateness_s >= 0.03
            assert value(registry, "frscope_rank_straggler", rank="2") == 1
            assert value(registry, "frscope_rank_straggler", rank="0") == 0
            assert value(registry, "frscope_rank_lateness_seconds", rank="2") >= 0.03
            status, headers, body = await get(sidecar, "/v1/status")
            st = decode(headers, body)
            assert st["ranks"]["2"]["lateness"]["straggler"] is True
            assert st["ranks"]["0"]["lateness"]["straggler"] is False
            assert not sidecar.tracker.suspected  # a straggler is no hang


@pytest.mark.timeout(300)
async def test_a_rank_20_percent_slower_alone_in_its_pod_is_a_straggler_across_pods() -> None:
    # One rank per pod (three sidecars, each serving one real gloo rank): no sidecar can compare its
    # ranks, so only the operator's comparison across pods sees rank 2 take 1.2 x the others' 0.25 s
    # step (50 ms late a step). The sweeps are the operator's: its own clock read around each
    # /v1/status request (each pod's clock offset from the answer's `answered_at_ns`), the answers
    # merged and compared by engine/pod_stragglers.compare with the default --clock-skew-ms. Gloo's
    # recorder dates enqueues only, and the bootstrap's collective timer (which dates the ranks' waits,
    # and makes the comparison one by waits) is off here (FRSCOPE_TIMINGS=0), so this is the comparison
    # by clocks; the sidecars share this host's clock, and the measured offsets say so within a few ms,
    # not the 20 ms assumed without them.
    args = ["--steps", "600", "--step-s", "0.25", "--jitter-s", "0.02", "--culprit", "2", "--slow-factor", "1.2",
            "--slow-from-step", "20"]
    with start_rhythm_job(3, 1, args, lifetime_s=250, env_extra={"FRSCOPE_TIMINGS": "0"}) as job:
        job.wait_for_sockets()
        async with contextlib.AsyncExitStack() as stack:
            sidecars = {f"trainer-worker-{i}": await stack.enter_async_context(
                running(default_config(job.pods[i], pod=f"trainer-worker-{i}"))) for i in range(3)}
            merged = JobArrivals()
            found: dict[str, PodLateness] = {}
            clocks: dict[str, PodClock] = {}

            async def sweep() -> bool:
                statuses = {}
                for pod, sidecar in sidecars.items():
                    asked = time.time_ns()
                    _status, headers, body = await get(sidecar, "/v1/status")
                    received = time.time_ns()
                    doc = decode(headers, body)
                    statuses[pod] = replace(wire.parse_status(doc), asked_ns=asked, received_ns=received)
                    assert all(r.get("lateness") is None for r in doc["ranks"].values())
                found.clear()
                found.update(await asyncio.to_thread(compare, merged, statuses, set(sidecars),
                                                     DEFAULT_CLOCK_SKEW_MS / 1000, time.time_ns()))
                clocks.update(merged.clocks(time.time_ns()))
                return "trainer-worker-2" in found and found["trainer-worker-2"].straggler

            deadline = asyncio.get_running_loop().time() + 200
            while not await sweep():
                assert asyncio.get_running_loop().time() < deadline, f"rank 2's pod never named: {found}"
                await asyncio.sleep(2.0)
            slow = found["trainer-worker-2"]
            assert slow.rank == 2 and slow.ranks == (2,) and slow.group == "0" and slow.by_waits == 0
            assert not found["trainer-worker-0"].straggler and not found["trainer-worker-1"].straggler
            assert sorted(clocks) == sorted(sidecars)
            assert all(abs(c.offset_ns) <= c.bound_ns < 20_000_000 for c in clocks.values()), clocks
            assert 0.1 <= slow.share <= 0.3 and slow.lateness_s >= 0.02
