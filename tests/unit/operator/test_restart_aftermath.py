"""After frscope restarts a hung job, what its deleted pods do is not a new incident.

The restart deletes both pods; their trainers are SIGKILLed at the end of the grace period (exit 137),
their sidecars push at the exit, the training operator sets Restarting and makes new pods of the same
names. Taken as new incidents (RankStopped from the 137, MissingDumps from the old pushes under the new
pods' attempt), they would overwrite the job's condition, and the new pods' own hang, in an attempt
already 'diagnosed', would never be reported. Here the same sequence runs through the Controller with
the real Actor over the fake API server and stand-in sidecars serving real recorder snapshots of a hung
gloo job.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from frscope.operator.actions import ActionOptions, Actor, Policy
from frscope.operator.engine.controller import Controller
from frscope.operator.engine.settings import OperatorConfig
from frscope.operator.evidence.gather import GatherOptions
from frscope.operator.evidence.pod_evidence import from_snapshot
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.evidence.sidecars import SidecarClient, parse_snapshot
from frscope.operator.kube import KubeClient
from frscope.operator.model.objects import pod_info, pods_digest
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.model.store import JobStore
from frscope.operator.publish import Publisher
from frscope.operator.serve.access import POD_NAME_EXTRA, POD_UID_EXTRA, Identity, KubernetesPush
from tests.unit.operator import builders
from tests.unit.operator.fakes import FakeKube, StandInSidecar

Make = Callable[..., Awaitable[StandInSidecar]]
# --exit-settle shortened: a pod these tests never end would hold a crash's gather 45 s.
CONFIG = OperatorConfig(decode_processes=0, stuck_after_s=0.5, cooldown_s=60, exit_settle_s=5.0,
                        gather=GatherOptions(per_pod_timeout_s=1, overall_timeout_s=3, attempts=2,
                                             backoff_base_s=0.01))
PODS = (("train-master-0", "Master"), ("train-worker-0", "Worker"))


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def controller_with_actor(kube: KubeClient, session: aiohttp.ClientSession) -> Controller:
    metrics = OperatorMetrics(CollectorRegistry())
    publisher = Publisher(kube, instance="op-0")
    actor = Actor(kube, publisher, metrics, ActionOptions(allowed=frozenset({Policy.RESTART})), instance="op-0")
    return Controller(CONFIG, store=JobStore(), pushes=PushStore(), sidecars=SidecarClient(session),
                      publisher=publisher, metrics=metrics, actor=actor)


async def start_generation(fake_kube: FakeKube, controller: Controller, sidecars: Make, ranks: dict[int, Any],
                           generation: int) -> list[tuple[StandInSidecar, dict[str, Any]]]:
    """The job's pods (made by the training operator), each with a stand-in sidecar serving its ranks."""
    out = []
    for (name, rtype), mine in zip(PODS, ({r: v for r, v in ranks.items() if r < 2},
                                          {r: v for r, v in ranks.items() if r >= 2}), strict=True):
        sidecar = await sidecars(name, mine)
        pod = builders.pod(name, uid=f"{name}-g{generation}", replica_type=rtype, port=sidecar.port)
        fake_kube.put("pods", pod)
        await controller.on_pod("ADDED", pod)
        out.append((sidecar, pod))
    return out


async def poll(controller: Controller, stand_ins: list[StandInSidecar]) -> None:
    statuses = {s.pod: await controller.sidecars.status(s.endpoint, 1) for s in stand_ins}
    controller.on_status(controller.store.jobs()[0].key, statuses)
    await controller.idle()


async def test_the_deleted_pods_aftermath_is_no_new_incident_and_the_new_pods_hang_is(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = controller_with_actor(kube_client, session)
    job = builders.job(annotations={"frscope.io/on-diagnosis": "restart"})
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        spec["restartPolicy"] = "ExitCode"
    job = fake_kube.put("pytorchjobs", job)
    await controller.on_job(None, job)
    first = await start_generation(fake_kube, controller, sidecars, hang_ranks, 1)
    await poll(controller, [s for s, _ in first])

    [report] = fake_kube.of("flightrecorderreports")
    assert report["action"]["state"] == "done" and report["action"]["action"] == "restart"
    assert all(fake_kube.get("pods", "ml", pod["metadata"]["name"]) is None for _, pod in first)
    await controller.on_report("MODIFIED", report)  # the report's watch event, as kopf delivers it

    # The aftermath (as tests/node/test_actions.py sees it): each sidecar pushes at its trainer's exit (SIGKILL at the
    # end of the grace period), the kubelet reports the 137 on the pod being deleted, the pod goes, the
    # training operator sets Restarting and makes new pods of the same names (not yet running).
    for sidecar, pod in first:
        pushed = from_snapshot(parse_snapshot({**sidecar.snapshot_obj(), "reason": "exit"}, "push", size_bytes=100),
                               origin="push")
        pushed.pod_uid = pod["metadata"]["uid"]
        controller.on_push(pushed)
        ending = builders.pod(pod["metadata"]["name"], uid=pod["metadata"]["uid"], port=sidecar.port,
                              state=builders.terminated("", 137))
        ending["metadata"]["deletionTimestamp"] = "2026-12-03T16:03:02Z"
        await controller.on_pod("MODIFIED", ending)
    await controller.idle()
    for _, pod in first:
        await controller.on_pod("DELETED", pod)
    restarting = dict(job, status={"conditions": job["status"]["conditions"] + [
        {"type": "Restarting", "status": "True", "reason": "PyTorchJobRestarting"}]})
    await controller.on_job("MODIFIED", restarting)
    for name, rtype in PODS:
        await controller.on_pod("ADDED", builders.pod(name, uid=f"{name}-g2", replica_type=rtype, ip=None))
    await controller.idle()
    assert len(fake_kube.of("flightrecorderreports")) == 1, [r["diagnosis"] for r in fake_kube.of(
        "flightrecorderreports")]
    stored = fake_kube.get("pytorchjobs", "ml", "train")
    assert stored is not None and stored["status"]["conditions"][0]["reason"] == "RankNotJoined"

    # The new pods hang the same way: that is a new incident, of their generation, acted on again.
    second = await start_generation(fake_kube, controller, sidecars, hang_ranks, 2)
    await poll(controller, [s for s, _ in second])
    reports = fake_kube.of("flightrecorderreports")
    assert len(reports) == 2
    again = next(r for r in reports if r["metadata"]["name"] != report["metadata"]["name"])
    digest = pods_digest([pod_info(p) for _, p in second])
    assert again["job"]["attempt"].startswith(digest + "/")
    assert again["diagnosis"]["what"]["category"] == "RankNotJoined"
    assert again["action"]["state"] == "done"
    assert sorted(again["action"]["targets"]) == sorted(f"pod/{n}/{n}-g2" for n, _ in PODS)


async def claimed_restart(fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession,
                          sidecars: Make, hang_ranks: dict[int, Any], *, restart_policy: str | None = None,
                          ) -> tuple[dict[str, Any], list[tuple[StandInSidecar, dict[str, Any]]], dict[str, Any]]:
    """A hung job diagnosed by an operator that died after claiming the restart (the report's action
    record 'acting', naming the pods) and before acting: (job, pods, report)."""
    first = controller_with_actor(kube_client, session)
    job = builders.job(annotations={"frscope.io/on-diagnosis": "restart"})
    if restart_policy is not None:
        for spec in job["spec"]["pytorchReplicaSpecs"].values():
            spec["restartPolicy"] = restart_policy
    job = fake_kube.put("pytorchjobs", job)
    first.actor = None  # this one diagnoses and dies before acting
    await first.on_job(None, job)
    pods = await start_generation(fake_kube, first, sidecars, hang_ranks, 1)
    await poll(first, [s for s, _ in pods])
    [report] = fake_kube.of("flightrecorderreports")
    report["action"] = {"requested": "restart", "source": "job annotation", "action": "restart", "state": "acting",
                        "why": "policy restart", "at": "2026-12-03T16:03:00Z",
                        "targets": [f"pod/{p['metadata']['name']}/{p['metadata']['uid']}" for _, p in pods]}
    report = fake_kube.put("flightrecorderreports", report)
    return job, pods, report


async def test_a_restart_claimed_by_an_operator_that_died_is_finished_by_the_next(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    """The claim names the pods (now retired), which are still running: their signals are not a new
    incident, but the claimed restart is still carried out."""
    job, pods, report = await claimed_restart(fake_kube, kube_client, session, sidecars, hang_ranks,
                                              restart_policy="ExitCode")

    second = controller_with_actor(kube_client, session)
    await second.on_report(None, report)
    await second.on_job(None, job)
    for _, pod in pods:
        await second.on_pod(None, pod)
    await poll(second, [s for s, _ in pods])
    [done] = fake_kube.of("flightrecorderreports")
    assert done["action"]["state"] == "done"
    assert all(fake_kube.get("pods", "ml", p["metadata"]["name"]) is None for _, p in pods)
    assert [e["reason"] for e in fake_kube.of("events")].count("HungJobRestarted") == 1


@pytest.mark.parametrize("report_first", [True, False])
async def test_a_claimed_restart_whose_pods_are_gone_is_finished_without_any_signal(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any], report_first: bool) -> None:
    """An operator claimed the restart, deleted the pods and died before writing the outcome; by the time
    its successor starts the pods are gone (else the action would stay 'acting' for good). No pod, no sidecar,
    no signal: the successor finishes the claim
    from the report alone, whichever of the report and the job its watches deliver first."""
    job, pods, report = await claimed_restart(fake_kube, kube_client, session, sidecars, hang_ranks)
    for _, pod in pods:
        del fake_kube.objects[("pods", "ml", pod["metadata"]["name"])]

    second = controller_with_actor(kube_client, session)
    if report_first:
        await second.on_report(None, report)
        await second.on_job(None, job)
    else:
        await second.on_job(None, job)
        await second.on_report(None, report)
    await second.idle()
    [done] = fake_kube.of("flightrecorderreports")
    assert done["action"]["state"] == "done"
    assert [e["reason"] for e in fake_kube.of("events")].count("HungJobRestarted") == 1
    # The outcome's own report event settles it: later job events act no more.
    await second.on_report("MODIFIED", done)
    await second.on_job("MODIFIED", job)
    await second.idle()
    assert fake_kube.of("flightrecorderreports")[0]["action"] == done["action"]


async def test_a_push_from_a_pod_frscope_deleted_is_not_kept(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    """Also after an operator restart: the retired pods come from the reports' action records."""
    controller = controller_with_actor(kube_client, session)
    job = fake_kube.put("pytorchjobs", builders.job())
    await controller.on_job(None, job)
    report = {"metadata": {"name": "train-abc", "namespace": "ml"},
              "job": {"name": "train", "uid": job["metadata"]["uid"], "incident": "abc", "attempt": "x/r0"},
              "diagnosis": {"what": {"category": "RankNotJoined"}},
              "action": {"action": "restart", "state": "done", "targets": ["pod/train-worker-0/old-uid"]}}
    await controller.on_report(None, report)
    new = builders.pod("train-worker-0", uid="new-uid")
    await controller.on_pod("ADDED", new)
    sidecar = await sidecars("train-worker-0", {r: v for r, v in hang_ranks.items() if r >= 2})
    snapshot = parse_snapshot({**sidecar.snapshot_obj(), "reason": "exit"}, "push", size_bytes=100)
    old = from_snapshot(snapshot, origin="push")
    old.pod_uid = "old-uid"
    controller.on_push(old)
    assert controller.pushes.get("ml", "train-worker-0") is None
    fresh = from_snapshot(snapshot, origin="push")
    fresh.pod_uid = "new-uid"
    controller.on_push(fresh)
    got = controller.pushes.get("ml", "train-worker-0")
    assert got is not None and got.pod_uid == "new-uid"
    await controller.idle()


async def test_a_push_is_told_from_its_pods_successor_by_the_uid_its_token_is_bound_to() -> None:
    """The kubelet binds a pod's projected token to the pod's name and uid; TokenReview returns both
    (the real API server's answer is exercised in tests/e2e/test_auth_e2e.py)."""
    class Reviewer:
        async def authenticate(self, token: str, audience: str | None, client: str | None = None) -> Identity | None:
            return Identity("system:serviceaccount:ml:default", extra={
                POD_NAME_EXTRA: ("train-worker-0",), POD_UID_EXTRA: ("uid-1",)})

    caller = await KubernetesPush(Reviewer()).caller("Bearer t")  # type: ignore[arg-type]
    assert (caller.namespace, caller.pod, caller.pod_uid) == ("ml", "train-worker-0", "uid-1")
