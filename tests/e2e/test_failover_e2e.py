"""Two operator replicas against the real API server (testenv): the leader is killed (SIGKILL, by PID)
in the middle of an incident and the standby carries the incident on to its diagnosis, publishing
nothing twice.

Everything is real but the kubelet's part: a real 4-rank gloo job that hangs (the rhythm job, through
the zero-code bootstrap), one real `frscope sidecar` per pod (suspects the hang from the job's rhythm,
confirms it at `--stall-after`), two `frscope operator` processes with the chart's RBAC for two replicas
(its ClusterRole and its leader-election Role, rendered by the real helm) electing a leader through a
real coordination.k8s.io Lease with the chart's default timing, and the chart's Service for two replicas,
whose selector picks the leader's pod by its role label. As in
test_operator_e2e, the pods (the job's and the two replicas') are objects whose status the test writes
the way a kubelet would.

The incident: the leader publishes the suspicion (condition Unknown, a SuspectedStall Event, the
job's suspicion report) and is killed. The standby takes the Lease once it has not changed for the
lease duration, labels its pod leader (and the dead leader's standby), carries the suspicion on (no
second Event) and publishes the confirmed diagnosis once the sidecars confirm the stall: within 30 s of
the kill, with exactly one incident report, one condition, one Event of each reason.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e.chart_tools import CHART, Helm, objects, one
    from tests.e2e.test_operator_e2e import (
        CONDITION,
        JOB,
        OperatorProcess,
        namespace,
        now,
        report_crd,
        wait_for,
    )
    from tests.e2e.test_suspicion_e2e import OPERATOR_ARGS, events, job_with_sidecars, ours, start, suspicion_report
except ModuleNotFoundError:
    from chart_tools import CHART, Helm, objects, one  # type: ignore[no-redef]
    from test_operator_e2e import (  # type: ignore[no-redef]
        CONDITION,
        JOB,
        OperatorProcess,
        namespace,
        now,
        report_crd,
        wait_for,
    )
    from test_suspicion_e2e import (  # type: ignore[no-redef]
        OPERATOR_ARGS,
        events,
        job_with_sidecars,
        ours,
        start,
        suspicion_report,
    )

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

__all__ = ["namespace", "report_crd"]  # fixtures, shared
pytestmark = [pytest.mark.e2e, pytest.mark.torch, pytest.mark.slow]

RELEASE = "frs"
LEASE = f"{RELEASE}-frscope"  # the chart's: its full name
REPLICAS = {"a": f"{LEASE}-a", "b": f"{LEASE}-b"}  # replica -> its pod
ROLE_LABEL = "frscope.io/operator-role"
STALL_AFTER = "25"  # the sidecars confirm the stall this long after it began: after the kill (suspected at 4-15 s)
# How long the test waits for the standby's diagnosis: the promise (within 30 s of the kill, 19.8-26.1 s measured on
# an idle machine) is a timing, reported below and in bench/RESULTS.md, not asserted; on a loaded machine it runs later.
TAKEOVER_WAIT_S = 120.0


def chart_lease_timing() -> dict[str, int]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return dict(values["operator"]["leaderElection"])


@pytest.fixture
def two_replicas(kube: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The chart for two replicas, rendered into the test's namespace: its operator ClusterRole and the
    leader-election Role bound to a ServiceAccount (its token in a kubeconfig), its Service applied, and
    a pod object per replica as the Deployment would make it (labelled standby, Running, Ready)."""
    helm = Helm(kube.bin_dir / "helm", tmp_path / "helm-home")
    rendered = objects(helm, sets=["operator.replicas=2"], release=RELEASE, namespace=namespace)
    cluster_role = one(rendered, "ClusterRole", f"{LEASE}-operator")
    election_role = one(rendered, "Role", f"{LEASE}-leader-election")
    service = one(rendered, "Service", LEASE)
    pod_template = one(rendered, "Deployment")["spec"]["template"]
    cluster_name = f"frscope-failover-{namespace}"
    subject = {"kind": "ServiceAccount", "name": "frscope-operator", "namespace": namespace}
    kube.kubectl("create", "serviceaccount", "frscope-operator", "-n", namespace)
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": cluster_name}, "rules": cluster_role["rules"]})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": cluster_name}, "subjects": [subject],
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_name}})
    kube.apply(election_role)
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": election_role["metadata"]["name"], "namespace": namespace},
                "subjects": [subject], "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                   "name": election_role["metadata"]["name"]}})
    kube.apply(service)
    ports = [{"name": p["targetPort"], "containerPort": 8000 + i} for i, p in enumerate(service["spec"]["ports"])]
    for index, pod in enumerate(REPLICAS.values()):  # the Service's selector must find them
        kube.apply({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod, "namespace": namespace, "labels": pod_template["metadata"]["labels"]},
                    "spec": {"containers": [{"name": "operator", "image": "frscope:e2e", "ports": ports}]}})
        ip = f"10.244.0.{index + 2}"
        kube.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(
            {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ip, "startTime": now(),
                        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now()}]}}))
    token = kube.kubectl("create", "token", "frscope-operator", "-n", namespace, "--duration=1h").stdout.strip()
    kubeconfig = kube.write_token_kubeconfig(tmp_path / "operator.kubeconfig", token,
                                             f"system:serviceaccount:{namespace}:frscope-operator")
    yield kubeconfig, service
    kube.kubectl("delete", "clusterrolebinding,clusterrole", cluster_name, "--ignore-not-found")


def role_of(kube: ControlPlane, ns: str, pod: str) -> str | None:
    labels = kube.kubectl_json("get", "pod", pod, "-n", ns)["metadata"].get("labels") or {}
    return labels.get(ROLE_LABEL)


def lease(kube: ControlPlane, ns: str) -> dict[str, Any]:
    found = kube.kubectl("get", "lease", LEASE, "-n", ns, "-o", "json", check=False)
    return dict(json.loads(found.stdout)["spec"]) if found.returncode == 0 else {}


def routed_to(kube: ControlPlane, ns: str) -> set[str]:
    """The pods the chart's Service selects, asked of the API server with the Service's own selector (its
    EndpointSlices would say the same, but the EndpointSlice controller skips pods of a node that does
    not exist, and no kubelet keeps one alive here)."""
    selector = kube.kubectl_json("get", "service", LEASE, "-n", ns)["spec"]["selector"]
    terms = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    return {p["metadata"]["name"] for p in kube.kubectl_json("get", "pods", "-n", ns, "-l", terms)["items"]}


def start_replica(kube: ControlPlane, kubeconfig: Path, ns: str, name: str, log: Path) -> OperatorProcess:
    timing = chart_lease_timing()
    args = [*OPERATOR_ARGS, "--decode-processes", "0",  # no worker processes: a SIGKILL leaves no orphan
            "--leader-election-lease", LEASE, "--lease-duration", str(timing["leaseDurationSeconds"]),
            "--lease-renew-deadline", str(timing["renewDeadlineSeconds"]),
            "--lease-retry-period", str(timing["retryPeriodSeconds"])]
    return OperatorProcess(kube, kubeconfig, log, args, {"POD_NAME": REPLICAS[name], "POD_NAMESPACE": ns})


def answer(url: str, data: bytes | None = None) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def incident_reports(kube: ControlPlane, ns: str) -> list[dict[str, Any]]:
    items = kube.kubectl_json("get", "flightrecorderreports", "-n", ns)["items"]
    return [r for r in items if not r["job"].get("suspicion")]


@pytest.mark.timeout(480)
def test_the_standby_takes_over_an_incident_when_the_leader_is_killed(
        kube: ControlPlane, report_crd: str, namespace: str, two_replicas: tuple[Path, dict[str, Any]],
        tmp_path: Path) -> None:
    kubeconfig, _service = two_replicas
    # The hang begins 50 s into the job: both replicas run by then, and the suspicion comes first.
    args = ["--steps", "100000", "--step-s", "0.25", "--hang-step", "200", "--culprit", "1"]
    with job_with_sidecars(tmp_path, args, stall_after=STALL_AFTER) as ports:
        start(kube, namespace, ports)
        a = start_replica(kube, kubeconfig, namespace, "a", tmp_path / "operator-a.log")
        b: OperatorProcess | None = None
        try:
            a.wait_ready()
            wait_for("replica a to lead", lambda: role_of(kube, namespace, REPLICAS["a"]) == "leader", 60,
                     diagnostics=a.logs)
            b = start_replica(kube, kubeconfig, namespace, "b", tmp_path / "operator-b.log")
            b.wait_ready()  # a standby is ready: the budget counts it, the Service does not route to it
            status, body = answer(b.url + "/readyz")
            assert status == 200 and body["leader"] is False and str(body["holder"]).startswith(REPLICAS["a"])
            status, body = answer(b.url + "/v1/push", b"{}")
            assert status == 503 and "standby replica" in body["error"], body
            assert role_of(kube, namespace, REPLICAS["b"]) == "standby"
            wait_for("the Service to route to the leader only", lambda: routed_to(kube, namespace) == {REPLICAS["a"]},
                     60)

            # --- the incident begins: the leader publishes the suspicion, then dies ---
            suspected = wait_for("the suspected condition",
                                 lambda: (c := ours(kube, namespace)) and c["status"] == "Unknown" and c, 200,
                                 diagnostics=a.logs)
            wait_for("the SuspectedStall Event", lambda: events(kube, namespace, "SuspectedStall"), 30)
            assert not incident_reports(kube, namespace), "the leader must die before the diagnosis"
            holder_before = lease(kube, namespace)["holderIdentity"]
            os.kill(a.proc.pid, signal.SIGKILL)
            killed = time.time()
            a.proc.wait(timeout=10)

            # --- the standby carries it on ---
            confirmed = wait_for("the diagnosis published by the standby",
                                 lambda: (c := ours(kube, namespace)) and c["status"] == "True" and c,
                                 TAKEOVER_WAIT_S, interval=0.25, diagnostics=b.logs)
            published_after = time.time() - killed
            spec = lease(kube, namespace)
            assert str(spec["holderIdentity"]).startswith(REPLICAS["b"]) and spec["holderIdentity"] != holder_before
            took_over_after = datetime.fromisoformat(spec["acquireTime"].replace("Z", "+00:00")).timestamp() - killed
            print(f"\nfailover: Lease taken {took_over_after:.1f} s after the kill (leaseDurationSeconds "
                  f"{chart_lease_timing()['leaseDurationSeconds']}), diagnosis published {published_after:.1f} s "
                  f"after it; suspicion published at {suspected['lastTransitionTime']}")
            assert confirmed["reason"] == "RankNotJoined" and "Rank 1" in confirmed["message"], confirmed
            assert spec["leaseTransitions"] == 1

            # --- nothing published twice ---
            job = kube.kubectl_json("get", "pytorchjob", JOB, "-n", namespace)
            assert [c["type"] for c in job["status"]["conditions"]].count(CONDITION) == 1
            [report] = wait_for("one incident report", lambda: incident_reports(kube, namespace), 10)
            assert report["diagnosis"]["what"]["category"] == "RankNotJoined"
            time.sleep(5)  # several more sweeps of the standby, now the leader, see the same stall
            assert len(incident_reports(kube, namespace)) == 1
            for reason in ("SuspectedStall", "RankNotJoined"):
                found = events(kube, namespace, reason)
                assert len(found) == 1 and found[0]["count"] == 1, (reason, found)
            kept = suspicion_report(kube, namespace)
            assert kept is not None and kept["state"]["phase"] == "Confirmed", kept
            metrics = b.metrics()
            assert 'frscope_operator_diagnoses_total{category="RankNotJoined"} 1.0' in metrics
            assert 'frscope_operator_suspected_stalls_total{outcome="published"} 1.0' not in metrics  # carried on

            # --- the Service follows the Lease: the new leader's pod only ---
            assert role_of(kube, namespace, REPLICAS["b"]) == "leader"
            assert role_of(kube, namespace, REPLICAS["a"]) == "standby"  # the dead leader's label, taken off
            wait_for("the Service to route to the new leader only",
                     lambda: routed_to(kube, namespace) == {REPLICAS["b"]}, 60)
            status, body = answer(b.url + "/readyz")
            assert status == 200 and body == {"ready": True}
        finally:
            for replica in (a, b):
                if replica is not None:
                    replica.stop()
