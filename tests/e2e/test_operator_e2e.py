"""`frscope operator` against the real API server from testenv (etcd, kube-apiserver,
kube-controller-manager), real sidecars (`frscope sidecar`) beside a real hung torch gloo job on
loopback, and the operator running as its own process with the Helm chart's least-privilege RBAC.

There is no kubelet and no scheduler: the test creates each pod as an object (labels and
ownerReference as the training operator sets them, the sidecar's named port set to where the real
sidecar listens), then patches its status the way a kubelet would (phase Running, podIP 127.0.0.1).
The job's own conditions are written through the status subresource the way the training operator
writes them. Everything else is decided by the real components: pruning, the status subresource,
conflicts, RBAC, admission (the webhook, over TLS), ownerReference garbage collection.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "charts" / "frscope" / "crds" / "flightrecorderreport.yaml"
CONDITION = "CollectiveTimeoutDiagnosed"
JOB = "train"


# -- helpers ---------------------------------------------------------------------------------------
def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.5,
             diagnostics: Callable[[], str] = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}\n{diagnostics()}")


class OperatorProcess:
    """`python -m frscope operator ...` with its own kubeconfig; ended by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, kube: ControlPlane, kubeconfig: Path, log: Path, args: list[str],
                 env: dict[str, str] | None = None) -> None:
        self.kube = kube
        self.port = free_port()
        self.log = log
        full_env = {**kube.env(), "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1", **(env or {})}
        full_env.pop("PYTHONPATH", None)
        self._out = open(log, "ab")  # closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "frscope", "operator", "--http-host", "127.0.0.1", "--http-port", str(self.port),
             "--log-level", "DEBUG", *args],
            env=full_env, stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the operator exited with {self.proc.returncode}:\n{self.logs()}")
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for("the operator's /readyz", self.ready, timeout, diagnostics=self.logs)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            return str(r.read().decode())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._out.close()


@contextmanager
def operator(kube: ControlPlane, kubeconfig: Path, log: Path, args: list[str],
             env: dict[str, str] | None = None) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(kube, kubeconfig, log, args, env)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@contextmanager
def hung_job_with_sidecars(tmp: Path, pods: dict[str, tuple[int, ...]],
                           hosts: dict[str, str] | None = None, port: int | None = None) -> Iterator[dict[str, int]]:
    """A real 4-rank gloo job that hangs (rank 1 never joins all_reduce #4), and one real `frscope
    sidecar` per pod watching that pod's ranks (their worker-server sockets, linked into a per-pod
    directory). Yields pod -> the sidecar's port. Everything is ended by PID on exit.
    With `hosts` (pod -> a loopback address, each pod its own) every sidecar listens on one port (`port`,
    or a free one), on its pod's address: pods made from one pod template (one containerPort) then reach
    their own sidecar."""
    from frscope.demo.launcher import start_job

    sidecars: list[tuple[subprocess.Popen[bytes], Any]] = []
    with start_job("hang", sum(len(r) for r in pods.values()), lifetime_s=240) as job:
        job.wait_for_sockets(time.monotonic() + 90)
        ports: dict[str, int] = {}
        shared_port = (port or free_port()) if hosts else 0
        try:
            for pod, ranks in pods.items():
                directory = tmp / pod
                directory.mkdir(parents=True)
                for rank in ranks:
                    os.symlink(job.socket_path(rank), directory / f"rank-{rank}.sock")
                port_file = directory / "port"
                log = open(directory / "sidecar.log", "wb")  # closed below
                proc = subprocess.Popen(
                    [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(directory),
                     "--evidence-dir", "none", "--host", (hosts or {}).get(pod, "127.0.0.1"),
                     "--port", str(shared_port), "--port-file", str(port_file),
                     "--poll-interval", "1", "--stall-after", "2", "--pod", pod, "--namespace", "ml"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                )
                sidecars.append((proc, log))
                ports[pod] = int(wait_for(f"sidecar of {pod}", lambda f=port_file: f.exists() and f.read_text().strip(),
                                          60))
            yield ports
        finally:
            for proc, _ in sidecars:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc, log in sidecars:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
                log.close()


def pytorchjob(namespace: str) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "pytorch", "image": "registry.invalid/train:1"}]}}
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": JOB, "namespace": namespace},
        "spec": {"nprocPerNode": "2", "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template},
            "Worker": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}},
    }


def training_conditions(*types: str) -> list[dict[str, Any]]:
    reasons = {"Created": "PyTorchJobCreated", "Running": "PyTorchJobRunning", "Failed": "PyTorchJobFailed",
               "Restarting": "PyTorchJobRestarting"}
    return [{"type": t, "status": "True", "reason": reasons[t], "message": f"PyTorchJob {JOB} is {t.lower()}.",
             "lastUpdateTime": now(), "lastTransitionTime": now()} for t in types]


def set_job_conditions(kube: ControlPlane, namespace: str, conditions: list[dict[str, Any]]) -> None:
    """What the training operator does: its list of conditions, through the status subresource."""
    kube.kubectl("patch", "pytorchjob", JOB, "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"conditions": conditions}}))


def create_pod(kube: ControlPlane, namespace: str, job_uid: str, name: str, replica: str, index: int,
               sidecar_port: int) -> None:
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": {"frscope.io/inject": "true",
                       "training.kubeflow.org/job-name": JOB, "training.kubeflow.org/replica-type": replica,
                       "training.kubeflow.org/replica-index": str(index),
                       "training.kubeflow.org/operator-name": "pytorchjob-controller"},
            "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": JOB,
                                 "uid": job_uid, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "initContainers": [{"name": "frscope-sidecar", "image": "frscope:e2e", "restartPolicy": "Always",
                                "ports": [{"name": "frscope", "containerPort": sidecar_port}]}],
            "containers": [{"name": "pytorch", "image": "registry.invalid/train:1",
                            "terminationMessagePolicy": "FallbackToLogsOnError"}],
        },
    }
    kube.apply(pod)
    # The kubelet's part: the pod runs, with the loopback address of the local sidecar.
    status = {"status": {
        "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "hostIP": "127.0.0.1",
        "startTime": now(),
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now()}],
        "initContainerStatuses": [{"name": "frscope-sidecar", "image": "frscope:e2e", "imageID": "", "ready": True,
                                   "restartCount": 0, "started": True,
                                   "state": {"running": {"startedAt": now()}}}],
        "containerStatuses": [{"name": "pytorch", "image": "registry.invalid/train:1", "imageID": "", "ready": True,
                               "restartCount": 0, "started": True, "state": {"running": {"startedAt": now()}}}],
    }}
    kube.kubectl("patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps(status))


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def report_crd(kube: ControlPlane) -> str:
    name = "flightrecorderreports.frscope.io"
    kube.kubectl("apply", "-f", str(CRD))

    def established() -> bool:
        conditions = kube.kubectl_json("get", "crd", name).get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(f"CRD {name} Established", established, 60)
    return name


@pytest.fixture
def namespace(kube: ControlPlane) -> Iterator[str]:
    name = f"op-{secrets.token_hex(4)}"
    kube.kubectl("create", "namespace", name)
    # Pods are admitted only once the controller manager made the namespace's default ServiceAccount.
    wait_for("the default ServiceAccount", lambda: kube.kubectl(
        "get", "serviceaccount", "default", "-n", name, check=False).returncode == 0, 30)
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture(scope="module")
def chart_rbac(kube: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The Helm chart's ClusterRole for the operator (default values), rendered by the real helm."""
    home = tmp_path_factory.mktemp("helm-home")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    proc = subprocess.run([str(kube.bin_dir / "helm"), "template", "frs", str(ROOT / "charts" / "frscope"),
                           "--namespace", "frscope-system"], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    rendered = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    [role] = [o for o in rendered if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-operator")]
    return list(role["rules"])


@pytest.fixture
def operator_kubeconfig(kube: ControlPlane, namespace: str, chart_rbac: list[dict[str, Any]],
                        tmp_path: Path) -> Iterator[Path]:
    """A ServiceAccount bound to exactly the chart's rules; its token in a kubeconfig."""
    name = f"frscope-operator-{namespace}"
    kube.kubectl("create", "serviceaccount", "frscope-operator", "-n", namespace)
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": name}, "rules": chart_rbac})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": "frscope-operator", "namespace": namespace}]})
    token = kube.kubectl("create", "token", "frscope-operator", "-n", namespace, "--duration=1h").stdout.strip()
    path = kube.write_token_kubeconfig(tmp_path / "operator.kubeconfig", token,
                                       f"system:serviceaccount:{namespace}:frscope-operator")
    yield path
    kube.kubectl("delete", "clusterrolebinding,clusterrole", name, "--ignore-not-found")


# -- the diagnosis, end to end ---------------------------------------------------------------------
@pytest.mark.timeout(360)
def test_a_real_hang_is_diagnosed_into_the_job(kube: ControlPlane, report_crd: str, namespace: str,
                                               operator_kubeconfig: Path, tmp_path: Path) -> None:
    job = kube.apply(pytorchjob(namespace))
    uid = job["metadata"]["uid"]
    set_job_conditions(kube, namespace, training_conditions("Created", "Running"))
    # Cluster-wide, as the chart runs it by default (its default RBAC has no namespace list for kopf's
    # namespace observer, which `--namespace` needs; the chart grants that only in namespaced mode).
    args = ["--poll-interval", "1", "--stuck-after", "1", "--gather-timeout", "30", "--cooldown", "3"]
    pods = {"train-master-0": (0, 1), "train-worker-0": (2, 3)}

    def get_job() -> dict[str, Any]:
        return dict(kube.kubectl_json("get", "pytorchjob", JOB, "-n", namespace))

    def reports() -> list[dict[str, Any]]:
        items = kube.kubectl_json("get", "flightrecorderreports", "-n", namespace)["items"]
        return [r for r in items if not r["job"].get("suspicion")]  # the incident's, not a suspicion's

    def diagnosed() -> bool:
        return any(c["type"] == CONDITION for c in get_job().get("status", {}).get("conditions", []))

    with hung_job_with_sidecars(tmp_path / "pods", pods) as ports:
        for pod, port in ports.items():
            create_pod(kube, namespace, uid, pod, "master" if "master" in pod else "worker", 0, port)
        log = tmp_path / "operator.log"
        with operator(kube, operator_kubeconfig, log, args) as op:
            wait_for("the condition on the job", diagnosed, 90, diagnostics=op.logs)
            wait_for("the Event", lambda: kube.kubectl_json("get", "events", "-n", namespace,
                                                              "--field-selector", "reason=RankNotJoined")["items"], 30)
            metrics = op.metrics()
            assert 'frscope_operator_diagnoses_total{category="RankNotJoined"} 1.0' in metrics
            watched = re.search(r"^frscope_operator_jobs_watched (\S+)$", metrics, re.M)
            assert watched and float(watched.group(1)) >= 1, metrics

        # --- what `kubectl describe pytorchjob` shows ---
        job = get_job()
        conditions = job["status"]["conditions"]
        assert conditions[0]["type"] == CONDITION and conditions[0]["reason"] == "RankNotJoined"
        assert "Rank 1" in conditions[0]["message"] and "all_reduce #4" in conditions[0]["message"]
        assert "group 0" in conditions[0]["message"]
        assert len(conditions[0]["message"].encode()) <= 1024
        # The job's STATE printer column (.status.conditions[-1:].type) is still the training operator's.
        table = kube.kubectl("get", "pytorchjob", JOB, "-n", namespace).stdout
        assert table.splitlines()[1].split()[1] == "Running", table
        # Nothing else was written into the status (the API server would prune it anyway).
        assert set(job["status"]) <= {"conditions", "replicaStatuses", "startTime", "completionTime",
                                      "lastReconcileTime"}
        # Nothing of frscope's or kopf's on the job itself (its bookkeeping is the report), no finalizer;
        # its only write to the job went through the status subresource.
        annotations = job["metadata"].get("annotations", {})
        assert not [k for k in annotations if "kopf" in k or k.startswith("frscope.io/")], annotations
        assert not job["metadata"].get("finalizers")
        managed = kube.kubectl_json("get", "pytorchjob", JOB, "-n", namespace, "--show-managed-fields")
        ours = [f for f in managed["metadata"]["managedFields"] if f["manager"] == "frscope-operator"]
        assert ours and all(f.get("subresource") == "status" for f in ours), ours
        [listed] = reports()
        report_name = listed["metadata"]["name"]
        assert listed["job"]["condition"]["reason"] == "RankNotJoined"
        for pod in pods:
            meta = kube.kubectl_json("get", "pod", pod, "-n", namespace)["metadata"]
            assert not meta.get("finalizers") and not [k for k in meta.get("annotations", {}) if "kopf" in k]

        described = kube.kubectl("describe", "pytorchjob", JOB, "-n", namespace).stdout
        assert CONDITION in described and "RankNotJoined" in described, described
        events_section = described.split("Events:")[1]
        assert "Warning" in events_section and "RankNotJoined" in events_section, described
        assert "Rank 1 never joined all_reduce #4" in " ".join(events_section.split()), described

        # --- the report: printer columns, describe, ownership ---
        [report] = reports()
        assert report["metadata"]["name"] == report_name
        assert report["metadata"]["ownerReferences"][0]["uid"] == uid
        table = kube.kubectl("get", "flightrecorderreports", report_name, "-n", namespace).stdout.splitlines()
        assert table[0].split() == ["NAME", "JOB", "STATE", "VERDICT", "CULPRITS", "AGE"], table
        assert table[1].split()[1:5] == [JOB, "Confirmed", "RankNotJoined", "1"], table
        wide = kube.kubectl("get", "frr", "-n", namespace, "-o", "wide").stdout
        assert "Rank 1 never joined" in wide, wide
        described = kube.kubectl("describe", "flightrecorderreport", report_name, "-n", namespace).stdout
        body = described.split("Diagnosis:", 1)
        assert len(body) == 2, described
        verdict_at = described.index("Verdict:")
        assert verdict_at < described.index("Evidence:") < described.index("Progress:"), described
        # The stuck rank's live stack, one frame per line.
        stack_lines = [line.strip() for line in described.split("Culprit Stacks:")[1].splitlines()]
        assert any(line.startswith("load_batch (") for line in stack_lines), described
        assert "ranks 0, 2-3" in described.split("Progress:")[1], described

        # --- operator restart mid-incident: no second report, no second Event ---
        with operator(kube, operator_kubeconfig, tmp_path / "operator-2.log", args) as op:
            time.sleep(6)  # several status sweeps see the same stall
            assert "already diagnosed" in op.logs(), op.logs()
        assert len(reports()) == 1
        events = kube.kubectl_json("get", "events", "-n", namespace, "--field-selector", "reason=RankNotJoined")
        assert len(events["items"]) == 1 and events["items"][0]["count"] == 1

        # --- the training operator rewrites the list without frscope's condition: it is put back first ---
        with operator(kube, operator_kubeconfig, tmp_path / "operator-3.log", args) as op:
            set_job_conditions(kube, namespace, training_conditions("Created", "Running", "Failed"))

            def put_back() -> bool:
                types = [c["type"] for c in get_job()["status"]["conditions"]]
                return types == [CONDITION, "Created", "Running", "Failed"]

            wait_for("the condition put back first", put_back, 30, diagnostics=op.logs)
            table = kube.kubectl("get", "pytorchjob", JOB, "-n", namespace).stdout
            assert table.splitlines()[1].split()[1] == "Failed", table

    # --- the job goes: the garbage collector takes its report with it ---
    kube.kubectl("delete", "pytorchjob", JOB, "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for("the report to be garbage-collected", lambda: not reports(), 90)


@pytest.mark.timeout(240)
def test_sidecar_down_gives_a_partial_report_and_an_event(kube: ControlPlane, report_crd: str, namespace: str,
                                                           operator_kubeconfig: Path, tmp_path: Path) -> None:
    job = kube.apply(pytorchjob(namespace))
    set_job_conditions(kube, namespace, training_conditions("Created", "Running"))
    pods = {"train-master-0": (0, 1), "train-worker-0": (2, 3)}
    with hung_job_with_sidecars(tmp_path / "pods", pods) as ports:
        create_pod(kube, namespace, job["metadata"]["uid"], "train-master-0", "master", 0, ports["train-master-0"])
        # The worker's sidecar port points nowhere: its sidecar is down.
        create_pod(kube, namespace, job["metadata"]["uid"], "train-worker-0", "worker", 0, free_port())
        args = ["--poll-interval", "1", "--stuck-after", "1", "--gather-timeout", "10", "--gather-attempts", "2"]
        with operator(kube, operator_kubeconfig, tmp_path / "operator.log", args) as op:
            found = wait_for("the report", lambda: [r for r in kube.kubectl_json(
                "get", "flightrecorderreports", "-n", namespace)["items"] if not r["job"].get("suspicion")], 90,
                diagnostics=op.logs)
            wait_for("the SidecarsUnreachable Event", lambda: kube.kubectl_json(
                "get", "events", "-n", namespace, "--field-selector", "reason=SidecarsUnreachable")["items"], 30)
    [report] = found
    assert report["diagnosis"]["who"]["missingRanks"] == "2-3"
    assert any("train-worker-0" in p for p in report["diagnosis"]["who"]["missingPods"])
    described = kube.kubectl("describe", "pytorchjob", JOB, "-n", namespace).stdout
    assert "SidecarsUnreachable" in described, described
    # `frscope doctor` reads the same Event: its operator-reach check names the pod it could not reach.
    doctor = subprocess.run([sys.executable, "-m", "frscope", "doctor", "--kubeconfig", str(kube.kubeconfig),
                             "--namespace", namespace, "--job", JOB], capture_output=True, text=True, timeout=120,
                            check=False)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    [line] = [x for x in doctor.stdout.splitlines() if x.startswith("[FAIL] operator-reach:")]
    assert "train-worker-0" in line, doctor.stdout


# -- the client's view of what the API server decides ----------------------------------------------
async def test_api_client_against_the_real_server(kube: ControlPlane, report_crd: str, namespace: str,
                                                  operator_kubeconfig: Path) -> None:
    """Typed errors and retries of frscope.operator.kube as the real API server answers: a stale
    resourceVersion is a Conflict, a second create AlreadyExists, unknown status fields are pruned,
    RBAC denies what the chart does not grant (the job itself, Secrets)."""
    from frscope.operator.kube import (
        EVENTS,
        PYTORCHJOBS,
        REPORTS,
        AlreadyExists,
        Conflict,
        Forbidden,
        KubeClient,
        Resource,
        retry_on_conflict,
    )
    from frscope.operator.model.objects import JobRef
    from frscope.operator.publish import build_event, make_condition
    from frscope.operator.runner import kube_client
    from frscope.operator.serve.login import login

    kube.apply(pytorchjob(namespace))
    set_job_conditions(kube, namespace, training_conditions("Created", "Running"))
    os.environ["KUBECONFIG"] = str(operator_kubeconfig)
    try:
        import kopf

        client: KubeClient = kube_client(login(kopf.OperatorSettings()), "e2e")
    finally:
        os.environ.pop("KUBECONFIG", None)
    try:
        job = await client.get(PYTORCHJOBS, namespace, JOB)
        stale = job["metadata"]["resourceVersion"]
        # The chart grants no write on the job itself (only its status).
        with pytest.raises(Forbidden):
            await client.merge_patch(PYTORCHJOBS, namespace, JOB, {"metadata": {"annotations": {"frscope.io/x": "1"}}})
        # A list that differs from the one set above: an identical one (same second) would be a no-op
        # that leaves the resourceVersion, and so `stale`, current.
        await client.merge_patch(PYTORCHJOBS, namespace, JOB, subresource="status",
                                 patch={"status": {"conditions": training_conditions("Created")}})
        with pytest.raises(Conflict) as conflict:
            await client.merge_patch(PYTORCHJOBS, namespace, JOB, subresource="status", patch={
                "metadata": {"resourceVersion": stale}, "status": {"conditions": []}})
        assert not isinstance(conflict.value, AlreadyExists) and conflict.value.status == 409

        attempts = 0

        async def cycle() -> None:
            nonlocal attempts
            attempts += 1
            fresh = await client.get(PYTORCHJOBS, namespace, JOB)
            rv = stale if attempts == 1 else fresh["metadata"]["resourceVersion"]
            ours = make_condition("RankNotJoined", "Rank 1 never joined all_reduce #4 of group 0.", now())
            await client.merge_patch(PYTORCHJOBS, namespace, JOB, subresource="status", patch={
                "metadata": {"resourceVersion": rv},
                "status": {"conditions": [ours, *training_conditions("Created", "Running")], "frscopeExtra": 1}})

        await retry_on_conflict(cycle)
        assert attempts == 2
        job = await client.get(PYTORCHJOBS, namespace, JOB)
        assert [c["type"] for c in job["status"]["conditions"]] == [CONDITION, "Created", "Running"]
        assert "frscopeExtra" not in job["status"]  # pruned by the API server

        ref = JobRef(namespace, JOB, job["metadata"]["uid"])
        event = build_event(ref, reason="RankNotJoined", message="x" * 5000, incident="e2e", now=now(), instance="e2e")
        await client.create(EVENTS, namespace, event)
        with pytest.raises(AlreadyExists):
            await client.create(EVENTS, namespace, event)
        report = {"apiVersion": "frscope.io/v1alpha1", "kind": "FlightRecorderReport",
                  "metadata": {"name": "r1"}, "diagnosis": {"verdict": "v", "unknownField": 1},
                  "job": {"name": JOB, "uid": ref.uid}, "report": {"free": {"form": [1, 2]}}}
        stored = await client.create(REPORTS, namespace, report)
        assert "unknownField" not in stored["diagnosis"] and stored["report"] == {"free": {"form": [1, 2]}}
        # The chart grants no access to Secrets.
        with pytest.raises(Forbidden):
            await client.list(Resource("", "v1", "secrets", "Secret"), namespace)
    finally:
        await client.close()


# -- the webhook, through the API server -----------------------------------------------------------
def make_serving_cert(directory: Path) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 (what the chart or cert-manager provide in a cluster)."""
    directory.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
        "-subj", "/CN=frscope-e2e-webhook-ca")
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "tls.crt", "-days", "1", "-extfile", "san.cnf")
    return (directory / "ca.crt").read_bytes()


@pytest.mark.timeout(180)
def test_webhook_injects_the_sidecar_through_the_api_server(kube: ControlPlane, namespace: str,
                                                             operator_kubeconfig: Path, tmp_path: Path) -> None:
    import base64

    ca = make_serving_cert(tmp_path / "tls")
    port = free_port()
    env = {"FRSCOPE_SIDECAR_IMAGE": "registry.invalid/frscope:e2e", "FRSCOPE_SIDECAR_PORT": "9402",
           "FRSCOPE_RECORDER_BUFFER_SIZE": "3000", "FRSCOPE_SIDECAR_OPERATOR_URL": "http://frscope.frscope-system.svc:80",
           "FRSCOPE_OPERATOR_IDENTITY": "system:serviceaccount:frscope-system:frscope"}
    args = ["--webhook-port", str(port), "--webhook-host", "127.0.0.1",
            "--webhook-cert-dir", str(tmp_path / "tls")]
    config_name = f"frscope-e2e-{namespace}"
    webhook_config = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": config_name},
        "webhooks": [{
            "name": "inject.frscope.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Ignore", "timeoutSeconds": 5,
            "clientConfig": {"url": f"https://127.0.0.1:{port}/inject", "caBundle": base64.b64encode(ca).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                       "scope": "Namespaced"}],
            "objectSelector": {"matchLabels": {"frscope.io/inject": "true"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        }],
    }

    def pod(name: str, opt_in: bool, extra_init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        labels = {"training.kubeflow.org/job-name": JOB, "training.kubeflow.org/replica-type": "worker"}
        if opt_in:
            labels["frscope.io/inject"] = "true"
        spec: dict[str, Any] = {"containers": [{"name": "pytorch", "image": "registry.invalid/train:1",
                                                "env": [{"name": "PYTHONPATH", "value": "/app"}]}]}
        if extra_init:
            spec["initContainers"] = extra_init
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                                 "labels": labels}, "spec": spec}

    kube.apply(webhook_config)
    try:
        with operator(kube, operator_kubeconfig, tmp_path / "operator.log", args, env) as op:
            def injected_now() -> Any:
                created = kube.kubectl_json("create", "-f", "-", input=json.dumps(pod(f"probe-{time.time_ns()}", True)))
                return created if created["spec"].get("initContainers") else None

            # The API server may take a moment to pick the configuration up.
            created = wait_for("an injected pod", injected_now, 30, interval=1, diagnostics=op.logs)
            [sidecar] = created["spec"]["initContainers"]
            assert sidecar["name"] == "frscope-sidecar" and sidecar["restartPolicy"] == "Always"  # native: v1.29+
            assert sidecar["image"] == "registry.invalid/frscope:e2e"
            assert {"name": "frscope", "containerPort": 9402, "protocol": "TCP"} in sidecar["ports"]
            assert "--operator-url=http://frscope.frscope-system.svc:80" in sidecar["args"]
            [trainer] = created["spec"]["containers"]
            env_map = {e["name"]: e.get("value") for e in trainer["env"]}
            assert env_map["TORCH_FR_BUFFER_SIZE"] == "3000"
            assert env_map["TORCH_FR_DUMP_TEMP_FILE"] == "/run/frscope/dumps/nccl_trace_rank_"
            assert env_map["PYTHONPATH"] == "/run/frscope/python:/app"
            assert env_map["FRSCOPE_SOCKET_DIR"] == "/run/frscope"
            assert trainer["terminationMessagePolicy"] == "FallbackToLogsOnError"
            assert any(v["name"] == "frscope" and "emptyDir" in v for v in created["spec"]["volumes"])
            assert created["metadata"]["annotations"]["frscope.io/injected"] == "native-sidecar"
            # Kubernetes identity: the projected tokens, in the sidecar only, as the API server stored them.
            assert "--operator-identity=system:serviceaccount:frscope-system:frscope" in sidecar["args"]
            [tokens] = [v for v in created["spec"]["volumes"] if v["name"] == "frscope-token"]
            audiences = [s["serviceAccountToken"].get("audience") for s in tokens["projected"]["sources"]
                         if "serviceAccountToken" in s]
            assert audiences == ["frscope.io/operator", None]
            assert any(m["name"] == "frscope-token" for m in sidecar["volumeMounts"])
            assert not any(m["name"] == "frscope-token" for m in trainer.get("volumeMounts", []))

            plain = kube.kubectl_json("create", "-f", "-", input=json.dumps(pod("not-opted-in", False)))
            assert "initContainers" not in plain["spec"] and "annotations" not in plain["metadata"]

            # Idempotent: a pod that already carries the sidecar is admitted as it is.
            already = pod("already", True, [{"name": "frscope-sidecar", "image": "registry.invalid/frscope:mine",
                                             "restartPolicy": "Always"}])
            again = kube.kubectl_json("create", "-f", "-", input=json.dumps(already))
            assert [c["name"] for c in again["spec"]["initContainers"]] == ["frscope-sidecar"]
            assert "TORCH_FR_BUFFER_SIZE" not in {e["name"] for e in again["spec"]["containers"][0]["env"]}

        # The operator is gone: pods are still admitted, unchanged (fails open).
        started = time.monotonic()
        down = kube.kubectl_json("create", "-f", "-", input=json.dumps(pod("while-down", True)))
        assert "initContainers" not in down["spec"]
        assert time.monotonic() - started < 30
    finally:
        kube.kubectl("delete", "mutatingwebhookconfiguration", config_name, "--ignore-not-found")


@pytest.mark.timeout(180)
def test_namespace_opt_in_through_the_charts_webhook_entries(kube: ControlPlane, namespace: str,
                                                             operator_kubeconfig: Path, tmp_path: Path) -> None:
    """The chart's own two webhook entries (helm template), pointed at a local operator: in a namespace
    labelled frscope.io/inject=true, PyTorchJob pods and TrainJob/JobSet pods get the sidecar without a
    pod label (and are then labelled, so the PodMonitor scrapes them); a pod labelled =false and a pod
    of no job do not."""
    import base64

    ca = make_serving_cert(tmp_path / "tls")
    port = free_port()
    kube.kubectl("label", "namespace", namespace, "frscope.io/inject=true")
    rendered = subprocess.run(
        [str(kube.bin_dir / "helm"), "template", "e2e", str(ROOT / "charts" / "frscope"),
         "--show-only", "templates/webhook.yaml"],
        check=True, capture_output=True, text=True, timeout=60).stdout
    [config] = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "MutatingWebhookConfiguration"]
    config["metadata"] = {"name": f"frscope-e2e-ns-{namespace}"}
    assert [w["name"] for w in config["webhooks"]] == ["inject.frscope.io", "inject-namespace.frscope.io",
                                                       "inject-namespace-jobset.frscope.io"]
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": base64.b64encode(ca).decode()}
        # Only this test's namespace: other tests' pods never meet this configuration.
        selector = hook.setdefault("namespaceSelector", {})
        selector.setdefault("matchExpressions", []).append(
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [namespace]})

    def pod(name: str, label: str | None, job: bool = True, jobset: bool = False) -> dict[str, Any]:
        labels = {"training.kubeflow.org/job-name": JOB} if job else {"app": "other"}
        if jobset:  # a pod as JobSet's Job makes it for a TrainJob or a JobSet
            labels = {"jobset.sigs.k8s.io/jobset-name": JOB, "jobset.sigs.k8s.io/replicatedjob-name": "node"}
        if label is not None:
            labels["frscope.io/inject"] = label
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
                "spec": {"containers": [{"name": "pytorch", "image": "registry.invalid/train:1"}]}}

    def create(body: dict[str, Any]) -> Any:
        return kube.kubectl_json("create", "-f", "-", input=json.dumps(body))

    kube.apply(config)
    args = ["--webhook-port", str(port), "--webhook-host", "127.0.0.1", "--webhook-cert-dir", str(tmp_path / "tls")]
    try:
        with operator(kube, operator_kubeconfig, tmp_path / "operator.log", args,
                      {"FRSCOPE_SIDECAR_IMAGE": "registry.invalid/frscope:e2e"}) as op:
            def injected_now() -> Any:
                created = create(pod(f"by-namespace-{time.time_ns()}", None))
                return created if created["spec"].get("initContainers") else None

            created = wait_for("a pod injected by namespace", injected_now, 30, interval=1, diagnostics=op.logs)
            assert [c["name"] for c in created["spec"]["initContainers"]] == ["frscope-sidecar"]
            assert created["metadata"]["labels"]["frscope.io/inject"] == "true"
            env = {e["name"]: e.get("value") for e in created["spec"]["containers"][0]["env"]}
            assert env["TORCH_NCCL_ENABLE_TIMING"] == "1"
            # Labelled by hand too: one sidecar, not two.
            both = create(pod("labelled-too", "true"))
            assert [c["name"] for c in both["spec"]["initContainers"]] == ["frscope-sidecar"]
            assert "initContainers" not in create(pod("opted-out", "false"))["spec"]
            # A TrainJob's or JobSet's pod: its own entry (with PyTorchJob's only, no other pod would be sent).
            of_jobset = create(pod("of-a-jobset", None, job=False, jobset=True))
            assert [c["name"] for c in of_jobset["spec"]["initContainers"]] == ["frscope-sidecar"]
            assert "initContainers" not in create(pod("jobset-opted-out", "false", job=False, jobset=True))["spec"]
            assert "initContainers" not in create(pod("not-a-trainer", None, job=False))["spec"]
    finally:
        kube.kubectl("delete", "mutatingwebhookconfiguration", config["metadata"]["name"], "--ignore-not-found")
