"""Hangs the recorder cannot see, on real gloo jobs through the zero-code bootstrap (issue 33, principle 6):
a `monitored_barrier` and a torch.distributed.pipelining stage that wait for a rank stuck in Python leave
every recorder idle with all its entries retired. The real sidecar, with its default timing (a poll every
2 s, suspicions from 4 s), finds the waiting ranks in their stacks, suspects the hang, pushes the capture
to the operator's endpoint and, at --stall-after, confirms it; frscope's analysis of what it pushed names
the rank stuck in Python. A healthy job whose long pauses have nothing in flight (evaluation without
collectives: the stacks are in Python) is never flagged. No timed assertions: the bounds are the tests'
own time-outs."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from frscope import wire
from frscope.analysis import AnalysisOptions, Category, Report, analyze
from frscope.records import assemble
from frscope.sidecar.config import SidecarConfig
from frscope.testing.rhythm_launch import RhythmJob, start_rhythm_job
from tests.integration.test_sidecar_faults import operator_receiver
from tests.integration.test_sidecar_support import decode, get, rank_dumps, running, wait_until

pytestmark = pytest.mark.torch

STALL_AFTER_S = 30.0


def default_config(socket_dir: Path, **overrides: object) -> SidecarConfig:
    """The sidecar's default timing on loopback, with --stall-after short enough to see the confirmation."""
    values: dict[str, object] = {"socket_dir": socket_dir, "evidence_dir": None, "host": "127.0.0.1", "port": 0,
                                 "stall_after_s": STALL_AFTER_S, "pod": "trainer-worker-0", "namespace": "ml",
                                 "push_backoff_s": 0.2}
    values.update(overrides)
    return SidecarConfig(**values)  # type: ignore[arg-type]


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def analysed(snapshot: dict[str, Any], stall_after_s: float) -> Report:
    """What the operator does with a pushed snapshot: its ranks -> frscope.analysis, with the stall
    threshold it gives a suspicion's analysis (half the suspected wait) or its own."""
    return analyze(assemble(rank_dumps(snapshot).values(), []), AnalysisOptions(stall_after_s=stall_after_s))


async def flagged_and_named(job: RhythmJob, culprit: int, waiting: set[int], op_names: set[str]) -> None:
    """The sidecar suspects the hang, pushes its capture with the stacks, confirms it at --stall-after;
    the analysis of the pushed snapshots names `culprit`, stuck in Python."""
    job.wait_for_sockets()
    registry = CollectorRegistry()
    async with operator_receiver() as (operator_url, pushed):
        async with running(default_config(job.pods[0], operator_url=operator_url), registry) as sidecar:
            watch = sidecar.unrecorded
            await wait_until(lambda: watch.suspected, 120, "a suspected hang the recorder cannot see", step_s=0.2)
            assert job.hang_started_ns() is not None, "suspected before the culprit stopped"
            assert set(watch.blocked) == waiting, watch.describe()
            assert {w.op for w in watch.blocked.values()} <= op_names, watch.describe()
            assert not sidecar.tracker.suspected  # nothing in flight: the stall tracker cannot see it
            assert watch.usual_step_s < 2.0 and watch.threshold_s <= 15.0
            for rank in waiting:
                assert value(registry, "frscope_unrecorded_wait_suspected", rank=str(rank)) == 1
            assert value(registry, "frscope_unrecorded_wait_suspected", rank=str(culprit)) == 0

            # Captured with the stacks, pushed as a suspicion; the status says who waits where.
            await wait_until(lambda: [p["body"]["reason"] for p in pushed][:1] == ["suspect"], 30, "the push")
            snapshot = pushed[0]["body"]
            stacks = {p["rank"]: p.get("stacks") or "" for p in snapshot["ranks"]}
            assert "stuck_in_python" in stacks[culprit]
            _status, headers, body = await get(sidecar, "/v1/status")
            doc = decode(headers, body)
            assert doc["suspected"] is True and doc["stalled"] is False
            for rank in waiting:
                assert doc["ranks"][str(rank)]["unrecorded_wait"]["op"] in op_names
            assert doc["ranks"][str(culprit)]["unrecorded_wait"] is None
            parsed = wire.parse_status(doc)
            assert {s.rank for s in parsed.suspects} == waiting and not parsed.stalls
            assert all(s.unrecorded and s.seq is None for s in parsed.suspects)

            quiet_s = min(s.age_s or 0.0 for s in parsed.suspects)
            assert quiet_s >= watch.threshold_s
            report = analysed(snapshot, quiet_s / 2)
            assert report.findings, "the analysis found nothing in the pushed snapshot"
            root = report.findings[0]
            assert root.culprit_ranks == (culprit,), report.findings
            assert root.category in (Category.RANK_NOT_JOINED, Category.P2P_MISMATCH), root
            assert any(f.name == "stuck_in_python" for f in root.culprit_stacks[culprit])

            # Confirmed at --stall-after: a stall push, the operator's stall in the status.
            await wait_until(lambda: watch.stalled, STALL_AFTER_S + 60, "the stall confirmed", step_s=0.5)
            await wait_until(lambda: "stall" in [p["body"]["reason"] for p in pushed], 30, "the stall push")
            stall = next(p["body"] for p in pushed if p["body"]["reason"] == "stall")
            assert analysed(stall, AnalysisOptions().stall_after_s).findings[0].culprit_ranks == (culprit,)
            _status, headers, body = await get(sidecar, "/v1/status")
            parsed = wire.parse_status(decode(headers, body))
            assert parsed.stalled and {s.rank for s in parsed.stalls} == waiting
            assert value(registry, "frscope_suspected_stalls_total", outcome="confirmed") == 1
            assert value(registry, "frscope_unrecorded_wait_stalled", rank=str(min(waiting))) == 1


@pytest.mark.timeout(300)
async def test_a_monitored_barrier_waiting_for_a_rank_stuck_in_python_is_flagged_and_named() -> None:
    args = ["--pattern", "monitored_barrier", "--steps", "400", "--step-s", "0.2", "--hang-step", "15",
            "--culprit", "1"]
    with start_rhythm_job(3, 3, args, lifetime_s=250) as job:
        await flagged_and_named(job, 1, {0, 2}, {"monitored_barrier"})


@pytest.mark.timeout(300)
async def test_a_pipeline_stage_stuck_in_python_is_flagged_and_named() -> None:
    # GPipe over three stages: stage 0 stops in its forward; stages 1 and 2 wait to receive.
    args = ["--pattern", "pipeline", "--steps", "400", "--step-s", "0.2", "--hang-step", "15", "--culprit", "0"]
    with start_rhythm_job(3, 3, args, lifetime_s=250) as job:
        await flagged_and_named(job, 0, {1, 2}, {"batch_isend_irecv", "recv", "irecv"})


@pytest.mark.timeout(300)
async def test_long_pauses_in_python_between_barriers_are_never_flagged() -> None:
    # Every 15 steps, 16 s of evaluation in Python with no collective (longer than --suspect-after):
    # the recorders are idle far past the usual step, but no stack waits in torch.distributed.
    args = ["--pattern", "monitored_barrier", "--steps", "46", "--step-s", "0.2", "--pause-every", "15",
            "--pause-s", "16"]
    with start_rhythm_job(3, 3, args, lifetime_s=250) as job:
        job.wait_for_sockets()
        registry = CollectorRegistry()
        async with running(default_config(job.pods[0]), registry) as sidecar:
            longest = 0.0
            while not job.finished():
                assert not sidecar.unrecorded.suspected, sidecar.unrecorded.describe()
                longest = max(longest, sidecar.unrecorded.quiet_s(sidecar.poller.last_round_ns or 0))
                await asyncio.sleep(0.2)
            assert all(proc.returncode == 0 for proc in job.procs.values()), job.log_tail(0)
            assert longest > 10.0  # the pauses were seen as quiet recorders
            assert sidecar.unrecorded.asked >= 2  # and the stacks were read, and judged healthy
            assert value(registry, "frscope_suspected_stalls_total", outcome="resumed") == 0
            assert sidecar.current_capture() is None


@pytest.mark.timeout(300)
async def test_a_culprit_in_another_pod_is_named_from_every_pods_snapshot() -> None:
    # One rank per pod: the pods of ranks 0 and 2 suspect (their rank waits in the barrier); rank 1's
    # pod sees its only rank in Python, nothing to suspect. The operator's gather (every pod's
    # /v1/snapshot?refresh=1: fresh recorders and stacks) names rank 1.
    args = ["--pattern", "monitored_barrier", "--steps", "400", "--step-s", "0.2", "--hang-step", "15",
            "--culprit", "1"]
    with start_rhythm_job(3, 1, args, lifetime_s=250) as job:
        job.wait_for_sockets()
        async with contextlib.AsyncExitStack() as stack:
            sidecars = [await stack.enter_async_context(running(default_config(job.pods[i], pod=f"trainer-worker-{i}")))
                        for i in range(3)]
            await wait_until(lambda: sidecars[0].unrecorded.suspected and sidecars[2].unrecorded.suspected, 120,
                             "both waiting pods suspecting", step_s=0.2)
            assert not sidecars[1].unrecorded.suspected
            bodies = []
            for sidecar in sidecars:
                _status, headers, body = await get(sidecar, "/v1/snapshot?refresh=1")
                bodies.append(decode(headers, body))
            dumps = [dump for snap in bodies for dump in rank_dumps(snap).values()]
            quiet_s = sidecars[0].unrecorded.quiet_s(bodies[0]["captured_at_ns"])
            report = analyze(assemble(dumps, []), AnalysisOptions(stall_after_s=quiet_s / 2))
            assert report.findings and report.findings[0].culprit_ranks == (1,), report.findings
