"""Publishing on a faked wire: what is written, in which order, idempotently, through errors."""

from __future__ import annotations

import pytest

from frscope.operator import names
from frscope.operator.kube import KubeClient
from frscope.operator.model.incidents import IncidentRecord, report_facts
from frscope.operator.model.objects import JobRef
from frscope.operator.publish import JobGone, Publication, Publisher, build_report_cr, make_condition
from tests.unit.operator import builders
from tests.unit.operator.fakes import FakeKube
from tests.unit.operator.test_publish_builders import real_report


def publication(job: JobRef, incident: str = "inc1") -> Publication:
    report = real_report("hang")
    msg = report.findings[0].summary
    obj = build_report_cr(job, report, incident=incident, attempt="d/r0", signal="SidecarStall: test",
                          missing_pods={}, gathered_at="2026-01-01T00:00:00Z", condition=("RankNotJoined", msg))
    record = IncidentRecord(incident, "d/r0", "0", 4, "RankNotJoined", obj["metadata"]["name"],
                            "2026-01-01T00:00:00Z")
    return Publication(job, record, obj, "RankNotJoined", msg, (("RankNotJoined", msg),))


async def test_publish_writes_report_condition_and_event(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    stored = fake_kube.put("pytorchjobs", builders.job())
    ref = JobRef("ml", "train", stored["metadata"]["uid"])
    pub = publication(ref)
    done = await Publisher(kube_client, instance="op-0").publish(pub)
    assert (done.report, done.condition, done.events, done.errors) == (True, True, 1, {})

    [report] = fake_kube.of("flightrecorderreports")
    assert report["metadata"]["ownerReferences"][0]["uid"] == ref.uid
    # The report is the ledger: it reads back into the incident that was published.
    facts = report_facts(report)
    assert facts is not None and facts.record == pub.record and facts.job_uid == ref.uid
    assert facts.condition == ("RankNotJoined", pub.condition_message)
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None and not job["metadata"]["annotations"]  # the job itself is never patched
    conditions = job["status"]["conditions"]
    assert conditions[0]["type"] == names.CONDITION_TYPE and conditions[-1]["type"] == "Running"
    [event] = fake_kube.of("events")
    assert event["type"] == "Warning" and event["involvedObject"]["uid"] == ref.uid
    # The only write on the job went through the status subresource.
    writes = [(m, p) for m, p, _ in fake_kube.writes()]
    assert [w for w in writes if "/pytorchjobs/" in w[1]] == [
        ("PATCH", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/train/status")]
    assert writes[0] == ("POST", "/apis/frscope.io/v1alpha1/namespaces/ml/flightrecorderreports")


async def test_publish_again_is_a_no_op(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    stored = fake_kube.put("pytorchjobs", builders.job())
    ref = JobRef("ml", "train", stored["metadata"]["uid"])
    publisher = Publisher(kube_client, instance="op-0")
    await publisher.publish(publication(ref))
    events_before = fake_kube.of("events")
    done = await publisher.publish(publication(ref))  # e.g. re-run after a crash
    assert done.errors == {}
    assert len(fake_kube.of("flightrecorderreports")) == 1 and len(fake_kube.of("events")) == 1
    after = fake_kube.get("pytorchjobs", "ml", "train")
    assert after is not None
    assert [c["type"] for c in after["status"]["conditions"]].count(names.CONDITION_TYPE) == 1
    assert fake_kube.of("events") == events_before


async def test_conflicts_and_server_errors_are_retried(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    stored = fake_kube.put("pytorchjobs", builders.job())
    ref = JobRef("ml", "train", stored["metadata"]["uid"])
    fake_kube.fail("PATCH", "/pytorchjobs/train/status", 409, reason="Conflict", times=2)
    fake_kube.fail("PATCH", "/pytorchjobs/train/status", 500)
    fake_kube.fail("POST", "/events", 429)
    fake_kube.fail("POST", "/flightrecorderreports", 503)
    done = await Publisher(kube_client, instance="op-0").publish(publication(ref))
    assert done.errors == {} and done.condition and done.report and done.events == 1


async def test_a_failing_step_does_not_stop_the_others(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    stored = fake_kube.put("pytorchjobs", builders.job())
    ref = JobRef("ml", "train", stored["metadata"]["uid"])
    fake_kube.fail("POST", "/flightrecorderreports", 403, times=10)
    done = await Publisher(kube_client, instance="op-0").publish(publication(ref))
    assert not done.report and "report" in done.errors
    assert done.condition and done.events == 1


async def test_job_deleted_or_replaced(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    publisher = Publisher(kube_client, instance="op-0")
    with pytest.raises(JobGone):
        await publisher.publish(publication(JobRef("ml", "train", "uid-x")))
    fake_kube.put("pytorchjobs", builders.job())  # same name, another uid
    with pytest.raises(JobGone):
        await publisher.publish(publication(JobRef("ml", "train", "uid-old")))
    assert fake_kube.of("flightrecorderreports") == []


async def test_assert_condition_puts_ours_back_first(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    ours = make_condition("RankNotJoined", "m", "2026-01-01T00:00:00Z")
    stored = fake_kube.put("pytorchjobs", builders.job(conditions=[
        {"type": "Created", "status": "True"}, {"type": "Running", "status": "False"},
        {"type": "Failed", "status": "True"}, ours]))
    ref = JobRef("ml", "train", stored["metadata"]["uid"])
    publisher = Publisher(kube_client, instance="op-0")
    assert await publisher.assert_condition(ref, ours)
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None
    assert [c["type"] for c in job["status"]["conditions"]] == [names.CONDITION_TYPE, "Created", "Running", "Failed"]
    assert not await publisher.assert_condition(ref, ours)  # in place: no second write


async def test_revise_rewrites_the_report_in_place_and_keeps_its_action(fake_kube: FakeKube,
                                                                        kube_client: KubeClient) -> None:
    """A revision replaces the report object (same name, at the resourceVersion it read: a write in
    between, such as the actor recording its action, makes it read again) and keeps the action record."""
    stored = fake_kube.put("pytorchjobs", builders.job())
    ref = JobRef("ml", "train", stored["metadata"]["uid"])
    publisher = Publisher(kube_client, instance="op-0")
    first = publication(ref)
    await publisher.publish(first)
    name = first.record.report
    fake_kube.put("flightrecorderreports", dict(fake_kube.get("flightrecorderreports", "ml", name) or {},
                                                action={"policy": "restart", "state": "done"}))
    obj = dict(first.report_object, job=dict(first.report_object["job"], revision=1))
    obj["diagnosis"] = dict(obj["diagnosis"], verdict="Rank 3 stopped.")
    revised = Publication(ref, first.record, obj, "RankStopped", "Rank 3 stopped.",
                          (("RankStopped", "Rank 3 stopped."), (names.REASON_REVISED, f"report {name} revised")),
                          event_incident=f"{first.record.id}-r1")
    fake_kube.fail("PUT", "/flightrecorderreports/", 409, reason="Conflict")
    done = await publisher.revise(revised)
    assert (done.report, done.condition, done.events, done.errors) == (True, True, 2, {})
    [report] = fake_kube.of("flightrecorderreports")
    assert report["diagnosis"]["verdict"] == "Rank 3 stopped." and report["job"]["revision"] == 1
    assert report["action"] == {"policy": "restart", "state": "done"}
    job = fake_kube.get("pytorchjobs", "ml", "train")
    assert job is not None and job["status"]["conditions"][0]["reason"] == "RankStopped"
    reasons = sorted((e["reason"], e["type"]) for e in fake_kube.of("events"))
    assert reasons == [(names.REASON_REVISED, "Normal"), ("RankNotJoined", "Warning"), ("RankStopped", "Warning")]
