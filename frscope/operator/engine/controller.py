"""The operator's logic between kopf's events and the API writes: the per-job signal queue and the
dedupe of incidents.

kopf handlers call `on_job()`, `on_pod()`, `on_report()`; the HTTP push endpoint calls `on_push()`; the
status poller calls `on_status()`. Each turns what it sees into `Signal`s; `signal()` returns at once
(kopf handlers must stay fast) and the job's incident is handled in a background task, one at a time
per job (signals that arrive meanwhile are folded into the running one):

    dedupe (ledger from the job's reports) -> incident.IncidentHandler.run: gather (sidecars + pushes),
    settle, analyze -> publish or revise -> act
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from frscope.operator.actions import Actor, restarted_pods, unfinished
from frscope.operator.engine.incident import IncidentHandler
from frscope.operator.engine.jobstate import Basis, JobState, job_fields
from frscope.operator.engine.publishing import DiagnosisWriter
from frscope.operator.engine.revisions import revisable
from frscope.operator.engine.settings import OperatorConfig
from frscope.operator.engine.suspicions import Suspicions
from frscope.operator.evidence.gather import Decoder
from frscope.operator.evidence.incident_bundles import IncidentBundles
from frscope.operator.evidence.pod_evidence import PodEvidence
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.evidence.sidecars import SidecarClient
from frscope.operator.evidence.trainer_exits import ended_runs
from frscope.operator.injection import polled_pod
from frscope.operator.kube import Gone, KubeError
from frscope.operator.model import jobkinds
from frscope.operator.model.incidents import Attempt, report_facts
from frscope.operator.model.objects import (
    JobKey,
    JobRef,
    PodInfo,
    job_conditions,
    job_ref,
    job_world_size,
    pods_digest,
)
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.model.signals import Signal, SignalKind, exit_signals, job_condition_signal, watchdog_signals
from frscope.operator.model.store import JobStore, JobView
from frscope.operator.publish import JobGone, Publisher, clip_line, make_condition, needs_write
from frscope.wire import GroupStall, SidecarStatus

log = logging.getLogger(__name__)


def _latest_run(pods: tuple[PodInfo, ...], ended: bool) -> int:
    if ended:
        runs = [t.run for p in pods for t in p.terminations]
        if runs:
            return max(runs)
    return max((p.run for p in pods), default=0)


def attempt_for(view: JobView, sig: Signal, restarts: int = 0) -> Attempt:
    """`restarts`: torchrun's restart count last reported for the job, for a signal that names none."""
    if sig.run is not None:
        run = sig.run
    else:
        run = _latest_run(view.pods, ended=sig.kind in (SignalKind.JOB_FAILED, SignalKind.JOB_RESTARTING))
    return Attempt(pods_digest(view.pods), run, sig.restarts if sig.restarts is not None else restarts)


def _new_stall(state: JobState, sig: Signal, attempt: Attempt) -> bool:
    """A sidecar sees a stall other than the one diagnosed in this attempt (the first one resolved
    and another began): a new incident."""
    return sig.kind is SignalKind.SIDECAR_STALL and sig.seq is not None and not state.ledger.has_seq(
        attempt, sig.group, sig.seq)


# The job's pods as the API server lists them now (raw Pod bodies).
# A job's opted-in pods from the API server, a page of raw objects at a time (each page is read into
# PodInfo records and dropped before the next: a 32,768-pod job's raw list is ~0.6 GiB parsed).
PodLister = Callable[[JobRef], AsyncIterator[list[dict[str, Any]]]]


class Controller:
    def __init__(self, config: OperatorConfig, *, store: JobStore, pushes: PushStore, sidecars: SidecarClient,
                 publisher: Publisher, metrics: OperatorMetrics, decoder: Decoder | None = None,
                 actor: Actor | None = None, pod_lister: PodLister | None = None,
                 bundles: IncidentBundles | None = None) -> None:
        self.config = config
        self._untrusted: set[str] = set()  # uids of pods whose sidecar is not as injected (logged once)
        self.store = store
        self.pushes = pushes
        self.sidecars = sidecars
        self.metrics = metrics
        # The job's pods straight from the API server (the runner's: opted-in pods with the job's label).
        self.pod_lister = pod_lister
        self.writer = DiagnosisWriter(publisher, metrics, store, report_limit_bytes=config.report_limit_bytes,
                                      default_watchdog_timeout_s=config.default_watchdog_timeout_s, bundles=bundles)
        self.incidents = IncidentHandler(config, store=store, pushes=pushes, sidecars=sidecars, writer=self.writer,
                                         metrics=metrics, decoder=decoder or Decoder(), actor=actor)
        self.suspicions = Suspicions(config, store=store, pushes=pushes, sidecars=sidecars, publisher=publisher,
                                     metrics=metrics, decoder=self.incidents.decoder, job_state=self._state,
                                     spawn=self._spawn)
        self._jobs: dict[JobKey, JobState] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def actor(self) -> Actor | None:
        """The action policy (None: diagnose only); the incident handler's."""
        return self.incidents.actor

    @actor.setter
    def actor(self, actor: Actor | None) -> None:
        self.incidents.actor = actor

    # -- inputs ------------------------------------------------------------------------------------
    def _state(self, key: JobKey) -> JobState:
        state = self._jobs.get(key)
        if state is None:
            state = self._jobs[key] = JobState()
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
            self.suspicions.forget(ref.key)
            self.metrics.job_gone(ref.key.namespace, ref.key.name)
            self._refresh_gauges()
            return
        conditions = job_conditions(body)
        self.store.upsert_job(ref, world_size=job_world_size(body), conditions=conditions)
        state = self._state(ref.key)
        self._refresh_gauges()
        view = self.store.job(ref.key)
        if state.unfinished and view is not None and self.actor is not None:
            self._spawn(self.incidents.act(view, state, sorted(state.unfinished)))  # its report came before the job
        ours = state.asserted[1] if state.asserted is not None and state.asserted[0] == ref.uid else None
        if ours is not None and needs_write(conditions, ours):
            # The training operator rewrote the list (or put ours last): put it back, first.
            self._spawn(self.writer.reassert(ref.key, ours))
        sig = job_condition_signal(ref.key, conditions, ref.job_kind)
        if sig is not None:
            self.signal(sig)

    def _pod(self, body: dict[str, Any]) -> PodInfo:
        """The pod as the operator will use it (`injection.polled_pod`: a sidecar not as injected has no
        endpoint, so it is never shown a credential nor asked)."""
        pod, why = polled_pod(body, self.config.webhook.injection if self.config.webhook is not None else None)
        if why is not None and pod.uid not in self._untrusted:
            if len(self._untrusted) >= 65_536:
                self._untrusted.clear()
            self._untrusted.add(pod.uid)
            log.warning("pod %s/%s: its frscope port is not served by the injected sidecar (%s); not polled",
                        pod.namespace, pod.name, why)
        return pod

    async def on_pod(self, event_type: str | None, body: dict[str, Any]) -> None:
        pod = self._pod(body)
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
        state.retire(key, restarted_pods(body.get("action")), self.pushes)
        state.ledger = state.ledger.with_record(facts.record)
        if facts.record.report and unfinished(body.get("action")):
            state.unfinished.add(facts.record.report)
            view = self.store.job(key)
            if view is not None and self.actor is not None:
                self._spawn(self.incidents.act(view, state, [facts.record.report]))
        else:
            state.unfinished.discard(facts.record.report)
        newest = state.ledger.records[-1]
        if facts.condition is not None and newest.id == facts.record.id:
            # The condition the report says was asserted (after a restart, this process wrote none yet).
            ours = make_condition(facts.condition[0], clip_line(facts.condition[1]), facts.record.at)
            state.asserted = (facts.job_uid, ours)
            view = self.store.job(key)
            if view is not None and view.ref.uid == facts.job_uid and needs_write(list(view.conditions), ours):
                self._spawn(self.writer.reassert(key, ours))

    def on_push(self, evidence: PodEvidence) -> JobKey | None:
        """Keep a pushed snapshot; raises `push.Full` when there is no room now (the caller answers 429)."""
        key = self.store.job_of_pod(evidence.namespace, evidence.pod)
        if key is not None and self._state(key).from_retired(evidence, self.store, key):
            log.info("push from %s/%s (%s) ignored: frscope's restart deleted that pod", evidence.namespace,
                     evidence.pod, evidence.reason, extra=job_fields(key))
            return key
        self.pushes.put(evidence, job=key.name if key is not None else None)
        if key is not None and evidence.reason in ("stall", "exit"):
            self.signal(Signal(SignalKind.SIDECAR_PUSH, key, f"pod {evidence.pod} pushed ({evidence.reason})",
                               pod=evidence.pod))
        elif key is not None and evidence.reason == "suspect" and not self._confirmed_or_busy(key):
            self.suspicions.suspect(key, f"pod {evidence.pod} pushed a suspected stall")
        return key

    def _confirmed_or_busy(self, key: JobKey) -> bool:
        """A stall is confirmed, or an incident is being handled: a suspicion would only race it."""
        return self.store.is_stalled(key) or self.handling(key)

    def on_first_suspect(self, key: JobKey, pod: str, status: SidecarStatus) -> None:
        """One sidecar's answer during a sweep that suspects a stall (none confirmed): published now."""
        if status.stalls or not status.suspects or self._confirmed_or_busy(key):
            return
        first = min(status.suspects, key=lambda s: (s.seq if s.seq is not None else 1 << 62, s.rank))
        self.suspicions.suspect(key, f"sidecar of pod {pod}: rank {first.rank} waits in {first.where()} for "
                                     f"{first.age_s or 0:.0f} s", status.suspects)

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
            self.suspicions.confirmed(key)
            self._stall_signal(key, stalls)
        self.suspicions.on_sweep(key, statuses)

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
        self.suspicions.confirmed(key)
        self._stall_signal(key, [(pod, s) for s in status.stalls])

    def _stall_signal(self, key: JobKey, stalls: list[tuple[str, GroupStall]]) -> None:
        pod, first = min(stalls, key=lambda ps: (ps[1].seq if ps[1].seq is not None else 1 << 62, ps[1].rank))
        self.signal(Signal(SignalKind.SIDECAR_STALL, key,
                           f"sidecar of pod {pod}: rank {first.rank} stalled in {first.where()}", pod=pod,
                           group=first.group or None, seq=first.seq,
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

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
                    log.exception("job %s: handling %s failed", key, sig.kind.value, extra=job_fields(key))
                if state.pending is None:
                    return
                sig, state.pending = state.pending, None
        finally:
            state.running = False
            state.first_signal_at = None

    def _skip_reason(self, view: JobView, state: JobState, attempt: Attempt, diagnosed: bool) -> str | None:
        """Why the signal is no news for this attempt (None: it is). `diagnosed`: the attempt has a
        diagnosis that neither a new stall nor a later trainer end can change."""
        pushed = self.pushes.for_namespace_pods(view.ref.namespace,
                                                state.gone_pods(self.store, view.key) | {p.name for p in view.pods})
        if not view.pods and not pushed:
            return "no pods and no pushed snapshots"
        if not pushed and not any(p.endpoint or p.terminations for p in view.pods):
            # New pods not started yet (the training operator recreating a restarted job): a gather would
            # find nothing, and its cooldown would then hold back the diagnosis of their first hang.
            return "no pod is up yet and none pushed anything"
        if diagnosed:
            return f"attempt {attempt} already diagnosed"
        quiet = state.quiet_until.get(str(attempt))
        if quiet is not None and time.monotonic() < quiet[0] and quiet[1] == ended_runs(view.pods):
            return f"attempt {attempt} gathered recently with nothing to report"
        return None

    def _triage(self, view: JobView, sig: Signal, state: JobState) -> tuple[Attempt, str | None, Basis | None]:
        """The attempt the signal is about (in this view of the job's pods), why it is no news (None: it
        is), and the attempt's published diagnosis it may revise. Within a diagnosed attempt, news is a
        sidecar seeing a stall somewhere else (the first one resolved and another began), or a trainer end
        the published diagnosis did not know; the watchdog and the job's failure are otherwise that
        incident's aftermath."""
        attempt = attempt_for(view, sig, state.restarts)
        revising = None
        diagnosed = state.ledger.has_attempt(attempt) and not _new_stall(state, sig, attempt)
        if diagnosed:
            revising = revisable(state, view, attempt)
        return attempt, self._skip_reason(view, state, attempt, diagnosed and revising is None), revising

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
                      sig.kind.value, sig.pod, extra=job_fields(view.key))
            await self.incidents.act(view, state, acted_on)
            return
        view = state.live(view)
        listed = False
        while True:
            attempt, skip, revising = self._triage(view, sig, state)
            if skip:
                log.debug("job %s: %s: %s", view.key, sig.kind.value, skip, extra=job_fields(view.key))
                reports = state.ledger.reports_of(attempt)
                await self.incidents.act(view, state, reports + [r for r in acted_on if r not in reports])
                return
            if listed:
                break
            # Pods the watch had not delivered change the attempt (its pods): decided again with them.
            completed, listed = await self._complete_pods(view, state), True
            if completed is view:
                break
            view = completed
        await self.incidents.run(view, state, sig, attempt, revising)

    async def _complete_pods(self, view: JobView, state: JobState) -> JobView:
        """The job's view with the pods the watch has not delivered yet, listed once from the API server
        (only pods the store does not know are added: the watch's own are newer). An operator that just
        started receives the listing of 1,000s of pods over seconds; a gather meanwhile took every
        pod not yet listed for a missing rank (bench/push_storm.py: 1,250 pods, the operator restarted
        mid-storm)."""
        if self.pod_lister is None:
            return view
        known = {p.uid for p in view.pods} | set(state.retired)
        listed: list[PodInfo] = []
        try:
            for attempt in range(2):  # a continue token that expired (410 Gone) mid-list: once more
                listed = []
                try:
                    async for page in self.pod_lister(view.ref):
                        listed += [pod for pod in map(self._pod, page) if pod.uid not in known]
                        del page
                    break
                except Gone:
                    if attempt:
                        raise
        except KubeError as exc:
            log.warning("job %s: could not list its pods (%s); gathering from the %d the watch delivered",
                        view.key, exc, len(view.pods), extra=job_fields(view.key))
            return view
        added = 0
        for pod in listed:
            if pod.uid and pod.uid not in known and pod.job_name == view.key.name and not pod.deleting:
                self.store.upsert_pod(pod)
                added += 1
        if not added:
            return view
        log.info("job %s: %d pods listed that the watch had not delivered yet", view.key, added,
                 extra=job_fields(view.key))
        self._refresh_gauges()
        fresh = self.store.job(view.key)
        return state.live(fresh) if fresh is not None else view
