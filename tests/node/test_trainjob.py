"""Kubeflow Trainer v2 on the real node: the Trainer controller (v2.3.0) and JobSet (v0.12.0, the release
Trainer v2.3.0 requires and installs) each run in a pod deployed from their own manifests (the `trainer`
fixture), with Trainer's own `torch-distributed` ClusterTrainingRuntime. Nothing is patched by hand:
Trainer makes the JobSet, JobSet the Jobs, the Job controller the pods, the kubelet runs them, the webhook
injects the sidecar on the way in.

- which of a TrainJob's, its runtime patches' and a runtime's fields reach the pods (issue 14: a
  TrainJob's own labels do not), and that a pod-template label set by a TrainJob's `runtimePatches`
  (Trainer v2.2+) is an opt-in the webhook honours, with no runtime of one's own;
- a TrainJob (2 nodes x torchrun with 2 processes, gloo on CPU) in a namespace opted in by its label,
  whose last rank hangs in a named function: the diagnosis reaches `kubectl describe trainjob`
  (frscope's condition in status.conditions, kept out of the STATE column, and the Warning Event), the
  report is owned by the TrainJob, and deleting the TrainJob removes its pods and the report;
- a TrainJob whose last rank raises: the report on the TrainJob names that rank with its exit code and
  exception, as the kubelet reports the `node` container's end.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
import yaml

from tests.node.support import (
    CONDITION,
    TRAINER,
    container_logs,
    dump_state,
    job_condition,
    new_namespace,
    pods,
    reports,
    script_configmap,
    wait_for,
)
from tests.node.test_exits import CRASH_MESSAGE, CRASH_PY, exits_in

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(900)]

RUNTIME = "torch-distributed"
STUCK_FUNCTION = "load_batch"
INJECT = {"frscope.io/inject": "true"}

# Plain torch, no frscope: three all_reduces, then the last rank waits forever in load_batch() while the
# others wait in the fourth all_reduce.
TRAIN_PY = """\
import datetime
import sys
import time

import torch
import torch.distributed as dist


def load_batch():
    while True:
        time.sleep(1)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    sys.stdout.write(f"rank {rank} of {world} up;\\n")  # one write: the pod's ranks share stdout
    sys.stdout.flush()
    t = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == world - 1:
        load_batch()
    dist.all_reduce(t)


if __name__ == "__main__":
    main()
"""


# Trainer's webhook wants a runtime patch's manager to be a domain-prefixed path.
PATCH_MANAGER = "frscope.io/node-tests"


def node_patch(*, pod_labels: dict[str, str] | None = None, pod_annotations: dict[str, str] | None = None,
               job_labels: dict[str, str] | None = None, volumes: list[dict[str, Any]] | None = None,
               mounts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A `runtimePatches` replicated-job entry for the runtime's `node` job (Trainer v2.2+)."""
    pod: dict[str, Any] = {"spec": {}}
    if pod_labels or pod_annotations:
        pod["metadata"] = {k: v for k, v in (("labels", pod_labels), ("annotations", pod_annotations)) if v}
    if volumes:
        pod["spec"]["volumes"] = volumes
    if mounts:
        pod["spec"]["containers"] = [{"name": "node", "volumeMounts": mounts}]
    job: dict[str, Any] = {"spec": {"template": pod}}
    if job_labels:
        job["metadata"] = {"labels": job_labels}
    return {"name": "node", "template": job}


def trainjob(name: str, namespace: str, *, runtime: str = RUNTIME, kind: str = "ClusterTrainingRuntime",
             num_nodes: int, nproc: int, command: list[str], metadata: dict[str, Any] | None = None,
             jobset_metadata: dict[str, Any] | None = None, pod_labels: dict[str, str] | None = None,
             job_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A TrainJob whose `node` containers run `command` from the trainer image, with the script mounted
    from a ConfigMap through one `runtimePatches` entry (Trainer v2.2 replaced podSpecOverrides with it),
    which may also carry labels for the JobSet, the Jobs and the pods."""
    template: dict[str, Any] = {"spec": {"replicatedJobs": [node_patch(
        pod_labels=pod_labels, job_labels=job_labels,
        volumes=[{"name": "scripts", "configMap": {"name": f"{name}-script"}}],
        mounts=[{"name": "scripts", "mountPath": "/scripts"}])]}}
    if jobset_metadata:
        template["metadata"] = jobset_metadata
    spec: dict[str, Any] = {
        "runtimeRef": {"name": runtime, "kind": kind, "apiGroup": "trainer.kubeflow.org"},
        "trainer": {"image": TRAINER, "command": command, "numNodes": num_nodes, "numProcPerNode": nproc},
        "runtimePatches": [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": template}}],
    }
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace, **(metadata or {})}, "spec": spec}


def trainjob_pods(node: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    return pods(node, namespace, f"jobset.sigs.k8s.io/jobset-name={name}")


# ---- which fields reach the pods --------------------------------------------------------------------
def test_which_trainjob_and_runtime_fields_reach_the_pods(node: Any, trainer: dict[str, str],
                                                          installed: Any) -> None:
    """A namespaced TrainingRuntime copied from Trainer's torch-distributed, with a probe label at each
    level of its template, and a TrainJob with labels of its own (metadata) and a probe label at each
    level of its `runtimePatches`: what the JobSet, its Jobs and the pods carry, as the real controllers
    propagate them. The opt-in label set on the pod template through `runtimePatches` reaches the pod,
    and the webhook injects it, in a namespace that is not opted in and with no label in the runtime."""
    ns = new_namespace(node, "trainjob-fields")
    name = "probe"
    try:
        cluster_runtime = node.plane.kubectl_json("get", "clustertrainingruntime", RUNTIME)
        runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
                   "metadata": {"name": "torch-probe", "namespace": ns,
                                "labels": {"probe/runtime-object": "x"}},
                   "spec": copy.deepcopy(cluster_runtime["spec"])}
        template = runtime["spec"]["template"]
        template.setdefault("metadata", {})["labels"] = {"probe/runtime-jobset-template": "x"}
        [rjob] = template["spec"]["replicatedJobs"]
        rjob["template"].setdefault("metadata", {}).setdefault("labels", {})["probe/runtime-job-template"] = "x"
        pod_meta = rjob["template"]["spec"]["template"].setdefault("metadata", {})
        pod_meta["labels"] = {"probe/runtime-pod-template": "x"}
        node.plane.apply(runtime)
        script_configmap(node, ns, f"{name}-script", "print('probe ran', flush=True)\n")
        node.plane.apply(trainjob(
            name, ns, runtime="torch-probe", kind="TrainingRuntime", num_nodes=1, nproc=1,
            command=["python", "/scripts/train.py"],
            metadata={"labels": {"probe/trainjob-metadata": "x"},
                      "annotations": {"probe/trainjob-annotation": "x"}},
            jobset_metadata={"labels": {"probe/patch-jobset-template": "x"},
                             "annotations": {"probe/patch-jobset-annotation": "x"}},
            job_labels={"probe/patch-job-template": "x"},
            pod_labels={"probe/patch-pod-template": "x", **INJECT}))
        dump = dump_state(node, ns, "trainjob", name, f"jobset.sigs.k8s.io/jobset-name={name}", ("node",))
        [pod] = wait_for("the probe's pod", lambda: trainjob_pods(node, ns, name), 120, 2, diagnostics=dump)

        def probes(obj: dict[str, Any], field: str = "labels") -> set[str]:
            return {k for k in (obj["metadata"].get(field) or {}) if k.startswith("probe/")}

        jobset = node.plane.kubectl_json("-n", ns, "get", "jobset", name)
        [job] = node.plane.kubectl_json("-n", ns, "get", "jobs", "-l", f"jobset.sigs.k8s.io/jobset-name={name}")[
            "items"]
        seen = {"jobset": probes(jobset), "job": probes(job), "pod": probes(pod),
                "jobset annotations": probes(jobset, "annotations"), "job annotations": probes(job, "annotations"),
                "pod annotations": probes(pod, "annotations")}
        print("probe labels by object:", seen)
        # Trainer v2.3.0 puts the runtime's JobSet-template labels and the patch's JobSet-template metadata
        # on the JobSet only; JobSet v0.12.0 gives the Jobs their replicated job's template labels (the
        # runtime's and the patch's, merged) and the pods the pod template's; nothing of the TrainJob's own
        # metadata goes down.
        assert seen["jobset"] == {"probe/patch-jobset-template", "probe/runtime-jobset-template"}, seen
        assert seen["job"] == {"probe/runtime-job-template", "probe/patch-job-template"}, seen
        assert seen["pod"] == {"probe/runtime-pod-template", "probe/patch-pod-template"}, seen
        assert seen["jobset annotations"] == {"probe/patch-jobset-annotation"}, seen
        assert not seen["job annotations"] and not seen["pod annotations"], seen
        assert "probe/trainjob-metadata" not in seen["pod"] | seen["job"] | seen["jobset"], seen
        # The pod-template label from runtimePatches is an opt-in that works: the webhook injected the sidecar.
        assert pod["metadata"]["labels"].get("frscope.io/inject") == "true", pod["metadata"]
        assert pod["metadata"]["annotations"].get("frscope.io/injected"), pod["metadata"]
        assert "frscope-sidecar" in [c["name"] for c in pod["spec"].get("initContainers") or []]
    finally:
        node.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


# ---- a hang in a TrainJob, diagnosed end to end -------------------------------------------------------
def test_a_hang_in_a_trainjob_is_diagnosed_into_kubectl_describe(node: Any, trainer: dict[str, str],
                                                                 installed: Any) -> None:
    ns = "trainjob-hang"
    name = "llm"
    nodes, nproc = 2, 2
    world = nodes * nproc
    stuck = world - 1
    try:
        new_namespace(node, ns, labels=INJECT)  # the namespace opt-in: nothing on the TrainJob or runtime
        script_configmap(node, ns, f"{name}-script", TRAIN_PY)
        job = node.plane.apply(trainjob(name, ns, num_nodes=nodes, nproc=nproc,
                                        command=["torchrun", "/scripts/train.py"]))
        uid = job["metadata"]["uid"]
        dump = dump_state(node, ns, "trainjob", name, f"jobset.sigs.k8s.io/jobset-name={name}", ("node",))

        def running() -> bool:
            got = trainjob_pods(node, ns, name)
            return len(got) == nodes and all(p.get("status", {}).get("phase") == "Running" for p in got)

        wait_for("the TrainJob's pods Running", running, 240, 2, diagnostics=dump)
        for pod in trainjob_pods(node, ns, name):
            assert pod["metadata"]["annotations"].get("frscope.io/injected"), pod["metadata"]
            # Opted in by the namespace: the webhook gave the pod the label, so the operator's pod watch
            # (selected by that label) sees it.
            assert pod["metadata"]["labels"].get("frscope.io/inject") == "true", pod["metadata"]
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}
            assert env.get("PET_NNODES") == str(nodes) and env.get("PET_NPROC_PER_NODE") == str(nproc), env

        def ranks_up() -> bool:
            return sum(container_logs(node, ns, p["metadata"]["name"], "node").count(" up;")
                       for p in trainjob_pods(node, ns, name)) == world

        wait_for("every rank up", ranks_up, 300, 2, diagnostics=dump)
        started = time.monotonic()
        def confirmed() -> dict[str, Any] | None:  # a suspected stall (status Unknown) comes first
            got = job_condition(node, ns, "trainjob", name)
            return got if got is not None and got["status"] == "True" else None

        ours = wait_for("frscope's confirmed condition on the TrainJob", confirmed, 90, 2, diagnostics=dump)
        took = time.monotonic() - started
        print(f"trainjob: diagnosed {took:.0f}s after every rank was up")
        assert ours["status"] == "True" and f"Rank {stuck}" in ours["message"], ours
        assert ours.get("observedGeneration") == job["metadata"]["generation"], ours  # a metav1.Condition

        described = node.kubectl("-n", ns, "describe", "trainjob", name).stdout
        assert CONDITION in described, described
        events = " ".join(described.split("Events:")[1].split())
        assert ours["reason"] in events and "Warning" in events, described
        for needle in (f"Rank {stuck}", "all_reduce", STUCK_FUNCTION):
            assert needle in events, f"{needle!r} not in the Events of:\n{described}"
        # frscope's condition is never the STATE column (the last condition), once Trainer wrote one.
        got = node.plane.kubectl_json("-n", ns, "get", "trainjob", name)
        types = [c["type"] for c in got["status"].get("conditions") or []]
        assert types[0] == CONDITION, types
        table = node.kubectl("-n", ns, "get", "trainjob", name).stdout
        print(table)
        if len(types) > 1:
            assert CONDITION not in table, table

        [report] = wait_for("the report", lambda: reports(node, ns), 30, 1, diagnostics=dump)
        owner = report["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"]) == ("TrainJob", uid), owner
        report_text = yaml.safe_dump(report)
        assert STUCK_FUNCTION in report_text, report_text[-4000:]

        node.kubectl("-n", ns, "delete", "trainjob", name, "--wait=true", "--timeout=90s", timeout=120)
        wait_for("the pods and the report to go", lambda: not trainjob_pods(node, ns, name) and not reports(node, ns),
                 120, 2, diagnostics=dump)
    finally:
        node.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


# ---- a crash in a TrainJob: the rank's exit in the report ----------------------------------------------
def test_a_crashed_rank_of_a_trainjob_is_named_with_its_exit(node: Any, trainer: dict[str, str],
                                                             installed: Any) -> None:
    """2 nodes x torchrun with 1 process; after three all_reduces the last rank raises. The kubelet's
    word on the `node` container (torchrun's exit status, its failure summary as the termination
    message) reaches the report on the TrainJob, which names the crashed rank and its exception."""
    ns = "trainjob-crash"
    name = "llm"
    nodes = 2
    crashed = nodes - 1
    try:
        new_namespace(node, ns, labels=INJECT)
        script_configmap(node, ns, f"{name}-script", CRASH_PY)
        job = node.plane.apply(trainjob(name, ns, num_nodes=nodes, nproc=1, command=["torchrun", "/scripts/train.py"]))
        uid = job["metadata"]["uid"]
        dump = dump_state(node, ns, "trainjob", name, f"jobset.sigs.k8s.io/jobset-name={name}", ("node",))

        def names_the_crashed_rank() -> dict[str, Any] | None:
            got = reports(node, ns)
            for report in got:
                if report["diagnosis"]["who"]["culpritRanks"] == [crashed] and crashed in exits_in(report):
                    return dict(report)
            return None

        report = wait_for(f"a report naming rank {crashed} with its exit", names_the_crashed_rank, 300, 2,
                          diagnostics=dump)
        text = json.dumps(report, indent=1)
        assert report["metadata"]["ownerReferences"][0]["uid"] == uid, text
        assert report["diagnosis"]["what"]["category"] == "RankStopped", text
        mine = exits_in(report)[crashed]
        assert mine["exit_code"] == 1 and mine["message"] == f"RuntimeError: {CRASH_MESSAGE}", mine
        described = node.kubectl("-n", ns, "describe", "trainjob", name).stdout
        assert CONDITION in described, described
    finally:
        node.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
