"""Acting on a published diagnosis, once: read the incident's report (the evidence is written first),
decide (policy.decide), claim the action in the report (resourceVersion precondition), act through the
job's kind (jobkinds.JobKind, with the I/O in jobs) or on the node (cordon), then record the outcome,
post the Event, count it.

Called by the Controller right after a publish, and again for a diagnosed incident whose action is
not final (the operator restarted mid-incident): the report's action record decides what is left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from frscope.operator import names
from frscope.operator.actions import cordon, jobs, record
from frscope.operator.actions.cordon import CordonOptions
from frscope.operator.actions.impact import Saving, saving
from frscope.operator.actions.policy import Decision, Policy, decide, requested_policy
from frscope.operator.actions.record import ActionRecord
from frscope.operator.kube import NAMESPACES, REPORTS, Conflict, Forbidden, KubeClient, KubeError, NotFound
from frscope.operator.model import jobkinds
from frscope.operator.model.jobkinds import JobKind
from frscope.operator.model.objects import JobRef
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.publish import Publisher, clip_line

log = logging.getLogger(__name__)

RATE_WINDOW_S = 3600.0


@dataclass(frozen=True, slots=True)
class ActionOptions:
    allowed: frozenset[Policy] = frozenset()
    default_policy: Policy = Policy.NONE
    rate_per_hour: int = 3  # actions (restart, stop, cordon) per namespace in any hour
    cordon: CordonOptions = field(default_factory=CordonOptions)
    namespaces: tuple[str, ...] = ()  # watched namespaces (empty: all); where reports are counted

    def __post_init__(self) -> None:
        if self.rate_per_hour < 0 or self.cordon.min_jobs < 1 or self.cordon.max_nodes < 0 \
                or self.cordon.window_s <= 0:
            raise ValueError("--action-rate must be >= 0, --cordon-min-jobs >= 1, --cordon-max-nodes >= 0 and "
                             "--cordon-window > 0")


def _rfc3339(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


@dataclass(slots=True)
class _Incident:
    """One report as read for acting."""

    ref: JobRef
    report: dict[str, Any]
    name: str
    incident: str
    category: str
    ambiguous: bool
    verdict: str

    @classmethod
    def of(cls, ref: JobRef, report: dict[str, Any]) -> _Incident:
        diagnosis = report.get("diagnosis") or {}
        what = diagnosis.get("what") or {}
        return cls(ref, report, str((report.get("metadata") or {}).get("name") or ""),
                   str((report.get("job") or {}).get("incident") or ""), str(what.get("category") or ""),
                   bool(what.get("ambiguous")), str(diagnosis.get("verdict") or ""))

    def saving(self, now: float) -> Saving:
        what = (self.report.get("diagnosis") or {}).get("what") or {}
        stalled = what.get("stalledForSeconds")
        return saving(self.report.get("impact") or {}, float(stalled) if isinstance(stalled, (int, float)) else None,
                      (self.report.get("job") or {}).get("gatheredAt"), now)

    @property
    def gpus(self) -> int:
        return int((self.report.get("impact") or {}).get("gpus") or 0)


class Actor:
    def __init__(self, kube: KubeClient, publisher: Publisher, metrics: OperatorMetrics, options: ActionOptions,
                 *, instance: str) -> None:
        self._kube = kube
        self._publisher = publisher
        self._metrics = metrics
        self.options = options
        self._instance = instance
        self._settled: set[tuple[str, str]] = set()  # (namespace, report) whose action is final
        self._namespace_forbidden = False
        # One decision at a time: the rate limit (per namespace) and the cordon budget (cluster-wide) are
        # counted from the reports, so a decision must see the claims of the ones before it.
        self._lock = asyncio.Lock()

    async def on_incident(self, ref: JobRef, report_name: str) -> ActionRecord | None:
        """Act on this incident's report if its policy says so and nothing was done yet. Never raises
        for API errors (logged; the next signal of the job tries again)."""
        key = (ref.namespace, report_name)
        if not report_name or key in self._settled:
            return None
        kind = jobkinds.find(ref.kind)
        if kind is None:
            self._settled.add(key)
            return None
        try:
            async with self._lock:
                result = await self._act(kind, ref, report_name)
        except KubeError as exc:
            log.error("job %s: acting on report %s failed: %s", ref.key, report_name, exc)
            return None
        if result is None or result.state in record.FINAL:
            self._settled.add(key)
        return result

    async def _namespace_annotations(self, namespace: str) -> dict[str, Any]:
        if self._namespace_forbidden:
            return {}
        try:
            obj = await self._kube.get(NAMESPACES, None, namespace)
        except Forbidden:
            # The chart grants `namespaces get` only with actions switched on.
            self._namespace_forbidden = True
            log.info("no permission to read Namespaces: namespace defaults of %s are not read", names.ANN_ON_DIAGNOSIS)
            return {}
        except NotFound:
            return {}
        annotations = (obj.get("metadata") or {}).get("annotations")
        return annotations if isinstance(annotations, dict) else {}

    async def _act(self, kind: JobKind, ref: JobRef, report_name: str) -> ActionRecord | None:
        try:
            report = await self._kube.get(REPORTS, ref.namespace, report_name)
        except NotFound:
            return None  # no evidence written: nothing is done without it
        existing = ActionRecord.from_json(report.get("action"))
        if existing is not None and existing.state in record.FINAL:
            # An operator killed between writing the outcome and posting its Event left it unsaid: post
            # it again (its name is derived from the incident and reason, so a second post is a no-op).
            await self._post_outcome(_Incident.of(ref, report), existing, existing.message)
            return existing
        try:
            job = await self._kube.get(kind.resource, ref.namespace, ref.name)
        except NotFound:
            return None
        if ref.uid and (job.get("metadata") or {}).get("uid") != ref.uid:
            return None
        inc = _Incident.of(ref, report)
        now = time.time()
        if existing is not None:  # 'acting': claimed before a crash; finish the same action
            log.warning("job %s: finishing the %s claimed at %s", ref.key, existing.action, existing.at)
            return await self._perform(kind, inc, existing, now)
        job_annotations = (job.get("metadata") or {}).get("annotations")
        requested = requested_policy(job_annotations if isinstance(job_annotations, dict) else {},
                                     await self._namespace_annotations(ref.namespace), self.options.default_policy)
        decision = decide(requested, self.options.allowed, inc.category, inc.ambiguous)
        if decision.act is Policy.NONE:
            if requested.policy is Policy.NONE:
                return None  # nothing asked: nothing written
            return await self._conclude(inc, self._record(decision, record.SKIPPED, now), decision.why, skip=True)
        # A cordon is about the node: it applies whatever became of the job that revealed it.
        inactive = kind.inactive(job) if decision.act is not Policy.CORDON else None
        if inactive is not None:
            return await self._conclude(inc, self._record(decision, record.SKIPPED, now),
                                        f"not acting: {inactive}", skip=True)
        would = decision.act if decision.act is not Policy.DRY_RUN else (
            requested.policy if requested.policy is not Policy.DRY_RUN else Policy.RESTART)
        if decision.act is Policy.DRY_RUN:
            return await self._dry_run(kind, inc, decision, would, job, now)
        refusal, targets = await self._targets(kind, inc, decision.act, job, now)
        if refusal is not None:
            return await self._conclude(inc, self._record(decision, record.SKIPPED, now), refusal, skip=True)
        claim = self._record(decision, record.ACTING, now, targets)
        try:
            await self._write(inc, claim, resource_version=(report.get("metadata") or {}).get("resourceVersion"))
        except Conflict:
            log.info("job %s: report %s changed meanwhile (another operator claimed it?): re-read next time",
                     ref.key, report_name)
            return None
        return await self._perform(kind, inc, claim, now)

    def _record(self, decision: Decision, state: str, now: float, targets: tuple[str, ...] = ()) -> ActionRecord:
        return ActionRecord(requested=decision.requested.policy.value, source=decision.requested.source,
                            action=decision.act.value, state=state, why=clip_line(decision.why, 512),
                            at=_rfc3339(now), targets=targets)

    async def _targets(self, kind: JobKind, inc: _Incident, act: Policy, job: dict[str, Any], now: float
                       ) -> tuple[str | None, tuple[str, ...]]:
        """(why not, ()) or (None, what the action will change). What the job's kind refuses is said
        first; the rate limit is checked last, so a refusal is never reported as a rate limit."""
        if act is Policy.RESTART:
            refused, targets = await jobs.restart_plan(self._kube, kind, inc.ref, job)
            refused = f"not restarting: {refused}" if refused else None
        elif act is Policy.STOP:
            refused, targets = await jobs.stop_plan(self._kube, kind, inc.ref, job)
            refused = f"not stopping: {refused}" if refused else None
        else:
            refused, targets = await self._cordon_target(inc, now)
        if refused is not None:
            return refused, ()
        reports = await self._kube.list(REPORTS, inc.ref.namespace)
        recent = record.actions_since(reports, now - RATE_WINDOW_S)
        if recent >= self.options.rate_per_hour:
            return (f"rate limit: {recent} action(s) in namespace {inc.ref.namespace} in the last hour "
                    f"(--action-rate={self.options.rate_per_hour})"), ()
        return None, targets

    async def _cordon_target(self, inc: _Incident, now: float) -> tuple[str | None, tuple[str, ...]]:
        opts = self.options.cordon
        nodes = [str(n) for n in (inc.report.get("impact") or {}).get("culpritNodes") or []]
        if not nodes:
            return "not cordoning: the culprit ranks' node is not known", ()
        tainted = await cordon.tainted_nodes(self._kube)
        reports = await cordon.reports_for(self._kube, self.options.namespaces)
        counts = {n: len(cordon.blaming_jobs(reports, n, now - opts.window_s)) for n in nodes}
        ready = sorted(n for n, c in counts.items() if c >= opts.min_jobs and n not in tainted)
        if not ready:
            blamed = ", ".join(f"{n}: {c}" for n, c in sorted(counts.items()))
            return (f"not cordoning: jobs blaming the node within {opts.window_s / 60:.0f} min ({blamed}); "
                    f"{opts.min_jobs} needed, or already cordoned"), ()
        if len(tainted) + 1 > opts.max_nodes:
            return (f"not cordoning {ready[0]}: {len(tainted)} node(s) already cordoned by frscope "
                    f"(budget --cordon-max-nodes={opts.max_nodes})"), ()
        return None, (f"node/{ready[0]}",)

    async def _perform(self, kind: JobKind, inc: _Incident, claim: ActionRecord, now: float) -> ActionRecord:
        action = Policy(claim.action)
        save = inc.saving(now) if action is not Policy.CORDON else Saving(0.0, 0.0, 0.0)
        stamp = _rfc3339(time.time())
        try:
            if action is Policy.RESTART:
                pods = [tuple(t.split("/", 2)[1:]) for t in claim.targets if t.startswith("pod/")]
                await jobs.delete_pods(self._kube, inc.ref.namespace, [(p[0], p[1]) for p in pods if len(p) == 2])
                what = f"Restarted the hung job: deleted its {len(pods)} pod(s) for {kind.controller} to recreate"
            elif action is Policy.STOP:
                what = await jobs.stop(self._kube, kind, inc.ref, claim.targets,
                                       clip_line(f"{inc.category}: {inc.verdict}", 1024))
            else:
                node = claim.targets[0].split("/", 1)[1]
                await cordon.taint_node(self._kube, node, inc.category, stamp)
                what = f"Tainted node {node} {names.TAINT_SUSPECT}:NoSchedule"
                await cordon.post_node_event(
                    self._kube, node, incident=inc.incident, now=stamp, instance=self._instance,
                    message=f"frscope: job {inc.ref.namespace}/{inc.ref.name} and others blame this node: "
                            f"{inc.category}: {inc.verdict}")
        except KubeError as exc:
            done = claim.finished(record.FAILED, stamp, clip_line(f"{claim.action} failed: {exc}"))
            return await self._conclude(inc, done, done.message)
        message = clip_line(f"{what}. {inc.category}: {inc.verdict} {save.describe(inc.gpus)}. {claim.why}.")
        done = claim.finished(record.DONE, stamp, message, saved_seconds=save.seconds,
                              saved_gpu_seconds=save.gpu_seconds)
        self._metrics.action_saved_gpu_seconds.labels(action=action.value).inc(save.gpu_seconds)
        return await self._conclude(inc, done, message)

    async def _dry_run(self, kind: JobKind, inc: _Incident, decision: Decision, would: Policy,
                       job: dict[str, Any], now: float) -> ActionRecord:
        save = inc.saving(now) if would is not Policy.CORDON else Saving(0.0, 0.0, 0.0)
        refusal = None
        if would is Policy.RESTART:
            refusal, _ = await jobs.restart_plan(self._kube, kind, inc.ref, job)
        elif would is Policy.STOP:
            refusal, _ = await jobs.stop_plan(self._kube, kind, inc.ref, job)
        if would is Policy.CORDON:
            nodes = ", ".join(str(n) for n in (inc.report.get("impact") or {}).get("culpritNodes") or []) or "unknown"
            what = (f"Dry run: would cordon the culprit's node ({nodes}) once {self.options.cordon.min_jobs} jobs "
                    "blame it")
        else:
            what = f"Dry run: would {would.value} the job" + (f" (but {refusal})" if refusal else "")
        if would is not Policy.CORDON:
            what += f"; {save.describe(inc.gpus).replace('saved', 'would be saved')}"
        message = clip_line(f"{what}. {inc.category}: {inc.verdict} {decision.why}.")
        dry = self._record(decision, record.DRY_RUN, now).finished(record.DRY_RUN, _rfc3339(now), message,
                                                                    saved_seconds=save.seconds,
                                                                    saved_gpu_seconds=save.gpu_seconds)
        return await self._conclude(inc, dry, message)

    async def _conclude(self, inc: _Incident, rec: ActionRecord, message: str, *, skip: bool = False) -> ActionRecord:
        if skip:
            rec = rec.finished(record.SKIPPED, rec.at, clip_line(message if message == rec.why else
                                                                 f"{message} ({rec.why})"))
            message = rec.message
        await self._write(inc, rec)
        outcome = {record.DONE: "done", record.DRY_RUN: "done", record.FAILED: "failed"}.get(rec.state, "skipped")
        action = rec.action if rec.action != Policy.NONE.value else rec.requested
        if action in self._metrics.ACTION_LABELS:
            self._metrics.actions.labels(action=action, outcome=outcome).inc()
        await self._post_outcome(inc, rec, message)
        log.warning("job %s: %s", inc.ref.key, message)
        return rec

    async def _post_outcome(self, inc: _Incident, rec: ActionRecord, message: str) -> None:
        """The Event that says what became of the incident's action (a Warning when something was done
        or failed). Never raises: the outcome is in the report either way."""
        reason = _outcome_reason(rec)
        warning = rec.state in (record.DONE, record.FAILED)
        try:
            await self._publisher.post_event(inc.ref, reason=reason, message=message or rec.why,
                                             incident=inc.incident, now=rec.done_at or rec.at,
                                             event_type="Warning" if warning else "Normal")
        except KubeError as exc:
            log.error("job %s: Event %s not posted: %s", inc.ref.key, reason, exc)

    async def _write(self, inc: _Incident, rec: ActionRecord, resource_version: str | None = None) -> None:
        patch: dict[str, Any] = {"action": rec.to_json()}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        await self._kube.merge_patch(REPORTS, inc.ref.namespace, inc.name, patch)


def _outcome_reason(rec: ActionRecord) -> str:
    if rec.state == record.DONE:
        return {Policy.RESTART.value: names.REASON_RESTARTED, Policy.STOP.value: names.REASON_STOPPED,
                Policy.CORDON.value: names.REASON_CORDONED}.get(rec.action, names.REASON_ACTION_SKIPPED)
    return {record.FAILED: names.REASON_ACTION_FAILED,
            record.DRY_RUN: names.REASON_DRY_RUN}.get(rec.state, names.REASON_ACTION_SKIPPED)
