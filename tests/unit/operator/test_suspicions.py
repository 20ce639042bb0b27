"""Suspected stalls and stragglers at the operator, against the fake API server and stand-in sidecars
serving real recorders (a real gloo hang: rank 1 never joined all_reduce #4): a suspicion is
published at once as not confirmed, cleared when the job moves on, replaced when the stall is
confirmed; a straggler is an Event, once per episode."""

from __future__ import annotations

from typing import Any

import aiohttp

from frscope.operator import names
from frscope.operator.engine.controller import Controller
from frscope.operator.engine.settings import OperatorConfig
from frscope.operator.evidence.pod_evidence import from_snapshot
from frscope.operator.evidence.sidecars import parse_snapshot
from frscope.operator.kube import KubeClient
from frscope.operator.ledger.incident_input import incident_from_report
from tests.unit.operator import builders
from tests.unit.operator.fakes import FakeKube, StandInSidecar
from tests.unit.operator.test_controller import CONFIG, Make, make_controller, session, setup_job
from tests.unit.test_lateness import job

__all__ = ["session"]  # the fixture, shared with test_controller


async def sweep(controller: Controller, stand_ins: list[StandInSidecar]) -> None:
    """One status sweep as the poller makes it: each answer first, then the job's answers together."""
    key = controller.store.jobs()[0].key
    statuses = {}
    for s in stand_ins:
        status = await controller.sidecars.status(s.endpoint, 1)
        statuses[s.pod] = status
        if status.stalls:
            controller.on_first_stall(key, s.pod, status)
        elif status.suspects:
            controller.on_first_suspect(key, s.pod, status)
    controller.on_status(key, statuses)
    await controller.idle()


def ours(fake_kube: FakeKube) -> dict[str, Any]:
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None
    [condition] = [c for c in job["status"]["conditions"] if c["type"] == names.CONDITION_TYPE]
    return dict(condition)


def events(fake_kube: FakeKube) -> list[tuple[str, str, str]]:
    return [(e["type"], e["reason"], e["message"]) for e in fake_kube.of("events")]


def outcome(controller: Controller, name: str) -> float | None:
    return controller.metrics.registry.get_sample_value("frscope_operator_suspected_stalls_total", {"outcome": name})


async def test_a_suspicion_is_published_as_not_confirmed_then_resumed(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    for s in stand_ins:
        s.stalled, s.suspected = False, True
    await sweep(controller, stand_ins)

    condition = ours(fake_kube)
    assert (condition["status"], condition["reason"]) == ("Unknown", "RankNotJoined")
    assert condition["message"].startswith("Suspected, not confirmed:")
    [(kind, reason, message)] = events(fake_kube)
    assert (kind, reason) == ("Warning", names.REASON_SUSPECTED)
    assert "not confirmed" in message and "rank 1" in message and "train-master-0" in message
    # the job's suspicion report: what the gather found, state Suspected, kept out of the ledger
    [report] = fake_kube.of("flightrecorderreports")
    assert report["metadata"]["name"] == "train-suspicion" and report["job"]["suspicion"] is True
    assert report["state"]["phase"] == names.REPORT_STATE_SUSPECTED
    assert report["job"]["condition"]["message"].startswith("Suspected, not confirmed:")
    assert report["metadata"]["labels"][names.LABEL_REPORT_STATE] == names.REPORT_STATE_SUSPECTED
    assert report["diagnosis"]["what"]["category"] == "RankNotJoined" and report["diagnosis"]["who"]["culprits"] == "1"
    await controller.on_report("ADDED", report)
    assert controller._state(controller.store.jobs()[0].key).ledger.records == []
    on_node = {**report, "impact": {"culpritRanksByNode": {"gpu-7": [1]}}}
    assert incident_from_report(on_node) is None  # nor does the node ledger count it
    assert incident_from_report({**on_node, "job": {**report["job"], "suspicion": False}}) is not None
    assert outcome(controller, "published") == 1
    gathers = sum(s.snapshot_requests for s in stand_ins)
    await sweep(controller, stand_ins)  # still suspected: nothing new
    assert len(events(fake_kube)) == 1 and sum(s.snapshot_requests for s in stand_ins) == gathers

    for s in stand_ins:
        s.suspected = False  # the job moved on
    await sweep(controller, stand_ins)
    condition = ours(fake_kube)
    assert (condition["status"], condition["reason"]) == ("False", names.CONDITION_REASON_RESUMED)
    assert sorted((k, r) for k, r, _m in events(fake_kube)) == [("Normal", names.REASON_RESUMED),
                                                                ("Warning", names.REASON_SUSPECTED)]
    assert any(m.startswith("resumed after ") for _k, r, m in events(fake_kube) if r == names.REASON_RESUMED)
    assert outcome(controller, "resumed") == 1 and outcome(controller, "confirmed") == 0
    [report] = fake_kube.of("flightrecorderreports")
    assert report["state"]["phase"] == names.REPORT_STATE_RESUMED and report["state"]["message"].startswith("Resumed")
    assert report["metadata"]["labels"][names.LABEL_REPORT_STATE] == names.REPORT_STATE_RESUMED


async def test_a_confirmed_stall_replaces_the_suspicion_with_the_diagnosis(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    for s in stand_ins:
        s.stalled, s.suspected = False, True
    await sweep(controller, stand_ins)
    assert ours(fake_kube)["status"] == "Unknown"
    for s in stand_ins:
        s.stalled = True  # --stall-after passed
    await sweep(controller, stand_ins)
    condition = ours(fake_kube)
    assert (condition["status"], condition["reason"]) == ("True", "RankNotJoined")
    assert sorted(r for _k, r, _m in events(fake_kube)) == ["RankNotJoined", names.REASON_SUSPECTED]
    states = {r["metadata"]["name"]: (r["state"]["phase"], r["job"].get("suspicion", False))
              for r in fake_kube.of("flightrecorderreports")}
    [incident] = [name for name in states if name != "train-suspicion"]
    assert states == {"train-suspicion": (names.REPORT_STATE_CONFIRMED, True),
                      incident: (names.REPORT_STATE_CONFIRMED, False)}
    assert outcome(controller, "confirmed") == 1 and outcome(controller, "resumed") == 0


async def test_no_suspicion_while_a_stall_is_confirmed(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    stand_ins[1].stalled = True
    stand_ins[0].stalled, stand_ins[0].suspected = False, True
    await sweep(controller, stand_ins)
    assert ours(fake_kube)["status"] == "True"
    assert [r for _k, r, _m in events(fake_kube)] == ["RankNotJoined"]
    assert outcome(controller, "published") == 0


async def test_a_straggler_is_an_event_once_per_episode(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    for s in stand_ins:
        s.stalled = False
    stand_ins[1].lateness = {2: {"group": "0", "lateness_s": 0.05, "share": 0.17, "late": 60, "compared": 120,
                                 "window_s": 59.0, "straggler": True},
                             3: {"group": "0", "lateness_s": 0.0, "share": 0.0, "late": 0, "compared": 120,
                                 "window_s": 59.0, "straggler": False}}
    await sweep(controller, stand_ins)
    await sweep(controller, stand_ins)
    [(kind, reason, message)] = events(fake_kube)
    assert (kind, reason) == ("Warning", names.REASON_STRAGGLER)
    assert "rank 2 (pod train-worker-0" in message and "costs the job 17% of its time" in message
    assert fake_kube.of("flightrecorderreports") == []
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None  # not a hang: no condition of frscope's
    assert not [c for c in job["status"]["conditions"] if c["type"] == names.CONDITION_TYPE]
    stand_ins[1].lateness = {}
    await sweep(controller, stand_ins)
    assert sorted((k, r) for k, r, _m in events(fake_kube)) == [("Normal", names.REASON_STRAGGLER_GONE),
                                                                ("Warning", names.REASON_STRAGGLER)]
    assert controller.metrics.registry.get_sample_value("frscope_operator_stragglers_total") == 1


async def test_a_pushed_suspicion_is_published_with_the_default_analysis_threshold(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    # The operator's --stuck-after default (10 s) would call a few seconds old hang healthy: a suspicion
    # is analyzed with its own threshold. The push carries no ages; the fixture's hang is 14 s old.
    config = OperatorConfig(decode_processes=0, stuck_after_s=30.0, cooldown_s=60, exit_settle_s=5.0,
                            gather=CONFIG.gather)
    controller = make_controller(kube_client, session, config)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    for s in stand_ins:
        s.stalled, s.suspected = False, True
    worker = stand_ins[1]
    pushed = from_snapshot(parse_snapshot({**worker.snapshot_obj(), "reason": "suspect"}, "push", size_bytes=100),
                           origin="push")
    assert controller.on_push(pushed) is not None
    await controller.idle()
    assert (ours(fake_kube)["status"], ours(fake_kube)["reason"]) == ("Unknown", "RankNotJoined")
    assert [r for _k, r, _m in events(fake_kube)] == [names.REASON_SUSPECTED]
    assert "pushed a suspected stall" in events(fake_kube)[0][2]


async def test_a_slow_pod_is_a_straggler_across_pods_until_it_keeps_up(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    # Both ranks of train-worker-0 (on node gpu-7) take 1.2x the others' step: no sidecar sees it among
    # its own pod's ranks (both of its ranks are equally late); the operator compares the pods' arrivals.
    # The arrivals are generated (a real slow node is tests/integration's); each sweep shows what a
    # sidecar would: the newest arrivals up to that moment, at most wire.STATUS_ARRIVALS of them.
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    worker = builders.pod("train-worker-0", port=stand_ins[1].port)
    worker["spec"]["nodeName"] = "gpu-7"
    await controller.on_pod("MODIFIED", worker)
    slow = job(60, 0.25, {2: 0.05, 3: 0.055}, ranks=4)
    healthy = job(300, 0.25, {}, ranks=4, jitter_s=0.02, start_s=60 * 0.36)
    arrivals = {r: slow[r]["0"] + [(seq + 120, t) for seq, t in healthy[r]["0"]] for r in slow}

    async def sweep_up_to(seq: int) -> None:
        for s in stand_ins:
            s.stalled = False
            s.arrivals = {r: [[q, t] for q, t in arrivals[r] if q <= seq][-80:] for r in s.ranks}
        await sweep(controller, stand_ins)

    for upto in (40, 80, 120):
        await sweep_up_to(upto)
    [(kind, reason, message)] = events(fake_kube)
    assert (kind, reason) == ("Warning", names.REASON_STRAGGLER)
    assert message.startswith("rank 3 (pod train-worker-0 on node gpu-7, ranks 2, 3) is a straggler across pods")
    assert int(message.rsplit("costs the job ", 1)[1].split("%")[0]) < 25  # the share a threshold of 0.25 needs
    assert "group 0" in message and "it costs the job" in message
    assert not [c for c in (fake_kube.get("pytorchjobs", "ml", "train") or {})["status"].get("conditions", [])
                if c["type"] == names.CONDITION_TYPE]  # not a hang
    for upto in range(180, 721, 60):  # > 60 s of healthy steps: the window forgets the slow ones
        await sweep_up_to(upto)
    assert sorted((k, r) for k, r, _m in events(fake_kube)) == [("Normal", names.REASON_STRAGGLER_GONE),
                                                                ("Warning", names.REASON_STRAGGLER)]
    assert controller.metrics.registry.get_sample_value("frscope_operator_stragglers_total") == 1


async def test_a_rank_its_sidecar_reports_is_not_reported_again_across_pods(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    slow = job(60, 0.25, {2: 0.1}, ranks=4)
    for s in stand_ins:
        s.stalled = False
        s.arrivals = {r: [[q, t] for q, t in slow[r]["0"]] for r in s.ranks}
    stand_ins[1].lateness = {2: {"group": "0", "lateness_s": 0.1, "share": 0.28, "late": 60, "compared": 120,
                                 "window_s": 20.0, "straggler": True}}
    await sweep(controller, stand_ins)
    [(kind, reason, message)] = events(fake_kube)
    assert (kind, reason) == ("Warning", names.REASON_STRAGGLER) and "across pods" not in message
    stand_ins[1].lateness = {}  # its sidecar no longer sees it; its pod is still the late one
    await sweep(controller, stand_ins)
    assert [m for _k, r, m in events(fake_kube) if r == names.REASON_STRAGGLER and "across pods" in m]


async def test_a_higher_straggler_threshold_names_no_pod_that_costs_less(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    """`--straggler-min-share` (the chart's sidecar.stragglerMinShare): the same 1.2 x pod as above, which
    costs the job less than 25% of its time, is no straggler with a threshold of 0.25."""
    from dataclasses import replace

    controller = make_controller(kube_client, session, replace(CONFIG, straggler_min_share=0.25))
    stand_ins = await setup_job(fake_kube, controller, sidecars, hang_ranks)
    slow = job(60, 0.25, {2: 0.05, 3: 0.055}, ranks=4)
    for upto in (40, 80, 120):
        for s in stand_ins:
            s.stalled = False
            s.arrivals = {r: [[q, t] for q, t in slow[r]["0"] if q <= upto][-80:] for r in s.ranks}
        await sweep(controller, stand_ins)
    assert events(fake_kube) == []


async def test_a_suspicion_published_by_another_process_is_carried_on_not_published_again(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    # Two operator processes over one API server, one after the other: the leader that published the
    # suspicion is killed, the replica that takes over (a fresh controller, no memory of it) sees the same
    # suspected wait, and the stall is then confirmed at the sidecars.
    first = make_controller(kube_client, session)
    stand_ins = await setup_job(fake_kube, first, sidecars, hang_ranks)
    for s in stand_ins:
        s.stalled, s.suspected = False, True
    await sweep(first, stand_ins)
    published = ours(fake_kube)
    assert published["status"] == "Unknown" and [r for _k, r, _m in events(fake_kube)] == [names.REASON_SUSPECTED]
    gathers = sum(s.snapshot_requests for s in stand_ins)

    second = make_controller(kube_client, session)
    await second.on_job(None, fake_kube.get("pytorchjobs", "ml", "train") or {})
    for s in stand_ins:
        await second.on_pod("ADDED", builders.pod(s.pod, replica_type="Master" if "master" in s.pod else "Worker",
                                                  port=s.port))
    await sweep(second, stand_ins)
    # carried on: no gather, the same condition, no second SuspectedStall Event
    assert sum(s.snapshot_requests for s in stand_ins) == gathers
    assert ours(fake_kube) == published
    assert [r for _k, r, _m in events(fake_kube)] == [names.REASON_SUSPECTED]
    assert outcome(second, "published") == 0

    for s in stand_ins:
        s.stalled = True  # --stall-after passed
    await sweep(second, stand_ins)
    condition = ours(fake_kube)
    assert (condition["status"], condition["reason"]) == ("True", "RankNotJoined")
    assert sorted(r for _k, r, _m in events(fake_kube)) == ["RankNotJoined", names.REASON_SUSPECTED]
    states = {r["metadata"]["name"]: r["state"]["phase"] for r in fake_kube.of("flightrecorderreports")}
    assert len(states) == 2 and set(states.values()) == {names.REPORT_STATE_CONFIRMED}, states


async def test_a_suspicion_left_by_another_process_is_settled(
        fake_kube: FakeKube, kube_client: KubeClient, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    # The process that published the suspicion died; when the one after it first sweeps the job, the
    # stall is confirmed already (its suspicion report moves to Confirmed), or the job moved on (Resumed,
    # with the condition and the Resumed Event named as the first process would have named them).
    for phase, stalled in ((names.REPORT_STATE_CONFIRMED, True), (names.REPORT_STATE_RESUMED, False)):
        fake_kube.objects.clear()
        first = make_controller(kube_client, session)
        stand_ins = await setup_job(fake_kube, first, sidecars, hang_ranks)
        for s in stand_ins:
            s.stalled, s.suspected = False, True
        await sweep(first, stand_ins)
        assert ours(fake_kube)["status"] == "Unknown"
        second = make_controller(kube_client, session)
        await second.on_job(None, fake_kube.get("pytorchjobs", "ml", "train") or {})
        for s in stand_ins:
            s.stalled, s.suspected = stalled, False
            await second.on_pod("ADDED", builders.pod(s.pod, port=s.port))
        await sweep(second, stand_ins)
        report = fake_kube.get("flightrecorderreports", "ml", "train-suspicion")
        assert report is not None and report["state"]["phase"] == phase, report
        if not stalled:
            assert (ours(fake_kube)["status"], ours(fake_kube)["reason"]) == ("False", names.CONDITION_REASON_RESUMED)
            names_by_reason = {e["reason"]: e["metadata"]["name"] for e in fake_kube.of("events")}
            suspected = names_by_reason[names.REASON_SUSPECTED]
            assert names_by_reason[names.REASON_RESUMED] == suspected.replace("suspectedstall", "resumed")
