"""The node ledger's sequence (frscope.operator.ledger.NodeLedger) over the fake API server: recording
incidents once, the suspected Event, the dry run, the cordon and each limit that refuses it, a person's
uncordon. What the real API server decides (the CRD, RBAC, printer columns) is in
tests/e2e/test_node_ledger_e2e.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from frscope.analysis.suspicion import LedgerPolicy
from frscope.operator.actions import ActionOptions, CordonOptions
from frscope.operator.kube import KubeClient
from frscope.operator.ledger import FencingOptions, LedgerMetrics, NodeLedger, NodeLedgerOptions
from tests.unit.operator.fakes import FakeKube

NOW = time.time()


def stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def put_node(fake: FakeKube, name: str, *, ready: bool = True, cordoned: bool = False,
             managed: list[dict[str, Any]] | None = None) -> None:
    fake.put("nodes", {"apiVersion": "v1", "kind": "Node",
                       "metadata": {"name": name, "labels": {"cloud.google.com/gke-nodepool": "a"},
                                    "managedFields": managed or []},
                       "spec": {"unschedulable": True} if cordoned else {},
                       "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})


def after_now(seconds: float) -> float:
    """The `age_s` of a report gathered `seconds` after the real clock's now (NOW is taken at import, which
    can be many minutes before a test runs in a whole-suite run)."""
    return NOW - time.time() - seconds


def report(fake: FakeKube, name: str, job: str, category: str, by_node: dict[str, list[int]], *,
           age_s: float = 600, action: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml"},
        "diagnosis": {"what": {"category": category, "ambiguous": False},
                      "who": {"culpritRanks": sorted({r for v in by_node.values() for r in v})}},
        "job": {"name": job, "uid": f"uid-{job}", "gatheredAt": stamp(NOW - age_s)},
        "impact": {"culpritNodes": sorted(by_node), "culpritRanksByNode": by_node},
    }
    if action is not None:
        obj["action"] = action
    return fake.put("flightrecorderreports", obj)


def ledger(kube: KubeClient, *, mode: str = "dry-run", max_nodes: int = 1, rate: int = 3,
           registry: CollectorRegistry | None = None, clock: Any = None) -> NodeLedger:
    options = NodeLedgerOptions(policy=LedgerPolicy(), fencing=FencingOptions(mode=mode), refresh_s=1)
    actions = ActionOptions(rate_per_hour=rate, cordon=CordonOptions(max_nodes=max_nodes))
    return NodeLedger(kube, LedgerMetrics(registry or CollectorRegistry()), options, actions, instance="test",
                      clock=clock or time.time)


def frnode(fake: FakeKube, name: str) -> dict[str, Any]:
    obj = fake.get("flightrecordernodes", "", name)
    assert obj is not None, name
    return obj


def events(fake: FakeKube, reason: str) -> list[dict[str, Any]]:
    return [e for e in fake.of("events") if e["reason"] == reason]


async def two_jobs_hang_on_n1(fake: FakeKube, led: NodeLedger) -> None:
    for body in (report(fake, "r-a", "a", "NotCompleted", {"n1": [1]}),
                 report(fake, "r-b", "b", "NotCompleted", {"n1": [2]}),
                 report(fake, "r-c", "c", "RankNotJoined", {"n1": [0], "n2": [3]})):
        await led.on_report("ADDED", body)


@pytest.fixture
def nodes(fake_kube: FakeKube) -> FakeKube:
    put_node(fake_kube, "n1")
    put_node(fake_kube, "n2")
    return fake_kube


async def test_two_jobs_make_the_shared_node_suspected_and_a_dry_run_changes_nothing(
        nodes: FakeKube, kube_client: KubeClient) -> None:
    registry = CollectorRegistry()
    led = ledger(kube_client, registry=registry)
    await two_jobs_hang_on_n1(nodes, led)
    n1, n2 = frnode(nodes, "n1"), frnode(nodes, "n2")
    assert (n1["summary"]["state"], n1["summary"]["incidents"], n1["summary"]["distinctJobs"]) == ("suspected", 2, 2)
    assert n1["fence"]["state"] == "would-fence" and "Dry run: would cordon node n1" in n1["fence"]["message"]
    assert (n2["summary"]["state"], n2["summary"]["score"]) == ("watched", 0)
    assert [e["type"] for e in events(nodes, "NodeSuspected")] == ["Warning"]
    assert [e["involvedObject"]["name"] for e in events(nodes, "SuspectNodeFenceDryRun")] == ["n1"]
    assert not [w for w in nodes.writes("PATCH") if "/nodes/" in w[1]]
    # Every watch event of a recorded report (an action written, a relist) adds nothing.
    writes = len(nodes.writes())
    await led.on_report("MODIFIED", nodes.get("flightrecorderreports", "ml", "r-a") or {})
    await led.on_report("DELETED", {"metadata": {"name": "r-z", "namespace": "ml"}})
    assert len(nodes.writes()) == writes
    fresh = ledger(kube_client)  # another operator (a restart): the objects know what was recorded
    await fresh.on_report("ADDED", nodes.get("flightrecorderreports", "ml", "r-b") or {})
    assert len(nodes.writes()) == writes and len(frnode(nodes, "n1")["incidents"]) == 3
    assert registry.get_sample_value("frscope_node_incidents_total", {"evidence": "code"}) == 2
    assert registry.get_sample_value("frscope_node_suspicion", {"node": "n2"}) == 0


async def test_fencing_cordons_and_a_persons_uncordon_is_recorded_once(nodes: FakeKube,
                                                                        kube_client: KubeClient) -> None:
    led = ledger(kube_client, mode="cordon")
    await two_jobs_hang_on_n1(nodes, led)
    node = nodes.get("nodes", "", "n1") or {}
    assert node["spec"]["unschedulable"] is True and node["metadata"]["annotations"]["frscope.io/fenced"] == "ml/r-b"
    n1 = frnode(nodes, "n1")
    assert (n1["summary"]["state"], n1["fence"]["state"], n1["fence"]["cordoned"]) == ("fenced", "fenced", True)
    assert [e["type"] for e in events(nodes, "SuspectNodeFenced")] == ["Warning"]
    assert not (nodes.get("nodes", "", "n2") or {})["spec"].get("unschedulable")

    await led.refresh()  # still cordoned: nothing to record
    assert frnode(nodes, "n1")["fence"]["state"] == "fenced"
    later = stamp(time.time() + 1)
    put_node(nodes, "n1", managed=[{"manager": "frscope-operator", "operation": "Update", "time": later},
                                   {"manager": "kubelet", "operation": "Update", "time": later,
                                    "subresource": "status"},
                                   {"manager": "kube-controller-manager", "operation": "Update", "time": later},
                                   {"manager": "kubectl-uncordon", "operation": "Update", "time": later}])
    await led.refresh()
    n1 = frnode(nodes, "n1")
    assert (n1["fence"]["state"], n1["fence"]["releasedBy"], n1["summary"]["state"]) == (
        "released", "kubectl-uncordon", "suspected")
    await led.refresh()
    assert len(events(nodes, "SuspectNodeReleased")) == 1
    # One more job's incident after the release (gathered after it) is not enough: the fence rule counts only
    # incidents after a release.
    await led.on_report("ADDED", report(nodes, "r-d", "d", "NotCompleted", {"n1": [1]}, age_s=after_now(60)))
    assert frnode(nodes, "n1")["fence"]["state"] == "released"
    assert not (nodes.get("nodes", "", "n1") or {})["spec"].get("unschedulable")
    # A second job's does.
    await led.on_report("ADDED", report(nodes, "r-e", "e", "Straggler", {"n1": [1]}, age_s=after_now(60)))
    assert frnode(nodes, "n1")["fence"]["state"] == "fenced"
    assert frnode(nodes, "n1")["fence"]["releasedBy"] == "kubectl-uncordon"  # history kept


@pytest.mark.parametrize(("setup", "why"), [
    ({"max_nodes": 0}, "budget --cordon-max-nodes=0"),
    ({"rate": 1}, "rate limit: 1 action(s) in namespace ml"),
    ({"n2_ready": False}, "would leave 0 other healthy node(s) in pool cloud.google.com/gke-nodepool=a"),
])
async def test_each_limit_refuses_the_fence_and_says_why(fake_kube: FakeKube, kube_client: KubeClient,
                                                         setup: dict[str, Any], why: str) -> None:
    put_node(fake_kube, "n1")
    put_node(fake_kube, "n2", ready=setup.get("n2_ready", True))
    if "rate" in setup:  # a restart in the namespace within the hour
        report(fake_kube, "r-x", "x", "RankNotJoined", {"n9": [0]},
               action={"action": "restart", "state": "done", "at": stamp(NOW - 60)})
    led = ledger(kube_client, mode="cordon", max_nodes=setup.get("max_nodes", 1), rate=setup.get("rate", 3))
    await two_jobs_hang_on_n1(fake_kube, led)
    n1 = frnode(fake_kube, "n1")
    assert n1["fence"]["state"] == "skipped" and why in n1["fence"]["message"], n1["fence"]
    assert n1["summary"]["state"] == "suspected"
    assert not (fake_kube.get("nodes", "", "n1") or {})["spec"].get("unschedulable")
    assert [e["type"] for e in events(fake_kube, "SuspectNodeFenceSkipped")] == ["Normal"]


async def test_a_node_already_cordoned_by_someone_else_is_left_alone(fake_kube: FakeKube,
                                                                     kube_client: KubeClient) -> None:
    put_node(fake_kube, "n1", cordoned=True)
    put_node(fake_kube, "n2")
    await two_jobs_hang_on_n1(fake_kube, ledger(kube_client, mode="cordon"))
    n1 = frnode(fake_kube, "n1")
    assert n1["fence"]["state"] == "skipped" and "cordoned already (not by frscope)" in n1["fence"]["message"]


async def test_old_incidents_are_forgotten_and_an_empty_entry_deleted(nodes: FakeKube,
                                                                      kube_client: KubeClient) -> None:
    clock = [NOW]
    led = ledger(kube_client, clock=lambda: clock[0])
    await led.on_report("ADDED", report(nodes, "r-a", "a", "NotCompleted", {"n1": [1]}, age_s=0))
    assert frnode(nodes, "n1")["summary"]["score"] == 1
    clock[0] = NOW + 86_400
    await led.refresh()
    assert frnode(nodes, "n1")["summary"]["score"] == 0.5
    clock[0] = NOW + 8 * 86_400
    await led.refresh()
    assert nodes.get("flightrecordernodes", "", "n1") is None and led.latest == {}


async def test_a_claim_left_by_an_operator_that_died_is_finished(nodes: FakeKube, kube_client: KubeClient) -> None:
    led = ledger(kube_client, mode="cordon")
    await two_jobs_hang_on_n1(nodes, ledger(kube_client, mode="dry-run"))
    obj = frnode(nodes, "n1")
    obj["fence"] = {"state": "fencing", "at": stamp(time.time() - 60), "mode": "cordon", "incident": "ml/r-b",
                    "message": "cordon under way"}
    nodes.put("flightrecordernodes", obj)
    await led.refresh()
    assert (nodes.get("nodes", "", "n1") or {})["spec"]["unschedulable"] is True
    n1 = frnode(nodes, "n1")
    assert (n1["fence"]["state"], n1["summary"]["state"]) == ("fenced", "fenced")
    assert "finished after an operator restart" in n1["fence"]["message"]
