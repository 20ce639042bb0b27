"""How each job kind is restarted and stopped through the mechanisms its own controller honours.

One small class per kind (PyTorchJob today; TrainJob and JobSet later, docs/actions.md): the Actor
asks a kind whether the job can still be acted on, why its controller would not bring it back after
a restart, and how to stop it. Restarting is the same for every kind: delete every pod of the job
(each by uid, so a re-run after a crash never touches the replacements).

Kubeflow training operator v1.8.1 (pkg/controller.v1/common/pod.go ReconcilePods,
pkg/controller.v1/common/job.go ReconcileJobs, read for this):
- a replica index with no pod gets a new pod whatever the restartPolicy: deleted pods come back;
- a pod seen in phase Failed (the kubelet gives a deleted pod a terminal phase before it goes) is
  restarted for OnFailure and Always, for ExitCode only when the trainer's exit code is >= 128
  (SIGTERM: 143; a trainer that traps SIGTERM and exits with 1 fails the job), and with Never the
  job is marked Failed. So a job with a Never replica is not restarted (it would end instead);
- `runPolicy.suspend: true` deletes the pods and services and sets the Suspended condition; the job
  resumes when it is set back to false. Kueue owns that field for the jobs it queues (label
  kueue.x-k8s.io/queue-name) and un-suspends an admitted job, so frscope does not stop those by
  suspending (deactivating the Kueue Workload would be the way; not done).
"""

from __future__ import annotations

from typing import Any, Protocol

from frscope.operator import names
from frscope.operator.kube import PODS, PYTORCHJOBS, Conflict, KubeClient, NotFound, Resource
from frscope.operator.objects import JobRef


class JobKind(Protocol):
    resource: Resource

    def label_selector(self, ref: JobRef) -> str: ...

    def inactive(self, job: dict[str, Any]) -> str | None:
        """Why the job cannot be acted on any more (finished, suspended), else None."""

    def restart_refusal(self, job: dict[str, Any]) -> str | None:
        """Why deleting the pods would not bring the job back, else None."""

    def stop_refusal(self, job: dict[str, Any]) -> str | None: ...

    async def stop(self, kube: KubeClient, ref: JobRef, reason: str) -> None: ...


def _conditions(job: dict[str, Any]) -> list[dict[str, Any]]:
    status = job.get("status") if isinstance(job.get("status"), dict) else {}
    assert isinstance(status, dict)
    return [c for c in status.get("conditions") or [] if isinstance(c, dict)]


class PyTorchJobKind:
    resource = PYTORCHJOBS

    def label_selector(self, ref: JobRef) -> str:
        return f"{names.LABEL_JOB_NAME}={ref.name}"

    @staticmethod
    def _run_policy(job: dict[str, Any]) -> dict[str, Any]:
        spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
        assert isinstance(spec, dict)
        policy = spec.get("runPolicy")
        return policy if isinstance(policy, dict) else {}

    def inactive(self, job: dict[str, Any]) -> str | None:
        if (job.get("metadata") or {}).get("deletionTimestamp"):
            return "the job is being deleted"
        if self._run_policy(job).get("suspend") is True:
            return "the job is suspended"
        for c in _conditions(job):
            if c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True":
                return f"the job has {str(c.get('type')).lower()}"
        return None

    def restart_refusal(self, job: dict[str, Any]) -> str | None:
        spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
        assert isinstance(spec, dict)
        replicas = spec.get("pytorchReplicaSpecs")
        never = sorted(rtype for rtype, rs in (replicas.items() if isinstance(replicas, dict) else [])
                       if isinstance(rs, dict) and rs.get("restartPolicy") == "Never")
        if never:
            return (f"replica type(s) {', '.join(never)} have restartPolicy Never: the training operator would "
                    "mark the job Failed instead of recreating its pods")
        return None

    def stop_refusal(self, job: dict[str, Any]) -> str | None:
        labels = (job.get("metadata") or {}).get("labels") or {}
        if isinstance(labels, dict) and labels.get(names.LABEL_KUEUE_QUEUE):
            return (f"the job is queued by Kueue ({names.LABEL_KUEUE_QUEUE}={labels[names.LABEL_KUEUE_QUEUE]}), "
                    "which owns runPolicy.suspend and would resume it")
        return None

    async def stop(self, kube: KubeClient, ref: JobRef, reason: str) -> None:
        # runPolicy.suspend: the training operator deletes the pods and services and keeps the job (and
        # so its report, which the job owns) with a Suspended condition; the verdict goes beside it.
        patch = {"metadata": {"uid": ref.uid, "annotations": {names.ANN_STOPPED: reason}},
                 "spec": {"runPolicy": {"suspend": True}}}
        await kube.merge_patch(self.resource, ref.namespace, ref.name, patch)


KINDS: dict[str, JobKind] = {names.JOB_KIND: PyTorchJobKind()}


def kind_of(ref: JobRef) -> JobKind | None:
    return KINDS.get(ref.kind)


async def job_pods(kube: KubeClient, kind: JobKind, ref: JobRef) -> list[tuple[str, str]]:
    """(name, uid) of every pod the job owns (by label and ownerReference uid), not already deleting."""
    pods = await kube.list(PODS, ref.namespace, label_selector=kind.label_selector(ref))
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict)]
        if ref.uid and not any(o.get("uid") == ref.uid for o in owners):
            continue
        if meta.get("deletionTimestamp"):
            continue
        out.append((str(meta.get("name") or ""), str(meta.get("uid") or "")))
    return sorted(out)


async def delete_pods(kube: KubeClient, namespace: str, pods: list[tuple[str, str]]) -> int:
    """Delete each pod by uid; one already gone (or replaced) counts as done. Returns how many were deleted."""
    deleted = 0
    for name, uid in pods:
        try:
            await kube.delete(PODS, namespace, name, uid=uid or None)
            deleted += 1
        except (NotFound, Conflict):
            pass  # gone already, or a new pod of that name (uid precondition): not ours to delete
    return deleted
