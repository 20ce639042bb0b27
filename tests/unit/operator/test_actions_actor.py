"""The Actor over the fake API server: an action claimed before a crash is finished once, on the same
targets; a final record is never acted on again; no report, no action. (The real API server, RBAC and
real hung jobs: tests/e2e/test_actions_e2e.py.)"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from frscope.operator.actions import ActionOptions, Actor, Policy
from frscope.operator.kube import KubeClient
from frscope.operator.model.objects import JobRef
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.publish import Publisher
from tests.unit.operator.fakes import FakeKube


def _setup(fake_kube: FakeKube, action: dict[str, Any] | None) -> JobRef:
    meta = {"name": "train", "annotations": {"frscope.io/on-diagnosis": "restart"}}
    job = fake_kube.put("pytorchjobs", {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta,
                                        "spec": {"pytorchReplicaSpecs": {"Worker": {"restartPolicy": "OnFailure"}}}})
    uid = job["metadata"]["uid"]
    for name, pod_uid in (("train-worker-0", "u0"), ("train-worker-1", "u1")):
        fake_kube.put("pods", {"metadata": {"name": name, "uid": pod_uid,
                                            "labels": {"training.kubeflow.org/job-name": "train"},
                                            "ownerReferences": [{"uid": uid}]}})
    report: dict[str, Any] = {
        "metadata": {"name": "train-abc"}, "job": {"name": "train", "uid": uid, "incident": "abc",
                                                   "gatheredAt": "2026-01-01T00:00:00Z"},
        "diagnosis": {"verdict": "Rank 1 never joined all_reduce #4.",
                      "what": {"category": "RankNotJoined", "ambiguous": False, "stalledForSeconds": 30}},
        "impact": {"watchdogTimeoutSeconds": 600, "gpus": 16, "ranks": 16},
    }
    if action is not None:
        report["action"] = action
    fake_kube.put("flightrecorderreports", report)
    return JobRef("ml", "train", uid)


def _actor(kube_client: KubeClient) -> tuple[Actor, OperatorMetrics]:
    metrics = OperatorMetrics(CollectorRegistry())
    options = ActionOptions(allowed=frozenset({Policy.RESTART}))
    return Actor(kube_client, Publisher(kube_client, instance="t"), metrics, options, instance="t"), metrics


async def test_a_claimed_restart_is_finished_on_its_own_targets_once(fake_kube: FakeKube,
                                                                    kube_client: KubeClient) -> None:
    # Claimed before a crash: only worker-0 was a target (worker-1 is a replacement made since).
    claim = {"requested": "restart", "source": "job annotation", "action": "restart", "state": "acting",
             "why": "policy restart", "at": "2026-01-01T00:00:05Z", "targets": ["pod/train-worker-0/u0"]}
    ref = _setup(fake_kube, claim)
    actor, metrics = _actor(kube_client)
    done = await actor.on_incident(ref, "train-abc")
    assert done is not None and done.state == "done" and done.targets == ("pod/train-worker-0/u0",)
    assert fake_kube.get("pods", "ml", "train-worker-0") is None
    assert fake_kube.get("pods", "ml", "train-worker-1") is not None
    stored = fake_kube.get("flightrecorderreports", "ml", "train-abc")
    assert stored is not None and stored["action"]["state"] == "done" and stored["action"]["at"] == claim["at"]
    [event] = fake_kube.of("events")
    assert event["reason"] == "HungJobRestarted" and "16 GPUs x" in event["message"]
    assert metrics.actions.labels(action="restart", outcome="done")._value.get() == 1

    writes = len(fake_kube.writes())
    fresh, _ = _actor(kube_client)  # another operator, later: the record is final
    again = await fresh.on_incident(ref, "train-abc")
    assert again is not None and again.state == "done"
    # Nothing is acted on again; only the outcome's Event is posted again, under the same name (a no-op).
    extra = fake_kube.writes()[writes:]
    assert [(method, path.rsplit("/", 1)[-1]) for method, path, _ in extra] == [("POST", "events")]
    assert len(fake_kube.of("events")) == 1


async def test_an_outcome_whose_event_was_lost_is_said_by_the_next_operator(fake_kube: FakeKube,
                                                                           kube_client: KubeClient) -> None:
    # The operator that restarted the job was killed after writing the outcome, before its Event.
    done = {"requested": "restart", "source": "job annotation", "action": "restart", "state": "done",
            "why": "policy restart", "at": "2026-01-01T00:00:05Z", "doneAt": "2026-01-01T00:00:06Z",
            "targets": ["pod/train-worker-0/u0"], "message": "Restarted the hung job: deleted its 1 pod(s)"}
    ref = _setup(fake_kube, done)
    actor, _ = _actor(kube_client)
    again = await actor.on_incident(ref, "train-abc")
    assert again is not None and again.state == "done"
    assert fake_kube.get("pods", "ml", "train-worker-0") is not None  # not restarted twice
    [event] = fake_kube.of("events")
    assert event["reason"] == "HungJobRestarted" and event["message"].startswith("Restarted the hung job")


async def test_no_report_no_action(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    ref = _setup(fake_kube, None)
    actor, _ = _actor(kube_client)
    assert await actor.on_incident(ref, "train-missing") is None
    assert fake_kube.get("pods", "ml", "train-worker-0") is not None and not fake_kube.writes()


async def test_a_fresh_restart_claims_before_it_deletes(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    ref = _setup(fake_kube, None)
    actor, _ = _actor(kube_client)
    done = await actor.on_incident(ref, "train-abc")
    assert done is not None and done.state == "done"
    methods = [(m, p.rsplit("/", 2)[-2]) for m, p, _ in fake_kube.writes() if m in ("PATCH", "DELETE")]
    assert methods[0] == ("PATCH", "flightrecorderreports")  # the claim, with a resourceVersion
    assert [m for m, _ in methods[1:3]] == ["DELETE", "DELETE"]
    claim = [b for m, p, b in fake_kube.writes() if m == "PATCH"][0]
    assert claim["action"]["state"] == "acting" and claim["metadata"]["resourceVersion"]
