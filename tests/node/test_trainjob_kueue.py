"""Stopping a Kueue-queued TrainJob (docs/actions.md, "Kueue") on the real node: the Kueue controller
manager (v0.17.0, built by testenv/build-kueue, in a pod from its own manifests with its TrainJob and
JobSet integrations on) beside the real Trainer (v2.3.0) and JobSet (v0.12.0) controllers (the `trainer`
fixture), and the chart upgraded to allow `stop`. Nothing is patched by hand on the TrainJob, its
Workload, its JobSet or its pods.

A TrainJob labelled `kueue.x-k8s.io/queue-name` is admitted through its Workload: Kueue owns its
`spec.suspend`, so frscope stops it the Kueue way, by setting the Workload's `spec.active: false`. Kueue
then evicts the Workload and suspends the TrainJob, Trainer suspends its JobSet, the Job controller
deletes the pods, and the TrainJob is not admitted again while the Workload is inactive.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.node.support import CHART_SETS, dump_state, new_namespace, script_configmap, wait_for
from tests.node.test_actions import events, final_action
from tests.node.test_trainjob import TRAIN_PY, trainjob, trainjob_pods
from tests.node.test_trainjob_actions import conditions, ranks_up, running, upgrade_chart

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(900)]

QUEUE = "frscope-test"
FLAVOR = "default-flavor"
CLUSTER_QUEUE = "frscope-test-cq"
NODES = 2
WORKLOADS = "workloads.kueue.x-k8s.io"
STOP_SETS = ["actions.allow={stop}", "actions.ratePerNamespacePerHour=1"]


@pytest.fixture(scope="module")
def stop_allowed(node: Any, installed: Path) -> Iterator[None]:
    """The chart upgraded to allow `stop`, before Kueue runs (Kueue's webhooks see Deployments too); the
    chart's values put back after Kueue is gone."""
    upgrade_chart(node, installed, CHART_SETS + STOP_SETS)
    try:
        yield
    finally:
        upgrade_chart(node, installed, CHART_SETS)


@pytest.fixture(scope="module")
def queue(node: Any, stop_allowed: None, kueue: str) -> str:
    """A ResourceFlavor and a ClusterQueue with room for the test's pods (Kueue itself: the conftest
    fixture `kueue`, removed with everything of it after the module). Returns the ClusterQueue's name."""
    quota = [{"name": FLAVOR, "resources": [{"name": "cpu", "nominalQuota": "64"},
                                            {"name": "memory", "nominalQuota": "256Gi"}]}]
    objects = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
         "spec": {"namespaceSelector": {}, "resourceGroups": [
             {"coveredResources": ["cpu", "memory"], "flavors": quota}]}},
    ]
    for obj in objects:
        # Kueue's webhooks check these: their configuration gets the CA bundle from Kueue's cert rotator a
        # moment after the Deployment is Available.
        wait_for(f"Kueue's webhook to take the {obj['kind']}", lambda o=obj: node.kubectl(
            "apply", "--server-side", "-f", "-", input=json.dumps(o), check=False).returncode == 0, 60, 2)
    return CLUSTER_QUEUE


@pytest.fixture
def namespace(node: Any, queue: str) -> Iterator[str]:
    ns = new_namespace(node, "tj-kueue", labels={"frscope.io/inject": "true"})
    node.plane.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                      "metadata": {"name": QUEUE, "namespace": ns}, "spec": {"clusterQueue": queue}})
    yield ns
    node.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def workloads(node: Any, ns: str, uid: str) -> list[dict[str, Any]]:
    got = node.plane.kubectl_json("-n", ns, "get", WORKLOADS)["items"]
    return [w for w in got if any(r.get("uid") == uid for r in w["metadata"].get("ownerReferences") or [])]


def test_stop_a_queued_trainjob_the_kueue_way(node: Any, namespace: str) -> None:
    ns, name = namespace, "llm"
    script_configmap(node, ns, f"{name}-script", TRAIN_PY)
    job = node.plane.apply(trainjob(
        name, ns, num_nodes=NODES, nproc=1, command=["torchrun", "/scripts/train.py"],
        metadata={"labels": {"kueue.x-k8s.io/queue-name": QUEUE},
                  "annotations": {"frscope.io/on-diagnosis": "stop"}}))
    uid = job["metadata"]["uid"]
    dump = dump_state(node, ns, "trainjob", name, f"jobset.sigs.k8s.io/jobset-name={name}", ("node",))
    # Kueue admits it through a Workload and un-suspends it; Trainer then makes the JobSet and the pods.
    [workload] = wait_for("the TrainJob's Workload", lambda: workloads(node, ns, uid) or None, 120, 2, diagnostics=dump)
    wait_for("the TrainJob's pods Running", lambda: running(node, ns, name), 300, 2, diagnostics=dump)
    admitted = workloads(node, ns, uid)[0]
    assert any(c["type"] == "Admitted" and c["status"] == "True" for c in admitted["status"]["conditions"]), admitted
    wait_for("every rank up", lambda: ranks_up(node, ns, name), 300, 2, diagnostics=dump)

    acted = wait_for("the report's action done", lambda: final_action(node, ns), 150, 1, diagnostics=dump)
    text = json.dumps(acted, indent=1)
    action = acted["action"]
    assert action["state"] == "done" and action["action"] == "stop", text
    assert f"workload/{workload['metadata']['name']}" in action["targets"], text
    assert "the Kueue way" in action["message"], text

    # Kueue evicts the Workload and suspends the TrainJob; Trainer suspends its JobSet; the pods go.
    def evicted() -> dict[str, Any] | None:
        [w] = workloads(node, ns, uid)
        found = {c["type"]: c for c in w.get("status", {}).get("conditions") or []}
        return w if (found.get("Evicted") or {}).get("status") == "True" else None

    gone = wait_for("the Workload evicted", evicted, 120, 2, diagnostics=dump)
    assert gone["spec"]["active"] is False
    assert gone["metadata"]["annotations"].get("frscope.io/stopped-by-diagnosis"), gone["metadata"]
    wait_for("the TrainJob suspended", lambda: node.plane.kubectl_json("-n", ns, "get", "trainjob", name)[
        "spec"].get("suspend") is True, 120, 2, diagnostics=dump)
    wait_for("the pods gone", lambda: not trainjob_pods(node, ns, name), 120, 2, diagnostics=dump)
    wait_for("Trainer's Suspended condition", lambda: (conditions(node, ns, name).get("Suspended") or {}).get(
        "status") == "True", 120, 2, diagnostics=dump)
    # And it stays so: Kueue does not admit an inactive Workload again.
    time.sleep(10)
    assert node.plane.kubectl_json("-n", ns, "get", "trainjob", name)["spec"].get("suspend") is True
    assert not trainjob_pods(node, ns, name)
    [event] = events(node, ns, "HungJobStopped")
    assert event["involvedObject"]["uid"] == uid, event
