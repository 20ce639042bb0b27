"""The node ledger's pure parts in the operator: a published report read as an incident (hostile
shapes included), the FlightRecorderNode object written and read back, pools and the healthy-node rule."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from frscope.analysis.suspicion import EvidenceClass, LedgerPolicy, NodeState, assess, implicate
from frscope.operator.ledger import pools
from frscope.operator.ledger.incident_input import incident_from_report
from frscope.operator.ledger.ledger_object import FenceRecord, LedgerEntry, incident_from_json, incident_to_json

NOW = 1_800_000_000.0


def report(category: str = "NotCompleted", *, by_node: Any = None, nodes: Any = None, culprits: Any = (1,),
           exits: Any = None, gathered: Any = "2027-01-15T08:00:00Z", ambiguous: bool = False) -> dict[str, Any]:
    impact: dict[str, Any] = {}
    if by_node is not None:
        impact["culpritRanksByNode"] = by_node
    if nodes is not None:
        impact["culpritNodes"] = nodes
    return {
        "metadata": {"name": "train-abc", "namespace": "ml", "creationTimestamp": "2027-01-15T08:00:05Z"},
        "diagnosis": {"what": {"category": category, "ambiguous": ambiguous},
                      "who": {"culpritRanks": list(culprits)}},
        "job": {"name": "train", "uid": "u-1", "gatheredAt": gathered},
        "impact": impact,
        "report": {"findings": [{"exits": exits or {}}]},
    }


def test_a_report_names_its_nodes_and_culprit_ends() -> None:
    exits = {"1": {"exit_code": 1, "reason": "Error", "message": "NVRM: Xid 79"}, "x": {"exit_code": 2}}
    inc = incident_from_report(report("RankStopped", by_node={"gpu-a": [1], "gpu-b": [2, "junk"]}, exits=exits))
    assert inc is not None
    assert (inc.key, inc.job, inc.job_uid, inc.category) == ("ml/train-abc", "ml/train", "u-1", "RankStopped")
    assert dict(inc.nodes) == {"gpu-a": (1,), "gpu-b": (2,)}
    assert inc.exits[1].message == "NVRM: Xid 79" and list(inc.exits) == [1]
    implicated = implicate(inc)
    # The Xid is the container's own text: its exit code 1 makes it the code's fault, never the node's.
    assert (implicated["gpu-a"].evidence, implicated["gpu-a"].weight) == (EvidenceClass.CODE, 0)
    assert implicated["gpu-b"].evidence is EvidenceClass.UNCLEAR


def test_an_older_report_without_ranks_per_node_puts_every_culprit_on_each_node() -> None:
    inc = incident_from_report(report(nodes=["gpu-a", 7, ""], culprits=[1, 3]))
    assert inc is not None and dict(inc.nodes) == {"gpu-a": (1, 3)}


@pytest.mark.parametrize("bad", [
    report("Healthy", by_node={"n": [1]}),
    report(by_node={}, nodes=None),
    report(by_node={"n": [1]}, gathered=None) | {"metadata": {"name": "x", "namespace": "ml"}},
    {"diagnosis": "nonsense", "impact": [1, 2]},
    {},
])
def test_reports_that_implicate_no_node_are_skipped(bad: dict[str, Any]) -> None:
    assert incident_from_report(bad) is None


def test_hostile_fields_are_bounded() -> None:
    many = {f"n{i}": list(range(1000)) for i in range(500)}
    inc = incident_from_report(report(by_node=many, exits={"1": {"message": "x" * 10**6, "exit_code": True}}))
    assert inc is not None and len(inc.nodes) == 64 and all(len(r) == 256 for r in inc.nodes.values())
    assert len(inc.exits[1].message) == 4096 and inc.exits[1].exit_code is None


def test_the_object_round_trips_and_drops_what_is_malformed() -> None:
    inc = incident_from_report(report(by_node={"gpu-a": [1]}))
    assert inc is not None
    item = implicate(inc)["gpu-a"]
    fence = FenceRecord(state="fenced", at="2027-01-15T08:01:00Z", mode="cordon", cordoned=True, incident=inc.key,
                        message="Cordoned")
    entry = LedgerEntry(node="gpu-a", pool="pool=a", incidents=[item], fence=fence)
    obj = entry.to_object(assess(entry.incidents, item.at, LedgerPolicy(), fenced=True), item.at)
    assert obj["metadata"]["name"] == "gpu-a" and obj["kind"] == "FlightRecorderNode"
    assert obj["summary"]["state"] == NodeState.FENCED.value and obj["summary"]["incidents"] == 1
    obj["incidents"] += [{"key": "k", "at": "nope", "evidence": "code", "weight": 0},
                         {"key": "k", "at": "2027-01-15T08:00:00Z", "evidence": "gpu", "weight": 0},
                         {"key": "k", "at": "2027-01-15T08:00:00Z", "evidence": "code", "weight": 7}, "junk"]
    obj["metadata"]["resourceVersion"] = "42"
    back = LedgerEntry.from_object(obj)
    assert back.incidents == [item] and back.fence == fence and back.resource_version == "42"
    assert back.state == "fenced" and back.pool == "pool=a"
    assert incident_from_json(incident_to_json(item)) == item
    assert FenceRecord.from_json({"state": "bogus", "at": "2027-01-15T08:01:00Z"}) is None


def test_a_released_fence_keeps_when_and_who() -> None:
    fence = FenceRecord(state="fenced", at="2027-01-15T08:01:00Z").released("2027-01-15T09:00:00Z", "kubectl")
    back = FenceRecord.from_json(fence.to_json())
    assert back is not None and (back.state, back.released_by) == ("released", "kubectl") and not back.holding
    entry = LedgerEntry(node="n", fence=back)
    assert entry.released_at == datetime.datetime(2027, 1, 15, 9, tzinfo=datetime.UTC).timestamp()


# -- pools -----------------------------------------------------------------------------------------
def node(name: str, pool: str | None = "a", *, ready: bool = True, cordoned: bool = False,
         tainted: bool = False) -> dict[str, Any]:
    labels = {"cloud.google.com/gke-nodepool": pool} if pool else {}
    spec: dict[str, Any] = {"unschedulable": True} if cordoned else {}
    if tainted:
        spec["taints"] = [{"key": "frscope.io/suspect-node", "effect": "NoSchedule"}]
    return {"metadata": {"name": name, "labels": labels}, "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_a_pool_keeps_its_last_healthy_nodes() -> None:
    labels = pools.DEFAULT_POOL_LABELS
    two = [node("n1"), node("n2")]
    assert pools.fence_refusal("n1", two, labels, keep=1) is None
    assert "leave 1 other healthy node(s) in pool cloud.google.com/gke-nodepool=a" in str(
        pools.fence_refusal("n1", two, labels, keep=2))
    # The other node of the pool is not healthy (not Ready, cordoned, tainted): n1 is the last one.
    for sick in (node("n2", ready=False), node("n2", cordoned=True), node("n2", tainted=True)):
        assert pools.fence_refusal("n1", [node("n1"), sick], labels, keep=1) is not None
    # A healthy node of another pool does not count.
    assert pools.fence_refusal("n1", [node("n1"), node("n3", "b")], labels, keep=1) is not None
    # Nodes without a pool label are one pool together.
    assert pools.fence_refusal("x", [node("x", None), node("y", None)], labels, keep=1) is None
    assert pools.fence_refusal("gone", two, labels, keep=0) == "node gone does not exist"


def test_the_report_names_each_nodes_culprit_ranks() -> None:
    from frscope.analysis import Category, Finding, GroupRef
    from frscope.operator.actions import culprit_placement
    from frscope.operator.model.objects import PodInfo

    def pod(name: str, node: str) -> PodInfo:
        return PodInfo(namespace="ml", name=name, uid=name, job_name="j", replica_type="Worker", replica_index=0,
                       ip=None, sidecar_port=None, phase="Running", run=0, terminations=(), deleting=False, node=node)

    finding = Finding(Category.NOT_COMPLETED, (1, 2, 5), GroupRef("0", "default_pg", (0, 1, 2, 3)), "stuck")
    pods_, nodes_, by_node = culprit_placement(finding, {0: "p0", 1: "p0", 2: "p1", 5: "p2"},
                                               [pod("p0", "gpu-a"), pod("p1", "gpu-b"), pod("p2", "")])
    assert (pods_, nodes_, by_node) == (("p0", "p1", "p2"), ("gpu-a", "gpu-b"), {"gpu-a": (1,), "gpu-b": (2,)})
