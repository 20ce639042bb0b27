"""What the operator knows about the jobs it watches: an in-memory store fed by kopf's events.

The operator writes it (`JobStore`); everything else reads it through `JobsView`, whose answers are
immutable snapshots (`JobView`), safe to hand to a web UI: `frscope/webui` reads the watched jobs and
each one's latest diagnosis from here and never writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from frscope.operator.model.objects import JobKey, JobRef, PodInfo
from frscope.wire import SidecarStatus


@dataclass(frozen=True, slots=True)
class LatestDiagnosis:
    incident: str
    category: str
    verdict: str
    culprit_ranks: tuple[int, ...]
    report_name: str
    at: str  # RFC 3339
    report: dict[str, Any]  # frscope.report.report_to_dict shape (treat as read-only)
    # frscope.report.timeline.build_timeline(dumpset, report), built once per diagnosis (the recorders
    # themselves are not kept); None when it could not be built
    timeline: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class RankSeen:
    """One rank as its pod's sidecar last answered `/v1/status`: state 'ok', 'stalled' or 'unreachable'
    (the sidecar did not answer, or could not reach the rank); `detail` is one short line."""

    rank: int
    pod: str
    state: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class JobView:
    ref: JobRef
    world_size: int | None
    conditions: tuple[dict[str, Any], ...]
    pods: tuple[PodInfo, ...]
    stalled: bool
    status_checked_at: float | None  # time.time() of the last sidecar status poll
    latest: LatestDiagnosis | None
    ranks: tuple[RankSeen, ...] = ()  # by rank, from the last status sweep
    ranks_changed_at: float | None = None  # time.time() when `ranks` last changed
    # an incident kept from before an operator restart (`JobStore.restore`) whose job has not been seen
    # since: only its latest diagnosis is known
    archived: bool = False

    @property
    def key(self) -> JobKey:
        return self.ref.key

    @property
    def state(self) -> str:
        """The training operator's view (last condition type), as `kubectl get` shows it."""
        return str(self.conditions[-1].get("type", "")) if self.conditions else ""


class JobsView(Protocol):
    """Read-only access for other components (the web UI)."""

    def jobs(self) -> list[JobView]: ...

    def job(self, key: JobKey) -> JobView | None: ...


@dataclass(slots=True)
class _Job:
    ref: JobRef | None = None
    raw_world_size: int | None = None
    conditions: tuple[dict[str, Any], ...] = ()
    pods: dict[str, PodInfo] = field(default_factory=dict)
    gone_pods: dict[str, float] = field(default_factory=dict)  # deleted pod -> when (pushes may name them)
    stalled: bool = False
    status_checked_at: float | None = None
    latest: LatestDiagnosis | None = None
    pod_ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)  # pod -> ranks it last reported
    ranks: tuple[RankSeen, ...] = ()
    ranks_changed_at: float | None = None


def _stall_detail(status: SidecarStatus) -> dict[int, str]:
    out: dict[int, str] = {}
    for s in sorted(status.stalls, key=lambda s: (s.seq if s.seq is not None else 1 << 62, s.group)):
        if s.rank not in out:
            where = f"{s.op or 'a collective'}" + (f" #{s.seq}" if s.seq is not None else "")
            out[s.rank] = (f"waits in {s.where()}" if s.unrecorded
                           else f"no progress in {where} of group {s.desc or s.group}")
    return out


class JobStore:
    """Mutable side, used by the operator only. Single event loop: no locks needed."""

    GONE_POD_MEMORY_S = 3600.0

    def __init__(self, on_latest: Callable[[JobRef, LatestDiagnosis], None] | None = None) -> None:
        self._jobs: dict[JobKey, _Job] = {}
        # incident views kept from before a restart, until their job shows up again (or is gone for good)
        self._archived: dict[JobKey, tuple[JobRef, LatestDiagnosis]] = {}
        self._on_latest = on_latest  # e.g. keep it on disk (evidence.incident_archive)

    def restore(self, ref: JobRef, latest: LatestDiagnosis) -> None:
        """An incident view kept from before a restart: shown as the job's latest diagnosis when the job
        (same uid) is seen again, and listed as archived until then."""
        job = self._jobs.get(ref.key)
        if job is None or job.ref is None:
            self._archived[ref.key] = (ref, latest)
        elif job.ref.uid == ref.uid and job.latest is None:
            job.latest = latest

    # -- writes (operator) -------------------------------------------------------------------------
    def upsert_job(self, ref: JobRef, *, world_size: int | None, conditions: Iterable[dict[str, Any]]) -> None:
        job = self._jobs.setdefault(ref.key, _Job())
        if job.ref is not None and job.ref.uid != ref.uid:
            self._jobs[ref.key] = job = _Job()  # same name, new job: forget the old one
        job.ref = ref
        job.raw_world_size = world_size
        job.conditions = tuple(dict(c) for c in conditions)
        kept = self._archived.pop(ref.key, None)
        if kept is not None and kept[0].uid == ref.uid and job.latest is None:
            job.latest = kept[1]

    def accepts(self, ref: JobRef) -> bool:
        """False for a job whose key (namespace/name) is taken by a watched job of another kind: a
        PyTorchJob and a TrainJob (or JobSet) of one name share the key, and the first one keeps it."""
        job = self._jobs.get(ref.key)
        return job is None or job.ref is None or job.ref.kind == ref.kind

    def remove_job(self, key: JobKey) -> None:
        self._jobs.pop(key, None)
        self._archived.pop(key, None)

    def upsert_pod(self, pod: PodInfo) -> None:
        key = JobKey(pod.namespace, pod.job_name)
        known = self._jobs.get(key)
        if known is not None and known.ref is not None and known.ref.job_kind.family != pod.family:
            return  # a pod of another kind's job that happens to share the name
        job = self._jobs.setdefault(key, _Job())
        job.pods[pod.name] = pod
        job.gone_pods.pop(pod.name, None)

    def remove_pod(self, pod: PodInfo) -> None:
        job = self._jobs.get(JobKey(pod.namespace, pod.job_name))
        if job is None:
            return
        job.pods.pop(pod.name, None)
        job.pod_ranks.pop(pod.name, None)
        now = time.monotonic()
        job.gone_pods[pod.name] = now
        for name, when in list(job.gone_pods.items()):
            if now - when > self.GONE_POD_MEMORY_S:
                job.gone_pods.pop(name)
        if job.ref is None and not job.pods:
            self._jobs.pop(JobKey(pod.namespace, pod.job_name), None)

    def is_stalled(self, key: JobKey) -> bool:
        """What the last status sweep (or a stall reported since) said of the job (cheap: no view)."""
        job = self._jobs.get(key)
        return job is not None and job.stalled

    def set_status(self, key: JobKey, *, stalled: bool) -> None:
        job = self._jobs.get(key)
        if job is not None:
            job.stalled = stalled
            job.status_checked_at = time.time()

    def set_sidecars(self, key: JobKey, answers: dict[str, SidecarStatus], failures: dict[str, str]) -> None:
        """Each rank's state from one status sweep: the pods that answered, and those that did not (their
        ranks are the ones they reported last)."""
        job = self._jobs.get(key)
        if job is None:
            return
        seen: dict[int, RankSeen] = {}
        for pod, status in sorted(answers.items()):
            stalled = _stall_detail(status)
            job.pod_ranks[pod] = tuple(r.rank for r in status.ranks) or tuple(sorted(stalled))
            for r in status.ranks:
                if r.rank in stalled:
                    seen[r.rank] = RankSeen(r.rank, pod, "stalled", stalled[r.rank])
                elif not r.up:
                    seen[r.rank] = RankSeen(r.rank, pod, "unreachable",
                                            f"the sidecar gets no answer from it: {r.error or 'no reason given'}")
                else:
                    seen[r.rank] = RankSeen(r.rank, pod, "ok")
            for rank, detail in stalled.items():
                seen.setdefault(rank, RankSeen(rank, pod, "stalled", detail))
        for pod, why in sorted(failures.items()):
            for rank in job.pod_ranks.get(pod, ()):
                detail = f"sidecar of {pod} not answering: {why}"[:200]
                seen.setdefault(rank, RankSeen(rank, pod, "unreachable", detail))
        ranks = tuple(v for _, v in sorted(seen.items()))
        if ranks != job.ranks:
            job.ranks = ranks
            job.ranks_changed_at = time.time()

    def set_latest(self, key: JobKey, latest: LatestDiagnosis) -> None:
        job = self._jobs.get(key)
        if job is not None:
            job.latest = latest
            if self._on_latest is not None and job.ref is not None:
                self._on_latest(job.ref, latest)

    # -- reads -------------------------------------------------------------------------------------
    def _view(self, job: _Job) -> JobView | None:
        if job.ref is None:
            return None
        order = sorted(job.pods.values(), key=lambda p: (p.replica_type != "Master", p.replica_index or 0, p.name))
        pods = tuple(order)
        # The spec's ranks, else what torchrun's env in the pods says (a TrainJob whose runtime holds
        # numNodes/numProcPerNode); else the analysis goes by the dumps alone.
        hints = [p.world_size_hint for p in pods if p.world_size_hint]
        world_size = job.raw_world_size or (max(hints) if hints else None)
        return JobView(job.ref, world_size, job.conditions, pods, job.stalled, job.status_checked_at,
                       job.latest, job.ranks, job.ranks_changed_at)

    def _archived_view(self, key: JobKey) -> JobView | None:
        kept = self._archived.get(key)
        if kept is None or (key in self._jobs and self._jobs[key].ref is not None):
            return None
        ref, latest = kept
        return JobView(ref, latest.report.get("world_size") if isinstance(latest.report.get("world_size"), int)
                       else None, (), (), False, None, latest, archived=True)

    def jobs(self) -> list[JobView]:
        views = [self._view(j) for _, j in sorted(self._jobs.items())]
        views += [self._archived_view(k) for k in sorted(self._archived)]
        return [v for v in views if v is not None]

    def job(self, key: JobKey) -> JobView | None:
        job = self._jobs.get(key)
        view = self._view(job) if job is not None else None
        return view if view is not None else self._archived_view(key)

    def gone_pods(self, key: JobKey) -> set[str]:
        job = self._jobs.get(key)
        return set(job.gone_pods) if job else set()

    def pod_counts(self) -> tuple[int, int]:
        """(jobs known with a ref, pods of those jobs)."""
        jobs = [j for j in self._jobs.values() if j.ref is not None]
        return len(jobs), sum(len(j.pods) for j in jobs)

    def job_of_pod(self, namespace: str, pod: str) -> JobKey | None:
        for key, job in self._jobs.items():
            if key.namespace == namespace and (pod in job.pods or pod in job.gone_pods):
                return key
        return None


def without_report(view: JobView) -> JobView:
    """A lighter copy for listings."""
    if view.latest is None:
        return view
    return replace(view, latest=replace(view.latest, report={}, timeline=None))
