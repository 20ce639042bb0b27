"""The node ledger (docs/actions.md, "The node ledger") against the real API server from testenv:
`frscope operator` as its own process, with a token bound to exactly the chart's rules (base, actions,
and the ledger's with `nodeLedger.fencing.mode=cordon`), the real FlightRecorderReport and
FlightRecorderNode CRDs, and Node objects.

Three jobs of two tenants (namespaces), two nodes of one pool. The incidents are SIMULATED: this tier
has no kubelet, scheduler or training operator to run real jobs on real nodes, so each incident is a
FlightRecorderReport created the way the operator publishes one (verdict, culprit ranks,
`impact.culpritRanksByNode` naming the node the culprit ranks ran on), sealed with the operator's key
(`--node-ledger-key-file`; the ledger records no other report). What the node says about itself is
real API state: a condition set through the Node's status subresource, as node-problem-detector does.
The operator's real report watch, ledger, fencing and Events handle them:

    job a   (tenant 1) NotCompleted on the shared node (a collective every rank entered that never completed)
    job b   (tenant 2) NotCompleted on the shared node
    job c   (tenant 1) RankNotJoined (a rank stuck in the user's Python) on both nodes, and a SizeMismatch
            on the other node: code faults, which never count
    node    the shared node reports GpuXidError=True (a GPU health agent's condition)

The shared node becomes suspected (a Warning Event on it) and, with fencing on, is cordoned; in the
default dry run it is not. The other node stays watched at score 0. A person's uncordon is recorded and
does not lead to a second fence without new incidents. The hostile tenant's side (one namespace alone,
Xid text in termination messages, reports it made itself) is tests/e2e/test_tenants_e2e.py.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e.test_actions_e2e import bind, helm_rules, new_namespace
    from tests.e2e.test_operator_e2e import ROOT, operator, wait_for
except ModuleNotFoundError:
    from test_actions_e2e import bind, helm_rules, new_namespace  # type: ignore[no-redef]
    from test_operator_e2e import ROOT, operator, wait_for  # type: ignore[no-redef]

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e]

CRDS = [ROOT / "charts" / "frscope" / "crds" / f"{name}.yaml"
        for name in ("flightrecorderreport", "flightrecordernode")]
POOL_LABEL = "cloud.google.com/gke-nodepool"
SEAL_KEY = os.urandom(32)  # the operator's key (--node-ledger-key-file): the tests publish as it does
XID_CONDITION = {"type": "GpuXidError", "status": "True", "reason": "Xid79",
                 "message": "GPU has fallen off the bus (a GPU health agent's condition)"}


def now(offset_s: float = 0.0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + offset_s))


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup(kube: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Both CRDs, and a ServiceAccount bound to exactly the chart's rules with cordon fencing on."""
    for crd in CRDS:
        kube.kubectl("apply", "-f", str(crd))
    for name in ("flightrecorderreports.frscope.io", "flightrecordernodes.frscope.io"):
        kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}", timeout=70)
    home_ns = new_namespace(kube)
    home = tmp_path_factory.mktemp("helm-home")
    bind(kube, home_ns, "ledger", helm_rules(kube, home, "nodeLedger.fencing.mode=cordon"))
    bind_default_role(kube, home_ns, "ledger", home)
    bind(kube, home_ns, "ledger-defaults", helm_rules(kube, home))
    bind(kube, home_ns, "ledger-off", helm_rules(kube, home, "nodeLedger.enabled=false"))
    token = kube.kubectl("create", "token", "ledger", "-n", home_ns, "--duration=2h").stdout.strip()
    kubeconfig = kube.write_token_kubeconfig(tmp_path_factory.mktemp("kc") / "operator.kubeconfig", token,
                                             f"system:serviceaccount:{home_ns}:ledger")
    key_file = tmp_path_factory.mktemp("seal") / "ledger.key"
    key_file.write_bytes(SEAL_KEY)
    yield {"kubeconfig": kubeconfig, "namespace": home_ns,
           "args": ["--poll-interval", "1", "--node-ledger-refresh", "1", "--node-ledger-key-file", str(key_file)]}
    kube.kubectl("delete", "clusterrolebinding,clusterrole", "-l", "frscope-e2e=actions", "--ignore-not-found")
    kube.kubectl("delete", "rolebinding,role", "-n", "default", "-l", "frscope-e2e=actions", "--ignore-not-found")
    kube.kubectl("delete", "namespace", home_ns, "--wait=false")


def bind_default_role(kube: ControlPlane, namespace: str, sa: str, home: Path) -> None:
    """The chart's ledger Role in `default` (the kubelet's node Events read), bound to `sa`."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    proc = subprocess.run([str(kube.bin_dir / "helm"), "template", "frs", str(ROOT / "charts" / "frscope"),
                           "--namespace", "frscope-system"], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    [role] = [o for o in yaml.safe_load_all(proc.stdout) if o and o["kind"] == "Role"
              and o["metadata"]["name"].endswith("-operator-ledger-events")]
    name = f"{sa}-{namespace}"
    meta = {"name": name, "namespace": "default", "labels": {"frscope-e2e": "actions"}}
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": role["rules"]})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]})


def set_condition(kube: ControlPlane, node: str, condition: dict[str, Any]) -> None:
    """A condition on the Node, through its status subresource, as node-problem-detector sets one (a
    strategic merge: the conditions are merged by type)."""
    stamp = now()
    kube.kubectl("patch", "node", node, "--subresource=status", "--type=strategic", "-p", json.dumps(
        {"status": {"conditions": [{**condition, "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]}}))


@contextmanager
def ready_nodes(kube: ControlPlane, names: list[str], pool: str) -> Iterator[None]:
    """Node objects of one pool, Ready, kept Ready by a heartbeat (their Lease and Ready condition) for
    as long as the test runs: without a kubelet the node lifecycle controller would mark them Unknown
    after its grace period, and a node that is not Ready does not count as healthy."""
    for name in names:
        kube.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {POOL_LABEL: pool}}})
    stop = threading.Event()

    def beat() -> None:
        for name in names:
            stamp = now()
            ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e heartbeat",
                     "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
            kube.kubectl("patch", "node", name, "--subresource=status", "--type=strategic",
                         "-p", json.dumps({"status": {"conditions": [ready]}}), check=False)
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": name, "namespace": "kube-node-lease"},
                     "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                              "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())}}
            kube.kubectl("apply", "-f", "-", input=json.dumps(lease), check=False)

    def loop() -> None:
        while not stop.wait(5):
            beat()

    beat()
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
        kube.kubectl("delete", "node", *names, "--ignore-not-found")
        kube.kubectl("delete", "flightrecordernodes", *names, "--ignore-not-found")
        kube.kubectl("delete", "lease", "-n", "kube-node-lease", *names, "--ignore-not-found")


def test_permissions_follow_the_ledger_values(kube: ControlPlane, setup: dict[str, Any]) -> None:
    """Default: nodes read, the ledger's own objects written, nodes never patched; fencing `cordon` adds
    nodes patch; the ledger off takes both away."""
    ns = setup["namespace"]

    def can(sa: str, *what: str) -> bool:
        proc = kube.kubectl("auth", "can-i", *what, f"--as=system:serviceaccount:{ns}:{sa}", check=False)
        return proc.stdout.strip() == "yes"

    ledger_objects = "flightrecordernodes.frscope.io"
    for verb in (("list", "nodes"), ("get", "nodes"), ("create", ledger_objects), ("update", ledger_objects),
                 ("create", "events", "-n", "default")):
        assert can("ledger-defaults", *verb) and can("ledger", *verb), verb
    assert can("ledger", "patch", "nodes") and not can("ledger-defaults", "patch", "nodes")
    assert not can("ledger-off", "list", ledger_objects) and not can("ledger-off", "list", "nodes")
    for verb in (("delete", "nodes"), ("update", "nodes"), ("create", "pods/eviction", "-n", ns)):
        assert not can("ledger", *verb), verb


def simulated_report(kube: ControlPlane, namespace: str, job: str, category: str,
                     ranks_by_node: dict[str, list[int]], *, age_s: float = 600.0,
                     exits: dict[str, Any] | None = None, sealed: bool = True) -> str:
    """A FlightRecorderReport as the operator publishes one for a diagnosed incident (simulated: see the
    module's docstring), sealed with the operator's key; `sealed=False`: as a tenant makes one. Returns
    namespace/name."""
    from frscope.operator.ledger import LedgerSeal

    name = f"{job}-{secrets.token_hex(4)}"
    culprits = sorted({r for ranks in ranks_by_node.values() for r in ranks})
    body = {
        "apiVersion": "frscope.io/v1alpha1", "kind": "FlightRecorderReport",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"frscope.io/job": job, "frscope.io/incident": name[-8:]}},
        "diagnosis": {"verdict": f"simulated {category} of job {job}",
                      "what": {"category": category, "ambiguous": False, "op": "all_reduce", "collectiveSeqId": 7},
                      "who": {"culprits": ",".join(map(str, culprits)), "culpritRanks": culprits}},
        "job": {"name": job, "uid": f"uid-{namespace}-{job}", "attempt": "0", "incident": name[-8:],
                "signal": "simulated", "gatheredAt": now(-age_s), "ranksGathered": 4, "worldSize": 4},
        "impact": {"watchdogTimeoutSeconds": 600, "timeoutSource": "simulated", "gpus": 0, "ranks": 4,
                   "culpritPods": [], "culpritNodes": sorted(ranks_by_node),
                   "culpritRanksByNode": ranks_by_node},
        "report": {"schema": "frscope.report/v1", "findings": [{"category": category, "exits": exits or {}}]},
    }
    kube.apply(LedgerSeal(SEAL_KEY).sealed(body) if sealed else body)
    return f"{namespace}/{name}"


def three_jobs(kube: ControlPlane, shared: str, other: str) -> tuple[list[str], dict[str, str]]:
    """Jobs a (tenant 1) and b (tenant 2) hang on the shared node; job c's faults (everywhere, tenant 1) are
    the code's. The namespaces (the operator watches only them: other tests' reports stay out of its
    counts) and each incident's report."""
    one, two = new_namespace(kube), new_namespace(kube)
    return [one, two], {
        "a": simulated_report(kube, one, "a", "NotCompleted", {shared: [1]}, age_s=1800),
        "b": simulated_report(kube, two, "b", "NotCompleted", {shared: [3]}, age_s=900),
        "c1": simulated_report(kube, one, "c", "RankNotJoined", {shared: [2], other: [0]}, age_s=600),
        "c2": simulated_report(kube, one, "c", "SizeMismatch", {other: [0]}, age_s=300),
    }


def watching(namespaces: list[str]) -> list[str]:
    return [arg for ns in namespaces for arg in ("--namespace", ns)]


def frnode(kube: ControlPlane, name: str) -> dict[str, Any]:
    found = kube.kubectl("get", "frnode", name, "-o", "json", check=False)
    return dict(json.loads(found.stdout)) if found.returncode == 0 else {}


def node_events(kube: ControlPlane, node: str) -> list[dict[str, Any]]:
    return [e for e in kube.kubectl_json("get", "events", "-n", "default")["items"]
            if e["involvedObject"].get("name") == node and e["involvedObject"].get("kind") == "Node"
            and e.get("source", {}).get("component") == "frscope-operator"]


def ui_nodes(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + "/ui/api/nodes", timeout=5) as r:  # loopback: --ui-auth port-forward
        return list(json.loads(r.read())["nodes"])


def _recorded(kube: ControlPlane, shared: str, other: str, incidents: int) -> bool:
    a, b = frnode(kube, shared), frnode(kube, other)
    return bool(a and b and len(a.get("incidents", [])) == incidents and len(b.get("incidents", [])) == 2)


def _check_suspected_and_code_faults_ignored(kube: ControlPlane, shared: str, other: str,
                                             reports: dict[str, str]) -> None:
    ledger = frnode(kube, shared)
    assert ledger["summary"]["state"] in ("suspected", "fenced"), ledger
    summary = ledger["summary"]
    assert (summary["incidents"], summary["distinctJobs"], summary["distinctNamespaces"], summary["nodeSourced"]) \
        == (2, 2, 2, 2), ledger
    assert 1.5 <= ledger["summary"]["score"] <= 2.0, ledger
    by_key = {i["key"]: i for i in ledger["incidents"]}
    assert (by_key[reports["a"]]["evidence"], by_key[reports["a"]]["weight"]) == ("hardware-exit", 1)
    assert "the node's condition GpuXidError=True (Xid79" in by_key[reports["a"]]["why"]
    assert (by_key[reports["c1"]]["evidence"], by_key[reports["c1"]]["weight"]) == ("code", 0)
    assert ledger["node"]["pool"].startswith(f"{POOL_LABEL}=")
    clean = frnode(kube, other)
    assert clean["summary"]["state"] == "watched" and clean["summary"]["score"] == 0, clean
    assert clean["summary"]["incidents"] == 0 and clean["summary"]["distinctJobs"] == 0
    assert sorted(i["evidence"] for i in clean["incidents"]) == ["code", "code"]
    assert not [e for e in node_events(kube, other) if e["type"] == "Warning"]
    [suspected] = [e for e in node_events(kube, shared) if e["reason"] == "NodeSuspected"]
    assert suspected["type"] == "Warning" and f"node {shared} is suspected" in suspected["message"]
    table = kube.kubectl("get", "frnodes", shared, other).stdout.splitlines()
    assert table[0].split()[:6] == ["NAME", "NODE", "SCORE", "INCIDENTS", "JOBS", "LAST"], table
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows[other][2:5] == ["0", "0", "0"] and rows[other][-1] == "watched", table
    assert rows[shared][3:5] == ["2", "2"], table


# -- dry run (the default) -------------------------------------------------------------------------
@pytest.mark.timeout(240)
def test_the_shared_node_is_suspected_and_in_a_dry_run_not_cordoned(kube: ControlPlane, setup: dict[str, Any],
                                                                    tmp_path: Path) -> None:
    suffix = secrets.token_hex(3)
    shared, other = f"shared-{suffix}", f"other-{suffix}"
    with ready_nodes(kube, [shared, other], f"pool-{suffix}"):
        set_condition(kube, shared, XID_CONDITION)
        namespaces, reports = three_jobs(kube, shared, other)
        with operator(kube, setup["kubeconfig"], tmp_path / "operator.log",
                      [*setup["args"], *watching(namespaces)]) as op:
            wait_for("the ledger's objects", lambda: _recorded(kube, shared, other, 3), 90, interval=1,
                     diagnostics=op.logs)
            wait_for("the dry run", lambda: frnode(kube, shared).get("fence", {}).get("state") == "would-fence", 30,
                     interval=1, diagnostics=op.logs)
            metrics = op.metrics()
            listed = ui_nodes(op.url)
        _check_suspected_and_code_faults_ignored(kube, shared, other, reports)
        fence = frnode(kube, shared)["fence"]
        assert fence["message"].startswith(f"Dry run: would cordon node {shared}"), fence
        assert fence["incident"] in (reports["a"], reports["b"])
        node = kube.kubectl_json("get", "node", shared)
        assert not node["spec"].get("unschedulable") and "frscope.io/fenced" not in node["metadata"].get(
            "annotations", {})
        assert [e["type"] for e in node_events(kube, shared) if e["reason"] == "SuspectNodeFenceDryRun"] == ["Normal"]
        assert f'frscope_node_suspicion{{node="{shared}"}}' in metrics
        assert f'frscope_node_suspicion{{node="{other}"}} 0.0' in metrics
        assert 'frscope_node_incidents_total{evidence="code"} 3.0' in metrics
        assert 'frscope_node_incidents_total{evidence="hardware-exit"} 2.0' in metrics
        assert 'frscope_node_fences_total{outcome="dry-run"} 1.0' in metrics
        assert [(n["node"], n["state"]) for n in listed if n["node"] in (shared, other)] == [
            (shared, "suspected"), (other, "watched")]


# -- fencing on ------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_with_fencing_the_shared_node_is_cordoned_and_a_persons_uncordon_is_recorded(
        kube: ControlPlane, setup: dict[str, Any], tmp_path: Path) -> None:
    suffix = secrets.token_hex(3)
    shared, other = f"shared-{suffix}", f"other-{suffix}"
    with ready_nodes(kube, [shared, other], f"pool-{suffix}"):
        set_condition(kube, shared, XID_CONDITION)
        namespaces, reports = three_jobs(kube, shared, other)
        args = [*setup["args"], *watching(namespaces), "--node-fencing", "cordon", "--node-fence-taint", "on",
                "--cordon-max-nodes", "5"]
        with operator(kube, setup["kubeconfig"], tmp_path / "operator-1.log", args) as op:
            wait_for("the fence", lambda: frnode(kube, shared).get("fence", {}).get("state") == "fenced", 90,
                     interval=1, diagnostics=op.logs)
            wait_for("the ledger's objects", lambda: _recorded(kube, shared, other, 3), 30, interval=1,
                     diagnostics=op.logs)
            metrics = op.metrics()
        _check_suspected_and_code_faults_ignored(kube, shared, other, reports)
        ledger = frnode(kube, shared)
        assert ledger["summary"]["state"] == "fenced" and ledger["fence"]["cordoned"] is True, ledger
        node = kube.kubectl_json("get", "node", shared)
        assert node["spec"]["unschedulable"] is True
        assert node["metadata"]["annotations"]["frscope.io/fenced"] in (reports["a"], reports["b"])
        assert [(t["key"], t["effect"]) for t in node["spec"]["taints"] if t["key"].startswith("frscope.io/")] == [
            ("frscope.io/suspect-node", "NoSchedule")]
        untouched = kube.kubectl_json("get", "node", other)
        assert not untouched["spec"].get("unschedulable") and not untouched["spec"].get("taints")
        [fenced] = [e for e in node_events(kube, shared) if e["reason"] == "SuspectNodeFenced"]
        assert fenced["type"] == "Warning" and "kubectl uncordon" in fenced["message"]
        assert 'frscope_node_fences_total{outcome="done"} 1.0' in metrics

        # A person lifts the fence: the ledger records it and, without new incidents, never fences again.
        kube.kubectl("uncordon", shared)
        kube.kubectl("taint", "node", shared, "frscope.io/suspect-node-")
        with operator(kube, setup["kubeconfig"], tmp_path / "operator-2.log", args) as op:
            wait_for("the release recorded", lambda: frnode(kube, shared).get("fence", {}).get("state") == "released",
                     60, interval=1, diagnostics=op.logs)
            time.sleep(4)  # refreshes and the report watch's relisting had every chance to fence it again
        released = frnode(kube, shared)
        assert released["summary"]["state"] == "suspected", released
        # `kubectl uncordon` only removes fields, so the node's managedFields keep no entry of it; the node
        # lifecycle controller, which then removes its own unschedulable taint, is not taken for the person.
        assert released["fence"]["releasedBy"].startswith("not recorded"), released
        assert released["fence"]["releasedAt"] >= released["fence"]["at"]
        assert "since a person released it" in released["summary"]["why"]
        assert not kube.kubectl_json("get", "node", shared)["spec"].get("unschedulable")
        assert [e["reason"] for e in node_events(kube, shared)].count("SuspectNodeFenced") == 1
        assert [e["reason"] for e in node_events(kube, shared)].count("SuspectNodeReleased") == 1
