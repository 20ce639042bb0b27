"""The operator's logic end to end in-process, with the wire faked on both sides: a fake API server
(FakeKube) and stand-in sidecars serving REAL recorder snapshots of a real hung gloo job. Stand-ins
because these tests need sidecars that go down or stall on cue; tests/e2e runs real API servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from frscope.operator import names
from frscope.operator.engine.controller import Controller
from frscope.operator.engine.settings import OperatorConfig
from frscope.operator.evidence.gather import GatherOptions
from frscope.operator.evidence.pod_evidence import from_snapshot
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.evidence.sidecars import SidecarClient, parse_snapshot
from frscope.operator.kube import KubeClient
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.model.store import JobStore
from frscope.operator.publish import Publisher
from tests.unit.operator import builders
from tests.unit.operator.fakes import FakeKube, StandInSidecar

Make = Callable[..., Awaitable[StandInSidecar]]
# --exit-settle shortened: a pod these tests never end would hold a crash's gather 45 s.
CONFIG = OperatorConfig(decode_processes=0, stuck_after_s=0.5, cooldown_s=60, exit_settle_s=5.0,
                        gather=GatherOptions(per_pod_timeout_s=1, overall_timeout_s=3, attempts=2,
                                             backoff_base_s=0.01))


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def make_controller(kube_client: KubeClient, session: aiohttp.ClientSession,
                    config: OperatorConfig = CONFIG) -> Controller:
    return Controller(config, store=JobStore(), pushes=PushStore(), sidecars=SidecarClient(session),
                      publisher=Publisher(kube_client, instance="op-0"),
                      metrics=OperatorMetrics(CollectorRegistry()))


async def setup_job(fake_kube: FakeKube, controller: Controller, sidecars: Make, ranks: dict[int, Any],
                    *, modes: tuple[str, str] = ("ok", "ok")) -> list[StandInSidecar]:
    stored = fake_kube.put("pytorchjobs", builders.job(workers=1, nproc=2))
    await controller.on_job(None, stored)
    a = {r: v for r, v in ranks.items() if r < 2}
    b = {r: v for r, v in ranks.items() if r >= 2}
    s0 = await sidecars("train-master-0", a, mode=modes[0])
    s1 = await sidecars("train-worker-0", b, mode=modes[1])
    await controller.on_pod("ADDED", builders.pod(s0.pod, replica_type="Master", port=s0.port))
    await controller.on_pod("ADDED", builders.pod(s1.pod, port=s1.port))
    return [s0, s1]


async def poll_once(controller: Controller, stand_ins: list[StandInSidecar]) -> None:
    statuses = {s.pod: await controller.sidecars.status(s.endpoint, 1) for s in stand_ins if s.mode == "ok"}
    view = controller.store.jobs()[0]
    controller.on_status(view.key, statuses)
    await controller.idle()


async def test_a_stall_yields_one_diagnosis_however_many_signals(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    await poll_once(controller, stand_ins)

    [report] = fake_kube.of("flightrecorderreports")
    assert report["diagnosis"]["who"]["culpritRanks"] == [1]
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None and job["status"]["conditions"][0]["reason"] == "RankNotJoined"
    assert [e["reason"] for e in fake_kube.of("events")] == ["RankNotJoined"]
    gathers = sum(s.snapshot_requests for s in stand_ins)

    # More signals about the same incident: the stall again, the watchdog killing the trainer, the job failing.
    await controller.on_job("MODIFIED", job)  # what the condition write looks like to the watcher
    await poll_once(controller, stand_ins)
    await controller.on_pod("MODIFIED", builders.pod(
        "train-worker-0", port=stand_ins[1].port, state=builders.terminated(builders.WATCHDOG_MESSAGE)))
    failed = dict(job, status={"conditions": job["status"]["conditions"] + [{"type": "Failed", "status": "True"}]})
    await controller.on_job("MODIFIED", failed)
    await controller.idle()
    assert len(fake_kube.of("flightrecorderreports")) == 1 and len(fake_kube.of("events")) == 1
    assert sum(s.snapshot_requests for s in stand_ins) == gathers  # deduped before gathering
    metrics = controller.metrics.registry
    assert metrics.get_sample_value("frscope_operator_diagnoses_total", {"category": "RankNotJoined"}) == 1
    assert metrics.get_sample_value("frscope_operator_signal_to_condition_seconds_count") == 1
    # The per-job gauge the dashboard filters by $namespace/$job: there while the job is, gone with it.
    labels = {"namespace": "ml", "training_job": "train", "category": "RankNotJoined"}
    assert metrics.get_sample_value("frscope_operator_job_diagnosis", labels) == 1
    await controller.on_job("DELETED", failed)
    assert metrics.get_sample_value("frscope_operator_job_diagnosis", labels) is None


async def test_operator_restart_mid_incident_makes_no_second_report(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    first = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, first, sidecars, hang_ranks)
    await poll_once(first, stand_ins)
    assert len(fake_kube.of("flightrecorderreports")) == 1

    # A new operator process: it relists frscope's reports (its ledger), the job and the pods.
    second = make_controller(kube_client, session)
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None and not job["metadata"]["annotations"]  # nothing of frscope's on the job
    for report in fake_kube.of("flightrecorderreports"):
        await second.on_report(None, report)
    await second.on_job(None, job)
    for s in stand_ins:
        kind = "Master" if "master" in s.pod else "Worker"
        await second.on_pod(None, builders.pod(s.pod, port=s.port, replica_type=kind))
    await poll_once(second, stand_ins)
    assert len(fake_kube.of("flightrecorderreports")) == 1 and len(fake_kube.of("events")) == 1


async def test_the_same_hang_after_a_torchrun_restart_is_a_new_incident(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    """torchrun --max-restarts restarts its workers inside the same pods and container run; they hang at
    the same group and sequence id again. The sidecars report the new restart count (the bootstrap's
    TORCHELASTIC_RESTART_COUNT), and that is a new attempt: a second report, not 'already diagnosed'."""
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    for s in stand_ins:
        s.restart_count = 0
    await poll_once(controller, stand_ins)
    assert len(fake_kube.of("flightrecorderreports")) == 1
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None
    await controller.on_job("MODIFIED", job)
    await poll_once(controller, stand_ins)  # the same hang, seen again: nothing new
    assert len(fake_kube.of("flightrecorderreports")) == 1

    for s in stand_ins:
        s.restart_count = 1
    await poll_once(controller, stand_ins)
    reports = fake_kube.of("flightrecorderreports")
    assert len(reports) == 2
    attempts = sorted(r["job"]["attempt"] for r in reports)
    assert attempts[0].endswith("/r0") and attempts[1] == attempts[0] + "t1"
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None
    await controller.on_job("MODIFIED", job)
    # The watchdog ending the restarted workers' container names no restart count: it belongs to the latest.
    await controller.on_pod("MODIFIED", builders.pod(
        "train-worker-0", port=stand_ins[1].port, state=builders.terminated(builders.WATCHDOG_MESSAGE)))
    await poll_once(controller, stand_ins)
    assert len(fake_kube.of("flightrecorderreports")) == 2


async def test_restart_between_report_and_condition_finds_its_own_report(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    first = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, first, sidecars, hang_ranks)
    # The report is created, then every write to the job fails: as if the operator died right there.
    fake_kube.fail("PATCH", "/pytorchjobs/train/status", 500, times=100)
    await poll_once(first, stand_ins)
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None and not any(c["type"] == names.CONDITION_TYPE for c in job["status"]["conditions"])
    fake_kube.faults.clear()

    # The new process has not seen the report yet (its watch is still listing): it diagnoses again,
    # finds the report already there under the incident's name, and writes the condition.
    second = make_controller(kube_client, session)
    await second.on_job(None, job)
    for s in stand_ins:
        await second.on_pod(None, builders.pod(s.pod, port=s.port))
    await poll_once(second, stand_ins)
    assert len(fake_kube.of("flightrecorderreports")) == 1  # same name: AlreadyExists, reused
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None and job["status"]["conditions"][0]["type"] == names.CONDITION_TYPE


async def test_the_condition_is_put_back_from_the_report_after_a_restart(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    first = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, first, sidecars, hang_ranks)
    await poll_once(first, stand_ins)
    [report] = fake_kube.of("flightrecorderreports")
    assert report["job"]["condition"]["reason"] == "RankNotJoined"
    # The training operator rewrites the list without frscope's condition while no operator runs.
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None
    theirs = [c for c in job["status"]["conditions"] if c["type"] != names.CONDITION_TYPE]
    job = fake_kube.put("pytorchjobs", dict(job, status={"conditions": theirs}))

    second = make_controller(kube_client, session)
    await second.on_report(None, report)  # kopf lists the reports ...
    await second.on_job(None, job)  # ... and the job: the condition goes back, first
    await second.idle()
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None
    assert [c["type"] for c in job["status"]["conditions"]] == [names.CONDITION_TYPE, *[c["type"] for c in theirs]]
    assert job["status"]["conditions"][0]["message"] == report["job"]["condition"]["message"]


async def test_sidecar_down_gives_a_partial_report_naming_missing_ranks(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks, modes=("ok", "down"))
    await poll_once(controller, stand_ins)
    [report] = fake_kube.of("flightrecorderreports")
    assert report["diagnosis"]["who"]["missingRanks"] == "2-3"
    assert "train-worker-0" in report["diagnosis"]["who"]["missingPods"][0]
    reasons = sorted(e["reason"] for e in fake_kube.of("events"))
    assert names.REASON_SIDECARS_UNREACHABLE in reasons
    assert controller.metrics.registry.get_sample_value("frscope_operator_sidecars_unreachable_total") == 1


async def test_job_deleted_mid_gather_is_not_a_crash(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    for s in stand_ins:
        s.mode, s.delay_s = "slow", 0.5
    statuses = {s.pod: s.status_obj() for s in stand_ins}
    from frscope.operator.evidence.sidecars import parse_status

    controller.on_status(controller.store.jobs()[0].key, {p: parse_status(o) for p, o in statuses.items()})
    await asyncio.sleep(0.1)  # the gather is under way
    fake_kube.objects.pop(("pytorchjobs", "ml", "train"))
    await controller.idle()
    assert fake_kube.of("flightrecorderreports") == [] and fake_kube.of("events") == []


async def test_healthy_job_is_not_reported_and_not_regathered_at_once(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make) -> None:
    from tests.unit.operator.fakes import real_snapshots

    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, real_snapshots("none"))
    await poll_once(controller, stand_ins)
    await poll_once(controller, stand_ins)
    assert fake_kube.of("flightrecorderreports") == []
    assert sum(s.snapshot_requests for s in stand_ins) == 2  # one gather, then the cooldown


async def test_a_trainer_run_that_ends_in_failure_is_gathered_again_within_the_cooldown(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make) -> None:
    """The sidecar's exit push arrives before the kubelet reports the container's end: that gather
    finds nothing, and the exit that follows is new evidence, not a repeat."""
    from tests.unit.operator.fakes import real_snapshots

    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, real_snapshots("none"))
    await poll_once(controller, stand_ins)
    once = sum(s.snapshot_requests for s in stand_ins)  # one gather: a snapshot from each sidecar
    assert once == 2
    crashed = builders.pod("train-worker-0", port=stand_ins[1].port,
                           state=builders.terminated("RuntimeError: boom", 1))
    await controller.on_pod("MODIFIED", crashed)
    await controller.idle()
    assert sum(s.snapshot_requests for s in stand_ins) == 2 * once  # the exit: gathered again
    await controller.on_pod("MODIFIED", crashed)  # the same end, seen again: the cooldown holds
    await controller.idle()
    assert sum(s.snapshot_requests for s in stand_ins) == 2 * once
    kinds = controller.metrics.registry.get_sample_value("frscope_operator_signals_total", {"kind": "TrainerExit"})
    assert kinds == 2


async def test_push_from_a_deleted_pod_counts(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    worker = stand_ins[1]
    await controller.on_pod("DELETED", builders.pod(worker.pod, port=worker.port))
    pushed = from_snapshot(parse_snapshot({**worker.snapshot_obj(), "reason": "exit"}, "push", size_bytes=100),
                           origin="push")
    assert controller.on_push(pushed) is not None
    await controller.idle()
    [report] = fake_kube.of("flightrecorderreports")
    assert report["diagnosis"]["who"]["missingRanks"] == "none"
    assert report["job"]["signal"].startswith("SidecarPush")


async def test_a_pod_whose_trainer_ended_is_not_asked_its_exit_push_counts(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    """Its sidecar is being stopped with the pod: asking it would wait out the gather's timeouts (30-40
    s); what it pushed at the exit is its evidence."""
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    worker = stand_ins[1]
    pushed = from_snapshot(parse_snapshot({**worker.snapshot_obj(), "reason": "exit"}, "push", size_bytes=100),
                           origin="push")
    controller.pushes.put(pushed, job="train")
    await controller.on_pod("MODIFIED", builders.pod(worker.pod, port=worker.port, phase="Failed",
                                                     state=builders.terminated("RuntimeError: boom", 1)))
    await controller.idle()
    assert worker.snapshot_requests == 0 and stand_ins[0].snapshot_requests == 1
    [report] = fake_kube.of("flightrecorderreports")
    assert report["diagnosis"]["who"]["missingRanks"] == "none"  # the push stood in for the sidecar


async def test_a_failed_rank_is_reported_from_its_exit_when_nothing_could_be_gathered(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession) -> None:
    """A rank that exited a second after joining, before any sidecar read a recorder: the kubelet's
    word is the evidence."""
    controller = make_controller(kube_client, session)
    stored = fake_kube.put("pytorchjobs", builders.job(workers=1, nproc=1))
    await controller.on_job(None, stored)
    await controller.on_pod("ADDED", builders.pod("train-master-0", replica_type="Master", port=None))
    await controller.on_pod("MODIFIED", builders.pod("train-worker-0", port=None, phase="Failed",
                                                     state=builders.terminated("frscope-test: lost its shard", 3)))
    await controller.idle()
    [report] = fake_kube.of("flightrecorderreports")
    assert report["diagnosis"]["who"]["culpritRanks"] == [1]
    assert report["diagnosis"]["what"]["category"] == "RankStopped"
    assert "exited with code 3" in report["diagnosis"]["verdict"]


async def test_condition_rewritten_by_the_training_operator_is_put_back(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    await poll_once(controller, stand_ins)
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None
    # The training operator writes its own list (from a stale copy): ours is gone.
    job["status"]["conditions"] = [{"type": "Created", "status": "True"}, {"type": "Restarting", "status": "True"}]
    rewritten = fake_kube.put("pytorchjobs", job)
    await controller.on_job("MODIFIED", rewritten)
    await controller.idle()
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None
    assert [c["type"] for c in job["status"]["conditions"]] == [names.CONDITION_TYPE, "Created", "Restarting"]
    assert len(fake_kube.of("flightrecorderreports")) == 1


async def test_status_sweep_is_rate_bounded_and_skips_pods_without_endpoints(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    import time

    from frscope.operator.serve.status_poller import StatusPoller

    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    for s in stand_ins:
        s.stalled = False
    await controller.on_pod("ADDED", builders.pod("train-worker-1", ip=None))  # no IP yet: not polled
    poller = StatusPoller(controller, interval_s=60, timeout_s=1, max_rps=4, concurrency=1)
    started = time.monotonic()
    await poller.sweep()
    assert time.monotonic() - started >= 0.45  # 2 requests at 4/s
    assert [s.status_requests for s in stand_ins] == [1, 1]
    assert not controller.store.jobs()[0].stalled and fake_kube.of("flightrecorderreports") == []


async def test_a_jobs_first_stall_is_signalled_before_the_sweep_ends(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    """A sweep over 1,000s of pods takes seconds (8,192 at --poll-max-rps 200: 41 s): the answer that
    first reports a stall starts the incident, not the sweep's end. While the incident is handled, the
    sweep asks none of the job's other sidecars (the gather is asking them for more: at 8,192 pods the
    polls competed with it); the next sweep polls them all and, the job known stalled, decides at its end."""
    import asyncio

    from frscope.operator.serve.status_poller import StatusPoller

    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    gate = asyncio.Event()
    for s in stand_ins:
        s.snapshot_gate = gate  # the gather's snapshots wait: the incident stays under way
    signals: list[tuple[str | None, int]] = []
    real_signal = controller.signal

    def noting(sig: Any) -> None:
        signals.append((sig.pod, sum(s.status_requests for s in stand_ins)))
        real_signal(sig)

    controller.signal = noting  # type: ignore[method-assign]
    poller = StatusPoller(controller, interval_s=60, timeout_s=1, max_rps=2, concurrency=1)
    sweep = asyncio.create_task(poller.sweep())
    await asyncio.sleep(0.3)  # the first pod answered; the second waits for its slot (2/s)
    assert signals == [("train-master-0", 1)] and controller.store.jobs()[0].stalled
    assert controller.handling(controller.store.jobs()[0].key)
    await sweep
    assert [s.status_requests for s in stand_ins] == [1, 0]  # the incident's job: no more polls
    assert len(signals) == 1
    gate.set()
    await controller.idle()
    assert len(fake_kube.of("flightrecorderreports")) == 1
    assert not controller.handling(controller.store.jobs()[0].key)
    # The incident over, the next sweep polls every pod; the job known stalled, it signals at its end
    # (already diagnosed: no second report).
    await poller.sweep()
    assert [s.status_requests for s in stand_ins] == [2, 1]
    assert len(signals) == 2
    await controller.idle()
    assert len(fake_kube.of("flightrecorderreports")) == 1


async def test_a_dead_pods_exit_reaches_the_report_as_evidence(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks, modes=("ok", "down"))
    # The worker (ranks 2-3) was OOM-killed: the kubelet's status says so, its sidecar is gone.
    oom = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "Killed"}}
    await controller.on_pod("MODIFIED", builders.pod("train-worker-0", port=stand_ins[1].port, state=oom,
                                                     restarts=0))
    await poll_once(controller, stand_ins)
    [report] = fake_kube.of("flightrecorderreports")
    findings = report["report"]["findings"]
    flat = [g for f in findings for g in (f, *f["consequences"])]
    exits = {r: e for f in flat for r, e in f["exits"].items()}
    assert exits["2"]["reason"] == "OOMKilled" and exits["2"]["exit_code"] == 137 and exits["2"]["signal"] == "SIGKILL"
    assert "train-worker-0" in exits["3"]["source"]


NODE_CRASH = __import__("pathlib").Path(__file__).resolve().parents[2] / "data" / "node" / "torchrun-crash-unread"
# torchrun's summary in the crashed pod's termination message (torch 2.13, the bootstrap's error file).
CRASHED_POD_TAIL = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/scripts/train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-03_12:34:05
  host      : train-worker-0
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 42)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 42
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_12:34:05
  host      : train-worker-0
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 43)
  error_file: /tmp/torchelastic/error.json
  traceback : Traceback (most recent call last):
    RuntimeError: frscope-test: this rank lost its data shard
============================================================
"""


async def crashed_job_with_exit_pushes(fake_kube: FakeKube, controller: Controller) -> None:
    """A 2-pod torchrun job whose sidecars both pushed at the exit (the real node's pushes); the kubelet
    has reported neither pod's end yet."""
    import json

    stored = fake_kube.put("pytorchjobs", builders.job(workers=1, nproc=2))
    await controller.on_job(None, stored)
    for name, kind in (("train-master-0", "Master"), ("train-worker-0", "Worker")):
        await controller.on_pod("ADDED", builders.pod(name, replica_type=kind, port=None))
        obj = json.loads((NODE_CRASH / f"{name}.json").read_text())
        obj["namespace"] = "ml"
        controller.pushes.put(from_snapshot(parse_snapshot(obj, "push", size_bytes=100), origin="push"), job="train")


async def test_a_crash_waits_for_every_pods_exit_before_naming_the_culprit(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession) -> None:
    """Rank 3 raises, and the kubelet reports the end of the *other* pod first (its ranks failed on
    gloo's 'Connection closed by peer'). Both sidecars have pushed at the exit. Diagnosed at once, rank 0
    would be named; the gather waits for the crashed pod's end
    (its torchrun summary names rank 3 the first failure) and names rank 3. The pushes are the real
    node's (tests/data/node/torchrun-crash-unread)."""
    controller = make_controller(kube_client, session)
    await crashed_job_with_exit_pushes(fake_kube, controller)
    victim = builders.terminated("RuntimeError: [pair.cc:553] Connection closed by peer [10.213.0.13]:59042. "
                                 "This is typically caused by a remote worker crashing.", 1)
    await controller.on_pod("MODIFIED", builders.pod("train-master-0", replica_type="Master", port=None,
                                                     state=victim))

    async def kubelet_reports_the_crashed_pod() -> None:
        await asyncio.sleep(1.5)
        await controller.on_pod("MODIFIED", builders.pod("train-worker-0", port=None,
                                                         state=builders.terminated(CRASHED_POD_TAIL, 1)))

    late = asyncio.create_task(kubelet_reports_the_crashed_pod())
    await controller.idle()
    await late
    await controller.idle()
    [report] = fake_kube.of("flightrecorderreports")
    assert report["diagnosis"]["who"]["culpritRanks"] == [3], report["diagnosis"]
    assert "lost its data shard" in report["diagnosis"]["verdict"]


async def test_the_wait_for_an_exit_the_kubelet_never_reports_is_bounded(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession) -> None:
    """A pod whose sidecar pushed an exit while its container keeps running (torchrun restarting its
    workers): the gather goes on after --exit-settle with what it has."""
    import time

    config = OperatorConfig(decode_processes=0, stuck_after_s=0.5, cooldown_s=60, exit_settle_s=1.0,
                            gather=CONFIG.gather)
    controller = make_controller(kube_client, session, config)
    await crashed_job_with_exit_pushes(fake_kube, controller)
    started = time.monotonic()
    await controller.on_pod("MODIFIED", builders.pod("train-master-0", replica_type="Master", port=None,
                                                     state=builders.terminated("RuntimeError: boom", 1)))
    await controller.idle()
    assert 1.0 <= time.monotonic() - started < 10
    [report] = fake_kube.of("flightrecorderreports")
    assert report["diagnosis"]["who"]["culpritRanks"] == [0]  # the only exit known


async def test_a_crashed_pods_end_that_comes_after_the_report_revises_it(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession) -> None:
    """The crash wait ends before the kubelet's word on the crashed pod, and the report names the ranks
    that died of the crash. When that end arrives the
    attempt is diagnosed again and the same report object is rewritten (one report, one incident), the
    job's condition follows, and a DiagnosisRevised Event says what changed. The same end seen again
    rewrites nothing."""
    config = OperatorConfig(decode_processes=0, stuck_after_s=0.5, cooldown_s=60, exit_settle_s=1.0,
                            gather=CONFIG.gather)
    controller = make_controller(kube_client, session, config)
    await crashed_job_with_exit_pushes(fake_kube, controller)
    await controller.on_pod("MODIFIED", builders.pod("train-master-0", replica_type="Master", port=None,
                                                     state=PEER_DIED))
    await controller.idle()
    [first] = fake_kube.of("flightrecorderreports")
    assert first["diagnosis"]["who"]["culpritRanks"] == [0]  # the only end known when the wait ended
    assert "revision" not in first["job"]

    crashed = builders.pod("train-worker-0", port=None, state=builders.terminated(CRASHED_POD_TAIL, 1))
    await controller.on_pod("MODIFIED", crashed)
    await controller.idle()
    [report] = fake_kube.of("flightrecorderreports")
    assert report["metadata"]["name"] == first["metadata"]["name"]
    assert report["job"]["incident"] == first["job"]["incident"] and report["job"]["revision"] == 1
    assert report["diagnosis"]["who"]["culpritRanks"] == [3], report["diagnosis"]
    assert "lost its data shard" in report["diagnosis"]["verdict"]
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None
    [ours] = [c for c in job["status"]["conditions"] if c["type"] == names.CONDITION_TYPE]
    assert "Rank 3" in ours["message"] and "lost its data shard" in ours["message"], ours
    revised = [e for e in fake_kube.of("events") if e["reason"] == names.REASON_REVISED]
    assert len(revised) == 1 and revised[0]["type"] == "Normal", revised
    assert first["metadata"]["name"] in revised[0]["message"]
    assert [r.report for r in controller._state(controller.store.jobs()[0].key).ledger.records] == [
        first["metadata"]["name"]]

    events = len(fake_kube.of("events"))
    await controller.on_pod("MODIFIED", crashed)  # the kubelet's status again: nothing new
    await controller.idle()
    [again] = fake_kube.of("flightrecorderreports")
    assert again["job"]["revision"] == 1 and len(fake_kube.of("events")) == events


MASTER_CRASH_TAIL = (CRASHED_POD_TAIL.replace("train-worker-0", "train-master-0")
                     .replace("rank      : 2 (local_rank: 0)", "rank      : 1 (local_rank: 1)")
                     .replace("rank      : 3 (local_rank: 1)", "rank      : 0 (local_rank: 0)"))
PEER_DIED = builders.terminated("RuntimeError: [pair.cc:553] Connection closed by peer [10.213.0.13]:59042. "
                                "This is typically caused by a remote worker crashing.", 1)


class GoingDownSidecar(StandInSidecar):
    """A sidecar asked while its ranks go down: it answers with what it holds, the real node's recorders
    that were never read (no entries) and its 'socket is gone' errors."""

    def __init__(self, pod: str, obj: dict[str, Any]) -> None:
        super().__init__(pod, {})
        self.obj = obj

    def snapshot_obj(self) -> dict[str, Any]:
        return dict(self.obj, reason="refresh")


async def test_a_crash_waits_for_the_pods_that_delivered_no_live_rank(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession) -> None:
    """Rank 0 raises; the worker's sidecar pushes at its ranks' exit, and the gather that push starts
    asks it again while it still answers (empty recorders, sockets gone), while the master pod, whose
    rank raised, delivers nothing. Diagnosed at once, ranks 0-1 would be 'missing'; the gather waits for
    both pods' ends (no live rank in either) and names rank 0 from the master's torchrun summary."""
    import json

    controller = make_controller(kube_client, session)
    stored = fake_kube.put("pytorchjobs", builders.job(workers=1, nproc=2))
    await controller.on_job(None, stored)
    obj = json.loads((NODE_CRASH / "train-worker-0.json").read_text())
    obj["namespace"] = "ml"
    worker = await GoingDownSidecar("train-worker-0", obj).start()
    try:
        await controller.on_pod("ADDED", builders.pod("train-master-0", replica_type="Master", port=None))
        await controller.on_pod("ADDED", builders.pod("train-worker-0", port=worker.port))

        async def kubelet_reports_both_ends() -> None:
            await asyncio.sleep(1.0)
            await controller.on_pod("MODIFIED", builders.pod("train-worker-0", port=worker.port, state=PEER_DIED))
            await asyncio.sleep(1.0)
            await controller.on_pod("MODIFIED", builders.pod("train-master-0", replica_type="Master", port=None,
                                                             state=builders.terminated(MASTER_CRASH_TAIL, 1)))

        late = asyncio.create_task(kubelet_reports_both_ends())
        pushed = from_snapshot(parse_snapshot(obj, "push", size_bytes=100), origin="push")
        assert controller.on_push(pushed) is not None
        await controller.idle()
        await late
        await controller.idle()
    finally:
        await worker.close()
    assert worker.snapshot_requests >= 1  # it was asked, as on the node
    [report] = fake_kube.of("flightrecorderreports")
    assert report["diagnosis"]["who"]["culpritRanks"] == [0], report["diagnosis"]
    assert "lost its data shard" in report["diagnosis"]["verdict"]


async def test_a_crash_does_not_wait_for_pods_whose_ranks_are_still_up(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any], caplog: pytest.LogCaptureFixture) -> None:
    """The worker's end is known and the master's ranks answer with their recorders (a hung job: rank 1
    never joined): nothing to wait for, the diagnosis goes out at once."""
    import logging

    config = OperatorConfig(decode_processes=0, stuck_after_s=0.5, cooldown_s=60, exit_settle_s=30.0,
                            gather=CONFIG.gather)
    controller = make_controller(kube_client, session, config)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks, modes=("ok", "down"))
    with caplog.at_level(logging.INFO, logger="frscope.operator"):
        await controller.on_pod("MODIFIED", builders.pod("train-worker-0", port=stand_ins[1].port,
                                                         state=builders.terminated("RuntimeError: boom", 1)))
        await asyncio.wait_for(controller.idle(), 20)
    assert not [r for r in caplog.records if "waiting up to" in r.getMessage()]
    [report] = fake_kube.of("flightrecorderreports")
    assert report["diagnosis"]["who"]["culpritRanks"] == [1]  # the hung master's rank that never joined


async def test_pods_the_watch_has_not_delivered_yet_are_listed_before_the_gather(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    """An operator that just started streams the listing of 1,000s of pods over seconds; a signal in
    that time (seen in bench/push_storm.py: the restarted operator got pushes at once) gathered from the
    pods delivered so far and reported every other rank missing. The job's pods are listed from the API
    server first; only the ones the store does not know are added."""
    listed: list[str] = []

    async def lister(ref: Any) -> AsyncIterator[list[dict[str, Any]]]:
        listed.append(ref.name)
        for s in stand_ins:  # a page of one pod each: read page by page
            yield [builders.pod(s.pod, replica_type="Master" if "master" in s.pod else "Worker", port=s.port)]

    controller = Controller(CONFIG, store=JobStore(), pushes=PushStore(), sidecars=SidecarClient(session),
                            publisher=Publisher(kube_client, instance="op-0"),
                            metrics=OperatorMetrics(CollectorRegistry()), pod_lister=lister)
    await controller.on_job(None, fake_kube.put("pytorchjobs", builders.job(workers=1, nproc=2)))
    stand_ins = [await sidecars("train-master-0", {r: hang_ranks[r] for r in (0, 1)}),
                 await sidecars("train-worker-0", {r: hang_ranks[r] for r in (2, 3)})]
    # The watch has delivered the master only.
    await controller.on_pod(None, builders.pod("train-master-0", replica_type="Master", port=stand_ins[0].port))
    await poll_once(controller, stand_ins[:1])
    assert listed == ["train"] and stand_ins[1].snapshot_requests == 1
    [report] = fake_kube.of("flightrecorderreports")
    assert report["diagnosis"]["who"]["culpritRanks"] == [1]
    assert report["diagnosis"]["who"]["missingRanks"] == "none"
    assert len(controller.store.jobs()[0].pods) == 2


async def test_a_pod_whose_trainer_restarts_during_the_wait_is_not_waited_for(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession) -> None:
    """The kubelet may report a restarted container only as running again, its end in `lastState`
    (restartPolicy OnFailure): the end came and went, so the wait for it stops there, not at
    --exit-settle."""
    import time

    config = OperatorConfig(decode_processes=0, stuck_after_s=0.5, cooldown_s=60, exit_settle_s=30.0,
                            gather=CONFIG.gather)
    controller = make_controller(kube_client, session, config)
    await crashed_job_with_exit_pushes(fake_kube, controller)
    crash = builders.terminated(CRASHED_POD_TAIL, 1)

    async def kubelet_reports_the_restarts() -> None:
        await asyncio.sleep(1.0)
        running = {"running": {"startedAt": "2026-01-01T00:01:00Z"}}
        await controller.on_pod("MODIFIED", builders.pod("train-worker-0", port=None, restarts=1, state=running,
                                                         last_state=crash))
        await controller.on_pod("MODIFIED", builders.pod("train-master-0", replica_type="Master", port=None,
                                                         restarts=1, state=running, last_state=PEER_DIED))

    started = time.monotonic()
    late = asyncio.create_task(kubelet_reports_the_restarts())
    await controller.on_pod("MODIFIED", builders.pod("train-master-0", replica_type="Master", port=None,
                                                     state=PEER_DIED))
    await asyncio.wait_for(controller.idle(), 25)
    await late
    assert time.monotonic() - started < 15  # not the 30 s of --exit-settle
    assert fake_kube.of("flightrecorderreports")
