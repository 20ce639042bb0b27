"""The web UI over the operator's job store: `OperatorJobs` implements `frscope.webui.JobProvider` on a
read-only `JobsView`, and `mount_ui()` serves it at `/ui/` in the operator's HTTP server.

What a job page shows comes from two places the operator already keeps up to date:

- the status sweep (`StatusPoller` -> `Controller.on_status` -> `JobStore.set_sidecars`): each rank ok,
  stalled or unreachable (its sidecar did not answer, or could not reach the rank); ranks of a pod that
  failed are 'failed'; ranks of the job that no sidecar reports are 'missing';
- the latest published diagnosis (`LatestDiagnosis`): the report and the timeline built once from that
  diagnosis's dumps (no recorders are kept). Before the first diagnosis the page shows the status only.

Everything here reads immutable snapshots; nothing is written.

Access (`ui_guard`, `--ui-auth`): a bearer token the API server accepts (TokenReview), and a
SubjectAccessReview `get pytorchjobs` in the namespace of the job asked for; the job list shows the
namespaces the caller may read. With 'port-forward' (the default) a `kubectl port-forward` connection
is let in too (`guards.port_forwarded`: from 127.0.0.1/::1, `Host` naming loopback, no proxy headers).
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from frscope.operator import names
from frscope.operator.evidence.incident_bundles import IncidentBundles
from frscope.operator.kube import KubeError
from frscope.operator.ledger import NodeLedger
from frscope.operator.model.objects import JobKey
from frscope.operator.model.store import JobsView, JobView
from frscope.operator.serve.access import Identity, Reviewer
from frscope.operator.serve.guards import authenticated, port_forwarded, refuse
from frscope.operator.serve.live_windows import LiveWindow, LiveWindows
from frscope.operator.serve.operator_http import OperatorHttp
from frscope.webui import JobDetail, JobSummary, NodeIncidentRow, NodeSummary, RankStatus, create_app
from frscope.webui.routes import DEFAULT_POLL_S, VISIBLE_NAMESPACE, VISIBLE_NODES

UI_PREFIX = "/ui"
MAX_MISSING_RANKS = 65_536  # list ranks nobody reports only for a plausible world size
FIRST_WINDOW_WAIT_S = 8.0


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
        state=view.state or ("archived (kept from before an operator restart)" if view.archived else ""),
        stalled=view.stalled or any(s.state == "stalled" for s in ranks.values()),
        category=latest.category if latest is not None else None,
        culprit_ranks=tuple(latest.culprit_ranks) if latest is not None else (),
        world_size=world_size if isinstance(world_size, int) else None,
        updated_at=max(times) if times else None,
    )


def _revision(summary: JobSummary, ranks: dict[int, RankStatus], view: JobView, live: LiveWindow | None) -> str:
    latest = view.latest
    small: dict[str, Any] = {
        "live": live.fingerprint if live is not None else None,
        "summary": summary.to_dict(),
        "ranks": [[r, s.state, s.detail] for r, s in sorted(ranks.items())],
        # a new diagnosis is a new LatestDiagnosis (incident, time): its report and timeline come with it
        "latest": [latest.incident, latest.at, latest.report_name, latest.timeline is not None] if latest else None,
    }
    text = json.dumps(small, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def shows_incident(view: JobView, ranks: dict[int, RankStatus]) -> bool:
    """Whether the page shows the latest diagnosis's timeline rather than the live window: while the job
    is stalled, or one of its ranks is stalled or failed (the incident is still what is going on)."""
    return view.latest is not None and view.latest.timeline is not None and (
        view.stalled or any(s.state in ("stalled", "failed") for s in ranks.values()))


class OperatorJobs:
    """`frscope.webui.JobProvider` over the operator's store (answers from memory, synchronously), with
    the live window of the jobs someone looks at (`live`)."""

    def __init__(self, store: JobsView, live: LiveWindows | None = None,
                 bundles: IncidentBundles | None = None) -> None:
        self._store = store
        self._live = live
        self._bundles = bundles

    def jobs(self) -> list[JobSummary]:
        return [job_summary(v) for v in self._store.jobs()]

    def job(self, namespace: str, name: str) -> JobDetail | None:
        view = self._store.job(JobKey(namespace, name))
        if view is None:
            return None
        ranks = rank_status(view)
        summary = job_summary(view, ranks)
        latest = view.latest
        timeline = latest.timeline if latest is not None else None
        window = None
        perf = None
        if self._live is not None and not view.archived:  # an archived job has no pods to ask
            self._live.watch(view.key)
            window = self._live.window(view.key)
            if window is not None and window.timeline is not None and not shows_incident(view, ranks):
                timeline = window.timeline
                perf = window.perf
            else:
                window = None
        return JobDetail(
            summary=summary,
            report=latest.report if latest is not None else None,
            timeline=timeline,
            ranks=ranks,
            perf=perf,
            revision=_revision(summary, ranks, view, window),
        )

    async def incident_bundle(self, namespace: str, name: str) -> tuple[Path, str] | None:
        """The kept bundle of the job's latest incident and the incident's id (`GET .../bundle`)."""
        view = self._store.job(JobKey(namespace, name))
        if self._bundles is None or view is None or view.latest is None:
            return None
        incident = view.latest.incident
        path = await asyncio.to_thread(self._bundles.kept, namespace, name, incident)
        return (path, incident) if path is not None else None

    async def fresh_timeline(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The live window's timeline, waiting a few seconds for the first one (`GET .../trace.json`)."""
        if self._live is None:
            return None
        window = await self._live.wait_for(JobKey(namespace, name), FIRST_WINDOW_WAIT_S)
        return window.timeline if window is not None else None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def ui_guard(mode: str, reviewer: Reviewer | None) -> Any:
    """The aiohttp middleware of `--ui-auth` (None for 'none'); see `guards`."""
    if mode == "none":
        return None
    if reviewer is None:
        raise ValueError(f"--ui-auth {mode} needs the API server to review tokens")

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if mode == "port-forward" and port_forwarded(request):
            return await handler(request)
        who = await authenticated(request, reviewer)
        if isinstance(who, web.Response):
            return who
        namespace = request.match_info.get("namespace")
        if namespace is not None:
            if not await _may_read(reviewer, who, namespace):
                return refuse(403, f"{who.username} may not get pytorchjobs in namespace {namespace}")
        else:
            async def visible(ns: str) -> bool:
                return await _may_read(reviewer, who, ns)

            async def nodes_visible() -> bool:
                try:
                    return await reviewer.allowed(who, verb="list", namespace="", group=names.REPORT_GROUP,
                                                  resource=names.NODE_LEDGER_PLURAL)
                except KubeError:
                    return False

            request[VISIBLE_NAMESPACE] = visible
            request[VISIBLE_NODES] = nodes_visible
        return await handler(request)

    return guard


async def _may_read(reviewer: Reviewer, who: Identity, namespace: str) -> bool:
    try:
        return await reviewer.allowed(who, verb="get", namespace=namespace)
    except KubeError:
        return False


class LedgerNodes:
    """`frscope.webui.NodeProvider` over the node ledger's latest read (answers from memory)."""

    def __init__(self, ledger: NodeLedger) -> None:
        self._ledger = ledger

    def nodes(self) -> list[NodeSummary]:
        out = []
        for entry, assessment in list(self._ledger.latest.values()):
            recent = tuple(NodeIncidentRow(i.at, i.job, i.category, i.evidence.value, i.weight, i.why)
                           for i in reversed(entry.incidents[-8:]))
            out.append(NodeSummary(
                node=entry.node, score=assessment.score, incidents=assessment.incidents, jobs=assessment.jobs,
                last_incident=assessment.last_incident, state=assessment.state.value, why=assessment.why,
                pool=entry.pool, fence=entry.fence.state if entry.fence else "",
                fence_message=entry.fence.message if entry.fence else "", recent=recent))
        return out


def mount_ui(http: OperatorHttp, store: JobsView, *, prefix: str = UI_PREFIX, poll_s: float = DEFAULT_POLL_S,
             guard: Any = None, live: LiveWindows | None = None, ledger: NodeLedger | None = None,
             bundles: IncidentBundles | None = None) -> None:
    """Serve the web UI at `{prefix}/` in the operator's HTTP server (call before it starts), behind
    `guard` (`ui_guard()`) when given; `live`: follow the jobs looked at (stopped with the server); with the
    node ledger, its page at `{prefix}/nodes`."""
    app = create_app(OperatorJobs(store, live, bundles), poll_s=poll_s,
                     middlewares=[guard] if guard is not None else [],
                     nodes=LedgerNodes(ledger) if ledger is not None else None)
    if live is not None:
        app.on_cleanup.append(live.close)
    http.add_subapp(prefix, app)
