"""What the controller remembers about each job between signals (in memory; the ledger is rebuilt from
the job's reports after a restart), and the pods frscope's own restart deleted."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from frscope import logs
from frscope.operator.evidence.pod_evidence import PodEvidence
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.model.incidents import IncidentRecord, Ledger
from frscope.operator.model.objects import JobKey
from frscope.operator.model.signals import Signal
from frscope.operator.model.store import JobStore, JobView

log = logging.getLogger(__name__)


def job_fields(key: JobKey, incident: str | None = None) -> dict[str, object]:
    """The job (and incident) as fields of a log record (`--log-format json` lifts them out)."""
    return logs.fields(job=key.name, namespace=key.namespace, incident=incident)


@dataclass(slots=True)
class Basis:
    """What this process published about an attempt, and the evidence it had: the trainer ends known
    then and the ranks loaded. When the verdict rested on how processes ended (`revisions.rests_on_ends`),
    a trainer end the kubelet reports after the report was written is evidence it lacked (a crash's pods
    end seconds apart, and `--exit-settle` is a bound, not a promise): the attempt is diagnosed again,
    and the report revised in place if the verdict changed. A verdict drawn from the recorders (a rank
    that never joined while the others waited) is not: the watchdog's kills that follow are its
    aftermath."""

    record: IncidentRecord
    ended: frozenset[str]  # trainer_exits.ended_set() then
    ranks: int  # ranks the gather delivered (with or without entries)
    verdict: tuple[Any, ...]  # revisions.verdict() of the published report
    rests_on_ends: bool  # revisions.rests_on_ends() of the published report: only then is a later end news
    revisions: int = 0


@dataclass(slots=True)
class JobState:
    ledger: Ledger = field(default_factory=Ledger)
    pending: Signal | None = None
    running: bool = False
    first_signal_at: float | None = None
    # attempt -> (monotonic time until which, the pods' ended runs then) of the last gather that found
    # nothing to publish: quiet only while no trainer run has ended since (an exit is new evidence)
    quiet_until: dict[str, tuple[float, str]] = field(default_factory=dict)
    # (job uid, condition) of the newest incident: the condition frscope keeps first in the job's list
    asserted: tuple[str, dict[str, Any]] | None = None
    restarts: int = 0  # torchrun's restart count the sidecars reported last (for signals that carry none)
    # Pods frscope's restart deleted (uid -> name), from the reports' action records: they end because
    # they were deleted, so their exits and pushes are the acted incident's aftermath, not a new one
    # (diagnosed, they would be RankStopped and MissingDumps under the new pods' attempt and hide the
    # restarted job's own hang).
    retired: dict[str, str] = field(default_factory=dict)
    # attempt -> what its published diagnosis was drawn from (a later trainer end may revise it)
    published: dict[str, Basis] = field(default_factory=dict)
    # Reports whose action was claimed and has no outcome yet (an operator died mid-action): finished
    # by the actor whatever attempt the job's pods now make (a restart's deleted pods may be gone).
    unfinished: set[str] = field(default_factory=set)

    def retire(self, key: JobKey, pods: dict[str, str], pushes: PushStore) -> None:
        """Remember the pods (uid -> name) frscope's restart deleted, and drop what they pushed."""
        for uid, name in pods.items():
            if uid in self.retired:
                continue
            self.retired[uid] = name
            pushes.discard(key.namespace, name, uid)
            log.info("job %s: pod %s (uid %s) was deleted by frscope's restart: its exit and pushes are not "
                     "evidence of a new incident", key, name, uid, extra=job_fields(key))

    def from_retired(self, evidence: PodEvidence, store: JobStore, key: JobKey) -> bool:
        """Whether a push comes from a pod frscope's restart deleted."""
        if not self.retired:
            return False
        if evidence.pod_uid:
            return evidence.pod_uid in self.retired
        # A push that does not say its uid (--sidecar-auth token or none): by the pod of that name now.
        view = store.job(key)
        current = next((p for p in view.pods if p.name == evidence.pod), None) if view is not None else None
        return current is not None and current.uid in self.retired

    def live(self, view: JobView) -> JobView:
        """The job without the pods frscope's restart deleted (still being deleted, or not yet gone)."""
        if not self.retired or not any(p.uid in self.retired for p in view.pods):
            return view
        return replace(view, pods=tuple(p for p in view.pods if p.uid not in self.retired))

    def gone_pods(self, store: JobStore, key: JobKey) -> set[str]:
        """The job's deleted pods whose pushes may still be evidence: not those frscope's restart deleted
        (a pod of the same name that is live again is not in this set anyway)."""
        retired = set(self.retired.values())
        return {p for p in store.gone_pods(key) if p not in retired}
