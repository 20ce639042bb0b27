"""Acting on a hung TrainJob, a bare JobSet and a Kueue-queued JobSet (docs/actions.md) against the real
API server from testenv, with the real controllers doing what frscope relies on them to do:

- the JobSet controller (testenv/build-controllers, out of cluster as in test_trainjob_e2e.py; v0.12.0,
  and v0.11.0 with its own CRD: the test of each action is parametrized) and kube-controller-manager's
  Job controller make the pods, remake deleted ones (a Job within its backoffLimit), restart a JobSet
  whose Job failed (its failurePolicy), and delete the pods of a suspended JobSet;
- the Kueue controller manager v0.17.0 (testenv/build-kueue) admits a queued JobSet through its
  Workload, and evicts and suspends it when frscope sets the Workload's spec.active to false.

What stands in for components that do not run here, and why:
- There is no kubelet: the test patches each pod's status (Running, a loopback IP: 127.0.0.1 for the
  completion index 0, 127.0.0.2 for 1) as test_trainjob_e2e.py does; the ranks are a real 4-rank gloo
  job that hangs, with one real `frscope sidecar` per pod listening on that pod's address.
- The Trainer controller does not run in this module (it does on the node, where
  tests/node/test_trainjob_actions.py restarts and stops a TrainJob, and out of cluster in
  test_jobset_versions_e2e.py, which does the same over each JobSet release): a TrainJob's JobSet is created by
  the test the way Trainer v2.3.0 builds it (owned by the TrainJob; one replicated job `node` of parallelism
  numNodes; no failurePolicy), and a stopped TrainJob shows as its `spec.suspend`, which Trainer copies
  to its JobSet (runtime/framework/plugins/jobset, read for this; not run).
- No webhook of JobSet (outside the namespaces test_jobset_versions_e2e.py labels) or Kueue is
  registered with the API server, so objects are created with what
  their defaulting webhooks would add (JobSet: successPolicy, startupPolicy, network; Kueue: a queued
  JobSet starts suspended).
- Kueue runs in a private mount namespace (unshare) whose /etc is an overlay: Kueue v0.17.0 without its
  internal certificate management reads its metrics certificate from the fixed path
  /etc/kueue/metrics/certs, where the test puts a throwaway one without touching the machine's /etc.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.e2e import jobset_versions
from tests.e2e.test_actions_e2e import ANN, action_of, bind, events, helm_rules, new_namespace, reports
from tests.e2e.test_operator_e2e import (  # noqa: F401  (fixtures used by name)
    ROOT,
    free_port,
    hung_job_with_sidecars,
    now,
    operator,
    report_crd,
    wait_for,
)
from tests.e2e.test_trainjob_e2e import jobset_controller, kinds_crds  # noqa: F401  (fixtures used by name)

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.torch, pytest.mark.slow]

PODS = {"p0": (0, 1), "p1": (2, 3)}
HOSTS = {"p0": "127.0.0.1", "p1": "127.0.0.2"}  # the pod of completion index i gets HOSTS[f"p{i}"]
GPUS_PER_POD = 2
ARGS = ["--poll-interval", "1", "--stall-after", "1", "--gather-timeout", "30", "--cooldown", "3"]
KUEUE_WORKLOADS = "workloads.kueue.x-k8s.io"
# Each JobSet release tested (tests/e2e/jobset_versions.py): v0.12.0, the one Trainer v2.3.0 requires, and
# v0.11.0 (its CRD and controller), for `indirect` parametrization of the jobset_controller fixture.
JOBSETS = [pytest.param(v, id=f"jobset-{v}") for v in jobset_versions.releases()]


# -- objects ---------------------------------------------------------------------------------------
def pod_template(port: int, *, cpu_only: bool = False) -> dict[str, Any]:
    """Trainer's torch pod (container `node`, torchrun's env), opted in, with frscope's sidecar as injected."""
    resources = {"requests": {"cpu": "100m"}} if cpu_only else {"limits": {"nvidia.com/gpu": str(GPUS_PER_POD)}}
    return {"metadata": {"labels": {"frscope.io/inject": "true"}}, "spec": {
        "restartPolicy": "Never",
        "initContainers": [{"name": "frscope-sidecar", "image": "frscope:e2e", "restartPolicy": "Always",
                            "ports": [{"name": "frscope", "containerPort": port}]}],
        "containers": [{"name": "node", "image": "registry.invalid/train:1", "resources": resources,
                        "env": [{"name": "PET_NNODES", "value": "2"}, {"name": "PET_NPROC_PER_NODE", "value": "2"}]}],
    }}


def jobset_body(namespace: str, name: str, port: int, *, job_spec: dict[str, Any] | None = None,
                failure_policy: dict[str, Any] | None = None, annotations: dict[str, str] | None = None,
                labels: dict[str, str] | None = None, owner: dict[str, Any] | None = None,
                suspend: bool = False, cpu_only: bool = False) -> dict[str, Any]:
    """A JobSet the way Trainer v2.3.0 builds one for numNodes=2 (one replicated job `node`, one Job of
    parallelism 2), with what JobSet's defaulting webhook would add."""
    spec: dict[str, Any] = {
        "successPolicy": {"operator": "All"}, "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {
            "parallelism": 2, "completions": 2, "completionMode": "Indexed", **(job_spec or {}),
            "template": pod_template(port, cpu_only=cpu_only)}}}],
    }
    if failure_policy is not None:
        spec["failurePolicy"] = failure_policy
    if suspend:
        spec["suspend"] = True
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": annotations or {},
                            "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": meta, "spec": spec}


def trainjob(kube: ControlPlane, namespace: str, name: str, port: int, policy: str | None) -> dict[str, Any]:
    """A TrainJob and the JobSet Trainer would build for it (owned by it, same name)."""
    annotations = {ANN: policy} if policy else {}
    job = kube.apply({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime",
                                "apiGroup": "trainer.kubeflow.org"},
                 "trainer": {"numNodes": 2, "image": "registry.invalid/train:1"}},
    })
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": name,
             "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    kube.apply(jobset_body(namespace, name, port, owner=owner))
    return dict(job)


def live_pods(kube: ControlPlane, namespace: str, jobset: str) -> list[dict[str, Any]]:
    items = kube.kubectl_json("get", "pods", "-n", namespace, "-l", f"jobset.sigs.k8s.io/jobset-name={jobset}")["items"]
    return sorted((p for p in items if not p["metadata"].get("deletionTimestamp")),
                  key=lambda p: p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index", ""))


def wait_for_pods(kube: ControlPlane, namespace: str, jobset: str, count: int = 2,
                  not_uids: set[str] | None = None, timeout: float = 120) -> list[dict[str, Any]]:
    def made() -> list[dict[str, Any]] | None:
        pods = [p for p in live_pods(kube, namespace, jobset) if p["metadata"]["uid"] not in (not_uids or set())]
        return pods if len(pods) == count else None

    return list(wait_for(f"{count} pods of {namespace}/{jobset} from the Job controller", made, timeout))


def run_pods(kube: ControlPlane, pods: list[dict[str, Any]]) -> None:
    """The kubelet's part: Running, the pod's address (by completion index), containers started."""
    for pod in pods:
        index = pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
        ip = HOSTS[f"p{index}"]
        running = {"running": {"startedAt": now()}}
        status = {"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ip, "startTime": now(),
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now()}],
            "initContainerStatuses": [{"name": "frscope-sidecar", "image": "frscope:e2e", "imageID": "",
                                       "ready": True, "restartCount": 0, "started": True, "state": running}],
            "containerStatuses": [{"name": "node", "image": "registry.invalid/train:1", "imageID": "",
                                   "ready": True, "restartCount": 0, "started": True, "state": running}],
        }}
        kube.kubectl("patch", "pod", pod["metadata"]["name"], "-n", pod["metadata"]["namespace"],
                     "--subresource=status", "--type=merge", "-p", json.dumps(status))


def uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), None)


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kueue_crds(kube: ControlPlane) -> Path:
    """Kueue's CRDs (Workload, ClusterQueue, LocalQueue, ...) from its Go module (testenv/build-kueue)."""
    proc = subprocess.run([str(ROOT / "testenv" / "build-kueue"), "--manifests"], capture_output=True, text=True,
                          timeout=300, check=False)
    if proc.returncode == 3:
        pytest.skip(f"Go is not installed: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    directory = Path(proc.stdout.strip().splitlines()[-1])
    for crd in sorted(directory.glob("kueue.x-k8s.io_*.yaml")):
        kube.kubectl("apply", "--server-side", "--field-manager=frscope-testenv", "-f", str(crd))
    def established(plural: str) -> bool:
        crd = kube.kubectl_json("get", "crd", f"{plural}.kueue.x-k8s.io")
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in crd.get("status", {}).get("conditions") or [])

    wait_for("the Kueue CRDs established",
             lambda: all(established(p) for p in ("workloads", "clusterqueues", "localqueues", "resourceflavors")), 60)
    return directory


@pytest.fixture(scope="module")
def accounts(kube: ControlPlane, report_crd: str, kinds_crds: Path, kueue_crds: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """ServiceAccounts bound to exactly the chart's rules for some values; the kubeconfig of the one
    with restart and stop allowed (the operator's)."""
    home = tmp_path_factory.mktemp("helm-home")
    ns = new_namespace(kube)
    values = {
        "act": ["actions.allow={restart,stop}"],
        "restart": ["actions.allow={restart}", "operator.jobKinds.jobset=false"],
        "stop": ["actions.allow={stop}", "operator.jobKinds.jobset=false", "operator.jobKinds.pytorchjob=false"],
        "defaults": [],
    }
    for sa, sets in values.items():
        bind(kube, ns, sa, helm_rules(kube, home, *sets))
    token = kube.kubectl("create", "token", "act", "-n", ns, "--duration=2h").stdout.strip()
    kubeconfig = kube.write_token_kubeconfig(tmp_path_factory.mktemp("kc") / "operator.kubeconfig", token,
                                             f"system:serviceaccount:{ns}:act")
    yield {"kubeconfig": kubeconfig, "namespace": ns}
    kube.kubectl("delete", "clusterrolebinding,clusterrole", "-l", "frscope-e2e=actions", "--ignore-not-found")
    kube.kubectl("delete", "namespace", ns, "--wait=false")


@pytest.fixture(scope="module")
def kueue_controller(kube: ControlPlane, kinds_crds: Path, kueue_crds: Path,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """The real Kueue controller manager v0.17.0 out of cluster, with only its JobSet integration on.
    Its webhooks serve on loopback but are not registered; leader election off; the visibility API
    server (an aggregated API) off."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed: Kueue needs its fixed metrics certificate path")
    proc = subprocess.run([str(ROOT / "testenv" / "build-kueue")], capture_output=True, text=True,
                          timeout=3600, check=False)
    if proc.returncode == 3:
        pytest.skip(f"Go is not installed: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    binary = Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "kueue"
    work = tmp_path_factory.mktemp("kueue")
    certs = work / "upper" / "kueue" / "metrics" / "certs"
    certs.mkdir(parents=True)
    (work / "overlay-work").mkdir()
    for directory in (work, certs):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        str(directory / "tls.key"), "-out", str(directory / "tls.crt"), "-days", "1",
                        "-subj", "/CN=127.0.0.1"], check=True, capture_output=True, timeout=60)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}})
    config = {"apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": "kueue-system",
              "internalCertManagement": {"enable": False},
              "webhook": {"port": free_port(), "host": "127.0.0.1", "certDir": str(work)},
              "metrics": {"bindAddress": "0"},
              "health": {"healthProbeBindAddress": f"127.0.0.1:{free_port()}"},
              "leaderElection": {"leaderElect": False},
              "integrations": {"frameworks": ["jobset.x-k8s.io/jobset"]}}
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    # /etc seen by Kueue only: an overlay whose upper layer holds kueue/metrics/certs; gone with the process.
    script = ('mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1/upper,workdir=$1/overlay-work" /etc '
              '&& exec "$2" --config "$1/config.yaml" --feature-gates=VisibilityOnDemand=false')
    log = open(work / "kueue.log", "wb")  # closed below
    controller = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                                   str(work), str(binary)],
                                  env={**kube.env(), "KUBECONFIG": str(kube.kubeconfig)},
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield controller
    finally:
        controller.terminate()
        try:
            controller.wait(timeout=20)
        except subprocess.TimeoutExpired:
            controller.kill()
            controller.wait(timeout=10)
        log.close()


# -- permissions -----------------------------------------------------------------------------------
def test_permissions_grow_with_the_actions_and_the_kinds_switched_on(kube: ControlPlane,
                                                                      accounts: dict[str, Any]) -> None:
    ns = accounts["namespace"]

    def can(sa: str, *what: str) -> bool:
        proc = kube.kubectl("auth", "can-i", *what, "-n", ns, f"--as=system:serviceaccount:{ns}:{sa}", check=False)
        return proc.stdout.strip() == "yes"

    stop = [("patch", "trainjobs.trainer.kubeflow.org"), ("patch", "jobsets.jobset.x-k8s.io"),
            ("list", KUEUE_WORKLOADS), ("patch", KUEUE_WORKLOADS)]
    for verb in stop:
        assert can("act", *verb), verb
        assert not can("defaults", *verb), verb
        assert not can("restart", *verb), verb  # restart alone writes no job and no Workload
    # stop with only the trainjob kind on: the TrainJob and Workloads, not a kind that is off.
    assert can("stop", "patch", "trainjobs.trainer.kubeflow.org") and can("stop", "patch", KUEUE_WORKLOADS)
    assert not can("stop", "patch", "jobsets.jobset.x-k8s.io") and not can("stop", "patch", "pytorchjobs")
    # restart of a TrainJob reads the JobSet it owns, even with the jobset kind off (get, not list/watch).
    assert can("restart", "get", "jobsets.jobset.x-k8s.io") and not can("restart", "list", "jobsets.jobset.x-k8s.io")
    assert not can("defaults", "delete", "pods")
    # Never more than the actions need.
    for verb in (("delete", "trainjobs.trainer.kubeflow.org"), ("delete", "jobsets.jobset.x-k8s.io"),
                 ("update", "jobsets.jobset.x-k8s.io"), ("delete", KUEUE_WORKLOADS), ("create", KUEUE_WORKLOADS),
                 ("update", KUEUE_WORKLOADS), ("patch", KUEUE_WORKLOADS, "--subresource=status"),
                 ("delete", "jobs.batch"), ("patch", "clusterqueues.kueue.x-k8s.io")):
        assert not can("act", *verb), verb


# -- each action on a hung TrainJob and JobSet -----------------------------------------------------
@pytest.mark.controllers
@pytest.mark.timeout(3900)  # a cold build of the controllers, once
@pytest.mark.parametrize("jobset_controller", JOBSETS, indirect=True)
def test_each_action_on_a_hung_trainjob_and_jobset(kube: ControlPlane, accounts: dict[str, Any],
                                                   jobset_controller: subprocess.Popen[bytes],
                                                   tmp_path: Path) -> None:
    port = free_port()
    ns = {name: new_namespace(kube) for name in ("js-restart", "js-refused", "js-stop", "tj-restart", "tj-stop")}
    ns["tj-dry"] = new_namespace(kube, {ANN: "dry-run"})
    # A bare JobSet whose Jobs fail when their pods go (backoffLimit 0): its failurePolicy restarts it.
    kube.apply(jobset_body(ns["js-restart"], "js", port, job_spec={"backoffLimit": 0},
                           failure_policy={"maxRestarts": 1}, annotations={ANN: "restart"}))
    # The same without a failurePolicy: a restart would fail it, so frscope does not restart it.
    kube.apply(jobset_body(ns["js-refused"], "js", port, job_spec={"backoffLimit": 0}, annotations={ANN: "restart"}))
    kube.apply(jobset_body(ns["js-stop"], "js", port, annotations={ANN: "stop"}))
    trainjobs = {key: trainjob(kube, ns[key], "tj", port, policy)
                 for key, policy in (("tj-restart", "restart"), ("tj-stop", "stop"), ("tj-dry", None))}
    first = {key: wait_for_pods(kube, namespace, "tj" if key.startswith("tj") else "js")
             for key, namespace in ns.items()}
    for pods in first.values():
        run_pods(kube, pods)

    def job(resource: str, key: str, name: str) -> dict[str, Any]:
        return dict(kube.kubectl_json("get", resource, name, "-n", ns[key]))

    with hung_job_with_sidecars(tmp_path / "pods", PODS, hosts=HOSTS, port=port), \
            operator(kube, accounts["kubeconfig"], tmp_path / "operator.log",
                     [*ARGS, "--allow-actions", "restart,stop"]) as op:
        wait_for("every job's action record", lambda: all(
            action_of(kube, namespace, "tj" if key.startswith("tj") else "js") for key, namespace in ns.items()),
            180, interval=1, diagnostics=op.logs)
        # What the controllers make of it.
        js_restarted = wait_for_pods(kube, ns["js-restart"], "js", not_uids=uids(first["js-restart"]))
        tj_restarted = wait_for_pods(kube, ns["tj-restart"], "tj", not_uids=uids(first["tj-restart"]))
        wait_for("the stopped JobSet's pods deleted", lambda: not live_pods(kube, ns["js-stop"], "js"), 90)
        wait_for("the JobSet's Suspended condition", lambda: (
            c := condition(job("jobset", "js-stop", "js"), "Suspended")) and c["status"] == "True", 60)
        time.sleep(3)

    # Bare JobSet, restart: every pod deleted; its Jobs failed, its failurePolicy restarted it (attempt 1).
    record = action_of(kube, ns["js-restart"], "js")
    assert record is not None and (record["action"], record["state"]) == ("restart", "done"), record
    assert sorted(t.split("/")[2] for t in record["targets"]) == sorted(uids(first["js-restart"]))
    jobset = job("jobset", "js-restart", "js")
    assert jobset["status"]["restarts"] == 1 and condition(jobset, "Failed") is None, jobset["status"]
    assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in js_restarted} == {"1"}
    [event] = events(kube, ns["js-restart"], "HungJobRestarted")
    assert event["involvedObject"]["kind"] == "JobSet" and "4 GPUs x" in event["message"], event
    assert "for the JobSet and Job controllers to recreate" in event["message"]

    # Bare JobSet without a failurePolicy: not restarted, and the record says why; its pods are untouched.
    refused = action_of(kube, ns["js-refused"], "js")
    assert refused is not None and refused["state"] == "skipped", refused
    assert "has no failurePolicy: the JobSet would fail instead of restarting" in refused["message"]
    assert uids(live_pods(kube, ns["js-refused"], "js")) == uids(first["js-refused"])

    # Bare JobSet, stop: spec.suspend; the JobSet controller suspended its Jobs, whose pods went.
    stopped = action_of(kube, ns["js-stop"], "js")
    assert stopped is not None and (stopped["action"], stopped["state"]) == ("stop", "done"), stopped
    jobset = job("jobset", "js-stop", "js")
    assert jobset["spec"]["suspend"] is True
    assert jobset["metadata"]["annotations"]["frscope.io/stopped-by-diagnosis"].startswith("RankNotJoined: Rank 1")
    assert len(events(kube, ns["js-stop"], "HungJobStopped")) == 1

    # TrainJob, restart: the pods of the JobSet it owns deleted; the Job controller made new ones
    # (within the Job's default backoffLimit: no JobSet restart needed).
    record = action_of(kube, ns["tj-restart"], "tj")
    assert record is not None and (record["action"], record["state"]) == ("restart", "done"), record
    assert len(tj_restarted) == 2 and job("jobset", "tj-restart", "tj")["status"].get("restarts", 0) == 0
    [event] = events(kube, ns["tj-restart"], "HungJobRestarted")
    assert event["involvedObject"]["kind"] == "TrainJob"
    assert event["involvedObject"]["uid"] == trainjobs["tj-restart"]["metadata"]["uid"]

    # TrainJob, stop: its spec.suspend (Trainer, not running here, copies it to the JobSet).
    stopped = action_of(kube, ns["tj-stop"], "tj")
    assert stopped is not None and (stopped["action"], stopped["state"]) == ("stop", "done"), stopped
    train = job("trainjob", "tj-stop", "tj")
    assert train["spec"]["suspend"] is True
    assert train["metadata"]["annotations"]["frscope.io/stopped-by-diagnosis"].startswith("RankNotJoined")
    assert "spec.suspend: true" in stopped["message"]

    # TrainJob in a namespace whose default is dry-run: an Event saying what would be done, nothing done.
    dry = action_of(kube, ns["tj-dry"], "tj")
    assert dry is not None and dry["state"] == "dry-run" and dry["source"] == "namespace annotation", dry
    [event] = events(kube, ns["tj-dry"], "DiagnosisActionDryRun")
    assert event["type"] == "Normal" and event["involvedObject"]["kind"] == "TrainJob"
    assert event["message"].startswith("Dry run: would restart the job;") and "would be saved" in event["message"]
    assert uids(live_pods(kube, ns["tj-dry"], "tj")) == uids(first["tj-dry"])
    assert len(reports(kube, ns["tj-dry"], "tj")) == 1


# -- Kueue -----------------------------------------------------------------------------------------
@pytest.mark.controllers
@pytest.mark.timeout(3900)  # a cold build of Kueue, once
def test_a_kueue_queued_jobset_is_stopped_through_its_workload(kube: ControlPlane, accounts: dict[str, Any],
                                                               jobset_controller: subprocess.Popen[bytes],
                                                               kueue_controller: subprocess.Popen[bytes],
                                                               tmp_path: Path) -> None:
    port = free_port()
    ns = new_namespace(kube)
    suffix = ns.removeprefix("act-")
    kube.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": f"rf-{suffix}"}})
    kube.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": f"cq-{suffix}"},
                "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                    {"name": f"rf-{suffix}", "resources": [{"name": "cpu", "nominalQuota": "4"}]}]}]}})
    kube.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": "team", "namespace": ns}, "spec": {"clusterQueue": f"cq-{suffix}"}})
    # Queued: created suspended, as Kueue's webhook would make it; Kueue admits it and un-suspends it.
    jobset = kube.apply(jobset_body(ns, "js", port, annotations={ANN: "stop"},
                                    labels={"kueue.x-k8s.io/queue-name": "team"}, suspend=True, cpu_only=True))

    def workload() -> dict[str, Any] | None:
        items = kube.kubectl_json("get", KUEUE_WORKLOADS, "-n", ns)["items"]
        uid = jobset["metadata"]["uid"]
        mine = [w for w in items if any(o["uid"] == uid for o in w["metadata"].get("ownerReferences", []))]
        return mine[0] if mine else None

    def diagnostics() -> str:
        return f"kueue exit code {kueue_controller.poll()}"

    wait_for("the Workload admitted", lambda: (w := workload()) and (c := condition(w, "Admitted"))
             and c["status"] == "True", 120, diagnostics=diagnostics)
    wait_for("the JobSet un-suspended by Kueue", lambda: kube.kubectl_json(
        "get", "jobset", "js", "-n", ns)["spec"].get("suspend") is False, 60, diagnostics=diagnostics)
    run_pods(kube, wait_for_pods(kube, ns, "js"))

    with hung_job_with_sidecars(tmp_path / "pods", PODS, hosts=HOSTS, port=port), \
            operator(kube, accounts["kubeconfig"], tmp_path / "operator.log",
                     [*ARGS, "--allow-actions", "stop"]) as op:
        record = wait_for("the action record", lambda: action_of(kube, ns, "js"), 120, interval=1,
                          diagnostics=op.logs)
    assert (record["action"], record["state"]) == ("stop", "done"), record
    wl = workload()
    assert wl is not None and record["targets"] == [f"workload/{wl['metadata']['name']}", "job/js"]
    assert wl["spec"]["active"] is False
    assert "the Kueue way" in record["message"]
    # Kueue evicts the deactivated Workload and suspends the JobSet; the JobSet controller ends its pods.
    wait_for("the Workload evicted", lambda: (c := condition(workload() or {}, "Evicted")) and c["status"] == "True"
             and c["reason"] == "Deactivated", 60, diagnostics=diagnostics)
    wait_for("the JobSet suspended by Kueue", lambda: kube.kubectl_json(
        "get", "jobset", "js", "-n", ns)["spec"].get("suspend") is True, 60, diagnostics=diagnostics)
    wait_for("the pods gone", lambda: not live_pods(kube, ns, "js"), 90)
    time.sleep(5)  # and it stays so: a deactivated Workload is not admitted again
    after = workload() or {}
    assert (condition(after, "Admitted") or {}).get("status") != "True", after.get("status")
    assert kube.kubectl_json("get", "jobset", "js", "-n", ns)["spec"]["suspend"] is True
    job = kube.kubectl_json("get", "jobset", "js", "-n", ns)
    assert job["metadata"]["annotations"]["frscope.io/stopped-by-diagnosis"].startswith("RankNotJoined")
    [event] = events(kube, ns, "HungJobStopped")
    assert "Workload" in event["message"] and "spec.active: false" in event["message"]
