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
namespaces the caller may read. With 'port-forward' (the default) a loopback connection is let in
too: inside the operator's pod only `kubectl port-forward` makes one, and the API server has
authorized that (`pods/portforward` in the operator's namespace).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from frscope.operator.kube import KubeError
from frscope.operator.model.objects import JobKey
from frscope.operator.model.store import JobsView, JobView
from frscope.operator.serve.access import Identity, Reviewer, bearer
from frscope.operator.serve.operator_http import OperatorHttp
from frscope.webui import JobDetail, JobSummary, RankStatus, create_app
from frscope.webui.app import DEFAULT_POLL_S, VISIBLE_NAMESPACE

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


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _loopback(request: web.Request) -> bool:
    try:
        return request.remote is not None and ipaddress.ip_address(request.remote).is_loopback
    except ValueError:
        return False


def _refuse(status: int, message: str) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="frscope"'} if status == 401 else None
    return web.json_response({"error": message}, status=status, headers=headers)


def ui_guard(mode: str, reviewer: Reviewer | None) -> Any:
    """The aiohttp middleware of `--ui-auth` (None for 'none')."""
    if mode == "none":
        return None
    if reviewer is None:
        raise ValueError(f"--ui-auth {mode} needs the API server to review tokens")

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if mode == "port-forward" and _loopback(request):
            return await handler(request)
        token = bearer(request.headers.get("Authorization", ""))
        if token is None:
            return _refuse(401, "a bearer token is required (or use kubectl port-forward)")
        try:
            who = await reviewer.authenticate(token, None)
        except KubeError as exc:
            return _refuse(503, f"the token could not be reviewed: {exc}")
        if who is None:
            return _refuse(401, "token refused by the API server")
        namespace = request.match_info.get("namespace")
        if namespace is not None:
            if not await _may_read(reviewer, who, namespace):
                return _refuse(403, f"{who.username} may not get pytorchjobs in namespace {namespace}")
        else:
            async def visible(ns: str) -> bool:
                return await _may_read(reviewer, who, ns)

            request[VISIBLE_NAMESPACE] = visible
        return await handler(request)

    return guard


async def _may_read(reviewer: Reviewer, who: Identity, namespace: str) -> bool:
    try:
        return await reviewer.allowed(who, verb="get", namespace=namespace)
    except KubeError:
        return False


def mount_ui(http: OperatorHttp, store: JobsView, *, prefix: str = UI_PREFIX, poll_s: float = DEFAULT_POLL_S,
             guard: Any = None) -> None:
    """Serve the web UI at `{prefix}/` in the operator's HTTP server (call before it starts), behind
    `guard` (`ui_guard()`) when given."""
    http.add_subapp(prefix, create_app(OperatorJobs(store), poll_s=poll_s,
                                       middlewares=[guard] if guard is not None else []))
