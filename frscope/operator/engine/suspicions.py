"""Suspected stalls and stragglers the sidecars report (docs/operator.md, "Suspected stalls and
stragglers"): published at once as *not yet confirmed*, cleared when the job moves on.

A sidecar suspects a group when a collective has waited far beyond the group's own rhythm (4-15 s,
long before its `--stall-after`) and pushes its capture (`reason: suspect`); the status sweep sees
it too. The operator then gathers every pod of the job at once (the gather of a confirmed stall:
windowed snapshots of fresh recorders, `GatherOptions`), analyzes, and writes:
  - frscope's condition on the job with status `Unknown`: reason the finding's category, message
    "suspected, not confirmed: ..." (Kubernetes' way of saying the condition is not known yet);
  - a Warning Event `SuspectedStall` naming the culprit rank, its pod and node;
  - `frscope_operator_suspected_stalls_total{outcome="published"}`.
No report object: the FlightRecorderReport is written when the stall is confirmed, by the incident
flow, which replaces the condition with status `True`. When a sweep finds no pod of the job suspected
or stalled any more, the suspicion is over: the condition turns status `False`, reason `Resumed`,
and a Normal Event `Resumed` says after how long.

Stragglers: a rank its sidecar reports as a straggler among its pod's ranks gets a Warning Event
`Straggler` on the job (rank, pod, node, its share of the job's time), once per episode, and a Normal
`StragglerKeepsUp` when its sidecar stops reporting it. Across pods (engine/pod_stragglers, off the
event loop): a pod the others keep waiting for (a slow node, or the pod of a slow rank that has no
peer in its pod) gets the same Events, naming its rank, the pod and its node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from frscope.analysis import AnalysisOptions, Report
from frscope.operator import names
from frscope.operator.actions import culprit_placement
from frscope.operator.engine.jobstate import JobState, job_fields
from frscope.operator.engine.kept_suspicion import KeptSuspicion, event_key, kept_suspicion, suspicion_report_name
from frscope.operator.engine.pod_stragglers import PodStragglers
from frscope.operator.engine.publishing import rfc3339
from frscope.operator.engine.settings import OperatorConfig
from frscope.operator.evidence.diagnosis import diagnose
from frscope.operator.evidence.gather import Decoder
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.evidence.settle import collect
from frscope.operator.evidence.sidecars import SidecarClient
from frscope.operator.kube import KubeError
from frscope.operator.model.objects import JobKey, JobRef
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.model.store import JobStore, JobView
from frscope.operator.publish import JobGone, Publisher, clip_line, make_condition
from frscope.operator.publish.report_cr import build_suspicion_cr, state_patch
from frscope.report import one_line
from frscope.wire import GroupStall, RankLate, SidecarStatus

log = logging.getLogger(__name__)

# A suspicion another process published is this wait's when it is no older than the oldest suspected
# wait (+ slack); a pushed suspicion carries no ages: then at most this old.
KEPT_WINDOW_S = 120.0
KEPT_SLACK_S = 5.0

# The analysis' own stall threshold for a suspicion's gather (its default, 10 s, would call a 5 s old
# hang healthy): half the youngest suspected wait (the sidecar already judged the wait against the
# job's rhythm), at least MIN_ANALYSIS_STALL_S; for a pushed suspicion, which carries no ages, half the
# sidecar's default --suspect-min.
MIN_ANALYSIS_STALL_S = 1.0
PUSHED_ANALYSIS_STALL_S = 2.0


@dataclass(slots=True)
class Suspicion:
    since_wall: float
    since_mono: float
    detail: str
    youngest_age_s: float | None
    published: bool = False
    task: asyncio.Task[None] | None = None
    report: str | None = None  # the job's suspicion report, once written
    ref: JobRef | None = None
    oldest_age_s: float | None = None
    event_key: str = ""  # what its Events' names are made from (kept_suspicion.event_key)


@dataclass(slots=True)
class Straggling:
    pod: str
    since_wall: float
    late: RankLate


@dataclass(slots=True)
class JobWatch:
    suspicion: Suspicion | None = None
    stragglers: dict[int, Straggling] = field(default_factory=dict)
    # Whether this process looked for a suspicion another one published (kept_suspicion): once per job.
    kept_checked: bool = False


class Suspicions:
    def __init__(self, config: OperatorConfig, *, store: JobStore, pushes: PushStore, sidecars: SidecarClient,
                 publisher: Publisher, metrics: OperatorMetrics, decoder: Decoder,
                 job_state: Callable[[JobKey], JobState],
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]) -> None:
        self.config = config
        self.store = store
        self.pushes = pushes
        self.sidecars = sidecars
        self.publisher = publisher
        self.metrics = metrics
        self.decoder = decoder
        self._job_state = job_state
        self._spawn = spawn
        self._jobs: dict[JobKey, JobWatch] = {}
        self.pods = PodStragglers(config, metrics, self._event, spawn)

    def _watch(self, key: JobKey) -> JobWatch:
        watch = self._jobs.get(key)
        if watch is None:
            watch = self._jobs[key] = JobWatch()
        return watch

    def current(self, key: JobKey) -> Suspicion | None:
        watch = self._jobs.get(key)
        return watch.suspicion if watch is not None else None

    # -- suspicions ----------------------------------------------------------------------------------

    def suspect(self, key: JobKey, detail: str, suspects: tuple[GroupStall, ...] = ()) -> None:
        """A sidecar suspects a stall of the job (a push or a status answer): gather and publish it
        now, unless the job already has a suspicion (or a confirmed stall: the caller's to know)."""
        watch = self._watch(key)
        if watch.suspicion is not None:
            return
        watch.kept_checked = True  # _publish carries on a kept one
        ages = [s.age_s for s in suspects if s.age_s is not None]
        suspicion = Suspicion(time.time(), time.monotonic(), detail, min(ages) if ages else None,
                              oldest_age_s=max(ages) if ages else None)
        watch.suspicion = suspicion
        log.info("job %s: suspected stall (%s): gathering at once", key, detail, extra=job_fields(key))
        suspicion.task = self._spawn(self._publish(key, suspicion))

    def confirmed(self, key: JobKey) -> None:
        """The stall is confirmed (a sidecar's --stall-after passed): the incident flow takes over."""
        watch = self._watch(key)
        suspicion = watch.suspicion
        if suspicion is None:
            if not watch.kept_checked and self._shows_suspicion(key):  # another process published it
                watch.kept_checked = True
                self._spawn(self._kept_confirmed(key))
            return
        watch.suspicion = None
        if suspicion.task is not None and not suspicion.task.done():
            suspicion.task.cancel()
        self.metrics.suspicions.labels(outcome="confirmed").inc()
        after = time.monotonic() - suspicion.since_mono
        log.info("job %s: suspected stall confirmed after %.1f s", key, after, extra=job_fields(key))
        self._spawn(self._report_state(suspicion, names.REPORT_STATE_CONFIRMED, _confirmed_message(after)))

    def on_sweep(self, key: JobKey, statuses: dict[str, SidecarStatus]) -> None:
        """One sweep's answers for the job: a suspicion is over when no pod that answered suspects or
        has a stall; stragglers come and go."""
        if not statuses:
            return
        watch = self._watch(key)
        suspicion = watch.suspicion
        quiet = not any(st.suspects or st.stalls or st.stalled for st in statuses.values())
        if suspicion is None and quiet and not watch.kept_checked and self._shows_suspicion(key):
            watch.kept_checked = True
            self._spawn(self._kept_resumed(key))
        if suspicion is not None and quiet:
            watch.suspicion = None
            if suspicion.task is not None and not suspicion.task.done():
                suspicion.task.cancel()
            self.metrics.suspicions.labels(outcome="resumed").inc()
            after = time.monotonic() - suspicion.since_mono
            log.info("job %s: suspected stall resumed after %.0f s", key, after, extra=job_fields(key))
            if suspicion.published:
                self._spawn(self._resumed(key, suspicion, after))
        self._stragglers(key, watch, statuses)

    def forget(self, key: JobKey) -> None:
        self.pods.forget(key)
        watch = self._jobs.pop(key, None)
        if watch is not None and watch.suspicion is not None and watch.suspicion.task is not None:
            watch.suspicion.task.cancel()

    async def _publish(self, key: JobKey, suspicion: Suspicion) -> None:
        view = self.store.job(key)
        if view is None or await self._carry_on(view, suspicion):
            return
        gathered = await collect(self.sidecars, view, self.config.gather, self.pushes, gone_pods=set(),
                                 decoder=self.decoder)
        self.metrics.gather_duration.observe(gathered.duration_s)
        stall_s = min(self.config.stuck_after_s, PUSHED_ANALYSIS_STALL_S)
        if suspicion.youngest_age_s is not None:
            stall_s = min(self.config.stuck_after_s, max(MIN_ANALYSIS_STALL_S, suspicion.youngest_age_s / 2))
        options = AnalysisOptions(stall_after_s=stall_s, clock_skew_ms=self.config.clock_skew_ms)
        diagnosis = await diagnose(gathered, view.world_size, options)
        report = diagnosis.report
        if report.healthy or not report.findings:
            self.metrics.suspicions.labels(outcome="unnamed").inc()
            log.info("job %s: suspected stall: the gather named no culprit (%d ranks)", key, len(report.ranks_loaded),
                     extra=job_fields(key))
            return
        if self.current(key) is not suspicion or self.store.is_stalled(key):
            return  # resumed or confirmed while gathering
        finding = report.findings[0]
        rank_pods = {d.rank: pod for pod, evidence in gathered.pods.items() for d in evidence.dumps}
        pods, nodes, _by_node = culprit_placement(finding, rank_pods, view.pods)
        waited = time.time() - suspicion.since_wall
        verdict = one_line(finding).rstrip(".")
        where = f"; pod {', '.join(pods)}" if pods else ""
        where += f" on node {', '.join(nodes)}" if nodes else ""
        at = rfc3339()
        suspicion.event_key = event_key(at)
        condition = make_condition(finding.category.value, clip_line(f"Suspected, not confirmed: {verdict}"), at)
        condition["status"] = "Unknown"
        message = clip_line(f"suspected stall, not confirmed yet ({suspicion.detail}; confirmed at the sidecars' "
                            f"--stall-after): {verdict}{where}")
        await self._write_report(view, suspicion, report, diagnosis.missing_pods,
                                 (finding.category.value, condition["message"]), at)
        if await self._write(view, condition, names.REASON_SUSPECTED, message, suspicion, "Warning"):
            suspicion.published = True
            self.metrics.suspicions.labels(outcome="published").inc()
            log.warning("job %s: suspected stall published %.1f s after the suspicion: %s%s", key, waited, verdict,
                        where, extra=job_fields(key))

    async def _resumed(self, key: JobKey, suspicion: Suspicion, after_s: float) -> None:
        view = self.store.job(key)
        if view is None or self.store.is_stalled(key):
            return
        condition = make_condition(names.CONDITION_REASON_RESUMED,
                                   f"The job moved on after {after_s:.0f} s: the suspected stall was not one",
                                   rfc3339())
        condition["status"] = "False"
        await self._report_state(suspicion, names.REPORT_STATE_RESUMED,
                                 f"Resumed after {after_s:.0f} s: the job moved on, the suspected stall was not one.")
        await self._write(view, condition, names.REASON_RESUMED,
                          f"resumed after {after_s:.0f} s: the suspected stall ({suspicion.detail}) was not one",
                          suspicion, "Normal")

    async def _write_report(self, view: JobView, suspicion: Suspicion, report: Report, missing: dict[str, str],
                            condition: tuple[str, str], at: str) -> None:
        """The job's suspicion report (`<job>-suspicion`, state Suspected), made or made again."""
        body = build_suspicion_cr(view.ref, report, signal=suspicion.detail, missing_pods=missing, at=at,
                                  condition=condition, message=condition[1],
                                  limit_bytes=self.config.report_limit_bytes)
        # Named before the write: a confirmation that cancels this task mid-write still moves it on.
        suspicion.report, suspicion.ref = body["metadata"]["name"], view.ref
        try:
            await self.publisher.put_report(view.ref, body)
        except JobGone:
            suspicion.report = None
        except KubeError as exc:
            suspicion.report = None
            self.metrics.publish_errors.labels(step="report").inc()
            log.error("job %s: suspicion report not written: %s", view.key, exc, extra=job_fields(view.key))

    async def _report_state(self, suspicion: Suspicion, phase: str, message: str) -> None:
        """Move the suspicion's report (if one was written) to Resumed or Confirmed."""
        if suspicion.report is None or suspicion.ref is None:
            return
        try:
            patch = state_patch(phase, message, rfc3339())
            await self.publisher.set_report_state(suspicion.ref, suspicion.report, patch)
        except KubeError as exc:
            self.metrics.publish_errors.labels(step="report").inc()
            log.error("job %s: suspicion report %s not moved to %s: %s", suspicion.ref.key, suspicion.report, phase,
                      exc, extra=job_fields(suspicion.ref.key))

    async def _write(self, view: JobView, condition: dict[str, Any], reason: str, message: str,
                     suspicion: Suspicion, event_type: str) -> bool:
        """The condition (kept first and re-asserted like a diagnosis') and one Event; False if the job
        is gone or the API server refused the condition."""
        try:
            await self.publisher.assert_condition(view.ref, condition)
            self._job_state(view.key).asserted = (view.ref.uid, condition)
            await self._event(view.ref, reason, message, suspicion.event_key or f"s{int(suspicion.since_wall * 1000)}",
                              event_type)
        except JobGone:
            return False
        except KubeError as exc:
            self.metrics.publish_errors.labels(step="condition").inc()
            log.error("job %s: %s not published: %s", view.key, reason, exc, extra=job_fields(view.key))
            return False
        return True

    async def _event(self, ref: JobRef, reason: str, message: str, incident: str, event_type: str) -> None:
        try:
            await self.publisher.post_event(ref, reason=reason, message=clip_line(message), incident=incident,
                                            now=rfc3339(), event_type=event_type)
        except KubeError as exc:
            self.metrics.publish_errors.labels(step="event").inc()
            log.error("job %s: Event %s not posted: %s", ref.key, reason, exc, extra=job_fields(ref.key))

    # -- a suspicion another process published --------------------------------------------------------

    def _shows_suspicion(self, key: JobKey) -> bool:
        """The job's condition of frscope's says Unknown: a suspicion this process may not know of (a leader
        killed mid-incident published it). Only then is the suspicion report read, not for every job."""
        view = self.store.job(key)
        ours = [c for c in view.conditions if c.get("type") == names.CONDITION_TYPE] if view is not None else []
        return bool(ours) and ours[0].get("status") == "Unknown"

    async def _kept(self, view: JobView) -> KeptSuspicion | None:
        try:
            obj = await self.publisher.get_report(view.ref, suspicion_report_name(view.ref))
        except KubeError as exc:
            log.warning("job %s: could not read its suspicion report: %s", view.key, exc, extra=job_fields(view.key))
            return None
        return kept_suspicion(view.ref, obj)

    def _adopt(self, view: JobView, suspicion: Suspicion, kept: KeptSuspicion) -> None:
        suspicion.report, suspicion.ref, suspicion.published = kept.report, view.ref, True
        suspicion.event_key = event_key(kept.at)
        suspicion.since_mono -= max(0.0, suspicion.since_wall - kept.since_wall)
        suspicion.since_wall = min(suspicion.since_wall, kept.since_wall)

    async def _carry_on(self, view: JobView, suspicion: Suspicion) -> bool:
        """A suspicion of this same wait that another process published (its report is no older than the
        oldest suspected wait): carried on, its condition and Event asserted again under their own names
        (no second Event), no gather. False: none, publish this one."""
        if not self._shows_suspicion(view.key):
            return False
        kept = await self._kept(view)
        window = suspicion.oldest_age_s if suspicion.oldest_age_s is not None else KEPT_WINDOW_S
        if kept is None or kept.since_wall < time.time() - window - KEPT_SLACK_S:
            return False
        if self.current(view.key) is not suspicion:
            return True  # resumed or confirmed meanwhile
        self._adopt(view, suspicion, kept)
        condition = make_condition(kept.condition[0], kept.condition[1], kept.at)
        condition["status"] = "Unknown"
        await self._write(view, condition, names.REASON_SUSPECTED,
                          f"suspected stall, not confirmed yet ({suspicion.detail}): {kept.condition[1]}", suspicion,
                          "Warning")
        log.info("job %s: carries on the suspected stall published at %s (report %s)", view.key, kept.at, kept.report,
                 extra=job_fields(view.key))
        return True

    async def _kept_confirmed(self, key: JobKey) -> None:
        """The stall is confirmed and this process published no suspicion: one another published moves on."""
        view = self.store.job(key)
        kept = await self._kept(view) if view is not None else None
        if view is None or kept is None:
            return
        after = time.time() - kept.since_wall
        try:
            await self.publisher.set_report_state(view.ref, kept.report, state_patch(
                names.REPORT_STATE_CONFIRMED, _confirmed_message(after), rfc3339()))
        except KubeError as exc:
            self.metrics.publish_errors.labels(step="report").inc()
            log.error("job %s: suspicion report %s not moved to Confirmed: %s", key, kept.report, exc,
                      extra=job_fields(key))
            return
        log.info("job %s: suspicion report %s (published by another process) confirmed", key, kept.report,
                 extra=job_fields(key))

    async def _kept_resumed(self, key: JobKey) -> None:
        """The job is quiet and this process published no suspicion: one another published is over."""
        view = self.store.job(key)
        kept = await self._kept(view) if view is not None else None
        if view is None or kept is None or self.current(key) is not None:
            return
        suspicion = Suspicion(time.time(), time.monotonic(), "published before this process started", None)
        self._adopt(view, suspicion, kept)
        await self._resumed(key, suspicion, time.time() - kept.since_wall)

    # -- stragglers ------------------------------------------------------------------------------------

    def _stragglers(self, key: JobKey, watch: JobWatch, statuses: dict[str, SidecarStatus]) -> None:
        view = self.store.job(key)
        if view is None:
            return
        nodes = {p.name: p.node for p in view.pods}
        now: dict[int, tuple[str, RankLate]] = {
            late.rank: (pod, late) for pod, st in statuses.items() for late in st.stragglers
        }
        answered = set(statuses)
        for rank, (pod, late) in sorted(now.items()):
            if rank in watch.stragglers:
                watch.stragglers[rank].late = late
                continue
            watch.stragglers[rank] = Straggling(pod, time.time(), late)
            self.metrics.stragglers.inc()
            node = f" on node {nodes[pod]}" if nodes.get(pod) else ""
            message = (f"rank {rank} (pod {pod}{node}) is a straggler: late at {late.late} of the last "
                       f"{late.compared} collectives of group {late.group} by {late.lateness_s:.3f} s on average; "
                       f"it costs the job {100 * late.share:.0f}% of its time")
            log.warning("job %s: %s", key, message, extra=job_fields(key))
            self._spawn(self._event(view.ref, names.REASON_STRAGGLER, message,
                                    f"late{rank}-{int(time.time() * 1000)}", "Warning"))
        for rank in [r for r, s in watch.stragglers.items() if r not in now and s.pod in answered]:
            gone = watch.stragglers.pop(rank)
            message = (f"rank {rank} (pod {gone.pod}) keeps up again after {time.time() - gone.since_wall:.0f} s "
                       f"as a straggler")
            log.info("job %s: %s", key, message, extra=job_fields(key))
            self._spawn(self._event(view.ref, names.REASON_STRAGGLER_GONE, message,
                                    f"kept{rank}-{int(time.time() * 1000)}", "Normal"))
        self.pods.on_sweep(key, view.ref, statuses, nodes, lambda: list(watch.stragglers))


def _confirmed_message(after_s: float) -> str:
    return (f"Confirmed after {after_s:.0f} s (the sidecars' --stall-after passed): the incident's own report has "
            f"the diagnosis.")
