"""Report revisions: an attempt's published report rewritten in place when trainer ends it did not know
arrive later and change its verdict (`jobstate.Basis` says what it was drawn from)."""

from __future__ import annotations

import logging
from typing import Any

from frscope.analysis import Report
from frscope.operator.engine.jobstate import Basis, JobState, job_fields
from frscope.operator.evidence.trainer_exits import ended_set
from frscope.operator.model.incidents import Attempt, IncidentKey, IncidentRecord
from frscope.operator.model.signals import Signal
from frscope.operator.model.store import JobView

log = logging.getLogger(__name__)

# How often one attempt's report may be revised as trainer ends arrive after it was written (bounds the
# API writes a job whose pods end one by one over minutes can cause).
MAX_REVISIONS = 3

# Categories decided by which processes had ended: ranks that stopped, ranks missing.
_ENDS_DECIDE = frozenset({"RankStopped", "MissingDumps"})


def verdict(report: Report) -> tuple[Any, ...]:
    """What a revision must change to be written: the first finding's category, culprits, group and
    sequence id, and the exits it cites (not its ages, which grow with every gather)."""
    finding = report.findings[0]
    exits = tuple(sorted((r, e.exit_code, e.message) for r, e in finding.exits.items()))
    return (finding.category.value, tuple(sorted(finding.culprit_ranks)), finding.process_group.name,
            finding.collective_seq_id, exits)


def rests_on_ends(report: Report) -> bool:
    """Whether which processes had ended (and how) decided the first finding: ranks that stopped, ranks
    missing (a pod that went down before it was read), or culprits named with their exits."""
    finding = report.findings[0]
    return finding.category.value in _ENDS_DECIDE or any(r in finding.exits for r in finding.culprit_ranks)


def revisable(state: JobState, view: JobView, attempt: Attempt) -> Basis | None:
    """The attempt's published diagnosis, when trainer ends it did not know have arrived since, its
    report is still there, and it may be revised again."""
    basis = state.published.get(str(attempt))
    if basis is None or basis.revisions >= MAX_REVISIONS or not basis.rests_on_ends:
        return None
    if not any(r.id == basis.record.id for r in state.ledger.records):
        return None  # its report was deleted
    return basis if ended_set(view.pods) - basis.ended else None


def revision_key(view: JobView, sig: Signal, attempt: Attempt, basis: Basis, report: Report,
                 ranks: int) -> IncidentKey | None:
    """The attempt diagnosed again with trainer ends its report did not know: the incident to rewrite
    the report under when the verdict changed, with no fewer ranks (`ranks`) behind it; else None, and
    the report stands. Either way `basis` now knows the ends of `view`."""
    ended, basis.ended = basis.ended, ended_set(view.pods)
    if report.healthy or ranks < basis.ranks:
        log.info("job %s: %s: report %s stands (the new gather %s)", view.key, sig.kind.value,
                 basis.record.report, "found nothing" if report.healthy else
                 f"delivered {ranks} ranks, it had {basis.ranks}", extra=job_fields(view.key))
        return None
    if verdict(report) == basis.verdict:
        log.info("job %s: %s: report %s stands (same verdict with the later trainer ends)", view.key,
                 sig.kind.value, basis.record.report, extra=job_fields(view.key))
        return None
    finding = report.findings[0]
    basis.revisions += 1
    why = ", ".join(sorted(e.split("/")[0] for e in basis.ended - ended))
    log.warning("job %s: revising report %s (revision %d): trainer ends it did not know (pod uid %s)",
                view.key, basis.record.report, basis.revisions, why, extra=job_fields(view.key, basis.record.id))
    return IncidentKey(view.ref.uid, attempt, finding.process_group.name, finding.collective_seq_id)


def published_basis(basis: Basis | None, state: JobState, attempt: Attempt, record: IncidentRecord, report: Report,
                    view: JobView, ranks: int) -> None:
    """Note what a written report was drawn from: a new attempt's basis, or the revised one's."""
    if basis is not None:
        basis.record, basis.verdict = record, verdict(report)
        basis.rests_on_ends = rests_on_ends(report)
        basis.ranks = max(basis.ranks, ranks)
    else:
        state.published[str(attempt)] = Basis(record, ended_set(view.pods), ranks, verdict(report),
                                              rests_on_ends(report))
