"""One incident handled, once the controller decided it is news: gather (sidecars and pushes), let the
trainer ends settle, analyze, then publish a new report or revise the attempt's one, and act on it."""

from __future__ import annotations

import logging
import time

from frscope.analysis import AnalysisOptions
from frscope.operator.actions import Actor, restarted_pods
from frscope.operator.engine.jobstate import Basis, JobState, job_fields
from frscope.operator.engine.publishing import DiagnosisWriter
from frscope.operator.engine.revisions import revision_key
from frscope.operator.engine.settings import OperatorConfig
from frscope.operator.evidence.diagnosis import Diagnosis, diagnose
from frscope.operator.evidence.gather import Decoder, Gathered
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.evidence.settle import await_exits, collect
from frscope.operator.evidence.sidecars import SidecarClient
from frscope.operator.evidence.trainer_exits import ended_runs, ended_set, rank_exits
from frscope.operator.model.incidents import Attempt, IncidentKey
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.model.signals import Signal
from frscope.operator.model.store import JobStore, JobView

log = logging.getLogger(__name__)


class IncidentHandler:
    def __init__(self, config: OperatorConfig, *, store: JobStore, pushes: PushStore, sidecars: SidecarClient,
                 writer: DiagnosisWriter, metrics: OperatorMetrics, decoder: Decoder, actor: Actor | None) -> None:
        self.config = config
        self.store = store
        self.pushes = pushes
        self.sidecars = sidecars
        self.writer = writer
        self.metrics = metrics
        self.decoder = decoder
        self.actor = actor
        self.options = AnalysisOptions(stall_after_s=config.stuck_after_s, clock_skew_ms=config.clock_skew_ms)

    async def run(self, view: JobView, state: JobState, sig: Signal, attempt: Attempt,
                  revising: Basis | None) -> None:
        """`revising`: the attempt's published diagnosis that trainer ends since may change."""
        log.info("job %s: %s (%s); gathering from %d pods%s", view.key, sig.kind.value, sig.detail, len(view.pods),
                 " to revise its report" if revising else "", extra=job_fields(view.key))
        gathered = await self._gather(view, state)

        def refresh() -> JobView | None:
            fresh = self.store.job(view.key)
            return state.live(fresh) if fresh is not None else None

        view = await await_exits(view, gathered, self.pushes, self.config.exit_settle_s, refresh,
                                 job_fields(view.key))
        exits = rank_exits(view.pods, gathered.pods, view.world_size,
                           about=(sig.pod, sig.run) if sig.pod is not None and sig.run is not None else None)
        if not gathered.anything and not any(e.failed for e in exits.values()):
            log.warning("job %s: nothing could be gathered (%d pods failed)", view.key, len(gathered.failures),
                        extra=job_fields(view.key))
            if revising is not None:
                revising.ended = ended_set(view.pods)  # the report stands
            else:
                self.quiet(state, attempt, view)
            return
        # Nothing gathered but a failed rank: its exit alone is evidence (a crash before any read).
        analyzing = time.monotonic()
        diagnosis = await diagnose(gathered, view.world_size, self.options, exits=exits)
        report = diagnosis.report
        log.info("job %s: analyzed %d ranks in %.1f s", view.key, len(report.ranks_loaded),
                 time.monotonic() - analyzing, extra=job_fields(view.key))
        rank_pods = {d.rank: pod for pod, evidence in gathered.pods.items() for d in evidence.dumps}
        if revising is not None:
            key = revision_key(view, sig, attempt, revising, report, len(rank_pods))
            if key is not None:
                await self._write(view, state, sig, attempt, key, diagnosis, rank_pods, revising)
            return
        if report.healthy:
            log.info("job %s: %s: no problem found in %d ranks", view.key, sig.kind.value, len(report.ranks_loaded),
                     extra=job_fields(view.key))
            self.quiet(state, attempt, view)
            return
        finding = report.findings[0]
        key = IncidentKey(view.ref.uid, attempt, finding.process_group.name, finding.collective_seq_id)
        if state.ledger.has(key):
            return
        await self._write(view, state, sig, attempt, key, diagnosis, rank_pods, None)

    async def _write(self, view: JobView, state: JobState, sig: Signal, attempt: Attempt, key: IncidentKey,
                     diagnosis: Diagnosis, rank_pods: dict[int, str], revising: Basis | None) -> None:
        written = await self.writer.write(view, state, sig, attempt, key, diagnosis, rank_pods, revising)
        if written is not None:
            await self.act(view, state, [written])  # only once the evidence is written

    def quiet(self, state: JobState, attempt: Attempt, view: JobView) -> None:
        """The attempt gathered with nothing to report: not again for `--cooldown`, unless a trainer ends."""
        state.quiet_until[str(attempt)] = (time.monotonic() + self.config.cooldown_s, ended_runs(view.pods))

    async def _gather(self, view: JobView, state: JobState) -> Gathered:
        gathered = await collect(self.sidecars, view, self.config.gather, self.pushes,
                                 gone_pods=state.gone_pods(self.store, view.key), decoder=self.decoder)
        self.metrics.gather_duration.observe(gathered.duration_s)
        log.info("job %s: gathered %d pods (%d from pushes, %d failed) in %.1f s", view.key, len(gathered.pods),
                 len(gathered.from_push), len(gathered.failures), gathered.duration_s, extra=job_fields(view.key))
        if gathered.failures:
            self.metrics.sidecars_unreachable.inc(len(gathered.failures))
        return gathered

    async def act(self, view: JobView, state: JobState, reports: list[str]) -> None:
        """The action policy on these incidents' reports (a no-op for those already acted on)."""
        if self.actor is None:
            return
        for report in reports:
            done = await self.actor.on_incident(view.ref, report)
            if done is not None:  # before the report's watch event says so: the pods go now
                state.retire(view.key, restarted_pods(done.to_json()), self.pushes)
