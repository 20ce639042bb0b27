"""Acting on a diagnosis (docs/actions.md) on the real node: the chart upgraded to allow `restart`, a
PyTorchJob whose rank hangs, and the real Kubeflow training operator (v1.8.1, in a pod) bringing the
job back after frscope ended every pod of it. Nothing is patched by hand on the job, its pods or the
report.

- restart: the job (Master 1 + Worker 1, plain python, gloo, watchdog timeout 10 min in the script,
  `restartPolicy: ExitCode`, annotation `frscope.io/on-diagnosis: restart`) hangs: rank 1 sleeps in
  load_batch. The report is written, then both pods are deleted (ordered by the API server's watch:
  the report's creation comes before either pod's deletion), the training operator makes new pods
  (new uids, Running, its conditions go through Restarting back to Running, never Failed); the report's
  action and the Event `HungJobRestarted` say what was done and the GPU-seconds saved. The restarted
  job runs the same script and hangs again: a new incident (a new generation of pods), with its own
  report; the chart's rate limit is set to 1 action per namespace an hour, so that one is refused
  (`DiagnosisActionSkipped`, "rate limit") and its pods are left alone. One action in all.
- dry-run: the same job asking for `dry-run`: an Event says what a restart would do and save, the
  report's action is `dry-run`, no pod is deleted.

There are no GPUs here. So that the saving is stated in GPU-seconds as for a real job, the node
advertises an extended resource `nvidia.com/gpu` (the way Kubernetes documents advertising extended
resources: a patch of the Node's status capacity, as a device plugin would register it) and each pod
asks for one; nothing uses it. That node patch is the only object the test writes besides the job.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.node.support import (
    CHART_SETS,
    RELEASE,
    SYSTEM_NS,
    all_running,
    chart_from_registry,
    diagnostics,
    helm,
    job_condition,
    job_pods,
    new_namespace,
    pytorchjob,
    reports,
    script_configmap,
    wait_for,
)
from tests.node.test_journey import TRAIN_PY

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(900)]

NODE = "frscope-node"
GPU = "nvidia.com/gpu"
GPUS_PER_POD = 1
WATCHDOG_S = 600  # TRAIN_PY's init_process_group timeout (10 minutes), which the recorder's timeout_ms carries
ANN = "frscope.io/on-diagnosis"
RATE = 1  # the chart's actions.ratePerNamespacePerHour here: the restarted job's new hang is refused
ACTION_SETS = ["actions.allow={restart}", f"actions.ratePerNamespacePerHour={RATE}"]
OPERATOR_SA = f"system:serviceaccount:{SYSTEM_NS}:{RELEASE}"


# ---- fixtures -------------------------------------------------------------------------------------
def _upgrade(node: Any, home: Path, sets: list[str]) -> None:
    args = ["upgrade", "--install", RELEASE, *chart_from_registry(node), "--namespace", SYSTEM_NS, "--wait",
            "--timeout", "4m"]
    for s in sets:
        args += ["--set", s]
    helm(node, home, *args, timeout=330)


def _can_delete_pods(node: Any) -> str:
    return str(node.kubectl("auth", "can-i", "delete", "pods", "-n", "default", "--as", OPERATOR_SA,
                            check=False).stdout.strip())


@pytest.fixture(scope="module")
def actions_allowed(node: Any, installed: Path) -> Iterator[None]:
    """The chart upgraded with `actions.allow={restart}` (the operator's --allow-actions) and a rate of
    one action per namespace an hour; the session's values again afterwards, for the tests after."""
    assert _can_delete_pods(node) == "no"  # the chart's default grants no pod deletion
    _upgrade(node, installed, CHART_SETS + ACTION_SETS)
    try:
        args = node.plane.kubectl_json("-n", SYSTEM_NS, "get", "deployment", RELEASE)[
            "spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--allow-actions=restart" in args and f"--action-rate={RATE}" in args, args
        assert _can_delete_pods(node) == "yes"
        yield
    finally:
        _upgrade(node, installed, CHART_SETS)
        assert _can_delete_pods(node) == "no"


@pytest.fixture(scope="module")
def gpus(node: Any) -> Iterator[None]:
    """`nvidia.com/gpu` advertised by the node (see the module's docstring), removed afterwards."""
    path = "/status/capacity/" + GPU.replace("/", "~1")
    node.kubectl("patch", "node", NODE, "--subresource=status", "--type=json",
                 "-p", json.dumps([{"op": "add", "path": path, "value": "8"}]))
    try:
        # The kubelet derives allocatable from capacity at its next status update (every 2 s here).
        wait_for("the node's allocatable GPUs", lambda: node.plane.kubectl_json("get", "node", NODE)[
            "status"].get("allocatable", {}).get(GPU) == "8", 60)
        yield
    finally:
        node.kubectl("patch", "node", NODE, "--subresource=status", "--type=json",
                     "-p", json.dumps([{"op": "remove", "path": path}]), check=False)


@pytest.fixture
def namespace(node: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    ns = f"act-{request.node.name.removeprefix('test_').replace('_', '-')}"[:60].rstrip("-")
    yield new_namespace(node, ns)
    # A hung job left running would eat the CPU of every test after it.
    node.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


# ---- watching the API server ------------------------------------------------------------------------
@dataclass
class Seen:
    """One watch event as it arrived: its type, the object's name, uid, resourceVersion, and itself."""

    type: str
    name: str
    uid: str
    rv: int
    obj: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


class Watch:
    """A watch of one collection (`kubectl get --raw PATH?watch=true`, a process of the test's own, read
    in a thread), every event kept in arrival order; `close()` ends that process by its PID.

    Ordering events of two collections by resourceVersion: kube-apiserver's resourceVersion is etcd's
    revision, one counter for every write in the cluster, so the write with the smaller number happened
    first. (The API's contract calls it opaque; this test relies on the etcd-backed server it runs.)"""

    def __init__(self, node: Any, path: str) -> None:
        listed = node.plane.get_raw(path)
        self.events: list[Seen] = [self._seen("LISTED", o) for o in listed.get("items") or []]
        rv = listed["metadata"]["resourceVersion"]
        sep = "&" if "?" in path else "?"
        self._proc = subprocess.Popen(
            [str(node.plane.bin_dir / "kubectl"), f"--kubeconfig={node.plane.kubeconfig}", "get", "--raw",
             f"{path}{sep}watch=true&resourceVersion={rv}&timeoutSeconds=1800", "--request-timeout=0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    @staticmethod
    def _seen(type_: str, obj: dict[str, Any]) -> Seen:
        meta = obj.get("metadata") or {}
        return Seen(type_, str(meta.get("name")), str(meta.get("uid")), int(meta.get("resourceVersion") or 0), obj)

    def _read(self) -> None:
        assert self._proc.stdout is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for chunk in self._proc.stdout:
            buffer += chunk
            while True:  # kubectl may pass the stream on without a newline after each event
                buffer = buffer.lstrip()
                try:
                    event, end = decoder.raw_decode(buffer)
                except ValueError:
                    break
                buffer = buffer[end:]
                with self._lock:
                    self.events.append(self._seen(event["type"], event["object"]))

    def snapshot(self) -> list[Seen]:
        with self._lock:
            return list(self.events)

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        self._thread.join(10)
        if self._proc.stdout is not None:
            self._proc.stdout.close()


# ---- the job ------------------------------------------------------------------------------------
def hung_job(node: Any, ns: str, name: str, policy: str) -> dict[str, Any]:
    """support.pytorchjob (python launcher) asking for `policy`, with the restart policy the training
    operator restarts a SIGTERM'd or SIGKILL'd trainer under (ExitCode: exit codes >= 128), one GPU a
    pod."""
    script_configmap(node, ns, f"{name}-script", TRAIN_PY)
    job = pytorchjob(name, ns, "python")
    job["metadata"]["annotations"] = {ANN: policy}
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        replica["restartPolicy"] = "ExitCode"
        replica["template"]["spec"]["containers"][0]["resources"] = {"limits": {GPU: str(GPUS_PER_POD)}}
    return dict(node.plane.apply(job))


def pod_uids(node: Any, ns: str, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in job_pods(node, ns, name)}


def generation(uids: dict[str, str]) -> str:
    """The operator's name for one generation of the job's pods (objects.pods_digest): a report's
    `job.attempt` starts with it."""
    return hashlib.sha256(",".join(sorted(uids.values())).encode()).hexdigest()[:8]


def ranks_up(node: Any, ns: str, name: str, world: int = 2) -> bool:
    ups: int = sum(node.kubectl("-n", ns, "logs", p["metadata"]["name"], "-c", "pytorch", check=False)
                   .stdout.count(" up; ") for p in job_pods(node, ns, name))
    return ups == world


def events(node: Any, ns: str, reason: str) -> list[dict[str, Any]]:
    got = node.plane.kubectl_json("-n", ns, "get", "events", "--field-selector", f"reason={reason}")["items"]
    return list(got)


def conditions(node: Any, ns: str, name: str) -> list[dict[str, Any]]:
    return list(node.plane.kubectl_json("-n", ns, "get", "pytorchjob", name).get("status", {}).get("conditions")
                or [])


def final_action(node: Any, ns: str, state: str | None = None) -> dict[str, Any] | None:
    """The one report whose action record is final (any state, or the one given)."""
    for report in reports(node, ns):
        action = report.get("action") or {}
        if action.get("state") in ("done", "failed", "skipped", "dry-run") and state in (None, action["state"]):
            return dict(report)
    return None


# ---- the tests ----------------------------------------------------------------------------------
def test_restart(node: Any, actions_allowed: None, gpus: None, namespace: str) -> None:
    ns, name = namespace, "train"
    dump = diagnostics(node, ns, name)
    pods_watch = Watch(node, f"/api/v1/namespaces/{ns}/pods")
    reports_watch = Watch(node, f"/apis/frscope.io/v1alpha1/namespaces/{ns}/flightrecorderreports")
    job_watch = Watch(node, f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs")
    try:
        job = hung_job(node, ns, name, "restart")
        uid = job["metadata"]["uid"]
        wait_for("both pods Running", lambda: all_running(node, ns, name), 240, 2, diagnostics=dump)
        first = pod_uids(node, ns, name)
        wait_for("both ranks up", lambda: ranks_up(node, ns, name), 240, 2, diagnostics=dump)
        up = time.monotonic()

        # The report, then the action on it.
        acted = wait_for("the report's action done", lambda: final_action(node, ns), 150, 1, diagnostics=dump)
        took = time.monotonic() - up
        text = json.dumps(acted, indent=1)
        action = acted["action"]
        assert action["state"] == "done" and action["action"] == "restart", text
        assert action["requested"] == "restart" and action["source"] == "job annotation", text
        assert acted["job"]["attempt"].startswith(generation(first) + "/"), (first, text)
        assert sorted(action["targets"]) == sorted(f"pod/{n}/{u}" for n, u in first.items()), text
        # What it saved: the recorder's 10 min watchdog, minus how long the collective had hung, times
        # the job's 2 GPUs.
        impact = acted["impact"]
        assert impact["gpus"] == 2 * GPUS_PER_POD and impact["watchdogTimeoutSeconds"] == WATCHDOG_S, impact
        assert impact["timeoutSource"].startswith("recorder"), impact
        saved = action["savedSeconds"]
        assert WATCHDOG_S - 120 < saved < WATCHDOG_S, text
        assert action["savedGpuSeconds"] == pytest.approx(saved * impact["gpus"], abs=0.2), text
        assert f"GPU-seconds saved ({impact['gpus']} GPUs x {saved:.0f} s before the watchdog)" in action["message"]
        assert action["message"].startswith("Restarted the hung job: deleted its 2 pod(s)"), text

        # Evidence first: the report was created before either pod was deleted.
        wait_for("both first pods deleted", lambda: all(
            any(s.uid == u and s.obj["metadata"].get("deletionTimestamp") for s in pods_watch.snapshot())
            for u in first.values()), 60, 1, diagnostics=dump)
        [created] = [s for s in reports_watch.snapshot() if s.type == "ADDED" and s.name == acted["metadata"]["name"]]
        for pod, pod_uid in first.items():
            deleting = min(s.rv for s in pods_watch.snapshot()
                           if s.uid == pod_uid and s.obj["metadata"].get("deletionTimestamp"))
            assert created.rv < deleting, f"{pod} deleted (rv {deleting}) before the report (rv {created.rv})"
            # Nothing but frscope's deletion ended it: the pod was still running when it was deleted.
            before = [s for s in pods_watch.snapshot() if s.uid == pod_uid and s.rv < deleting]
            assert before[-1].obj["status"].get("phase") == "Running", before[-1].obj["status"]

        # The training operator brings the job back: new pods of the same names, Running.
        def restarted() -> dict[str, str] | None:
            now = pod_uids(node, ns, name)
            fresh = sorted(now) == sorted(first) and not set(now.values()) & set(first.values())
            return now if fresh and all_running(node, ns, name) else None

        second = wait_for("new pods Running", restarted, 240, 2, diagnostics=dump)
        back = time.monotonic() - up - took
        wait_for("the job Running again", lambda: any(
            c["type"] == "Running" and c["status"] == "True" for c in conditions(node, ns, name)), 60, 2,
            diagnostics=dump)
        # The training operator's own account, as its status went (it drops Restarting once Running).
        states = [[(c["type"], c.get("reason")) for c in s.obj.get("status", {}).get("conditions") or []
                   if c["status"] == "True"] for s in job_watch.snapshot()]
        print(f"restart: acted {took:.0f}s after both ranks were up, new pods Running {back:.0f}s later; "
              f"the job's True conditions as they went: {states}")
        assert any(("Restarting", "PyTorchJobRestarting") in s for s in states), states
        assert not any(t == "Failed" for s in states for t, _ in s), states

        # The Event: one, a Warning on the job, saying what was done and saved.
        [event] = events(node, ns, "HungJobRestarted")
        assert event["type"] == "Warning" and event["involvedObject"]["uid"] == uid, event
        assert event.get("count", 1) == 1 and (event.get("series") or {}).get("count", 1) == 1, event
        assert event["message"].startswith("Restarted the hung job") and "GPU-seconds saved" in event["message"], event
        # ACTION is a wide column of `kubectl get frr`.
        table = node.kubectl("-n", ns, "get", "frr", acted["metadata"]["name"], "-o", "wide").stdout.splitlines()
        print("\n".join(table))
        header = table[0].split()
        assert table[1].split()[header.index("ACTION")] == "restart", table

        # The new pods hang the same way: a new incident, refused by the rate limit (1 an hour here).
        wait_for("both ranks up again", lambda: ranks_up(node, ns, name), 240, 2, diagnostics=dump)

        def second_report() -> dict[str, Any] | None:
            for r in reports(node, ns):
                if r["metadata"]["name"] != acted["metadata"]["name"] and (r.get("action") or {}).get("state"):
                    return dict(r)
            return None

        again = wait_for("the second incident's report", second_report, 150, 1, diagnostics=dump)
        text = json.dumps(again, indent=1)
        assert again["job"]["attempt"].startswith(generation(second) + "/"), (second, text)
        assert again["diagnosis"]["what"]["category"] == acted["diagnosis"]["what"]["category"], text
        assert again["action"]["state"] == "skipped" and "rate limit" in again["action"]["message"], text
        [skipped] = events(node, ns, "DiagnosisActionSkipped")
        assert "rate limit" in skipped["message"] and skipped["type"] == "Normal", skipped
        # frscope's condition on the job tells of the new pods' hang (not of the deleted pods' ends).
        ours = job_condition(node, ns, "pytorchjob", name)
        assert ours is not None and ours["reason"] == acted["diagnosis"]["what"]["category"], ours
        time.sleep(10)  # an action would have been claimed within the same pass; give any straggler time
        assert pod_uids(node, ns, name) == second, "the restarted job's pods were touched"
        # One action in all, and one report per generation of pods.
        assert len(events(node, ns, "HungJobRestarted")) == 1
        assert len(reports(node, ns)) == 2, [r["metadata"]["name"] for r in reports(node, ns)]
        deleted = {s.uid for s in pods_watch.snapshot() if s.obj["metadata"].get("deletionTimestamp")}
        assert deleted == set(first.values()), deleted
        # What the operator made of it all, for the record (-s shows it).
        logs = node.kubectl("-n", SYSTEM_NS, "logs", f"deploy/{RELEASE}", "--tail=400", check=False).stdout
        print("\n".join(line[:300] for line in logs.splitlines() if f"{ns}/" in line))
    finally:
        for watch in (pods_watch, reports_watch, job_watch):
            watch.close()


def test_dry_run(node: Any, actions_allowed: None, gpus: None, namespace: str) -> None:
    ns, name = namespace, "train"
    dump = diagnostics(node, ns, name)
    hung_job(node, ns, name, "dry-run")
    wait_for("both pods Running", lambda: all_running(node, ns, name), 240, 2, diagnostics=dump)
    first = pod_uids(node, ns, name)
    wait_for("both ranks up", lambda: ranks_up(node, ns, name), 240, 2, diagnostics=dump)
    dry = wait_for("the report's dry run", lambda: final_action(node, ns), 150, 1, diagnostics=dump)
    text = json.dumps(dry, indent=1)
    action = dry["action"]
    assert action["state"] == "dry-run" and action["action"] == "dry-run", text
    assert action["requested"] == "dry-run" and not action["targets"], text
    [event] = events(node, ns, "DiagnosisActionDryRun")
    assert event["type"] == "Normal", event
    message = event["message"]
    assert message.startswith("Dry run: would restart the job;"), message
    assert f"GPU-seconds would be saved ({2 * GPUS_PER_POD} GPUs x" in message, message
    assert action["savedGpuSeconds"] > 0, text
    time.sleep(10)
    pods = job_pods(node, ns, name)
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods} == first
    assert not any(p["metadata"].get("deletionTimestamp") for p in pods), pods
    assert not [c for c in conditions(node, ns, name) if c["type"] == "Restarting"], conditions(node, ns, name)
    assert not events(node, ns, "HungJobRestarted")
