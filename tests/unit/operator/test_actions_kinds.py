"""How each job kind is acted on (jobkinds.JobKind: inactive, restart refusal, stop patch; the JobSet
failurePolicy arithmetic of JobSet v0.12.0), and the Actor restarting and stopping a TrainJob, a JobSet
and a Kueue-queued job over the fake API server. (The real API server, the real JobSet and Job
controllers: tests/e2e/test_actions_kinds_e2e.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from frscope.operator.actions import ActionOptions, Actor, Policy
from frscope.operator.kube import KubeClient
from frscope.operator.model import jobkinds
from frscope.operator.model.objects import JobRef
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.publish import Publisher
from tests.unit.operator.fakes import FakeKube


# -- the kinds, pure ---------------------------------------------------------------------------------
def test_each_kind_names_its_own_suspend_field_and_end_states() -> None:
    assert jobkinds.PYTORCHJOB.stop_patch("u", "why") == {
        "metadata": {"uid": "u", "annotations": {"frscope.io/stopped-by-diagnosis": "why"}},
        "spec": {"runPolicy": {"suspend": True}}}
    for kind in (jobkinds.TRAINJOB, jobkinds.JOBSET):
        assert kind.stop_patch("u", "why")["spec"] == {"suspend": True}
        assert kind.inactive({"spec": {"suspend": True}}) == "the job is suspended (spec.suspend)"
        assert kind.inactive({"spec": {"runPolicy": {"suspend": True}}}) is None
    assert jobkinds.PYTORCHJOB.inactive({"spec": {"suspend": True}}) is None
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert jobkinds.TRAINJOB.inactive(done) == "the job has complete"
    assert jobkinds.JOBSET.inactive(done) is None  # JobSet says Completed
    assert jobkinds.JOBSET.inactive({"status": {"conditions": [{"type": "Completed", "status": "True"}]}})
    assert jobkinds.PYTORCHJOB.inactive({"status": {"conditions": [{"type": "Failed", "status": "False"}]}}) is None
    assert jobkinds.JOBSET.inactive({"metadata": {"deletionTimestamp": "x"}}) == "the job is being deleted"
    assert jobkinds.TRAINJOB.pod_selector("t") == "jobset.sigs.k8s.io/jobset-name=t"
    assert jobkinds.PYTORCHJOB.pod_selector("p") == "training.kubeflow.org/job-name=p"
    assert jobkinds.find("TrainJob") is jobkinds.TRAINJOB and jobkinds.find("MPIJob") is None
    assert jobkinds.kueue_queue({"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "q"}}}) == "q"
    assert jobkinds.kueue_queue({"metadata": {}}) is None


def jobset(job_spec: dict[str, Any], policy: dict[str, Any] | None = None, counted: int = 0,
           replicated: str = "node") -> dict[str, Any]:
    spec: dict[str, Any] = {"replicatedJobs": [{"name": replicated, "replicas": 2, "template": {"spec": job_spec}}]}
    if policy is not None:
        spec["failurePolicy"] = policy
    return {"spec": spec, "status": {"restarts": counted, "restartsCountTowardsMax": counted}}


@pytest.mark.parametrize(("job_spec", "policy", "counted", "refused"), [
    ({}, None, 0, None),  # backoffLimit 6 by default: the Job controller makes a new pod
    ({"parallelism": 6}, None, 0, None),
    ({"parallelism": 8}, None, 0, "8 pod(s) deleted at once > backoffLimit 6) and the JobSet has no failurePolicy"),
    ({"backoffLimit": 0}, None, 0, "no failurePolicy"),
    ({"backoffLimit": 0}, {"maxRestarts": 2}, 1, None),  # the JobSet restarts (default action RestartJobSet)
    ({"backoffLimit": 0}, {"maxRestarts": 2}, 2, "used 2 of its failurePolicy.maxRestarts=2"),
    ({"backoffLimit": 0}, {"maxRestarts": 0, "rules": [{"action": "RestartJobSetAndIgnoreMaxRestarts"}]}, 5, None),
    ({"backoffLimit": 0}, {"maxRestarts": 3, "rules": [{"action": "FailJobSet"}]}, 0, "answers FailJobSet"),
    # A rule for another replicated job, or another failure reason, does not apply: the default restarts.
    ({"backoffLimit": 0}, {"maxRestarts": 3, "rules": [{"action": "FailJobSet", "targetReplicatedJobs": ["init"]}]},
     0, None),
    ({"backoffLimit": 0}, {"maxRestarts": 3, "rules": [{"action": "FailJobSet",
                                                         "onJobFailureReasons": ["PodFailurePolicy"]}]}, 0, None),
    ({"podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [143]}}]}},
     None, 0, "its podFailurePolicy may fail it"),
    ({"backoffLimitPerIndex": 0}, None, 0, "backoffLimitPerIndex is 0"),
    ({"backoffLimitPerIndex": 1, "parallelism": 64}, None, 0, None),
    ({"parallelism": "many"}, None, 0, "not a number"),
    # JobSet v0.12: RestartJob recreates the failed Job only, counted toward maxRestarts like RestartJobSet.
    ({"backoffLimit": 0}, {"maxRestarts": 1, "rules": [{"action": "RestartJob"}]}, 0, None),
    ({"backoffLimit": 0}, {"maxRestarts": 1, "rules": [{"action": "RestartJob"}]}, 1, "used 1 of"),
    ({"backoffLimit": 0}, {"maxRestarts": 0, "rules": [{"action": "RestartJobAndIgnoreMaxRestarts"}]}, 9, None),
    # A message pattern is matched against the Job controller's message for the reason.
    ({"backoffLimit": 0}, {"maxRestarts": 3, "rules": [{"action": "FailJobSet",
                                                         "onJobFailureMessagePatterns": ["backoff limit"]}]},
     0, "answers FailJobSet"),
    ({"backoffLimit": 0}, {"maxRestarts": 3, "rules": [{"action": "FailJobSet",
                                                         "onJobFailureMessagePatterns": ["^OOM", "("]}]}, 0, None),
    # A PodFailurePolicy failure's message is not known beforehand: a FailJobSet rule on it may apply.
    ({"podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [143]}}]}},
     {"maxRestarts": 3, "rules": [{"action": "FailJobSet", "onJobFailureMessagePatterns": ["exit code 143"]}]},
     0, "may answer FailJobSet"),
    ({"podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [143]}}]}},
     {"maxRestarts": 3, "rules": [{"action": "RestartJob", "onJobFailureMessagePatterns": ["exit code 143"]}]},
     0, None),
])
def test_a_jobset_restart_is_refused_when_its_controllers_would_fail_it(
        job_spec: dict[str, Any], policy: dict[str, Any] | None, counted: int, refused: str | None) -> None:
    found = jobkinds.JOBSET.restart_refusal({}, jobset(job_spec, policy, counted))
    if refused is None:
        assert found is None
    else:
        assert found is not None and refused in found, found


def test_every_job_s_counted_restarts_count_toward_max_restarts() -> None:
    """JobSet v0.12 adds each Job's RestartJob restarts to the JobSet's own in the maxRestarts check."""
    js = jobset({"backoffLimit": 0}, {"maxRestarts": 3}, 1)
    js["status"]["replicatedJobsStatus"] = [{"name": "node", "jobRestartsCountTowardsMax": [1, 0]}]
    assert jobkinds.JOBSET.restart_refusal({}, js) is None
    js["status"]["replicatedJobsStatus"][0]["jobRestartsCountTowardsMax"] = [1, 1]
    assert "used 3 of its failurePolicy.maxRestarts=3" in str(jobkinds.JOBSET.restart_refusal({}, js))


def test_restarts_that_did_not_count_and_every_way_a_job_may_fail() -> None:
    """restartsCountTowardsMax is omitempty: absent, no restart counted, however many `restarts` (those of
    RestartJobSetAndIgnoreMaxRestarts). A Job past its backoffLimit whose podFailurePolicy may also fail it
    may fail either way: a rule for either decides. (Both found by test_jobset_restart_sweep.py.)"""
    js = jobset({"backoffLimit": 0}, {"maxRestarts": 1})
    js["status"] = {"restarts": 3}
    assert jobkinds.JOBSET.restart_refusal({}, js) is None
    both = {"backoffLimit": 0, "podFailurePolicy": {"rules": [{"action": "FailJob"}]}}
    policy = {"maxRestarts": 3, "rules": [{"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]}
    assert "answers FailJobSet" in str(jobkinds.JOBSET.restart_refusal({}, jobset(both, policy)))


def test_a_trainjob_restart_reads_the_jobset_it_runs_on() -> None:
    assert jobkinds.TRAINJOB.restart_refusal({"spec": {}}, None) == "no JobSet runs the job (Trainer has not made it)"
    assert jobkinds.TRAINJOB.restart_refusal({"spec": {}}, jobset({"parallelism": 8})) is not None
    never = {"spec": {"pytorchReplicaSpecs": {"Worker": {"restartPolicy": "Never"}}}}
    assert "restartPolicy Never" in str(jobkinds.PYTORCHJOB.restart_refusal(never))


# -- the Actor over the fake API server ------------------------------------------------------------
REPORT: dict[str, Any] = {
    "diagnosis": {"verdict": "Rank 1 never joined all_reduce #4.",
                  "what": {"category": "RankNotJoined", "ambiguous": False, "stalledForSeconds": 30}},
    "impact": {"watchdogTimeoutSeconds": 600, "gpus": 8, "ranks": 8},
}


def put_job(fake: FakeKube, plural: str, kind: jobkinds.JobKind, policy: str, *, labels: dict[str, str] | None = None,
            spec: dict[str, Any] | None = None) -> JobRef:
    job = fake.put(plural, {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": {
        "name": "llm", "labels": labels or {}, "annotations": {"frscope.io/on-diagnosis": policy},
        "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": spec or {}})
    uid = job["metadata"]["uid"]
    fake.put("flightrecorderreports", {"metadata": {"name": "llm-abc"}, **REPORT, "job": {
        "name": "llm", "uid": uid, "incident": "abc", "gatheredAt": "2026-01-01T00:10:00Z"}})
    return JobRef("ml", "llm", uid, kind.api_version, kind.kind)


def put_jobset_pod(fake: FakeKube, name: str, created: str) -> None:
    fake.put("pods", {"metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created, "labels": {
        "jobset.sigs.k8s.io/jobset-name": "llm", "jobset.sigs.k8s.io/replicatedjob-name": "node"},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "llm-node-0", "uid": "job-uid"}]}})


def actor(kube_client: KubeClient, *allowed: Policy) -> Actor:
    return Actor(kube_client, Publisher(kube_client, instance="t"), OperatorMetrics(CollectorRegistry()),
                 ActionOptions(allowed=frozenset(allowed)), instance="t")


async def test_a_trainjob_restart_deletes_the_pods_of_the_jobset_it_owns(fake_kube: FakeKube,
                                                                        kube_client: KubeClient) -> None:
    ref = put_job(fake_kube, "trainjobs", jobkinds.TRAINJOB, "restart")
    fake_kube.put("jobsets", {"metadata": {"name": "llm", "creationTimestamp": "2026-01-01T00:00:01Z",
                                           "ownerReferences": [{"kind": "TrainJob", "uid": ref.uid}]},
                              "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"parallelism": 2}}}]}})
    put_jobset_pod(fake_kube, "llm-node-0-0", "2026-01-01T00:00:02Z")
    put_jobset_pod(fake_kube, "llm-node-0-1", "2026-01-01T00:00:02Z")
    put_jobset_pod(fake_kube, "llm-old", "2025-12-31T00:00:00Z")  # an older JobSet's, of the same name
    done = await actor(kube_client, Policy.RESTART).on_incident(ref, "llm-abc")
    assert done is not None and done.state == "done", done
    assert done.targets == ("pod/llm-node-0-0/uid-llm-node-0-0", "pod/llm-node-0-1/uid-llm-node-0-1")
    assert [p["metadata"]["name"] for p in fake_kube.of("pods")] == ["llm-old"]
    [event] = fake_kube.of("events")
    assert event["reason"] == "HungJobRestarted"
    assert "for the JobSet and Job controllers to recreate" in event["message"]
    assert event["involvedObject"]["kind"] == "TrainJob"


async def test_a_trainjob_whose_jobset_would_fail_is_not_restarted(fake_kube: FakeKube,
                                                                   kube_client: KubeClient) -> None:
    ref = put_job(fake_kube, "trainjobs", jobkinds.TRAINJOB, "restart")
    one_job_of_16_pods = {"replicatedJobs": [{"name": "node", "template": {"spec": {"parallelism": 16}}}]}
    fake_kube.put("jobsets", {"metadata": {"name": "llm", "ownerReferences": [{"kind": "TrainJob", "uid": ref.uid}]},
                              "spec": one_job_of_16_pods})
    put_jobset_pod(fake_kube, "llm-node-0-0", "2026-01-01T00:00:02Z")
    done = await actor(kube_client, Policy.RESTART).on_incident(ref, "llm-abc")
    assert done is not None and done.state == "skipped" and "16 pod(s) deleted at once > backoffLimit 6" in done.message
    assert len(fake_kube.of("pods")) == 1


async def test_a_jobset_is_stopped_by_its_suspend_field(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    ref = put_job(fake_kube, "jobsets", jobkinds.JOBSET, "stop", spec={"replicatedJobs": []})
    done = await actor(kube_client, Policy.STOP).on_incident(ref, "llm-abc")
    assert done is not None and done.state == "done" and done.targets == ("job/llm",)
    job = fake_kube.get("jobsets", "ml", "llm")
    assert job is not None and job["spec"]["suspend"] is True
    assert job["metadata"]["annotations"]["frscope.io/stopped-by-diagnosis"].startswith("RankNotJoined: Rank 1")
    assert "spec.suspend: true" in done.message


@pytest.mark.parametrize("served", ["v1beta2", "v1beta1"])
async def test_a_kueue_job_is_stopped_by_deactivating_its_workload(fake_kube: FakeKube, kube_client: KubeClient,
                                                                   served: str) -> None:
    if served == "v1beta1":  # an older Kueue: no v1beta2 Workloads
        fake_kube.fail("GET", "/kueue.x-k8s.io/v1beta2/", 404, times=5)
        fake_kube.fail("PATCH", "/kueue.x-k8s.io/v1beta2/", 404, times=5)
    ref = put_job(fake_kube, "trainjobs", jobkinds.TRAINJOB, "stop", labels={"kueue.x-k8s.io/queue-name": "team"})
    wls = (("old", ref.uid, "True"), ("other", "someone-else", "False"), ("wl", ref.uid, "False"))
    for name, owner, finished in wls:
        fake_kube.put("workloads", {"metadata": {"name": f"trainjob-llm-{name}", "ownerReferences": [{"uid": owner}]},
                                    "spec": {"active": True, "queueName": "team"},
                                    "status": {"conditions": [{"type": "Finished", "status": finished}]}})
    done = await actor(kube_client, Policy.STOP).on_incident(ref, "llm-abc")
    assert done is not None and done.state == "done", done
    assert done.targets == ("workload/trainjob-llm-wl", "job/llm")
    assert [w["spec"]["active"] for w in fake_kube.of("workloads")] == [True, True, False]
    job = fake_kube.get("trainjobs", "ml", "llm")
    assert job is not None and "suspend" not in job["spec"]  # Kueue's to set, not frscope's
    assert job["metadata"]["annotations"]["frscope.io/stopped-by-diagnosis"].startswith("RankNotJoined")
    assert "the Kueue way" in done.message


async def test_a_kueue_job_without_a_workload_is_not_stopped(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    ref = put_job(fake_kube, "pytorchjobs", jobkinds.PYTORCHJOB, "stop", labels={"kueue.x-k8s.io/queue-name": "q"})
    done = await actor(kube_client, Policy.STOP).on_incident(ref, "llm-abc")
    assert done is not None and done.state == "skipped"
    assert "queued by Kueue (kueue.x-k8s.io/queue-name=q), which owns spec.runPolicy.suspend" in done.message
    job = fake_kube.get("pytorchjobs", "ml", "llm")
    assert job is not None and job["spec"] == {}


async def test_a_dry_run_that_may_not_read_the_workload_says_so(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    # stop asked for but not allowed: a dry run, and the chart grants no `workloads` list then.
    fake_kube.fail("GET", "/workloads", 403, times=5, reason="Forbidden")
    ref = put_job(fake_kube, "jobsets", jobkinds.JOBSET, "stop", labels={"kueue.x-k8s.io/queue-name": "q"})
    done = await actor(kube_client, Policy.RESTART).on_incident(ref, "llm-abc")
    assert done is not None and done.state == "dry-run", done
    assert "would stop the job (but the job is queued by Kueue" in done.message
    assert "may not read its Workload (workloads list comes with stop allowed)" in done.message
