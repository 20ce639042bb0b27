"""Each JobSet release frscope supports (tests/e2e/jobset_versions.py: v0.12.0, the one Trainer v2.3.0
requires, and v0.11.0), with its own CRD and its real controller on the API-server tier, and the real
Kubeflow Trainer v2.3.0 controller over it. Every test is parametrized with the release.

- A bare JobSet whose failurePolicy.maxRestarts the real JobSet controller has used up (status written
  by that controller: JobSet v0.11.0 has no `replicatedJobsStatus[].jobRestartsCountTowardsMax`, and its
  CRD refuses the RestartJob action) is not restarted: the action record says why, its pods stay.
- A TrainJob reconciled by the real Trainer controller (out of cluster, certificate management off): the
  JobSet it creates goes through the JobSet webhooks (registered by URL for the test's namespaces) and
  the JobSet controller; frscope restarts one hung TrainJob (its pods remade by the Job controller) and
  stops another (Trainer copies its spec.suspend to the JobSet; the JobSet controller ends the pods).

As in test_actions_kinds_e2e.py, there is no kubelet (the test writes each pod's status and address) and
the ranks are a real 4-rank gloo job that hangs, with one real `frscope sidecar` per pod. A TrainJob opts
in through its runtimePatches (the label, as README.md shows); the sidecar and its port, which frscope's
injection webhook (not registered here) would add, are in its runtime, a TrainingRuntime (runtimePatches
may not set a container's image or ports).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.e2e import jobset_versions
from tests.e2e.test_actions_e2e import ANN, action_of, events, new_namespace
from tests.e2e.test_actions_kinds_e2e import (  # noqa: F401  (fixtures used by name)
    ARGS,
    HOSTS,
    JOBSETS,
    PODS,
    accounts,
    condition,
    jobset_body,
    kueue_crds,
    live_pods,
    run_pods,
    uids,
    wait_for_pods,
)
from tests.e2e.test_operator_e2e import (  # noqa: F401  (fixtures used by name)
    CONDITION,
    free_port,
    hung_job_with_sidecars,
    operator,
    report_crd,
    wait_for,
)
from tests.e2e.test_trainjob_e2e import jobset_controller, kinds_crds  # noqa: F401  (fixtures used by name)

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.torch, pytest.mark.slow, pytest.mark.controllers,
              pytest.mark.parametrize("jobset_controller", JOBSETS, indirect=True)]


def webhook_namespace(kube: ControlPlane) -> str:
    """A namespace whose JobSets go through the registered JobSet webhooks."""
    ns = new_namespace(kube)
    kube.kubectl("label", "namespace", ns, f"{jobset_versions.WEBHOOK_LABEL}=true")
    return ns


def version_of(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["jobset_controller"])


@pytest.fixture(scope="module")
def trainer_controller(kube: ControlPlane, kinds_crds: Path, jobset_controller: subprocess.Popen[bytes],
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """The real Trainer v2.3.0 controller manager out of cluster (jobset_versions.trainer_controller), one
    per JobSet release (it starts after that release's CRD is in place)."""
    with jobset_versions.trainer_controller(kube, kinds_crds, tmp_path_factory.mktemp("trainer")) as controller:
        yield controller


@pytest.mark.timeout(3900)  # a cold build of the controllers, once
def test_a_jobset_whose_restarts_are_used_up_is_not_restarted(request: pytest.FixtureRequest, kube: ControlPlane,
                                                              accounts: dict[str, Any],
                                                              jobset_controller: subprocess.Popen[bytes],
                                                              tmp_path: Path) -> None:
    version = version_of(request)
    # The release's own CRD is what the server validates with: v0.11.0 refuses the v0.12 actions.
    assert jobset_versions.restart_job_accepted(kube) == (version != "0.11.0")
    port = free_port()
    ns = webhook_namespace(kube)
    kube.apply(jobset_body(ns, "js", port, job_spec={"backoffLimit": 0}, failure_policy={"maxRestarts": 1},
                           annotations={ANN: "restart"}))
    first = wait_for_pods(kube, ns, "js")
    # Its one restart used by a failure before frscope: the pods deleted, the Job fails (backoffLimit 0),
    # the JobSet controller restarts the JobSet and counts it.
    kube.kubectl("delete", "pods", "-n", ns, "-l", "jobset.sigs.k8s.io/jobset-name=js", "--wait=false")
    second = wait_for_pods(kube, ns, "js", not_uids=uids(first))
    status = wait_for("the restart counted by the JobSet controller", lambda: (
        s := kube.kubectl_json("get", "jobset", "js", "-n", ns).get("status", {})).get("restarts") == 1 and s, 60,
        diagnostics=lambda: f"jobset controller exit code {jobset_controller.poll()}")
    assert status["restartsCountTowardsMax"] == 1, status
    if version == "0.11.0":
        assert not [r for r in status.get("replicatedJobsStatus", []) if "jobRestartsCountTowardsMax" in r], status
    run_pods(kube, second)

    with hung_job_with_sidecars(tmp_path / "pods", PODS, hosts=HOSTS, port=port), \
            operator(kube, accounts["kubeconfig"], tmp_path / "operator.log",
                     [*ARGS, "--allow-actions", "restart,stop"]) as op:
        record = wait_for("the action record", lambda: action_of(kube, ns, "js"), 180, interval=1,
                          diagnostics=op.logs)
        time.sleep(3)
    assert record["state"] == "skipped", record
    assert "has used 1 of its failurePolicy.maxRestarts=1: it would fail" in record["message"], record
    assert uids(live_pods(kube, ns, "js")) == uids(second)  # nothing deleted
    jobset = kube.kubectl_json("get", "jobset", "js", "-n", ns)
    assert jobset["status"]["restarts"] == 1 and condition(jobset, "Failed") is None, jobset["status"]
    assert not events(kube, ns, "HungJobRestarted")


def trainjob(kube: ControlPlane, manifests: Path, namespace: str, port: int, policy: str) -> dict[str, Any]:
    """A TrainJob of 2 nodes of 2 processes, opted in through its runtimePatches (the label, as README.md
    shows), of a TrainingRuntime that is Trainer's torch-distributed with what frscope's injection would
    add to the pods (runtimePatches may not add a container's image or ports)."""
    runtime = yaml.safe_load((manifests / "torch_distributed.yaml").read_text())
    runtime["kind"], runtime["metadata"] = "TrainingRuntime", {"name": "torch-frscope", "namespace": namespace,
                                                                "labels": runtime["metadata"]["labels"]}
    [rjob] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    rjob["template"]["spec"]["template"]["spec"]["initContainers"] = [{
        "name": "frscope-sidecar", "image": "frscope:e2e", "restartPolicy": "Always",
        "ports": [{"name": "frscope", "containerPort": port}]}]
    kube.apply(runtime)
    opt_in = {"metadata": {"labels": {"frscope.io/inject": "true"}}}
    return dict(kube.apply({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "tj", "namespace": namespace, "annotations": {ANN: policy}},
        "spec": {"runtimeRef": {"name": "torch-frscope", "kind": "TrainingRuntime", "apiGroup": "trainer.kubeflow.org"},
                 "trainer": {"numNodes": 2, "numProcPerNode": 2, "image": "registry.invalid/train:1"},
                 "runtimePatches": [{"manager": "frscope.io/e2e", "trainingRuntimeSpec": {"template": {"spec": {
                     "replicatedJobs": [{"name": "node", "template": {"spec": {"template": opt_in}}}]}}}}]},
    }))


@pytest.mark.timeout(3900)  # a cold build of the controllers, once
def test_the_real_trainer_s_trainjob_is_restarted_and_stopped(kube: ControlPlane, accounts: dict[str, Any],
                                                              kinds_crds: Path,
                                                              jobset_controller: subprocess.Popen[bytes],
                                                              trainer_controller: subprocess.Popen[bytes],
                                                              tmp_path: Path) -> None:
    port = free_port()
    ns = {policy: webhook_namespace(kube) for policy in ("restart", "stop")}
    jobs = {policy: trainjob(kube, kinds_crds, namespace, port, policy) for policy, namespace in ns.items()}

    def diagnostics() -> str:
        return (f"trainer exit code {trainer_controller.poll()}, jobset exit code {jobset_controller.poll()}; "
                + kube.kubectl("get", "trainjob,jobset,jobs,pods", "-A", check=False).stdout)

    first = {policy: wait_for_pods(kube, namespace, "tj", timeout=120) for policy, namespace in ns.items()}
    for policy, namespace in ns.items():
        # The JobSet is Trainer's: owned by the TrainJob, defaulted by the JobSet webhook.
        jobset = kube.kubectl_json("get", "jobset", "tj", "-n", namespace)
        [owner] = jobset["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("TrainJob", jobs[policy]["metadata"]["uid"])
        assert jobset["spec"]["successPolicy"]["operator"] == "All", jobset["spec"]
        run_pods(kube, first[policy])

    def trainjob_of(policy: str) -> dict[str, Any]:
        return dict(kube.kubectl_json("get", "trainjob", "tj", "-n", ns[policy]))

    with hung_job_with_sidecars(tmp_path / "pods", PODS, hosts=HOSTS, port=port), \
            operator(kube, accounts["kubeconfig"], tmp_path / "operator.log",
                     [*ARGS, "--allow-actions", "restart,stop"]) as op:
        wait_for("both action records", lambda: all(action_of(kube, n, "tj") for n in ns.values()), 180,
                 interval=1, diagnostics=op.logs)
        restarted = wait_for_pods(kube, ns["restart"], "tj", not_uids=uids(first["restart"]))
        wait_for("the diagnosis on the TrainJob", lambda: condition(trainjob_of("restart"), CONDITION), 60,
                 diagnostics=op.logs)
        wait_for("the JobSet suspended by Trainer", lambda: kube.kubectl_json(
            "get", "jobset", "tj", "-n", ns["stop"])["spec"].get("suspend") is True, 60, diagnostics=diagnostics)
        wait_for("the stopped TrainJob's pods gone", lambda: not live_pods(kube, ns["stop"], "tj"), 90,
                 diagnostics=diagnostics)
        time.sleep(3)

    record = action_of(kube, ns["restart"], "tj")
    assert record is not None and (record["action"], record["state"]) == ("restart", "done"), record
    assert sorted(t.split("/")[2] for t in record["targets"]) == sorted(uids(first["restart"]))
    assert len(restarted) == 2
    [event] = events(kube, ns["restart"], "HungJobRestarted")
    assert (event["involvedObject"]["kind"], event["involvedObject"]["uid"]) == (
        "TrainJob", jobs["restart"]["metadata"]["uid"])
    diagnosed = condition(trainjob_of("restart"), CONDITION)
    assert diagnosed is not None and diagnosed["reason"] == "RankNotJoined", diagnosed

    stopped = action_of(kube, ns["stop"], "tj")
    assert stopped is not None and (stopped["action"], stopped["state"]) == ("stop", "done"), stopped
    train = trainjob_of("stop")
    assert train["spec"]["suspend"] is True
    assert train["metadata"]["annotations"]["frscope.io/stopped-by-diagnosis"].startswith("RankNotJoined")
    assert not live_pods(kube, ns["stop"], "tj")
