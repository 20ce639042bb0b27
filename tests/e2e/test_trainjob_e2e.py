"""A hang in a Kubeflow Trainer v2 TrainJob, and in a bare JobSet, diagnosed end to end through the real
API server: the verdict lands in the job's `status.conditions` (metav1.Condition, validated by the real
CRDs from Trainer v2.3.0 and JobSet v0.12.0, read from their Go modules by `testenv/build-controllers
--manifests`), Events on the job, and a FlightRecorderReport owned by it. The operator runs as a process
with exactly the chart's RBAC (default values: every job kind on).

What stands in for components that do not run here, and why:
- The Trainer controller does not run in this module (tests/node/test_trainjob.py runs it in a pod,
  tests/e2e/test_jobset_versions_e2e.py out of cluster).
  In the two hang tests the JobSet controller does not run either: they create the pods with the
  labels the real JobSet v0.12.0 and Job controllers put on them (what
  test_the_real_jobset_controller_s_pods_map_to_their_jobset checks with the real JobSet controller:
  jobset-name = the TrainJob's name, replicatedjob-name, job-index, the batch Job's completion index),
  so that each pod can point at its own sidecar's port, and write Trainer's conditions (types and
  reasons of Trainer v2.3.0) through the status subresource, as Trainer does.
- There is no kubelet: the test patches each pod's status (Running, loopback IP) the way
  test_operator_e2e.py does; the ranks are a real 4-rank gloo job on loopback that hangs, with one
  real `frscope sidecar` per pod.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.e2e import jobset_versions
from tests.e2e.chart_tools import Helm, objects
from tests.e2e.test_operator_e2e import (  # noqa: F401  (fixtures used by name)
    CONDITION,
    ROOT,
    chart_rbac,
    free_port,
    hung_job_with_sidecars,
    namespace,
    now,
    operator,
    operator_kubeconfig,
    report_crd,
    wait_for,
)

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.torch, pytest.mark.slow]

JOB = "llm"
ARGS = ["--poll-interval", "1", "--stall-after", "1", "--gather-timeout", "30", "--cooldown", "3"]


@pytest.fixture(scope="module")
def kinds_crds(kube: ControlPlane) -> Path:
    """The JobSet CRD (and Trainer's runtime CRDs and torch runtime) from their Go modules."""
    proc = subprocess.run([str(ROOT / "testenv" / "build-controllers"), "--manifests"], capture_output=True,
                          text=True, timeout=300, check=False)
    if proc.returncode == 3:
        pytest.skip(f"Go is not installed: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    directory = Path(proc.stdout.strip().splitlines()[-1])
    for name in ("jobset.x-k8s.io_jobsets.yaml", "trainer.kubeflow.org_clustertrainingruntimes.yaml"):
        kube.kubectl("apply", "--server-side", "--field-manager=frscope-testenv", "-f", str(directory / name))
    for crd in ("jobsets.jobset.x-k8s.io", "clustertrainingruntimes.trainer.kubeflow.org"):
        kube.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    # Trainer's own torch runtime, as its manifests ship it: the TrainJob below refers to it.
    kube.kubectl("apply", "--server-side", "--field-manager=frscope-testenv", "-f",
                 str(directory / "torch_distributed.yaml"))
    return directory


def jobset_pod(kube: ControlPlane, namespace: str, job: str, index: int, sidecar_port: int) -> str:
    """A pod as the JobSet controller's Job makes it (labels of JobSet v0.12.0; Trainer's container
    name `node`), then the kubelet's part (Running, loopback IP)."""
    name = f"{job}-node-{index}-0-{index:05x}"
    kube.apply({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {
            "frscope.io/inject": "true",
            "jobset.sigs.k8s.io/jobset-name": job, "jobset.sigs.k8s.io/replicatedjob-name": "node",
            "jobset.sigs.k8s.io/replicatedjob-replicas": "2", "jobset.sigs.k8s.io/job-index": str(index),
            "jobset.sigs.k8s.io/job-key": f"{index:040x}", "batch.kubernetes.io/job-completion-index": "0",
            "job-name": f"{job}-node-{index}"}},
        "spec": {
            "initContainers": [{"name": "frscope-sidecar", "image": "frscope:e2e", "restartPolicy": "Always",
                                "ports": [{"name": "frscope", "containerPort": sidecar_port}]}],
            "containers": [{"name": "node", "image": "registry.invalid/train:1",
                            "env": [{"name": "PET_NNODES", "value": "2"}, {"name": "PET_NPROC_PER_NODE", "value": "2"}],
                            "terminationMessagePolicy": "FallbackToLogsOnError"}],
        },
    })
    running = {"running": {"startedAt": now()}}
    status = {"status": {
        "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "hostIP": "127.0.0.1",
        "startTime": now(), "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now()}],
        "initContainerStatuses": [{"name": "frscope-sidecar", "image": "frscope:e2e", "imageID": "", "ready": True,
                                   "restartCount": 0, "started": True, "state": running}],
        "containerStatuses": [{"name": "node", "image": "registry.invalid/train:1", "imageID": "", "ready": True,
                               "restartCount": 0, "started": True, "state": running}],
    }}
    kube.kubectl("patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps(status))
    return name


def metav1(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now()}


def set_conditions(kube: ControlPlane, resource: str, namespace: str, conditions: list[dict[str, Any]]) -> None:
    """What Trainer (or the JobSet controller) does: its conditions, through the status subresource."""
    kube.kubectl("patch", resource, JOB, "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"conditions": conditions}}))


def diagnose_hang(kube: ControlPlane, namespace: str, kubeconfig: Path, tmp_path: Path, resource: str,
                  uid: str, then: Callable[[], None] | None = None) -> dict[str, Any]:
    """Runs the hung job, its pods and the operator until the condition is on the job; returns the job."""

    def get_job() -> dict[str, Any]:
        return dict(kube.kubectl_json("get", resource, JOB, "-n", namespace))

    def diagnosed() -> bool:
        return any(c["type"] == CONDITION for c in get_job().get("status", {}).get("conditions", []))

    with hung_job_with_sidecars(tmp_path / "pods", {"p0": (0, 1), "p1": (2, 3)}) as ports:
        for index, pod in enumerate(("p0", "p1")):
            jobset_pod(kube, namespace, JOB, index, ports[pod])
        with operator(kube, kubeconfig, tmp_path / "operator.log", ARGS) as op:
            wait_for(f"the condition on the {resource}", diagnosed, 90, diagnostics=op.logs)
            wait_for("the Event", lambda: kube.kubectl_json("get", "events", "-n", namespace,
                                                              "--field-selector", "reason=RankNotJoined")["items"], 30)
            if then is not None:
                then()
    job = get_job()
    [report] = [r for r in kube.kubectl_json("get", "flightrecorderreports", "-n", namespace)["items"]
                if not r["job"].get("suspicion")]
    owner = report["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == (job["kind"], uid)
    [event] = kube.kubectl_json("get", "events", "-n", namespace, "--field-selector", "reason=RankNotJoined")["items"]
    assert (event["involvedObject"]["kind"], event["involvedObject"]["uid"]) == (job["kind"], uid)
    assert "Rank 1 never joined all_reduce #4" in event["message"]
    return job


@pytest.mark.timeout(360)
def test_a_hang_in_a_trainjob_is_diagnosed_into_the_trainjob(kube: ControlPlane, report_crd: str, kinds_crds: Path,
                                                            namespace: str, operator_kubeconfig: Path,
                                                            tmp_path: Path) -> None:
    trainjob = kube.apply({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": JOB, "namespace": namespace},
        "spec": {"runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime",
                                "apiGroup": "trainer.kubeflow.org"},
                 "trainer": {"numNodes": 2, "image": "registry.invalid/train:1"}},
    })
    uid, generation = trainjob["metadata"]["uid"], trainjob["metadata"]["generation"]
    resumed = metav1("Suspended", "False", "Resumed", "TrainJob is resumed")
    set_conditions(kube, "trainjob", namespace, [resumed])

    def trainer_fails() -> None:
        # Trainer copies the JobSet's failure in: its list, without frscope's condition. frscope puts
        # its own back, first; Trainer's conditions stay, and the STATE column is Trainer's.
        failed = metav1("Failed", "True", "JobSetFailed", "jobset failed")
        set_conditions(kube, "trainjob", namespace, [resumed, failed])
        wait_for("the condition put back first", lambda: [c["type"] for c in kube.kubectl_json(
            "get", "trainjob", JOB, "-n", namespace)["status"]["conditions"]] == [CONDITION, "Suspended", "Failed"], 30)

    job = diagnose_hang(kube, namespace, operator_kubeconfig, tmp_path, "trainjob", uid, then=trainer_fails)
    ours, *trainers = job["status"]["conditions"]
    assert ours["type"] == CONDITION and ours["reason"] == "RankNotJoined" and ours["status"] == "True"
    assert ours["observedGeneration"] == generation and "lastUpdateTime" not in ours
    assert "Rank 1" in ours["message"] and "all_reduce #4" in ours["message"]
    assert [(c["type"], c["reason"]) for c in trainers] == [("Suspended", "Resumed"), ("Failed", "JobSetFailed")]
    table = kube.kubectl("get", "trainjob", JOB, "-n", namespace).stdout.splitlines()
    assert table[1].split()[1] == "Failed", table  # STATE: .status.conditions[-1:].type
    described = kube.kubectl("describe", "trainjob", JOB, "-n", namespace).stdout
    assert CONDITION in described and "RankNotJoined" in described.split("Events:")[1], described
    # The operator only wrote the status (no annotations, no finalizer on the TrainJob).
    assert not job["metadata"].get("finalizers")
    assert not [k for k in job["metadata"].get("annotations", {}) if k.startswith("frscope.io/") or "kopf" in k]


@pytest.mark.timeout(360)
def test_a_hang_in_a_bare_jobset_is_diagnosed_into_the_jobset(kube: ControlPlane, report_crd: str, kinds_crds: Path,
                                                             namespace: str, operator_kubeconfig: Path,
                                                             tmp_path: Path) -> None:
    template = {"spec": {"parallelism": 1, "completions": 1, "completionMode": "Indexed", "template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "node", "image": "registry.invalid/train:1"}]}}}}
    jobset = kube.apply({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": JOB, "namespace": namespace},
        "spec": {"replicatedJobs": [{"name": "node", "replicas": 2, "template": template}]},
    })
    uid = jobset["metadata"]["uid"]
    set_conditions(kube, "jobset", namespace, [metav1("StartupPolicyCompleted", "True", "AllJobsReady", "started")])
    job = diagnose_hang(kube, namespace, operator_kubeconfig, tmp_path, "jobset", uid)
    ours, theirs = job["status"]["conditions"]
    assert ours["type"] == CONDITION and ours["reason"] == "RankNotJoined"
    assert ours["observedGeneration"] == job["metadata"]["generation"]
    assert theirs["type"] == "StartupPolicyCompleted"
    described = kube.kubectl("describe", "jobset", JOB, "-n", namespace).stdout
    assert "RankNotJoined" in described.split("Events:")[1], described


def _granted(rules: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[str, ...]]:
    return {(g, r): tuple(rule["verbs"]) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}


KIND_RESOURCES = {"pytorchjob": ("kubeflow.org", "pytorchjobs"), "trainjob": ("trainer.kubeflow.org", "trainjobs"),
                  "jobset": ("jobset.x-k8s.io", "jobsets")}


def test_the_chart_grants_each_kind_only_when_on(kube: ControlPlane, chart_rbac: list[dict[str, Any]],
                                                 tmp_path: Path) -> None:
    """Default values: every kind, read + status patch, nothing else on the jobs; a kind switched off
    takes its permissions and its --job-kind flag with it (rendered by the real helm)."""
    granted = _granted(chart_rbac)
    for group, plural in KIND_RESOURCES.values():
        assert granted[(group, plural)] == ("get", "list", "watch")
        assert granted[(group, f"{plural}/status")] == ("patch",)
    helm = Helm(kube.bin_dir / "helm", tmp_path / "helm-home")
    rendered = objects(helm, sets=["operator.jobKinds.pytorchjob=false", "operator.jobKinds.jobset=false"])
    [role] = [o for o in rendered if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-operator")]
    only = _granted(role["rules"])
    assert ("trainer.kubeflow.org", "trainjobs") in only
    assert not [key for key in only if key[0] in ("kubeflow.org", "jobset.x-k8s.io")], only
    [deployment] = [o for o in rendered if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--job-kind")] == ["--job-kind=trainjob"]
    assert yaml.safe_dump(role)  # a plain object, as helm rendered it


@pytest.fixture(scope="module")
def jobset_controller(request: pytest.FixtureRequest, kube: ControlPlane, kinds_crds: Path,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """The real JobSet controller out of cluster, against the test API server: the release Trainer v2.3.0
    requires (v0.12.0, testenv/build-controllers), or the one a test is parametrized with (indirectly,
    e.g. "0.11.0": its CRD installed for the module, tests/e2e/jobset_versions.py). Its webhooks serve on
    loopback and are registered by URL only for the namespaces labelled jobset_versions.WEBHOOK_LABEL (so
    other JobSets are created with the fields its defaulting webhook would fill in); the batch Job
    controller of kube-controller-manager makes the pods."""
    version = getattr(request, "param", jobset_versions.default_release())
    with jobset_versions.jobset_controller(kube, version, kinds_crds,
                                           tmp_path_factory.mktemp(f"jobset-{version}")) as controller:
        yield controller


@pytest.mark.controllers
@pytest.mark.timeout(3900)  # a cold build of the controllers, once
def test_the_real_jobset_controller_s_pods_map_to_their_jobset(kube: ControlPlane, namespace: str,
                                                              jobset_controller: subprocess.Popen[bytes]) -> None:
    """Which fields reach the pods, as the real JobSet and Job controllers make them: the JobSet's own
    labels do not, a replicated job's pod-template labels do (how a TrainJob runtime opts its pods in);
    frscope's pod view maps each pod to the JobSet with its job index."""
    pod_template = {"metadata": {"labels": {"frscope.io/inject": "true"}}, "spec": {
        "restartPolicy": "Never", "containers": [{"name": "node", "image": "registry.invalid/train:1"}]}}
    kube.apply({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": JOB, "namespace": namespace, "labels": {"team": "llm"}},
        "spec": {
            # What JobSet's defaulting webhook would fill in (it is not registered here).
            "successPolicy": {"operator": "All"}, "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "replicatedJobs": [{"name": "node", "replicas": 2, "template": {"spec": {
                "parallelism": 1, "completions": 1, "completionMode": "Indexed", "backoffLimit": 0,
                "template": pod_template}}}]},
    })

    def pods() -> list[dict[str, Any]] | None:
        items = kube.kubectl_json("get", "pods", "-n", namespace)["items"]
        return list(items) if len(items) == 2 else None

    created = wait_for("the JobSet's pods", pods, 120,
                       diagnostics=lambda: f"controller exit code {jobset_controller.poll()}")
    from frscope.operator.model import jobkinds
    from frscope.operator.model.objects import pod_info

    views = sorted((pod_info(p) for p in created), key=lambda v: v.replica_index or 0)
    assert [(v.job_name, v.family, v.replica_type, v.replica_index) for v in views] == [
        (JOB, jobkinds.FAMILY_JOBSET, "node", 0), (JOB, jobkinds.FAMILY_JOBSET, "node", 1)]
    for pod in created:
        labels = pod["metadata"]["labels"]
        assert labels["frscope.io/inject"] == "true"  # the pod template's labels reach the pods
        assert "team" not in labels  # the JobSet's own labels do not
        assert labels["batch.kubernetes.io/job-completion-index"] == "0"
        [owner] = pod["metadata"]["ownerReferences"]
        assert owner["kind"] == "Job"  # the pod's owner is a batch Job, whose owner is the JobSet
