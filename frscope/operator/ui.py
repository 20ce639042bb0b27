"""The web UI over the operator's job store: `OperatorJobs` implements `frscope.webui.JobProvider` on a
read-only `JobsView`, and `mount_ui()` serves it at `/ui/` in the operator's HTTP server.

What a job page shows comes from two places the operator already keeps up to date:

- the status sweep (`StatusPoller` -> `Controller.on_status` -> `JobStore.set_sidecars`): each rank ok,
  stalled or unreachable (its sidecar did not answer, or could not reach the rank); ranks of a pod that
  failed are 'failed'; ranks of the job that no sidecar reports are 'missing';
- the latest published diagnosis (`LatestDiagnosis`): the report and the timeline built once from that
  diagnosis's dumps (no recorders are kept). Before the first diagnosis the page shows the status only.

Everything here reads immutable snapshots; nothing is written.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any

from frscope.operator.http import OperatorHttp
from frscope.operator.objects import JobKey
from frscope.operator.store import JobsView, JobView
from frscope.webui import JobDetail, JobSummary, RankStatus, create_app
from frscope.webui.app import DEFAULT_POLL_S

UI_PREFIX = "/ui"
MAX_MISSING_RANKS = 65_536  # list ranks nobody reports only for a plausible world size


def _epoch(rfc3339: str) -> float | None:
    try:
        moment = datetime.datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
    return moment.timestamp()


def rank_status(view: JobView) -> dict[int, RankStatus]:
    """Each rank's state now, from the last status sweep and the pods' phases."""
    failed_pods = {p.name for p in view.pods if p.phase == "Failed"}
    out: dict[int, RankStatus] = {}
    for seen in view.ranks:
        if seen.pod in failed_pods:
            out[seen.rank] = RankStatus("failed", f"pod {seen.pod} failed")
        else:
            out[seen.rank] = RankStatus(seen.state, seen.detail)
    world = view.world_size
    if out and world is not None and 0 < world <= MAX_MISSING_RANKS:
        for rank in range(world):
            if rank not in out:
                out[rank] = RankStatus("missing", "no sidecar reports this rank")
    return out


def job_summary(view: JobView, ranks: dict[int, RankStatus] | None = None) -> JobSummary:
    ranks = rank_status(view) if ranks is None else ranks
    latest = view.latest
    report = latest.report if latest is not None else {}
    healthy = report.get("healthy")
    world_size = view.world_size if view.world_size is not None else report.get("world_size")
    times = [t for t in (view.ranks_changed_at, _epoch(latest.at) if latest else None) if t is not None]
    return JobSummary(
        namespace=view.ref.namespace,
        name=view.ref.name,
        verdict=(str(report.get("verdict") or latest.verdict)) if latest is not None else None,
        healthy=(bool(healthy) if healthy is not None else False) if latest is not None else None,
        state=view.state,
        stalled=view.stalled or any(s.state == "stalled" for s in ranks.values()),
        category=latest.category if latest is not None else None,
        culprit_ranks=tuple(latest.culprit_ranks) if latest is not None else (),
        world_size=world_size if isinstance(world_size, int) else None,
        updated_at=max(times) if times else None,
    )


def _revision(summary: JobSummary, ranks: dict[int, RankStatus], view: JobView) -> str:
    latest = view.latest
    small: dict[str, Any] = {
        "summary": summary.to_dict(),
        "ranks": [[r, s.state, s.detail] for r, s in sorted(ranks.items())],
        # a new diagnosis is a new LatestDiagnosis (incident, time): its report and timeline come with it
        "latest": [latest.incident, latest.at, latest.report_name, latest.timeline is not None] if latest else None,
    }
    text = json.dumps(small, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class OperatorJobs:
    """`frscope.webui.JobProvider` over the operator's store (answers from memory, synchronously)."""

    def __init__(self, store: JobsView) -> None:
        self._store = store

    def jobs(self) -> list[JobSummary]:
        return [job_summary(v) for v in self._store.jobs()]

    def job(self, namespace: str, name: str) -> JobDetail | None:
        view = self._store.job(JobKey(namespace, name))
        if view is None:
            return None
        ranks = rank_status(view)
        summary = job_summary(view, ranks)
        latest = view.latest
        return JobDetail(
            summary=summary,
            report=latest.report if latest is not None else None,
            timeline=latest.timeline if latest is not None else None,
            ranks=ranks,
            revision=_revision(summary, ranks, view),
        )


def mount_ui(http: OperatorHttp, store: JobsView, *, prefix: str = UI_PREFIX, poll_s: float = DEFAULT_POLL_S) -> None:
    """Serve the web UI at `{prefix}/` in the operator's HTTP server (call before it starts)."""
    http.add_subapp(prefix, create_app(OperatorJobs(store), poll_s=poll_s))
