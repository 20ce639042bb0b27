"""Job kinds: which pods belong to which job, how many ranks the spec says, the condition's shape."""

from __future__ import annotations

from typing import Any

import pytest

from frscope.operator.model import jobkinds
from frscope.operator.model.objects import JobRef, job_ref, job_world_size, pod_info
from frscope.operator.model.signals import SignalKind, job_condition_signal
from frscope.operator.model.store import JobStore
from frscope.operator.publish.condition import for_kind, make_condition, place_condition


def trainjob_pod(name: str, job: str, index: int, *, container: str = "node") -> dict[str, Any]:
    """What the JobSet controller (v0.12.0) and the batch Job controller put on a TrainJob's pod."""
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": {
            "jobset.sigs.k8s.io/jobset-name": job, "jobset.sigs.k8s.io/replicatedjob-name": "node",
            "jobset.sigs.k8s.io/job-index": str(index), "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
            "batch.kubernetes.io/job-completion-index": "0", "job-name": f"{job}-node-{index}"}},
        "spec": {"containers": [{"name": container}, ]},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": container, "restartCount": 2, "state": {"running": {}}}]},
    }


def test_a_trainjob_pod_is_found_by_jobset_labels() -> None:
    pod = pod_info(trainjob_pod("t-node-1-0-abc", "t", 1))
    assert (pod.job_name, pod.replica_type, pod.replica_index, pod.family) == ("t", "node", 1, jobkinds.FAMILY_JOBSET)
    assert pod.run == 2  # Trainer's trainer container is called "node"


def test_a_pytorchjob_pod_keeps_its_labels() -> None:
    labels = {"training.kubeflow.org/job-name": "p", "training.kubeflow.org/replica-type": "worker",
              "training.kubeflow.org/replica-index": "3"}
    found = jobkinds.pod_job(labels)
    assert found == jobkinds.PodJob(jobkinds.FAMILY_KUBEFLOW_V1, "p", "worker", 3)
    assert jobkinds.pod_job({"app": "x"}) is None


def test_completion_index_stands_in_for_a_missing_job_index() -> None:
    found = jobkinds.pod_job({"jobset.sigs.k8s.io/jobset-name": "j", "batch.kubernetes.io/job-completion-index": "5"})
    assert found is not None and found.replica_index == 5


def test_world_size_per_kind() -> None:
    trainjob = {"kind": "TrainJob", "spec": {"trainer": {"numNodes": 2, "numProcPerNode": 4}}}
    assert job_world_size(trainjob) == 8
    # 'auto' or absent (the runtime decides): only the pods know.
    assert job_world_size({"kind": "TrainJob", "spec": {"trainer": {"numNodes": 2, "numProcPerNode": "auto"}}}) is None
    assert job_world_size({"kind": "TrainJob", "spec": {"runtimeRef": {"name": "torch-distributed"}}}) is None
    container = {"name": "node", "env": [{"name": "PET_NPROC_PER_NODE", "value": "2"}]}
    jobset = {"kind": "JobSet", "spec": {"replicatedJobs": [
        {"name": "node", "replicas": 3, "template": {"spec": {"parallelism": 2,
                                                              "template": {"spec": {"containers": [container]}}}}}]}}
    assert job_world_size(jobset) == 12
    no_env = {"kind": "JobSet", "spec": {"replicatedJobs": [
        {"name": "n", "replicas": 3, "template": {"spec": {"template": {"spec": {"containers": [{"name": "n"}]}}}}}]}}
    assert job_world_size(no_env) is None
    assert job_world_size({"kind": "PyTorchJob", "spec": {"nprocPerNode": "2", "pytorchReplicaSpecs": {
        "Master": {"replicas": 1}, "Worker": {"replicas": 3}}}}) == 8


def test_a_pod_s_torchrun_env_gives_the_world_size_the_trainjob_does_not_say() -> None:
    pod = trainjob_pod("t-node-0-0-a", "t", 0)
    pod["spec"]["containers"][0]["env"] = [{"name": "PET_NNODES", "value": "4"},
                                           {"name": "PET_NPROC_PER_NODE", "value": "8"},
                                           {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]
    assert pod_info(pod).world_size_hint == 32
    store = JobStore()
    ref = JobRef("ml", "t", "u", "trainer.kubeflow.org/v1alpha1", "TrainJob")
    store.upsert_job(ref, world_size=None, conditions=[])
    store.upsert_pod(pod_info(pod))
    view = store.job(ref.key)
    assert view is not None and view.world_size == 32
    store.upsert_job(ref, world_size=16, conditions=[])  # the spec says it: the spec wins
    view = store.job(ref.key)
    assert view is not None and view.world_size == 16
    pod["spec"]["containers"][0]["env"][1]["value"] = "auto"
    assert pod_info(pod).world_size_hint is None


def test_parse_keys() -> None:
    assert jobkinds.parse_keys(["trainjob,pytorchjob"]) == (jobkinds.PYTORCHJOB, jobkinds.TRAINJOB)
    assert jobkinds.parse_keys(["jobset", " JobSet "]) == (jobkinds.JOBSET,)
    with pytest.raises(ValueError, match="unknown job kind 'mpijob'"):
        jobkinds.parse_keys(["mpijob"])
    with pytest.raises(ValueError, match="no job kind"):
        jobkinds.parse_keys([","])


def test_trainers_jobset_is_not_a_job_of_its_own() -> None:
    owned = {"metadata": {"ownerReferences": [
        {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "t", "uid": "u"}]}}
    assert jobkinds.owned_by_trainjob(owned)
    assert not jobkinds.owned_by_trainjob({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "TrainJob"}]}})
    assert not jobkinds.owned_by_trainjob({"metadata": {}})


def test_job_ref_knows_its_kind_and_generation() -> None:
    ref = job_ref({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                   "metadata": {"name": "t", "namespace": "ml", "uid": "u", "generation": 3}})
    assert ref.job_kind is jobkinds.TRAINJOB and ref.generation == 3
    assert ref.job_kind.resource.plural == "trainjobs"


def test_a_metav1_condition_has_observed_generation_and_no_update_time() -> None:
    ours = make_condition("RankNotJoined", "Rank 1 never joined all_reduce #4", "2026-01-01T00:00:00Z")
    assert "lastUpdateTime" in ours  # the training operator's JobCondition has it
    shaped = for_kind(ours, jobkinds.TRAINJOB, 7)
    assert set(shaped) == {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"}
    assert shaped["observedGeneration"] == 7
    assert for_kind(ours, jobkinds.PYTORCHJOB, 7) is ours
    long = for_kind(make_condition("X", "é" * 20000, "t"), jobkinds.JOBSET, None)
    assert len(long["message"].encode()) <= jobkinds.CONDITION_MESSAGE_MAX and long["message"].endswith("...")
    # Trainer's own conditions stay, in their order, after frscope's.
    trainer = [{"type": "Created", "status": "True", "reason": "JobSetCreated", "message": "m",
                "lastTransitionTime": "t"}]
    assert place_condition(trainer, shaped) == [shaped, *trainer]


def test_a_failed_trainjob_is_a_signal() -> None:
    ref = JobRef("ml", "t", "u", "trainer.kubeflow.org/v1alpha1", "TrainJob")
    failed = [{"type": "Created", "status": "True"}, {"type": "Failed", "status": "True", "reason": "JobSetFailed"}]
    sig = job_condition_signal(ref.key, failed, jobkinds.TRAINJOB)
    assert sig is not None and sig.kind is SignalKind.JOB_FAILED
    assert job_condition_signal(ref.key, [{"type": "Complete", "status": "True"}], jobkinds.TRAINJOB) is None


def test_a_name_taken_by_another_kind_is_kept_by_the_first() -> None:
    store = JobStore()
    first = JobRef("ml", "x", "u1", "kubeflow.org/v1", "PyTorchJob")
    store.upsert_job(first, world_size=None, conditions=[])
    assert not store.accepts(JobRef("ml", "x", "u2", "jobset.x-k8s.io/v1alpha2", "JobSet"))
    assert store.accepts(JobRef("ml", "x", "u3", "kubeflow.org/v1", "PyTorchJob"))
    # A JobSet's pod of that name does not join the PyTorchJob.
    store.upsert_pod(pod_info(trainjob_pod("x-node-0-0-a", "x", 0)))
    view = store.job(first.key)
    assert view is not None and not view.pods
