"""The operator's logic between kopf's events and the API writes.

kopf handlers call `on_job()`, `on_pod()`, `on_report()`; the HTTP push endpoint calls `on_push()`; the status
poller calls `on_status()`. Each turns what it sees into `Signal`s; `signal()` returns at once (kopf
handlers must stay fast) and the job's incident is handled in a background task, one at a time per
job (signals that arrive meanwhile are folded into the running one):

    dedupe (ledger from the job's reports) -> gather (sidecars + pushes) -> analyze -> publish
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from frscope import logs
from frscope.analysis import AnalysisOptions
from frscope.operator import names
from frscope.operator.actions import Actor, Impact, culprit_placement, job_timeout, restarted_pods, unfinished
from frscope.operator.engine.settings import OperatorConfig
from frscope.operator.evidence.diagnosis import Diagnosis, diagnose
from frscope.operator.evidence.gather import Decoder, Gathered, Target, gather
from frscope.operator.evidence.pod_evidence import PodEvidence
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.evidence.sidecars import SidecarClient
from frscope.operator.evidence.trainer_exits import rank_exits
from frscope.operator.kube import KubeError
from frscope.operator.model import jobkinds
from frscope.operator.model.incidents import Attempt, IncidentKey, IncidentRecord, Ledger, report_facts
from frscope.operator.model.objects import (
    JobKey,
    JobRef,
    PodInfo,
    job_conditions,
    job_ref,
    job_world_size,
    pod_info,
    pods_digest,
)
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.model.signals import Signal, SignalKind, exit_signals, job_condition_signal, watchdog_signals
from frscope.operator.model.store import JobStore, JobView, LatestDiagnosis
from frscope.operator.publish import (
    JobGone,
    Publication,
    Publisher,
    build_report_cr,
    clip_line,
    make_condition,
    needs_write,
    report_name,
)
from frscope.report import one_line, report_to_dict
from frscope.report.timeline import build_timeline
from frscope.wire import GroupStall, SidecarStatus

log = logging.getLogger(__name__)


def rfc3339(now: float | None = None) -> str:
    moment = datetime.datetime.fromtimestamp(time.time() if now is None else now, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


_SETTLE_POLL_S = 0.5  # how often the store is looked at while waiting for a kubelet's word on an exit
# How often one attempt's report may be revised as trainer ends arrive after it was written (bounds the
# API writes a job whose pods end one by one over minutes can cause).
MAX_REVISIONS = 3


def _job(key: JobKey, incident: str | None = None) -> dict[str, object]:
    """The job (and incident) as fields of the log record (`--log-format json` lifts them out)."""
    return logs.fields(job=key.name, namespace=key.namespace, incident=incident)


@dataclass(slots=True)
class _JobState:
    ledger: Ledger
    lock: asyncio.Lock
    pending: Signal | None = None
    running: bool = False
    first_signal_at: float | None = None
    # attempt -> (monotonic time until which, the pods' ended runs then) of the last gather that found
    # nothing to publish: quiet only while no trainer run has ended since (an exit is new evidence)
    quiet_until: dict[str, tuple[float, str]] | None = None
    # (job uid, condition) of the newest incident: the condition frscope keeps first in the job's list
    asserted: tuple[str, dict[str, Any]] | None = None
    restarts: int = 0  # torchrun's restart count the sidecars reported last (for signals that carry none)
    # Pods frscope's restart deleted (uid -> name), from the reports' action records: they end because
    # they were deleted, and their exits and pushes are the acted incident's aftermath, not a new one
    # (seen on a real node: the SIGKILLed ranks' exits were diagnosed as RankStopped and MissingDumps,
    # the latter under the new pods' attempt, which then hid the restarted job's own hang).
    retired: dict[str, str] = field(default_factory=dict)
    # attempt -> what its published diagnosis was drawn from (a later trainer end may revise it)
    published: dict[str, _Basis] = field(default_factory=dict)
    # Reports whose action was claimed and has no outcome yet (an operator died mid-action): finished
    # by the actor whatever attempt the job's pods now make (a restart's deleted pods may be gone).
    unfinished: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Basis:
    """What this process published about an attempt, and the evidence it had: the trainer ends known
    then and the ranks loaded. When the verdict rested on how processes ended (`_rests_on_ends`), a
    trainer end the kubelet reports after the report was written is evidence it lacked (a crash's pods
    end seconds apart, and `--exit-settle` is a bound, not a promise: seen on a real node, the report
    named the ranks that died of the crash): the attempt is diagnosed again, and the report revised in
    place if the verdict changed. A verdict drawn from the recorders (a rank that never joined while
    the others waited) is not: the watchdog's kills that follow are its aftermath."""

    record: IncidentRecord
    ended: frozenset[str]  # ended_runs() then, split
    ranks: int  # ranks the gather delivered (with or without entries)
    verdict: tuple[Any, ...]  # _verdict() of the published report
    rests_on_ends: bool  # _rests_on_ends() of the published report: only then is a later end news
    revisions: int = 0


def _verdict(report: Any) -> tuple[Any, ...]:
    """What a revision must change to be written: the first finding's category, culprits, group and
    sequence id, and the exits it cites (not its ages, which grow with every gather)."""
    finding = report.findings[0]
    exits = tuple(sorted((r, e.exit_code, e.message) for r, e in finding.exits.items()))
    return (finding.category.value, tuple(sorted(finding.culprit_ranks)), finding.process_group.name,
            finding.collective_seq_id, exits)


_ENDS_DECIDE = frozenset({"RankStopped", "MissingDumps"})


def _rests_on_ends(report: Any) -> bool:
    """Whether which processes had ended (and how) decided the first finding: ranks that stopped, ranks
    missing (a pod that went down before it was read), or culprits named with their exits."""
    finding = report.findings[0]
    return finding.category.value in _ENDS_DECIDE or any(r in finding.exits for r in finding.culprit_ranks)


def _ended_set(pods: tuple[PodInfo, ...]) -> frozenset[str]:
    text = ended_runs(pods)
    return frozenset(text.split(",")) if text else frozenset()


def _latest_run(pods: tuple[PodInfo, ...], ended: bool) -> int:
    if ended:
        runs = [t.run for p in pods for t in p.terminations]
        if runs:
            return max(runs)
    return max((p.run for p in pods), default=0)


def ended_runs(pods: tuple[PodInfo, ...]) -> str:
    """The trainer runs that have ended, as known now (pod, container, run, exit code)."""
    return ",".join(sorted(f"{p.uid}/{t.container}/{t.run}/{t.exit_code}" for p in pods for t in p.terminations))


def _ended(pod: PodInfo, push: PodEvidence | None) -> str | None:
    """Why a pod's sidecar is not asked: the pod has ended, and its native sidecar stopped with it (its
    address may stay in the status while nothing answers there: each try would wait out its timeout,
    40 s on a real node); or its trainer's current run has ended and the sidecar pushed what it had at
    the exit (it is being stopped: 30 s on a real node). Its pushes are the evidence then."""
    if pod.phase in ("Succeeded", "Failed"):
        return f"the pod has ended (phase {pod.phase}); its sidecar stopped with it"
    if push is not None and push.reason == "exit" and any(t.run == pod.run for t in pod.terminations):
        return "its trainer has ended and its sidecar pushed what it had at the exit"
    return None


def _has_live_rank(evidence: PodEvidence | None) -> bool:
    """Whether the pod delivered a recorder with entries for a rank its sidecar does not report down
    (a hung peer of a crash: its pod is not about to end)."""
    if evidence is None:
        return False
    down = {p.rank for p in evidence.problems if p.kind == "error" and p.rank is not None}
    return any(d.entries and d.rank not in down for d in evidence.dumps)


def crash_under_way(pods: tuple[PodInfo, ...], gathered: Gathered, pushed_exit: bool = False) -> bool:
    """A trainer run has ended with a failure, or a sidecar saw its ranks exit (`pushed_exit`: one
    pushed at an exit, whatever the gather then fetched from it)."""
    if pushed_exit or any(e.reason == "exit" for e in gathered.pods.values()):
        return True
    return any(t.run == p.run and t.exit_code not in (None, 0) for p in pods for t in p.terminations)


def exits_coming(pods: tuple[PodInfo, ...], gathered: Gathered, crashed: bool = False,
                 runs: dict[str, int] | None = None) -> set[str]:
    """Pods whose trainer's end the kubelet has not reported yet although it is likely coming: the
    sidecar pushed at its trainer's exit; or, while a crash is under way (`crashed`), the pod
    delivered no rank that is still up (nothing gathered, or only ranks its sidecar reports down or
    empty recorders). A pod with a live rank (a hung peer) is not waited for, nor one whose trainer
    has restarted since the wait began (`runs`: each pod's run then; the end came and went)."""
    out = set()
    for pod in pods:
        if pod.phase in ("Succeeded", "Failed") or any(t.run == pod.run for t in pod.terminations):
            continue
        if runs is not None and pod.run > runs.get(pod.name, pod.run):
            continue
        evidence = gathered.pods.get(pod.name)
        if (evidence is not None and evidence.reason == "exit") or (crashed and not _has_live_rank(evidence)):
            out.add(pod.name)
    return out


def _same_pod(view: JobView, name: str, evidence: PodEvidence) -> bool:
    """A push from the pod of that name now in the job (not an earlier pod of the same name)."""
    return not evidence.pod_uid or any(p.name == name and p.uid == evidence.pod_uid for p in view.pods)


def attempt_for(view: JobView, sig: Signal, restarts: int = 0) -> Attempt:
    """`restarts`: torchrun's restart count last reported for the job, for a signal that names none."""
    if sig.run is not None:
        run = sig.run
    else:
        run = _latest_run(view.pods, ended=sig.kind in (SignalKind.JOB_FAILED, SignalKind.JOB_RESTARTING))
    return Attempt(pods_digest(view.pods), run, sig.restarts if sig.restarts is not None else restarts)


# The job's pods as the API server lists them now (raw Pod bodies).
PodLister = Callable[[JobRef], Awaitable[list[dict[str, Any]]]]


class Controller:
    def __init__(self, config: OperatorConfig, *, store: JobStore, pushes: PushStore, sidecars: SidecarClient,
                 publisher: Publisher, metrics: OperatorMetrics, decoder: Decoder | None = None,
                 actor: Actor | None = None, pod_lister: PodLister | None = None) -> None:
        self.config = config
        self.store = store
        self.pushes = pushes
        self.sidecars = sidecars
        self.publisher = publisher
        self.metrics = metrics
        self.decoder = decoder or Decoder()
        self.actor = actor
        # The job's pods straight from the API server (the runner's: opted-in pods with the job's label).
        self.pod_lister = pod_lister
        self._jobs: dict[JobKey, _JobState] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- inputs ------------------------------------------------------------------------------------
    def _state(self, key: JobKey) -> _JobState:
        state = self._jobs.get(key)
        if state is None:
            state = self._jobs[key] = _JobState(Ledger(), asyncio.Lock(), quiet_until={})
        return state

    def _refresh_gauges(self) -> None:
        jobs, pods = self.store.pod_counts()
        self.metrics.jobs_watched.set(jobs)
        self.metrics.pods_watched.set(pods)

    async def on_job(self, event_type: str | None, body: dict[str, Any]) -> None:
        ref = job_ref(body)
        if ref.job_kind is jobkinds.JOBSET and jobkinds.owned_by_trainjob(body):
            return  # Trainer's JobSet: its pods are the TrainJob's, diagnosed as the TrainJob
        if not self.store.accepts(ref):
            log.warning("%s %s ignored: a job of another kind with this name is already watched",
                        ref.kind, ref.key)
            return
        if event_type == "DELETED":
            self.store.remove_job(ref.key)
            self._jobs.pop(ref.key, None)
            self.metrics.job_gone(ref.key.namespace, ref.key.name)
            self._refresh_gauges()
            return
        conditions = job_conditions(body)
        self.store.upsert_job(ref, world_size=job_world_size(body), conditions=conditions)
        state = self._state(ref.key)
        self._refresh_gauges()
        view = self.store.job(ref.key)
        if state.unfinished and view is not None and self.actor is not None:
            self._spawn(self._act(view, sorted(state.unfinished)))  # its report came before the job
        ours = state.asserted[1] if state.asserted is not None and state.asserted[0] == ref.uid else None
        if ours is not None and needs_write(conditions, ours):
            # The training operator rewrote the list (or put ours last): put it back, first.
            self._spawn(self._reassert(ref.key, ours))
        sig = job_condition_signal(ref.key, conditions, ref.job_kind)
        if sig is not None:
            self.signal(sig)

    async def on_pod(self, event_type: str | None, body: dict[str, Any]) -> None:
        pod = pod_info(body)
        if not pod.job_name:
            return
        if event_type == "DELETED":
            self.store.remove_pod(pod)
            self._refresh_gauges()
            return
        self.store.upsert_pod(pod)
        self._refresh_gauges()
        if pod.uid in self._state(JobKey(pod.namespace, pod.job_name)).retired:
            return  # its trainer ends because frscope deleted the pod
        for sig in (*watchdog_signals(pod), *exit_signals(pod)):
            self.signal(sig)

    async def on_report(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A FlightRecorderReport appeared, changed or went: the job's ledger (which incidents are
        diagnosed, across operator restarts) and the condition to keep asserted follow the reports."""
        facts = report_facts(body)
        if facts is None:
            return
        key = JobKey(facts.namespace, facts.job)
        state = self._state(key)
        if event_type == "DELETED":
            state.ledger = state.ledger.without(facts.record.id)
            return
        self._retire(key, restarted_pods(body.get("action")))
        state.ledger = state.ledger.with_record(facts.record)
        if facts.record.report and unfinished(body.get("action")):
            state.unfinished.add(facts.record.report)
            view = self.store.job(key)
            if view is not None and self.actor is not None:
                self._spawn(self._act(view, [facts.record.report]))
        else:
            state.unfinished.discard(facts.record.report)
        newest = state.ledger.records[-1]
        if facts.condition is not None and newest.id == facts.record.id:
            ours = make_condition(facts.condition[0], clip_line(facts.condition[1]), facts.record.at)
            state.asserted = (facts.job_uid, ours)
            view = self.store.job(key)
            if view is not None and view.ref.uid == facts.job_uid and needs_write(list(view.conditions), ours):
                self._spawn(self._reassert(key, ours))

    def on_push(self, evidence: PodEvidence) -> JobKey | None:
        """Keep a pushed snapshot; raises `push.Full` when there is no room now (the caller answers 429)."""
        key = self.store.job_of_pod(evidence.namespace, evidence.pod)
        if key is not None and self._from_retired(key, evidence):
            log.info("push from %s/%s (%s) ignored: frscope's restart deleted that pod", evidence.namespace,
                     evidence.pod, evidence.reason, extra=_job(key))
            return key
        self.pushes.put(evidence, job=key.name if key is not None else None)
        if key is not None and evidence.reason in ("stall", "exit"):
            self.signal(Signal(SignalKind.SIDECAR_PUSH, key, f"pod {evidence.pod} pushed ({evidence.reason})",
                               pod=evidence.pod))
        return key

    def _retire(self, key: JobKey, pods: dict[str, str]) -> None:
        """Remember the pods (uid -> name) frscope's restart deleted, and drop what they pushed."""
        state = self._state(key)
        for uid, name in pods.items():
            if uid in state.retired:
                continue
            state.retired[uid] = name
            self.pushes.discard(key.namespace, name, uid)
            log.info("job %s: pod %s (uid %s) was deleted by frscope's restart: its exit and pushes are not "
                     "evidence of a new incident", key, name, uid, extra=_job(key))

    def _from_retired(self, key: JobKey, evidence: PodEvidence) -> bool:
        retired = self._state(key).retired
        if not retired:
            return False
        if evidence.pod_uid:
            return evidence.pod_uid in retired
        # A push that does not say its uid (--sidecar-auth token or none): by the pod of that name now.
        view = self.store.job(key)
        current = next((p for p in view.pods if p.name == evidence.pod), None) if view is not None else None
        return current is not None and current.uid in retired

    def _live(self, view: JobView) -> JobView:
        """The job without the pods frscope's restart deleted (still being deleted, or not yet gone)."""
        retired = self._state(view.key).retired
        if not retired or not any(p.uid in retired for p in view.pods):
            return view
        return replace(view, pods=tuple(p for p in view.pods if p.uid not in retired))

    def _gone_pods(self, view: JobView) -> set[str]:
        """The job's deleted pods whose pushes may still be evidence: not those frscope's restart deleted
        (a pod of the same name that is live again is not in this set anyway)."""
        retired = set(self._state(view.key).retired.values())
        return {p for p in self.store.gone_pods(view.key) if p not in retired}

    def on_status(self, key: JobKey, statuses: dict[str, SidecarStatus],
                  unreachable: dict[str, str] | None = None) -> None:
        """One sweep's answers for a job (pod -> status), and the pods whose sidecar did not answer."""
        self.store.set_sidecars(key, statuses, unreachable or {})
        if not statuses:
            return
        restarts = [r.restarts for st in statuses.values() for r in st.ranks if r.restarts is not None]
        if restarts:
            self._state(key).restarts = max(restarts)
        stalls = [(pod, s) for pod, st in statuses.items() for s in st.stalls]
        self.store.set_status(key, stalled=bool(stalls) or any(st.stalled for st in statuses.values()))
        if stalls:
            self._stall_signal(key, stalls)

    def handling(self, key: JobKey) -> bool:
        """Whether an incident of the job is being handled now (gathering, analyzing, publishing)."""
        state = self._jobs.get(key)
        return state is not None and state.running

    def on_first_stall(self, key: JobKey, pod: str, status: SidecarStatus) -> None:
        """One sidecar's answer during a sweep that reports a stall: when the job was not stalled at the
        last sweep, the stall is signalled now, not when the sweep ends (a sweep over 8,192 pods at
        --poll-max-rps 200 takes 41 s). The sweep's answers then follow in `on_status` as before (while
        the incident runs, they are its pending signal)."""
        if not status.stalls or self.store.is_stalled(key):
            return
        self.store.set_status(key, stalled=True)
        self._stall_signal(key, [(pod, s) for s in status.stalls])

    def _stall_signal(self, key: JobKey, stalls: list[tuple[str, GroupStall]]) -> None:
        pod, first = min(stalls, key=lambda ps: (ps[1].seq if ps[1].seq is not None else 1 << 62, ps[1].rank))
        self.signal(Signal(SignalKind.SIDECAR_STALL, key,
                           f"sidecar of pod {pod}: rank {first.rank} stalled in {first.op} #{first.seq} "
                           f"of group {first.group}", pod=pod, group=first.group, seq=first.seq,
                           restarts=first.restarts))

    # -- incident handling -------------------------------------------------------------------------
    def signal(self, sig: Signal) -> None:
        """Note a signal; the job's incident is handled in the background, one at a time per job."""
        self.metrics.signals.labels(kind=sig.kind.value).inc()
        state = self._state(sig.job)
        if state.first_signal_at is None:
            state.first_signal_at = time.monotonic()
        if state.running:
            if state.pending is None or (sig.seq is not None and state.pending.seq is None):
                state.pending = sig
            return
        state.running = True
        self._spawn(self._run(sig.job, sig))

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def idle(self) -> None:
        """Wait until no incident is being handled (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _run(self, key: JobKey, sig: Signal) -> None:
        state = self._state(key)
        try:
            while True:
                try:
                    await self.handle(sig)
                except JobGone as exc:
                    log.info("%s", exc)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("job %s: handling %s failed", key, sig.kind.value, extra=_job(key))
                if state.pending is None:
                    return
                sig, state.pending = state.pending, None
        finally:
            state.running = False
            state.first_signal_at = None

    def _skip_reason(self, view: JobView, sig: Signal, attempt: Attempt) -> str | None:
        state = self._state(view.key)
        pushed = self.pushes.for_namespace_pods(view.ref.namespace, self._gone_pods(view) | {p.name for p in view.pods})
        if not view.pods and not pushed:
            return "no pods and no pushed snapshots"
        if not pushed and not any(p.endpoint or p.terminations for p in view.pods):
            # New pods not started yet (the training operator recreating a restarted job): a gather would
            # find nothing, and its cooldown would then hold back the diagnosis of their first hang.
            return "no pod is up yet and none pushed anything"
        if state.ledger.has_attempt(attempt):
            # Within a diagnosed attempt, news is a sidecar seeing a stall somewhere else (the first one
            # resolved and another began), or a trainer end the published diagnosis did not know; the
            # watchdog and the job's failure are otherwise that incident's aftermath.
            if not self._new_stall(sig, attempt) and self._revisable(view, attempt) is None:
                return f"attempt {attempt} already diagnosed"
        quiet = (state.quiet_until or {}).get(str(attempt))
        if quiet is not None and time.monotonic() < quiet[0] and quiet[1] == ended_runs(view.pods):
            return f"attempt {attempt} gathered recently with nothing to report"
        return None

    def _new_stall(self, sig: Signal, attempt: Attempt) -> bool:
        """A sidecar sees a stall other than the one diagnosed in this attempt (the first one resolved
        and another began): a new incident."""
        return sig.kind is SignalKind.SIDECAR_STALL and sig.seq is not None and not self._state(
            sig.job).ledger.has_seq(attempt, sig.group, sig.seq)

    def _revisable(self, view: JobView, attempt: Attempt) -> _Basis | None:
        """The attempt's published diagnosis, when trainer ends it did not know have arrived since, its
        report is still there, and it may be revised again."""
        state = self._state(view.key)
        basis = state.published.get(str(attempt))
        if basis is None or basis.revisions >= MAX_REVISIONS or not basis.rests_on_ends:
            return None
        if not any(r.id == basis.record.id for r in state.ledger.records):
            return None  # its report was deleted
        return basis if _ended_set(view.pods) - basis.ended else None

    async def handle(self, sig: Signal) -> None:
        """One signal, start to end. Public for tests; `signal()` is the way in."""
        view = self.store.job(sig.job)
        if view is None:
            log.debug("signal %s for unknown job %s: ignored", sig.kind.value, sig.job)
            return
        state = self._state(view.key)
        retired = state.retired
        # The incident whose restart retired pods may still have its action to finish (an operator that
        # died after the claim): its reports are those of the attempt the pods, retired ones included, make.
        acted_on = state.ledger.reports_of(attempt_for(view, sig, state.restarts)) if retired else []
        acted_on += sorted(state.unfinished - set(acted_on))
        if sig.pod is not None and sig.pod in retired.values() and not any(
                p.name == sig.pod and p.uid not in retired for p in view.pods):
            log.debug("job %s: %s from pod %s, which frscope's restart deleted: ignored", view.key,
                      sig.kind.value, sig.pod, extra=_job(view.key))
            await self._act(view, acted_on)
            return
        view = self._live(view)
        listed = False
        while True:
            attempt = attempt_for(view, sig, state.restarts)
            skip = self._skip_reason(view, sig, attempt)
            if skip:
                log.debug("job %s: %s: %s", view.key, sig.kind.value, skip, extra=_job(view.key))
                reports = state.ledger.reports_of(attempt)
                await self._act(view, reports + [r for r in acted_on if r not in reports])
                return
            if listed:
                break
            # Pods the watch had not delivered change the attempt (its pods): decided again with them.
            completed, listed = await self._complete_pods(view), True
            if completed is view:
                break
            view = completed
        revising = None
        if state.ledger.has_attempt(attempt) and not self._new_stall(sig, attempt):
            revising = self._revisable(view, attempt)
        log.info("job %s: %s (%s); gathering from %d pods%s", view.key, sig.kind.value, sig.detail, len(view.pods),
                 " to revise its report" if revising else "", extra=_job(view.key))
        gathered = await self._gather(view)
        view = await self._await_exits(view, gathered)
        state = self._state(view.key)
        exits = rank_exits(view.pods, gathered.pods, view.world_size,
                           about=(sig.pod, sig.run) if sig.pod is not None and sig.run is not None else None)
        if not gathered.anything and not any(e.failed for e in exits.values()):
            log.warning("job %s: nothing could be gathered (%d pods failed)", view.key, len(gathered.failures),
                        extra=_job(view.key))
            if revising is not None:
                revising.ended = _ended_set(view.pods)  # the report stands
            else:
                self._quiet(state, attempt, view)
            return
        # Nothing gathered but a failed rank: its exit alone is evidence (a crash before any read).
        analyzing = time.monotonic()
        diagnosis = await diagnose(gathered, view.world_size,
                                   AnalysisOptions(stall_after_s=self.config.stuck_after_s,
                                                   clock_skew_ms=self.config.clock_skew_ms),
                                   exits=exits)
        report = diagnosis.report
        log.info("job %s: analyzed %d ranks in %.1f s", view.key, len(report.ranks_loaded),
                 time.monotonic() - analyzing, extra=_job(view.key))
        rank_pods = {d.rank: pod for pod, evidence in gathered.pods.items() for d in evidence.dumps}
        if revising is not None:
            await self._revise(view, sig, attempt, revising, diagnosis, rank_pods)
            return
        if report.healthy:
            log.info("job %s: %s: no problem found in %d ranks", view.key, sig.kind.value, len(report.ranks_loaded),
                     extra=_job(view.key))
            self._quiet(state, attempt, view)
            return
        finding = report.findings[0]
        key = IncidentKey(view.ref.uid, attempt, finding.process_group.name, finding.collective_seq_id)
        if state.ledger.has(key):
            return
        await self._publish(view, sig, attempt, key, diagnosis, rank_pods)

    async def _revise(self, view: JobView, sig: Signal, attempt: Attempt, basis: _Basis, diagnosis: Diagnosis,
                      rank_pods: dict[int, str]) -> None:
        """The attempt diagnosed again with trainer ends its report did not know: the report is rewritten
        in place (same object, same incident) when the verdict changed, with no fewer ranks behind it."""
        report = diagnosis.report
        ended, basis.ended = basis.ended, _ended_set(view.pods)
        if report.healthy or len(rank_pods) < basis.ranks:
            log.info("job %s: %s: report %s stands (the new gather %s)", view.key, sig.kind.value,
                     basis.record.report, "found nothing" if report.healthy else
                     f"delivered {len(rank_pods)} ranks, it had {basis.ranks}", extra=_job(view.key))
            return
        if _verdict(report) == basis.verdict:
            log.info("job %s: %s: report %s stands (same verdict with the later trainer ends)", view.key,
                     sig.kind.value, basis.record.report, extra=_job(view.key))
            return
        finding = report.findings[0]
        key = IncidentKey(view.ref.uid, attempt, finding.process_group.name, finding.collective_seq_id)
        basis.revisions += 1
        why = ", ".join(sorted(e.split("/")[0] for e in basis.ended - ended))
        log.warning("job %s: revising report %s (revision %d): trainer ends it did not know (pod uid %s)",
                    view.key, basis.record.report, basis.revisions, why, extra=_job(view.key, basis.record.id))
        await self._publish(view, sig, attempt, key, diagnosis, rank_pods, revision=basis)

    async def _complete_pods(self, view: JobView) -> JobView:
        """The job's view with the pods the watch has not delivered yet, listed once from the API server
        (only pods the store does not know are added: the watch's own are newer). An operator that just
        started receives the listing of 1,000s of pods over seconds; a gather meanwhile took every
        pod not yet listed for a missing rank (bench/push_storm.py, 1,250 pods, restarted mid-storm:
        MissingDumps of ~1,000 ranks instead of the culprit)."""
        if self.pod_lister is None:
            return view
        try:
            listed = await self.pod_lister(view.ref)
        except KubeError as exc:
            log.warning("job %s: could not list its pods (%s); gathering from the %d the watch delivered",
                        view.key, exc, len(view.pods), extra=_job(view.key))
            return view
        known = {p.uid for p in view.pods} | set(self._state(view.key).retired)
        added = 0
        for body in listed:
            pod = pod_info(body)
            if pod.uid and pod.uid not in known and pod.job_name == view.key.name and not pod.deleting:
                self.store.upsert_pod(pod)
                added += 1
        if not added:
            return view
        log.info("job %s: %d pods listed that the watch had not delivered yet", view.key, added, extra=_job(view.key))
        self._refresh_gauges()
        fresh = self.store.job(view.key)
        return self._live(fresh) if fresh is not None else view

    async def _await_exits(self, view: JobView, gathered: Gathered) -> JobView:
        """The job as the store has it once the kubelet reported the end of every trainer run whose
        sidecar says it ended, and, while a crash is under way, of every pod that delivered no live rank
        (`exits_coming`); or `--exit-settle` seconds later. A crash ends ranks in several pods within a
        second, and the kubelet reports each container's end a few seconds apart: diagnosed on the
        first exit alone, a peer that died of the crash (gloo's "Connection closed by peer") would be
        named instead of the rank that raised, or the crashed pod's ranks reported missing (both seen
        on a real node, the second when its sidecar was asked while its ranks went down). The pushes
        the wait brings are taken too (a pod's second rank going down pushes again)."""
        pushed = self.pushes.for_namespace_pods(view.ref.namespace, {p.name for p in view.pods})
        crashed = crash_under_way(view.pods, gathered, any(
            e.reason == "exit" and _same_pod(view, n, e) for n, e in pushed.items()))
        waiting = exits_coming(view.pods, gathered, crashed)
        if not waiting:
            return view
        waited = set(waiting)
        runs = {p.name: p.run for p in view.pods}
        deadline = time.monotonic() + self.config.exit_settle_s
        log.info("job %s: waiting up to %g s for the kubelet to report the end of %s", view.key,
                 self.config.exit_settle_s, ", ".join(sorted(waiting)), extra=_job(view.key))
        while waiting and time.monotonic() < deadline:
            await asyncio.sleep(min(_SETTLE_POLL_S, max(0.0, deadline - time.monotonic())))
            fresh = self.store.job(view.key)
            if fresh is None:
                break
            view = self._live(fresh)
            waiting = exits_coming(view.pods, gathered, crashed, runs)
        # What the ended pods pushed meanwhile replaces what was gathered from them when that held no
        # recorder entries (a sidecar asked while its ranks were going down).
        for pod, evidence in self.pushes.for_namespace_pods(view.ref.namespace,
                                                            set(gathered.from_push) | waited).items():
            current = gathered.pods.get(pod)
            if not _same_pod(view, pod, evidence):
                continue
            if pod in gathered.from_push or current is None or not any(d.entries for d in current.dumps):
                gathered.pods[pod] = evidence
                gathered.from_push.add(pod)
                gathered.failures.pop(pod, None)
        return view

    def _quiet(self, state: _JobState, attempt: Attempt, view: JobView) -> None:
        if state.quiet_until is not None:
            state.quiet_until[str(attempt)] = (time.monotonic() + self.config.cooldown_s, ended_runs(view.pods))

    async def _gather(self, view: JobView) -> Gathered:
        pushed = self.pushes.for_namespace_pods(view.ref.namespace, {p.name for p in view.pods})
        pushed = {n: e for n, e in pushed.items() if _same_pod(view, n, e)}
        targets = [Target(p.name, p.endpoint, _ended(p, pushed.get(p.name)), p.uid) for p in view.pods]
        gathered = await gather(self.sidecars, view.ref.namespace, targets, self.config.gather, self.pushes,
                                push_pods=self._gone_pods(view), decoder=self.decoder)
        self.metrics.gather_duration.observe(gathered.duration_s)
        log.info("job %s: gathered %d pods (%d from pushes, %d failed) in %.1f s", view.key, len(gathered.pods),
                 len(gathered.from_push), len(gathered.failures), gathered.duration_s, extra=_job(view.key))
        if gathered.failures:
            self.metrics.sidecars_unreachable.inc(len(gathered.failures))
        return gathered

    async def _act(self, view: JobView, reports: list[str]) -> None:
        """The action policy on these incidents' reports (a no-op for those already acted on)."""
        if self.actor is None:
            return
        for report in reports:
            done = await self.actor.on_incident(view.ref, report)
            if done is not None:  # before the report's watch event says so: the pods go now
                self._retire(view.key, restarted_pods(done.to_json()))

    def _impact(self, view: JobView, diagnosis: Diagnosis, rank_pods: dict[int, str]) -> Impact:
        finding = diagnosis.report.findings[0]
        timeout_s, source = job_timeout(diagnosis.dumpset, finding, view.pods, diagnosis.report.backend,
                                        self.config.default_watchdog_timeout_s)
        culprit_pods, culprit_nodes = culprit_placement(finding, rank_pods, view.pods)
        ranks = view.world_size or diagnosis.report.world_size
        return Impact(timeout_s, source, sum(p.gpus for p in view.pods), ranks, culprit_pods, culprit_nodes)

    async def _publish(self, view: JobView, sig: Signal, attempt: Attempt, key: IncidentKey,
                       diagnosis: Diagnosis, rank_pods: dict[int, str], revision: _Basis | None = None) -> None:
        """Write the report, the condition and the Events; `revision`: rewrite that published report
        (same object and incident id) instead of making a new one."""
        report = diagnosis.report
        finding = report.findings[0]
        now = rfc3339()
        publishing = time.monotonic()
        incident = revision.record.id if revision is not None else key.digest
        name = report_name(view.ref, incident)
        record = IncidentRecord(incident, str(attempt), key.group, key.seq, finding.category.value, name, now)
        message = one_line(finding)
        obj = build_report_cr(view.ref, report, incident=incident, attempt=str(attempt),
                              signal=f"{sig.kind.value}: {sig.detail}", missing_pods=diagnosis.missing_pods,
                              gathered_at=now, limit_bytes=self.config.report_limit_bytes,
                              condition=(finding.category.value, message),
                              impact=self._impact(view, diagnosis, rank_pods).to_json(),
                              revision=revision.revisions if revision is not None else 0)
        events: list[tuple[str, str]] = [(finding.category.value, message)]
        if revision is not None:
            before = revision.record
            events.append((names.REASON_REVISED, clip_line(
                f"report {name} revised with trainer ends the kubelet reported after it was written: "
                f"{before.category} (group {before.group}, seq {before.seq}) -> {finding.category.value}: "
                f"{message}")))
        if diagnosis.missing_pods:
            listed = ", ".join(f"{pod} ({why})" for pod, why in sorted(diagnosis.missing_pods.items()))
            events.append((names.REASON_SIDECARS_UNREACHABLE,
                           clip_line(f"{len(diagnosis.missing_pods)} pod(s) could not be gathered; the report "
                                     f"names their ranks as missing: {listed}")))
        pub = Publication(view.ref, record, obj, finding.category.value, message, tuple(events),
                          event_incident=f"{incident}-r{revision.revisions}" if revision is not None else incident)
        done = await (self.publisher.revise(pub) if revision is not None else self.publisher.publish(pub))
        for step in done.errors:
            self.metrics.publish_errors.labels(step=step.split(" ")[0]).inc()
        log.info("job %s: report %s built and published in %.1f s", view.key, name, time.monotonic() - publishing,
                 extra=_job(view.key))
        state = self._state(view.key)
        if done.report or done.condition:
            state.ledger = state.ledger.with_record(record)
            if revision is not None:
                revision.record, revision.verdict = record, _verdict(report)
                revision.rests_on_ends = _rests_on_ends(report)
                revision.ranks = max(revision.ranks, len(rank_pods))
            else:
                state.published[str(attempt)] = _Basis(record, _ended_set(view.pods), len(rank_pods),
                                                       _verdict(report), _rests_on_ends(report))
            state.asserted = (view.ref.uid, make_condition(finding.category.value, message, now))
            self.metrics.diagnoses.labels(category=finding.category.value).inc()
            self.metrics.job_diagnosed(view.key.namespace, view.key.name, finding.category.value)
        if done.condition and state.first_signal_at is not None:
            self.metrics.signal_to_publish.observe(time.monotonic() - state.first_signal_at)
            state.first_signal_at = None
        self.store.set_latest(view.key, LatestDiagnosis(
            incident=key.digest, category=finding.category.value, verdict=finding.summary,
            culprit_ranks=tuple(finding.culprit_ranks), report_name=name if done.report else "", at=now,
            report=report_to_dict(report), timeline=await self._timeline(view.key, diagnosis)))
        log.warning("job %s: %s: %s (report %s)", view.key, finding.category.value, message, name,
                    extra=_job(view.key, key.digest))
        if done.report:
            await self._act(view, [name])  # only once the evidence is written

    async def _timeline(self, key: JobKey, diagnosis: Diagnosis) -> dict[str, Any] | None:
        """The web UI's timeline, built once per diagnosis off the event loop (the dumps are then let go)."""
        try:
            return await asyncio.to_thread(build_timeline, diagnosis.dumpset, diagnosis.report)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("job %s: building the timeline failed", key, extra=_job(key))
            return None

    async def _reassert(self, key: JobKey, ours: dict[str, Any]) -> None:
        view = self.store.job(key)
        if view is None:
            return
        try:
            if await self.publisher.assert_condition(view.ref, ours):
                log.info("job %s: condition %s put back first in status.conditions", key, names.CONDITION_TYPE,
                         extra=_job(key))
        except JobGone:
            pass
        except KubeError as exc:
            self.metrics.publish_errors.labels(step="condition").inc()
            log.error("job %s: could not re-assert the condition: %s", key, exc, extra=_job(key))
