"""Acting on a TrainJob's diagnosis (docs/actions.md) on the real node, with the real Kubeflow Trainer
(v2.3.0) and JobSet (v0.12.0) controllers in pods (the `trainer` fixture) and the chart upgraded to allow
`restart` and `stop`. Nothing is patched by hand on the TrainJob, its JobSet, its pods or the report.

- restart: a TrainJob on Trainer's own `torch-distributed` runtime (2 nodes x torchrun with 1 process,
  gloo), annotated `frscope.io/on-diagnosis: restart`, hangs. Trainer's runtime makes one Job of
  parallelism 2 with the default backoffLimit 6 and no failurePolicy, so frscope judges that deleting
  the pods brings them back; it deletes them after the report exists, the Job controller makes new pods
  (new uids), the TrainJob never fails, and `HungJobRestarted` is on the TrainJob.
- stop: the same TrainJob asking for `stop`: frscope sets its `spec.suspend`, Trainer suspends its
  JobSet, the JobSet controller its Job, the Job controller deletes the pods; Trainer's `Suspended`
  condition is True, the verdict is in the TrainJob's annotation, `HungJobStopped` is on the TrainJob, and
  the report (owned by the TrainJob) stays.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.node.support import (
    CHART_SETS,
    RELEASE,
    SYSTEM_NS,
    chart_from_registry,
    container_logs,
    dump_state,
    helm,
    new_namespace,
    script_configmap,
    wait_for,
)
from tests.node.test_actions import events, final_action
from tests.node.test_trainjob import TRAIN_PY, trainjob, trainjob_pods

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(900)]

ANN = "frscope.io/on-diagnosis"
ACTION_SETS = ["actions.allow={restart,stop}", "actions.ratePerNamespacePerHour=1"]
NODES = 2
INJECT = {"frscope.io/inject": "true"}


def upgrade_chart(node: Any, home: Path, sets: list[str]) -> None:
    """The chart from the node's registry, as the session installed it, with `sets`."""
    args = ["upgrade", "--install", RELEASE, *chart_from_registry(node), "--namespace", SYSTEM_NS, "--wait",
            "--timeout", "4m"]
    for s in sets:
        args += ["--set", s]
    helm(node, home, *args, timeout=330)


@pytest.fixture(scope="module")
def actions_allowed(node: Any, installed: Path) -> Iterator[None]:
    """The chart upgraded to allow restart and stop (one action per namespace an hour); the session's
    values again afterwards, for the tests after."""
    upgrade_chart(node, installed, CHART_SETS + ACTION_SETS)
    try:
        args = node.plane.kubectl_json("-n", SYSTEM_NS, "get", "deployment", RELEASE)[
            "spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--allow-actions=restart,stop" in args, args
        yield
    finally:
        upgrade_chart(node, installed, CHART_SETS)


@pytest.fixture
def namespace(node: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    ns = f"tj-{request.node.name.removeprefix('test_').replace('_', '-')}"[:60].rstrip("-")
    yield new_namespace(node, ns, labels=INJECT)  # opted in by the namespace label
    # A hung job left running would eat the CPU of every test after it.
    node.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def hung_trainjob(node: Any, ns: str, name: str, policy: str) -> dict[str, Any]:
    script_configmap(node, ns, f"{name}-script", TRAIN_PY)
    job = trainjob(name, ns, num_nodes=NODES, nproc=1, command=["torchrun", "/scripts/train.py"],
                   metadata={"annotations": {ANN: policy}})
    applied: dict[str, Any] = node.plane.apply(job)
    return applied


def pod_uids(node: Any, ns: str, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in trainjob_pods(node, ns, name)
            if not p["metadata"].get("deletionTimestamp")}


def running(node: Any, ns: str, name: str) -> bool:
    got = [p for p in trainjob_pods(node, ns, name) if not p["metadata"].get("deletionTimestamp")]
    return len(got) == NODES and all(p.get("status", {}).get("phase") == "Running" for p in got)


def ranks_up(node: Any, ns: str, name: str) -> bool:
    return sum(container_logs(node, ns, p, "node").count(" up;") for p in pod_uids(node, ns, name)) == NODES


def conditions(node: Any, ns: str, name: str) -> dict[str, dict[str, Any]]:
    got = node.plane.kubectl_json("-n", ns, "get", "trainjob", name)
    return {c["type"]: c for c in got.get("status", {}).get("conditions") or []}


def test_restart_a_hung_trainjob(node: Any, trainer: dict[str, str], actions_allowed: None, namespace: str) -> None:
    ns, name = namespace, "llm"
    job = hung_trainjob(node, ns, name, "restart")
    uid = job["metadata"]["uid"]
    dump = dump_state(node, ns, "trainjob", name, f"jobset.sigs.k8s.io/jobset-name={name}", ("node",))
    wait_for("the TrainJob's pods Running", lambda: running(node, ns, name), 240, 2, diagnostics=dump)
    first = pod_uids(node, ns, name)
    wait_for("every rank up", lambda: ranks_up(node, ns, name), 300, 2, diagnostics=dump)
    up = time.monotonic()

    acted = wait_for("the report's action done", lambda: final_action(node, ns), 150, 1, diagnostics=dump)
    took = time.monotonic() - up
    text = json.dumps(acted, indent=1)
    action = acted["action"]
    assert action["state"] == "done" and action["action"] == "restart", text
    assert action["requested"] == "restart" and action["source"] == "job annotation", text
    assert sorted(action["targets"]) == sorted(f"pod/{n}/{u}" for n, u in first.items()), text
    assert action["message"].startswith(f"Restarted the hung job: deleted its {NODES} pod(s)"), text
    owner = acted["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("TrainJob", uid), owner

    # The Job controller brings the pods back (new names and uids: an Indexed Job's pods), Running.
    def restarted() -> dict[str, str] | None:
        now = pod_uids(node, ns, name)
        return now if not set(now.values()) & set(first.values()) and running(node, ns, name) else None

    second = wait_for("new pods Running", restarted, 240, 2, diagnostics=dump)
    print(f"trainjob restart: acted {took:.0f}s after every rank was up, new pods {sorted(second)} Running "
          f"{time.monotonic() - up - took:.0f}s later")
    jobset = node.plane.kubectl_json("-n", ns, "get", "jobset", name)
    assert not [c for c in jobset["status"].get("conditions") or [] if c["type"] == "Failed"
                and c["status"] == "True"], jobset["status"]
    assert not (conditions(node, ns, name).get("Failed") or {}).get("status") == "True"
    [event] = events(node, ns, "HungJobRestarted")
    assert event["type"] == "Warning" and event["involvedObject"]["uid"] == uid, event
    assert event["involvedObject"]["kind"] == "TrainJob", event


def test_stop_a_hung_trainjob(node: Any, trainer: dict[str, str], actions_allowed: None, namespace: str) -> None:
    ns, name = namespace, "llm"
    job = hung_trainjob(node, ns, name, "stop")
    uid = job["metadata"]["uid"]
    dump = dump_state(node, ns, "trainjob", name, f"jobset.sigs.k8s.io/jobset-name={name}", ("node",))
    wait_for("the TrainJob's pods Running", lambda: running(node, ns, name), 240, 2, diagnostics=dump)
    wait_for("every rank up", lambda: ranks_up(node, ns, name), 300, 2, diagnostics=dump)

    acted = wait_for("the report's action done", lambda: final_action(node, ns), 150, 1, diagnostics=dump)
    text = json.dumps(acted, indent=1)
    action = acted["action"]
    assert action["state"] == "done" and action["action"] == "stop", text
    assert action["targets"] == [f"job/{name}"], text
    assert "spec.suspend: true" in action["message"], text

    # Trainer suspends its JobSet, the JobSet its Job, the Job controller deletes the pods.
    got = wait_for("Trainer's Suspended condition", lambda: (conditions(node, ns, name).get("Suspended") or {}).get(
        "status") == "True", 120, 2, diagnostics=dump)
    assert got
    wait_for("the pods gone", lambda: not trainjob_pods(node, ns, name), 120, 2, diagnostics=dump)
    stopped = node.plane.kubectl_json("-n", ns, "get", "trainjob", name)
    assert stopped["spec"]["suspend"] is True
    assert stopped["metadata"]["annotations"].get("frscope.io/stopped-by-diagnosis"), stopped["metadata"]
    assert node.plane.kubectl_json("-n", ns, "get", "jobset", name)["spec"].get("suspend") is True
    [event] = events(node, ns, "HungJobStopped")
    assert event["type"] == "Warning" and event["involvedObject"]["uid"] == uid, event
    # The report stays (owned by the TrainJob, which stays).
    report = node.plane.kubectl_json("-n", ns, "get", "frr", acted["metadata"]["name"])
    assert report["metadata"]["ownerReferences"][0]["uid"] == uid
