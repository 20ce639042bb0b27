"""The action policy (docs/actions.md) against the real API server from testenv: `frscope operator`
as its own process with the chart's RBAC for `actions.allow={restart,stop,cordon}`, real `frscope
sidecar`s beside real torch gloo jobs on loopback (a hang: RankNotJoined; a straggler: a node-pointing
verdict), PyTorchJobs and pods created as objects the way the training operator makes them (there is
no kubelet, scheduler or training operator here: a restart shows as the pods deleted, which is what the
training operator reacts to; a real node cluster can show them coming back).

Each PyTorchJob object (one per namespace or name) points its pods at the same sidecars, so one real
hang serves every policy: restart, stop, dry-run (not allowed, and asked for), none, the rate limit,
exactly one action across an operator killed mid-incident; a straggler serves cordon and a verdict that
is not a hang. Permissions: `kubectl auth can-i` both ways for the chart's default and actions values.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e.test_operator_e2e import (
        ROOT,
        OperatorProcess,
        free_port,
        hung_job_with_sidecars,
        now,
        operator,
        training_conditions,
        wait_for,
    )
except ModuleNotFoundError:
    from test_operator_e2e import (  # type: ignore[no-redef]
        ROOT,
        OperatorProcess,
        free_port,
        hung_job_with_sidecars,
        now,
        operator,
        training_conditions,
        wait_for,
    )

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.torch, pytest.mark.slow]

CRD = ROOT / "charts" / "frscope" / "crds" / "flightrecorderreport.yaml"
ANN = "frscope.io/on-diagnosis"
PODS: dict[str, tuple[int, ...]] = {"master-0": (0, 1), "worker-0": (2, 3)}
GPUS_PER_POD = 2
ACTION_REASONS = {"HungJobRestarted", "HungJobStopped", "SuspectNodeCordoned", "DiagnosisActionDryRun",
                  "DiagnosisActionSkipped", "DiagnosisActionFailed"}
BASE_ARGS = ["--poll-interval", "1", "--stall-after", "1", "--gather-timeout", "30", "--cooldown", "3"]


# -- objects ---------------------------------------------------------------------------------------
def make_job(kube: ControlPlane, namespace: str, name: str, policy: str | None = None,
             restart_policy: str = "OnFailure", labels: dict[str, str] | None = None) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "pytorch", "image": "registry.invalid/train:1"}]}}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if policy is not None:
        meta["annotations"] = {ANN: policy}
    job = kube.apply({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta,
        "spec": {"nprocPerNode": "2", "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": restart_policy, "template": template},
            "Worker": {"replicas": 1, "restartPolicy": restart_policy, "template": template}}},
    })
    set_conditions(kube, namespace, name, training_conditions("Created", "Running"))
    return dict(job)


def set_conditions(kube: ControlPlane, namespace: str, name: str, conditions: list[dict[str, Any]]) -> None:
    for c in conditions:
        c["message"] = c["message"].replace("train", name)
    kube.kubectl("patch", "pytorchjob", name, "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"conditions": conditions}}))


def make_pods(kube: ControlPlane, job: dict[str, Any], ports: dict[str, int],
              nodes: dict[str, str] | None = None) -> None:
    """The job's pods as the training operator makes them, running as a kubelet would report, each
    asking for GPUS_PER_POD GPUs, its sidecar port where the real sidecar of that pod listens."""
    namespace, name, uid = job["metadata"]["namespace"], job["metadata"]["name"], job["metadata"]["uid"]
    for pod, port in ports.items():
        replica, index = pod.split("-")
        spec: dict[str, Any] = {
            "initContainers": [{"name": "frscope-sidecar", "image": "frscope:e2e", "restartPolicy": "Always",
                                "ports": [{"name": "frscope", "containerPort": port}]}],
            "containers": [{"name": "pytorch", "image": "registry.invalid/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(GPUS_PER_POD)}}}],
        }
        if nodes and pod in nodes:
            spec["nodeName"] = nodes[pod]
        kube.apply({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-{pod}", "namespace": namespace,
                         "labels": {"frscope.io/inject": "true", "training.kubeflow.org/job-name": name,
                                    "training.kubeflow.org/replica-type": replica,
                                    "training.kubeflow.org/replica-index": index},
                         "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name,
                                              "uid": uid, "controller": True, "blockOwnerDeletion": True}]},
            "spec": spec,
        })
        status = {"status": {
            "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "startTime": now(),
            "initContainerStatuses": [{"name": "frscope-sidecar", "image": "frscope:e2e", "imageID": "",
                                       "ready": True, "restartCount": 0, "started": True,
                                       "state": {"running": {"startedAt": now()}}}],
            "containerStatuses": [{"name": "pytorch", "image": "registry.invalid/train:1", "imageID": "",
                                   "ready": True, "restartCount": 0, "started": True,
                                   "state": {"running": {"startedAt": now()}}}]}}
        kube.kubectl("patch", "pod", f"{name}-{pod}", "-n", namespace, "--subresource=status", "--type=merge",
                     "-p", json.dumps(status))


def reports(kube: ControlPlane, namespace: str, job: str | None = None) -> list[dict[str, Any]]:
    items = kube.kubectl_json("get", "flightrecorderreports", "-n", namespace)["items"]
    return [r for r in items if (job is None or r["job"]["name"] == job) and not r["job"].get("suspicion")]


def action_of(kube: ControlPlane, namespace: str, job: str) -> dict[str, Any] | None:
    """The job's action record once it has an outcome. A claim still `acting` counts as none: the
    operator writes the claim before it acts, and a test that stopped the operator on seeing the claim
    read "acting" where the stop was done a few ms later (CI, the Kueue stop)."""
    found = [r.get("action") for r in reports(kube, namespace, job) if r.get("action")]
    return found[0] if found and found[0].get("state") != "acting" else None


def events(kube: ControlPlane, namespace: str, reason: str) -> list[dict[str, Any]]:
    return list(kube.kubectl_json("get", "events", "-n", namespace, "--field-selector", f"reason={reason}")["items"])


def job_pods(kube: ControlPlane, namespace: str, job: str) -> list[str]:
    items = kube.kubectl_json("get", "pods", "-n", namespace, "-l", f"training.kubeflow.org/job-name={job}")["items"]
    return sorted(p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp"))


def new_namespace(kube: ControlPlane, annotations: dict[str, str] | None = None) -> str:
    name = f"act-{secrets.token_hex(4)}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "annotations": annotations or {}}})
    wait_for("the default ServiceAccount", lambda: kube.kubectl(
        "get", "serviceaccount", "default", "-n", name, check=False).returncode == 0, 30)
    return name


# -- fixtures --------------------------------------------------------------------------------------
def helm_rules(kube: ControlPlane, home: Path, *sets: str) -> list[dict[str, Any]]:
    """Every rule the chart grants its operator (base ClusterRole and the actions one) for these values."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    args = [str(kube.bin_dir / "helm"), "template", "frs", str(ROOT / "charts" / "frscope"),
            "--namespace", "frscope-system"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    roles = [o for o in yaml.safe_load_all(proc.stdout) if o and o["kind"] == "ClusterRole"
             and o["metadata"]["name"].startswith("frs-frscope-operator")]
    return [rule for role in roles for rule in role["rules"]]


def bind(kube: ControlPlane, namespace: str, sa: str, rules: list[dict[str, Any]]) -> None:
    name = f"{sa}-{namespace}"
    kube.kubectl("create", "serviceaccount", sa, "-n", namespace)
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": name, "labels": {"frscope-e2e": "actions"}}, "rules": rules})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": name, "labels": {"frscope-e2e": "actions"}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]})


@pytest.fixture(scope="module")
def setup(kube: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The report CRD, and a ServiceAccount bound to exactly the chart's rules with every action allowed
    (its kubeconfig), plus one with the chart's defaults (for can-i)."""
    kube.kubectl("apply", "-f", str(CRD))
    wait_for("the report CRD", lambda: any(
        c["type"] == "Established" and c["status"] == "True" for c in kube.kubectl_json(
            "get", "crd", "flightrecorderreports.frscope.io").get("status", {}).get("conditions", [])), 60)
    home = tmp_path_factory.mktemp("helm-home")
    home_ns = new_namespace(kube)
    bind(kube, home_ns, "actions", helm_rules(kube, home, "actions.allow={restart,stop,cordon}"))
    bind(kube, home_ns, "defaults", helm_rules(kube, home))
    token = kube.kubectl("create", "token", "actions", "-n", home_ns, "--duration=2h").stdout.strip()
    kubeconfig = kube.write_token_kubeconfig(tmp_path_factory.mktemp("kc") / "operator.kubeconfig", token,
                                             f"system:serviceaccount:{home_ns}:actions")
    yield {"kubeconfig": kubeconfig, "namespace": home_ns}
    kube.kubectl("delete", "clusterrolebinding,clusterrole", "-l", "frscope-e2e=actions", "--ignore-not-found")
    kube.kubectl("delete", "namespace", home_ns, "--wait=false")


@pytest.fixture(scope="module")
def hang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """One real hung 4-rank gloo job (rank 1 never joins all_reduce #4) and its two pods' sidecars."""
    with hung_job_with_sidecars(tmp_path_factory.mktemp("hang"), PODS) as ports:
        yield ports


# -- permissions -----------------------------------------------------------------------------------
def test_permissions_grow_only_with_the_actions_switched_on(kube: ControlPlane, setup: dict[str, Any]) -> None:
    ns = setup["namespace"]

    def can(sa: str, *what: str) -> bool:
        proc = kube.kubectl("auth", "can-i", *what, f"--as=system:serviceaccount:{ns}:{sa}", check=False)
        return proc.stdout.strip() == "yes"

    for verb in (("delete", "pods", "-n", ns), ("patch", "nodes"), ("get", "namespaces/" + ns)):
        assert can("actions", *verb), verb
        assert not can("defaults", *verb), verb
    # The node ledger (on by default) reads nodes; fencing (nodes patch) is its own opt-in
    # (tests/e2e/test_node_ledger_e2e.py checks the ledger's permissions both ways).
    assert can("defaults", "list", "nodes")
    # Never more than the actions need.
    for verb in (("delete", "nodes"), ("delete", "pytorchjobs", "-n", ns), ("create", "pods", "-n", ns),
                 ("get", "secrets", "-n", ns), ("create", "pods/eviction", "-n", ns)):
        assert not can("actions", *verb), verb
    assert can("actions", "patch", "pytorchjobs", "-n", ns)


# -- each policy on a hung job ---------------------------------------------------------------------
@pytest.mark.timeout(420)
def test_each_policy_on_a_hung_job(kube: ControlPlane, setup: dict[str, Any], hang: dict[str, int],
                                   tmp_path: Path) -> None:
    restart_ns, stop_ns, none_ns, rate_ns = (new_namespace(kube) for _ in range(4))
    dry_ns = new_namespace(kube, {ANN: "dry-run"})
    jobs = {
        (restart_ns, "r"): make_job(kube, restart_ns, "r", "restart"),
        (stop_ns, "s"): make_job(kube, stop_ns, "s", "stop"),
        (stop_ns, "never"): make_job(kube, stop_ns, "never", "restart", restart_policy="Never"),
        (dry_ns, "d"): make_job(kube, dry_ns, "d"),  # the namespace's default: dry-run
        (none_ns, "n"): make_job(kube, none_ns, "n"),  # nothing asked
        (none_ns, "c"): make_job(kube, none_ns, "c", "cordon"),  # allowed, but not allowed here (below)
        (rate_ns, "a"): make_job(kube, rate_ns, "a", "restart"),
        (rate_ns, "b"): make_job(kube, rate_ns, "b", "restart"),
    }
    for job in jobs.values():
        make_pods(kube, job, {f"{p}": port for p, port in hang.items()})
    # One action an hour per namespace; cordon is not allowed (the cordon job gets a dry run).
    args = [*BASE_ARGS, "--allow-actions", "restart,stop", "--action-rate", "1"]
    with operator(kube, setup["kubeconfig"], tmp_path / "operator.log", args) as op:
        def settled() -> bool:
            return all(action_of(kube, ns, name) for ns, name in jobs if name != "n")

        wait_for("every policy's action record", settled, 150, interval=1, diagnostics=op.logs)
        time.sleep(3)  # the no-policy job had every chance to be acted on
        metrics = op.metrics()
    try:
        _check_each_policy(kube, restart_ns, stop_ns, none_ns, rate_ns, dry_ns, metrics)
    except AssertionError:
        sys.stderr.write(f"--- operator log\n{(tmp_path / 'operator.log').read_text()[-8000:]}\n")
        raise


def _check_each_policy(kube: ControlPlane, restart_ns: str, stop_ns: str, none_ns: str, rate_ns: str,
                       dry_ns: str, metrics: str) -> None:

    # restart: every pod of the job deleted (by uid), the Event and the report say what was saved.
    restarted = action_of(kube, restart_ns, "r")
    assert restarted is not None and (restarted["action"], restarted["state"]) == ("restart", "done"), restarted
    assert sorted(t.split("/")[1] for t in restarted["targets"]) == ["r-master-0", "r-worker-0"]
    assert job_pods(kube, restart_ns, "r") == []
    [event] = events(kube, restart_ns, "HungJobRestarted")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "r"
    assert "RankNotJoined" in event["message"] and "GPU-seconds saved (4 GPUs x" in event["message"], event
    [report] = reports(kube, restart_ns, "r")
    impact = report["impact"]
    assert impact["gpus"] == 2 * GPUS_PER_POD and impact["ranks"] == 4 and impact["watchdogTimeoutSeconds"] > 0
    assert impact["culpritPods"] == ["r-master-0"]  # rank 1 runs in the master pod
    assert 0 < restarted["savedSeconds"] <= impact["watchdogTimeoutSeconds"]
    assert restarted["savedGpuSeconds"] == pytest.approx(restarted["savedSeconds"] * 4, abs=1)
    table = kube.kubectl("get", "frr", report["metadata"]["name"], "-n", restart_ns, "-o", "wide").stdout.splitlines()
    header = table[0].split()
    assert table[1].split()[header.index("ACTION")] == "restart", table

    # stop: runPolicy.suspend with the verdict beside it; the pods are the training operator's to delete.
    stopped = action_of(kube, stop_ns, "s")
    assert stopped is not None and (stopped["action"], stopped["state"]) == ("stop", "done"), stopped
    job = kube.kubectl_json("get", "pytorchjob", "s", "-n", stop_ns)
    assert job["spec"]["runPolicy"]["suspend"] is True
    assert job["metadata"]["annotations"]["frscope.io/stopped-by-diagnosis"].startswith("RankNotJoined: Rank 1")
    assert len(events(kube, stop_ns, "HungJobStopped")) == 1
    # restartPolicy Never: deleting the pods would fail the job, so it is not restarted.
    never = action_of(kube, stop_ns, "never")
    assert never is not None and never["state"] == "skipped" and "restartPolicy Never" in never["message"]
    assert job_pods(kube, stop_ns, "never") == ["never-master-0", "never-worker-0"]

    # dry-run (the namespace's default): an Event saying what would be done; nothing changed.
    dry = action_of(kube, dry_ns, "d")
    assert dry is not None and dry["state"] == "dry-run" and dry["source"] == "namespace annotation", dry
    [event] = events(kube, dry_ns, "DiagnosisActionDryRun")
    assert event["type"] == "Normal" and event["message"].startswith("Dry run: would restart the job;"), event
    assert "GPU-seconds would be saved" in event["message"]
    assert job_pods(kube, dry_ns, "d") == ["d-master-0", "d-worker-0"]
    # cordon asked but not allowed (and RankNotJoined does not point at a node): nothing done.
    cordon = action_of(kube, none_ns, "c")
    assert cordon is not None and cordon["state"] == "skipped" and "does not point at a node" in cordon["why"]
    # none: no action record, no action Event.
    assert action_of(kube, none_ns, "n") is None
    assert not [e for e in kube.kubectl_json("get", "events", "-n", none_ns)["items"]
                if e["involvedObject"]["name"] == "n" and e["reason"] in ACTION_REASONS]
    assert job_pods(kube, none_ns, "n") == ["n-master-0", "n-worker-0"]

    # The rate limit: one action an hour in rate_ns; the second job's restart is refused and says why.
    both = [action_of(kube, rate_ns, name) for name in ("a", "b")]
    assert sorted(str(a and a["state"]) for a in both) == ["done", "skipped"], both
    [limited] = [a for a in both if a and a["state"] == "skipped"]
    assert "rate limit: 1 action(s) in namespace" in limited["message"]
    assert len(events(kube, rate_ns, "DiagnosisActionSkipped")) == 1

    assert 'frscope_operator_actions_total{action="restart",outcome="done"} 2.0' in metrics
    assert 'frscope_operator_actions_total{action="stop",outcome="done"} 1.0' in metrics
    assert 'frscope_operator_actions_total{action="dry-run",outcome="done"} 1.0' in metrics
    saved = [ln for ln in metrics.splitlines() if ln.startswith('frscope_operator_action_saved_gpu_seconds_total'
                                                                '{action="restart"}')]
    assert saved and float(saved[0].split()[-1]) > 0, saved


# -- once, across an operator killed mid-incident ---------------------------------------------------
@pytest.mark.timeout(300)
def test_exactly_one_action_after_an_operator_restart_mid_incident(kube: ControlPlane, setup: dict[str, Any],
                                                                   hang: dict[str, int], tmp_path: Path) -> None:
    ns = new_namespace(kube)
    job = make_job(kube, ns, "k", "restart")
    make_pods(kube, job, dict(hang))
    args = [*BASE_ARGS, "--allow-actions", "restart"]
    first = OperatorProcess(kube, setup["kubeconfig"], tmp_path / "operator-1.log", args)
    try:
        first.wait_ready()
        # Killed (no shutdown) as soon as the evidence exists: before, during or after acting on it.
        wait_for("the report", lambda: reports(kube, ns, "k"), 90, interval=0.1, diagnostics=first.logs)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
    finally:
        first.stop()
    for n in (2, 3):
        with operator(kube, setup["kubeconfig"], tmp_path / f"operator-{n}.log", args) as op:
            done = wait_for("the action done", lambda: (a := action_of(kube, ns, "k")) and a["state"] == "done"
                            and a, 90, interval=1, diagnostics=op.logs)
            time.sleep(4)  # sweeps and signals keep coming: none may act again
    assert done["action"] == "restart" and job_pods(kube, ns, "k") == []
    assert len(reports(kube, ns, "k")) == 1
    [event] = events(kube, ns, "HungJobRestarted")
    assert event["count"] == 1
    assert action_of(kube, ns, "k") == done  # the record was not rewritten


# -- cordon ----------------------------------------------------------------------------------------
def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@contextmanager
def settled_job_with_sidecars(fault: str, base: Path, settle_s: float) -> Iterator[dict[str, int]]:
    """A real 4-rank gloo job with `fault` that ends with every rank alive and idle (frscope/demo), and
    one real sidecar per pod of PODS. Everything is ended by PID on exit."""
    from frscope.demo.launcher import start_job

    with start_job(fault, 4, lifetime_s=300) as job:
        job.wait_for_sockets(time.monotonic() + 90)
        time.sleep(settle_s)  # the fault's steps run, then every rank idles
        procs: list[subprocess.Popen[bytes]] = []
        ports: dict[str, int] = {}
        try:
            for pod, ranks in PODS.items():
                directory = base / pod
                directory.mkdir(parents=True)
                for rank in ranks:
                    (directory / f"rank-{rank}.sock").symlink_to(job.socket_path(rank))
                port = free_port()
                with open(directory / "sidecar.log", "wb") as log:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(directory),
                         "--evidence-dir", "none", "--host", "127.0.0.1", "--port", str(port),
                         "--poll-interval", "1", "--pod", pod, "--namespace", "ml"],
                        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
                ports[pod] = port
            for port in ports.values():
                wait_for("a sidecar", lambda p=port: _answers(f"http://127.0.0.1:{p}/healthz"), 60)
            yield ports
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def straggler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """Rank 2 is late to every all_reduce for 20 steps (a Straggler verdict), then every rank idles."""
    with settled_job_with_sidecars("straggler", tmp_path_factory.mktemp("straggler"), 6) as ports:
        yield ports


@pytest.mark.timeout(240)
def test_no_action_on_a_healthy_job(kube: ControlPlane, setup: dict[str, Any], tmp_path: Path) -> None:
    ns = new_namespace(kube, {ANN: "restart"})
    with settled_job_with_sidecars("none", tmp_path / "pods", 3) as ports:
        job = make_job(kube, ns, "h", "restart")
        make_pods(kube, job, ports)
        with operator(kube, setup["kubeconfig"], tmp_path / "operator.log",
                      [*BASE_ARGS, "--allow-actions", "restart,stop,cordon"]) as op:
            # The training operator reports a restart: the operator gathers every rank and finds nothing.
            set_conditions(kube, ns, "h", training_conditions("Created", "Running", "Restarting"))
            wait_for("the gather", lambda: f"job {ns}/h: JobRestarting: no problem found in 4 ranks" in op.logs(),
                     90, interval=1, diagnostics=op.logs)
            time.sleep(3)
    assert reports(kube, ns) == []
    assert job_pods(kube, ns, "h") == ["h-master-0", "h-worker-0"]
    assert [e["reason"] for e in kube.kubectl_json("get", "events", "-n", ns)["items"]] == []


@pytest.mark.timeout(360)
def test_cordon_needs_two_jobs_and_stays_within_the_budget(kube: ControlPlane, setup: dict[str, Any],
                                                           straggler: dict[str, int], tmp_path: Path) -> None:
    suffix = secrets.token_hex(3)
    nodes = [f"gpu-a-{suffix}", f"gpu-b-{suffix}", f"ok-{suffix}"]
    for node in nodes:
        kube.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        # Rank 2 (the straggler) runs in worker-0: jobs 1 and 2 put it on gpu-a, jobs 3 and 4 on gpu-b.
        placement = {"1": nodes[0], "2": nodes[0], "3": nodes[1], "4": nodes[1]}
        namespaces: dict[str, str] = {}
        args = [*BASE_ARGS, "--allow-actions", "cordon", "--cordon-min-jobs", "2", "--cordon-max-nodes", "1"]
        with operator(kube, setup["kubeconfig"], tmp_path / "operator.log", args) as op:
            for pair in (("1", "2"), ("3", "4")):  # the second pair only once the first node is cordoned
                for n in pair:
                    ns = namespaces[n] = new_namespace(kube)
                    job = make_job(kube, ns, f"j{n}", "cordon")
                    make_pods(kube, job, dict(straggler), nodes={"worker-0": placement[n], "master-0": nodes[2]})
                for n in pair:
                    # The training operator reports a restart: the operator gathers and finds the straggler.
                    restarting = training_conditions("Created", "Running", "Restarting")
                    set_conditions(kube, namespaces[n], f"j{n}", restarting)
                for n in pair:
                    wait_for(f"job {n}'s action record", lambda n=n: action_of(kube, namespaces[n], f"j{n}"), 90,
                             interval=1, diagnostics=op.logs)
        records = {n: action_of(kube, ns, f"j{n}") or {} for n, ns in namespaces.items()}
        # Whichever of a pair decided last saw both reports: one cordon for gpu-a; gpu-b is over the budget.
        assert sorted(str(records[n].get("state")) for n in ("1", "2")) == ["done", "skipped"], records
        [cordoned] = [r for n, r in records.items() if r.get("state") == "done"]
        assert cordoned["targets"] == [f"node/{nodes[0]}"] and cordoned["action"] == "cordon"
        assert [records[n].get("state") for n in ("3", "4")] == ["skipped", "skipped"], records
        assert any("budget --cordon-max-nodes=1" in records[n]["message"] for n in ("3", "4")), records
        [first_skip] = [r for n, r in records.items() if n in ("1", "2") and r.get("state") == "skipped"]
        assert (f"({nodes[0]}: 1); 2 needed" in first_skip["message"]
                or "or already cordoned" in first_skip["message"]), first_skip

        def taints(node: str) -> list[dict[str, Any]]:
            return [t for t in kube.kubectl_json("get", "node", node)["spec"].get("taints", [])
                    if t["key"] == "frscope.io/suspect-node"]

        assert [(t["effect"], t["value"]) for t in taints(nodes[0])] == [("NoSchedule", "Straggler")]
        assert taints(nodes[1]) == [] and taints(nodes[2]) == []
        node_events = [e for e in kube.kubectl_json("get", "events", "-n", "default")["items"]
                       if e["involvedObject"].get("name") == nodes[0]
                       and e.get("source", {}).get("component") == "frscope-operator"]
        assert [e["reason"] for e in node_events] == ["SuspectNodeCordoned"]
        assert "Straggler" in node_events[0]["message"] and any(
            f"{namespaces[n]}/j{n}" in node_events[0]["message"] for n in ("1", "2")), node_events
    finally:
        kube.kubectl("delete", "node", *nodes, "--ignore-not-found")
