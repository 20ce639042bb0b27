"""The node ledger's sequence (frscope.operator.ledger.NodeLedger) over the fake API server: recording
incidents once, only from reports the operator sealed, by tenant and with hardware evidence only from
the node itself (its conditions, the kubelet's OOM Events), the suspected Event, the dry run, the cordon
and each limit that refuses it (a namespace's share of the budget too), a person's uncordon. What the
real API server decides (the CRD, RBAC, printer columns) is in
tests/e2e/test_node_ledger_e2e.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from frscope.analysis.suspicion import LedgerPolicy
from frscope.operator.actions import ActionOptions, CordonOptions
from frscope.operator.kube import KubeClient
from frscope.operator.ledger import FencingOptions, LedgerMetrics, LedgerSeal, NodeLedger, NodeLedgerOptions
from tests.unit.operator.fakes import FakeKube

NOW = time.time()
SEAL = LedgerSeal(b"k" * 32)
XID_CONDITION = {"type": "GpuXidError", "status": "True", "reason": "Xid79",
                 "message": "GPU has fallen off the bus (from NVSentinel)"}


def stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def put_node(fake: FakeKube, name: str, *, ready: bool = True, cordoned: bool = False,
             managed: list[dict[str, Any]] | None = None, conditions: list[dict[str, Any]] | None = None) -> None:
    fake.put("nodes", {"apiVersion": "v1", "kind": "Node",
                       "metadata": {"name": name, "labels": {"cloud.google.com/gke-nodepool": "a"},
                                    "managedFields": managed or []},
                       "spec": {"unschedulable": True} if cordoned else {},
                       "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"},
                                                 *(conditions or [])]}})


def after_now(seconds: float) -> float:
    """The `age_s` of a report gathered `seconds` after the real clock's now (NOW is taken at import, which
    can be many minutes before a test runs in a whole-suite run)."""
    return NOW - time.time() - seconds


def report(fake: FakeKube, name: str, job: str, category: str, by_node: dict[str, list[int]], *,
           age_s: float = 600, action: dict[str, Any] | None = None, namespace: str = "ml",
           exits: dict[str, Any] | None = None, seal: LedgerSeal | None = SEAL) -> dict[str, Any]:
    """A report as the operator publishes one, sealed with SEAL (`seal=None`: as anyone else makes one)."""
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace},
        "diagnosis": {"what": {"category": category, "ambiguous": False},
                      "who": {"culpritRanks": sorted({r for v in by_node.values() for r in v})}},
        "job": {"name": job, "uid": f"uid-{job}", "gatheredAt": stamp(NOW - age_s)},
        "impact": {"culpritNodes": sorted(by_node), "culpritRanksByNode": by_node},
        "report": {"findings": [{"category": category, "exits": exits or {}}]},
    }
    if action is not None:
        obj["action"] = action
    return fake.put("flightrecorderreports", seal.sealed(obj) if seal is not None else obj)


def ledger(kube: KubeClient, *, mode: str = "dry-run", max_nodes: int = 1, rate: int = 3,
           registry: CollectorRegistry | None = None, clock: Any = None) -> NodeLedger:
    options = NodeLedgerOptions(policy=LedgerPolicy(), fencing=FencingOptions(mode=mode), refresh_s=1)
    actions = ActionOptions(rate_per_hour=rate, cordon=CordonOptions(max_nodes=max_nodes))
    return NodeLedger(kube, LedgerMetrics(registry or CollectorRegistry()), options, actions, instance="test",
                      seal=SEAL, clock=clock or time.time)


def frnode(fake: FakeKube, name: str) -> dict[str, Any]:
    obj = fake.get("flightrecordernodes", "", name)
    assert obj is not None, name
    return obj


def events(fake: FakeKube, reason: str) -> list[dict[str, Any]]:
    return [e for e in fake.of("events") if e["reason"] == reason]


async def two_tenants_hang_on_n1(fake: FakeKube, led: NodeLedger) -> None:
    """Tenants ml and cv hang on n1, which reports an Xid condition; ml's job c is a code fault on both."""
    for body in (report(fake, "r-a", "a", "NotCompleted", {"n1": [1]}),
                 report(fake, "r-b", "b", "NotCompleted", {"n1": [2]}, namespace="cv"),
                 report(fake, "r-c", "c", "RankNotJoined", {"n1": [0], "n2": [3]})):
        await led.on_report("ADDED", body)


@pytest.fixture
def nodes(fake_kube: FakeKube) -> FakeKube:
    put_node(fake_kube, "n1", conditions=[XID_CONDITION])
    put_node(fake_kube, "n2")
    return fake_kube


async def test_two_tenants_and_the_nodes_condition_make_it_suspected_and_a_dry_run_changes_nothing(
        nodes: FakeKube, kube_client: KubeClient) -> None:
    registry = CollectorRegistry()
    led = ledger(kube_client, registry=registry)
    await two_tenants_hang_on_n1(nodes, led)
    n1, n2 = frnode(nodes, "n1"), frnode(nodes, "n2")
    summary = n1["summary"]
    assert (summary["state"], summary["incidents"], summary["distinctJobs"], summary["distinctNamespaces"],
            summary["nodeSourced"]) == ("suspected", 2, 2, 2, 2)
    assert {i["evidence"] for i in n1["incidents"] if i["weight"]} == {"hardware-exit"}
    assert "GpuXidError=True (Xid79" in n1["incidents"][-1]["why"] or "GpuXidError=True" in str(n1["incidents"])
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
    await fresh.on_report("ADDED", nodes.get("flightrecorderreports", "cv", "r-b") or {})
    assert len(nodes.writes()) == writes and len(frnode(nodes, "n1")["incidents"]) == 3
    assert registry.get_sample_value("frscope_node_incidents_total", {"evidence": "code"}) == 2
    assert registry.get_sample_value("frscope_node_suspicion", {"node": "n2"}) == 0


async def test_fencing_cordons_and_a_persons_uncordon_is_recorded_once(nodes: FakeKube,
                                                                        kube_client: KubeClient) -> None:
    led = ledger(kube_client, mode="cordon")
    await two_tenants_hang_on_n1(nodes, led)
    node = nodes.get("nodes", "", "n1") or {}
    assert node["spec"]["unschedulable"] is True and node["metadata"]["annotations"]["frscope.io/fenced"] == "cv/r-b"
    n1 = frnode(nodes, "n1")
    assert (n1["summary"]["state"], n1["fence"]["state"], n1["fence"]["cordoned"]) == ("fenced", "fenced", True)
    assert [e["type"] for e in events(nodes, "SuspectNodeFenced")] == ["Warning"]
    assert not (nodes.get("nodes", "", "n2") or {})["spec"].get("unschedulable")

    await led.refresh()  # still cordoned: nothing to record
    assert frnode(nodes, "n1")["fence"]["state"] == "fenced"
    later = stamp(time.time() + 1)
    put_node(nodes, "n1", conditions=[XID_CONDITION],
             managed=[{"manager": "frscope-operator", "operation": "Update", "time": later},
                      {"manager": "kubelet", "operation": "Update", "time": later, "subresource": "status"},
                      {"manager": "kube-controller-manager", "operation": "Update", "time": later},
                      {"manager": "kubectl-uncordon", "operation": "Update", "time": later}])
    await led.refresh()
    n1 = frnode(nodes, "n1")
    assert (n1["fence"]["state"], n1["fence"]["releasedBy"], n1["summary"]["state"]) == (
        "released", "kubectl-uncordon", "suspected")
    await led.refresh()
    assert len(events(nodes, "SuspectNodeReleased")) == 1
    # More incidents of one tenant after the release (gathered after it) are not enough: the fence rule counts
    # only incidents after a release, by namespace.
    for name in ("r-d", "r-d2"):
        await led.on_report("ADDED", report(nodes, name, "d", "NotCompleted", {"n1": [1]}, age_s=after_now(60)))
    assert frnode(nodes, "n1")["fence"]["state"] == "released"
    assert not (nodes.get("nodes", "", "n1") or {})["spec"].get("unschedulable")
    # A second tenant's does.
    await led.on_report("ADDED", report(nodes, "r-e", "e", "Straggler", {"n1": [1]}, age_s=after_now(60),
                                        namespace="cv"))
    assert frnode(nodes, "n1")["fence"]["state"] == "fenced"
    assert frnode(nodes, "n1")["fence"]["releasedBy"] == "kubectl-uncordon"  # history kept


@pytest.mark.parametrize(("setup", "why"), [
    ({"max_nodes": 0}, "budget --cordon-max-nodes=0"),
    ({"rate": 1}, "rate limit: 1 action(s) in namespace cv"),
    ({"n2_ready": False}, "would leave 0 other healthy node(s) in pool cloud.google.com/gke-nodepool=a"),
])
async def test_each_limit_refuses_the_fence_and_says_why(fake_kube: FakeKube, kube_client: KubeClient,
                                                         setup: dict[str, Any], why: str) -> None:
    put_node(fake_kube, "n1", conditions=[XID_CONDITION])
    put_node(fake_kube, "n2", ready=setup.get("n2_ready", True))
    if "rate" in setup:  # a restart in the namespace within the hour
        report(fake_kube, "r-x", "x", "RankNotJoined", {"n9": [0]}, namespace="cv",
               action={"action": "restart", "state": "done", "at": stamp(NOW - 60)})
    led = ledger(kube_client, mode="cordon", max_nodes=setup.get("max_nodes", 1), rate=setup.get("rate", 3))
    await two_tenants_hang_on_n1(fake_kube, led)
    n1 = frnode(fake_kube, "n1")
    assert n1["fence"]["state"] == "skipped" and why in n1["fence"]["message"], n1["fence"]
    assert n1["summary"]["state"] == "suspected"
    assert not (fake_kube.get("nodes", "", "n1") or {})["spec"].get("unschedulable")
    assert [e["type"] for e in events(fake_kube, "SuspectNodeFenceSkipped")] == ["Normal"]


async def test_a_node_already_cordoned_by_someone_else_is_left_alone(fake_kube: FakeKube,
                                                                     kube_client: KubeClient) -> None:
    put_node(fake_kube, "n1", cordoned=True, conditions=[XID_CONDITION])
    put_node(fake_kube, "n2")
    await two_tenants_hang_on_n1(fake_kube, ledger(kube_client, mode="cordon"))
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
    await two_tenants_hang_on_n1(nodes, ledger(kube_client, mode="dry-run"))
    obj = frnode(nodes, "n1")
    obj["fence"] = {"state": "fencing", "at": stamp(time.time() - 60), "mode": "cordon", "incident": "cv/r-b",
                    "message": "cordon under way"}
    nodes.put("flightrecordernodes", obj)
    await led.refresh()
    assert (nodes.get("nodes", "", "n1") or {})["spec"]["unschedulable"] is True
    n1 = frnode(nodes, "n1")
    assert (n1["fence"]["state"], n1["summary"]["state"]) == ("fenced", "fenced")
    assert "finished after an operator restart" in n1["fence"]["message"]


# -- what a tenant cannot forge --------------------------------------------------------------------
async def test_one_hostile_tenant_never_suspects_a_shared_node(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    """Tenant evil pins two jobs on the shared node; they hang, and their containers write 'Xid 79 ... fallen
    off the bus' as their termination messages. The node says nothing: it stays watched at score 2 (stuck
    collectives), no Warning, no fence; the Xid text is no evidence."""
    put_node(fake_kube, "n1")
    put_node(fake_kube, "n2")
    led = ledger(kube_client, mode="cordon", max_nodes=5)
    xid = {"1": {"exit_code": 1, "reason": "Error", "message": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off "
                 "the bus"}}
    await led.on_report("ADDED", report(fake_kube, "e-1", "j1", "NotCompleted", {"n1": [1]}, namespace="evil"))
    await led.on_report("ADDED", report(fake_kube, "e-2", "j2", "RankStopped", {"n1": [1]}, namespace="evil",
                                        exits=xid))
    await led.on_report("ADDED", report(fake_kube, "e-3", "j3", "NotCompleted", {"n1": [2]}, namespace="evil"))
    n1 = frnode(fake_kube, "n1")
    assert (n1["summary"]["state"], n1["summary"]["distinctJobs"], n1["summary"]["distinctNamespaces"]) == (
        "watched", 2, 1), n1["summary"]
    assert [i["evidence"] for i in n1["incidents"]] == ["stuck-collective", "code", "stuck-collective"]
    assert "fence" not in n1 and not events(fake_kube, "NodeSuspected")
    assert not (fake_kube.get("nodes", "", "n1") or {})["spec"].get("unschedulable")


async def test_reports_the_operator_did_not_seal_are_never_recorded(nodes: FakeKube, kube_client: KubeClient) -> None:
    registry = CollectorRegistry()
    led = ledger(kube_client, registry=registry)
    forged = [report(nodes, "f-1", "a", "NotCompleted", {"n1": [1]}, seal=None),  # made by a tenant
              report(nodes, "f-2", "b", "NotCompleted", {"n1": [1]}, namespace="cv",
                     seal=LedgerSeal(b"x" * 32))]  # another key
    edited = report(nodes, "f-3", "c", "NotCompleted", {"n2": [1]}, namespace="cv")
    edited["impact"]["culpritRanksByNode"] = {"n1": [1]}  # sealed, then changed to blame another node
    for body in (*forged, nodes.put("flightrecorderreports", edited)):
        await led.on_report("ADDED", body)
    assert nodes.get("flightrecordernodes", "", "n1") is None and nodes.get("flightrecordernodes", "", "n2") is None
    assert registry.get_sample_value("frscope_node_reports_unsealed_total") == 3


async def test_the_kubelets_oom_event_on_the_node_is_evidence_a_tenants_event_is_not(
        fake_kube: FakeKube, kube_client: KubeClient) -> None:
    put_node(fake_kube, "n1")
    at = stamp(NOW - 600)

    def oom_event(name: str, namespace: str, component: str) -> None:
        fake_kube.put("events", {"metadata": {"name": name, "namespace": namespace}, "reason": "SystemOOM",
                                 "message": "System OOM encountered, victim process: python",
                                 "involvedObject": {"kind": "Node", "name": "n1"}, "source": {"component": component},
                                 "lastTimestamp": at, "type": "Warning"})

    oom_event("forged-1", "ml", "kubelet")  # a tenant's own namespace
    oom_event("forged-2", "default", "trainer")  # not the kubelet
    led = ledger(kube_client)
    await led.on_report("ADDED", report(fake_kube, "r-a", "a", "RankStopped", {"n1": [1]}))
    assert [i["evidence"] for i in frnode(fake_kube, "n1")["incidents"]] == ["unclear"]
    oom_event("n1.oom", "default", "kubelet")
    await led.on_report("ADDED", report(fake_kube, "r-b", "b", "RankStopped", {"n1": [1]}, namespace="cv"))
    by_key = {i["key"]: i for i in frnode(fake_kube, "n1")["incidents"]}
    assert (by_key["cv/r-b"]["evidence"], by_key["cv/r-b"]["weight"]) == ("node-oom", 0.5)
    assert "the kubelet reported SystemOOM on the node" in by_key["cv/r-b"]["why"]


async def test_one_namespace_never_holds_more_than_its_share_of_the_fence_budget(
        fake_kube: FakeKube, kube_client: KubeClient) -> None:
    """Budget 2, share 0.5: incidents of one namespace set off one fence; another namespace's the next."""
    for name in ("n1", "n2", "n3", "n4"):
        put_node(fake_kube, name, conditions=[XID_CONDITION])
    led = ledger(kube_client, mode="cordon", max_nodes=2, rate=10)
    for node in ("n1", "n2"):  # cv sets both fences off (ml first, cv second on each)
        await led.on_report("ADDED", report(fake_kube, f"ml-{node}", "a", "RankStopped", {node: [1]}))
        await led.on_report("ADDED", report(fake_kube, f"cv-{node}", "b", "RankStopped", {node: [1]}, namespace="cv"))
    assert frnode(fake_kube, "n1")["fence"]["state"] == "fenced"
    n2 = frnode(fake_kube, "n2")
    assert n2["fence"]["state"] == "skipped" and "namespace cv set off (its share of the budget: 1" in n2["fence"][
        "message"], n2["fence"]
    await led.on_report("ADDED", report(fake_kube, "cv-n3", "b", "RankStopped", {"n3": [1]}, namespace="cv"))
    await led.on_report("ADDED", report(fake_kube, "ml-n3", "a", "RankStopped", {"n3": [1]}))
    assert frnode(fake_kube, "n3")["fence"]["state"] == "fenced"  # set off by ml: its own share


def test_the_flags_count_namespaces_and_the_older_names_still_work(tmp_path: Any) -> None:
    from frscope.cli import build_parser
    from frscope.operator.command import from_args

    def ledger_options(*argv: str) -> NodeLedgerOptions:
        options = from_args(build_parser("operator").parse_args(["operator", *argv])).node_ledger
        assert options is not None
        return options

    default = ledger_options()
    assert (default.policy.suspect_namespaces, default.policy.fence_namespaces) == (2, 2)
    assert default.policy.need_node_evidence and default.fencing.namespace_share == 0.5
    assert default.signals.hardware_conditions == ("*",) and default.key_file is None
    key = tmp_path / "key"
    given = ledger_options("--node-suspect-jobs", "3", "--node-fence-namespaces", "4", "--node-hardware-conditions",
                           "GpuXidError, KernelDeadlock", "--node-fence-namespace-share", "0.25",
                           "--node-ledger-key-file", str(key), "--node-oom-window", "60")
    assert (given.policy.suspect_namespaces, given.policy.fence_namespaces) == (3, 4)
    assert given.signals.hardware_conditions == ("GpuXidError", "KernelDeadlock")
    assert (given.fencing.namespace_share, given.signals.oom_window_s, given.key_file) == (0.25, 60.0, key)
