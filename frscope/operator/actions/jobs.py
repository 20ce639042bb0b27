"""The I/O of restarting and stopping a job, as its kind (jobkinds.JobKind) says: which pods are the
job's, which JobSet runs it, which Kueue Workload admits it, and the writes themselves.

- restart deletes every pod of the job, each by uid (a re-run after a crash never touches the
  replacements), after the kind's refusal was asked (for a TrainJob: about the JobSet it owns).
- stop suspends the job (`JobKind.stop_patch`), or, for a job Kueue queues (label
  kueue.x-k8s.io/queue-name), deactivates its Workload: Kueue owns the suspend field of the jobs it
  queues and un-suspends an admitted one ("Job admitted, unsuspending", Kueue v0.17.0 jobframework
  reconciler), while a Workload with `spec.active: false` is evicted (Kueue then suspends the job) and
  never admitted again until set back to true. The Workload is the one whose ownerReference is the job.
"""

from __future__ import annotations

from typing import Any, Final

from frscope.operator import names
from frscope.operator.actions.impact import parse_time
from frscope.operator.kube import PODS, Conflict, Forbidden, KubeClient, NotFound, Resource
from frscope.operator.model import jobkinds
from frscope.operator.model.jobkinds import JobKind
from frscope.operator.model.objects import JobRef

# Kueue's Workload: v1beta2 since Kueue v0.15 (the storage version of v0.17), v1beta1 before (still
# served, deprecated). `spec.active` is the same field in both.
WORKLOAD_VERSIONS: Final = (Resource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload"),
                            Resource("kueue.x-k8s.io", "v1beta1", "workloads", "Workload"))
JOBSETS: Final = jobkinds.JOBSET.resource

# (why not, or None; the targets: 'pod/<name>/<uid>', 'job/<name>', 'workload/<name>')
Plan = tuple[str | None, tuple[str, ...]]


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(isinstance(o, dict) and o.get("uid") == uid for o in _meta(obj).get("ownerReferences") or [])


async def running_jobset(kube: KubeClient, kind: JobKind, ref: JobRef, job: dict[str, Any]) -> dict[str, Any] | None:
    """The JobSet whose Jobs run the job's pods: the job itself for a bare JobSet, the JobSet of the same
    name that a TrainJob owns, None for a kind without one (or a TrainJob Trainer has not built yet)."""
    if kind is jobkinds.JOBSET:
        return job
    if kind is not jobkinds.TRAINJOB:
        return None
    try:
        jobset = await kube.get(JOBSETS, ref.namespace, ref.name)
    except NotFound:
        return None
    return jobset if not ref.uid or _owned_by(jobset, ref.uid) else None


async def job_pods(kube: KubeClient, kind: JobKind, ref: JobRef, jobset: dict[str, Any] | None = None
                   ) -> list[tuple[str, str]]:
    """(name, uid) of every pod of the job not already deleting. A PyTorchJob's pods are owned by it
    (uid); a JobSet's by its batch Jobs, so they count when labelled with its name and made no earlier
    than the JobSet (the pods of an older JobSet of that name are not its)."""
    pods = await kube.list(PODS, ref.namespace, label_selector=kind.pod_selector(ref.name))
    since = parse_time(_meta(jobset).get("creationTimestamp")) if jobset is not None else None
    out = []
    for pod in pods:
        meta = _meta(pod)
        if meta.get("deletionTimestamp"):
            continue
        if kind.runs_on_jobset:
            created = parse_time(meta.get("creationTimestamp"))
            if since is not None and (created is None or created < since):
                continue
        elif ref.uid and not _owned_by(pod, ref.uid):
            continue
        out.append((str(meta.get("name") or ""), str(meta.get("uid") or "")))
    return sorted(out)


async def restart_plan(kube: KubeClient, kind: JobKind, ref: JobRef, job: dict[str, Any]) -> Plan:
    try:
        jobset = await running_jobset(kube, kind, ref, job) if kind.runs_on_jobset else None
    except Forbidden:  # a dry run without restart allowed: the chart grants `jobsets get` with restart
        return "frscope may not read the JobSet that runs the job (jobsets get comes with restart allowed)", ()
    refusal = kind.restart_refusal(job, jobset)
    if refusal:
        return refusal, ()
    pods = await job_pods(kube, kind, ref, jobset)
    if not pods:
        return "the job has no pods", ()
    return None, tuple(f"pod/{name}/{uid}" for name, uid in pods)


async def _workloads(kube: KubeClient, namespace: str) -> tuple[Resource, list[dict[str, Any]]] | None:
    for resource in WORKLOAD_VERSIONS:
        try:
            return resource, await kube.list(resource, namespace)
        except NotFound:
            continue  # this version is not served (an older or newer Kueue, or none)
    return None


async def kueue_workload(kube: KubeClient, ref: JobRef) -> tuple[Resource, dict[str, Any]] | None:
    """The job's Kueue Workload (owned by it) that has not finished, with the version it was read at."""
    found = await _workloads(kube, ref.namespace)
    if found is None:
        return None
    resource, items = found
    for wl in items:
        if not _owned_by(wl, ref.uid):
            continue
        status = wl.get("status") if isinstance(wl.get("status"), dict) else {}
        finished = any(isinstance(c, dict) and c.get("type") == "Finished" and c.get("status") == "True"
                       for c in (status or {}).get("conditions") or [])
        if not finished:
            return resource, wl
    return None


async def stop_plan(kube: KubeClient, kind: JobKind, ref: JobRef, job: dict[str, Any]) -> Plan:
    queue = jobkinds.kueue_queue(job)
    if queue is None:
        return None, (f"job/{ref.name}",)
    try:
        found = await kueue_workload(kube, ref)
    except Forbidden:  # a dry run without stop allowed: the chart grants `workloads` list with stop
        return (f"the job is queued by Kueue ({names.LABEL_KUEUE_QUEUE}={queue}) and frscope may not read its "
                "Workload (workloads list comes with stop allowed)"), ()
    if found is None:
        return (f"the job is queued by Kueue ({names.LABEL_KUEUE_QUEUE}={queue}), which owns "
                f"{kind.suspend_field}, and no Workload of it was found to deactivate"), ()
    return None, (f"workload/{_meta(found[1]).get('name')}", f"job/{ref.name}")


async def stop(kube: KubeClient, kind: JobKind, ref: JobRef, targets: tuple[str, ...], reason: str) -> str:
    """Carry out a stop planned by stop_plan; returns what was done (one sentence)."""
    workload = next((t.split("/", 1)[1] for t in targets if t.startswith("workload/")), None)
    if workload is None:
        await kube.merge_patch(kind.resource, ref.namespace, ref.name, kind.stop_patch(ref.uid, reason))
        return f"Stopped the hung job ({kind.suspend_field}: true; resume by setting it back to false)"
    patch = {"metadata": {"annotations": {names.ANN_STOPPED: reason}}, "spec": {"active": False}}
    last: NotFound | None = None
    for resource in WORKLOAD_VERSIONS:
        try:
            await kube.merge_patch(resource, ref.namespace, workload, patch)
            break
        except NotFound as exc:
            last = exc
    else:
        assert last is not None
        raise last
    # The verdict beside the job too, where people look; Kueue suspends the job itself.
    await kube.merge_patch(kind.resource, ref.namespace, ref.name,
                           {"metadata": {"uid": ref.uid, "annotations": {names.ANN_STOPPED: reason}}})
    return (f"Stopped the hung job the Kueue way: Workload {workload} spec.active: false (Kueue evicts it and "
            f"suspends the job, and does not admit it again until active is set back to true)")


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
