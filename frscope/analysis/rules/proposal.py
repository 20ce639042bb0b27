"""What a rule hands to the ranking step: a finding, the rule that made it, and where it stands."""

from __future__ import annotations

from dataclasses import dataclass

from frscope.analysis.findings import Finding

Point = tuple[str, int]  # (group name, collective_seq_id): a collective ranks stand still in


@dataclass(slots=True)
class Proposal:
    finding: Finding
    rule: str
    # The stuck points this finding explains: ranks blocked there wait because of it. The ranking step
    # gives each point to the proposal of highest precedence; a hang proposed there nests under it.
    points: list[Point]
    # A mismatch explains every later stuck point of its group too (the group diverged, then stopped).
    covers_later: bool = False
    # Its finding already tells the ranks waiting at its points (who waits where, since when): a
    # NotCompleted there is the same event, not a consequence, and is left out.
    absorbs_waiting: bool = False
    # A mismatch that gloo aborts on (different byte counts): the receiving rank dies at it, so a rank
    # whose recorder stopped before it in the same group may be that receiver, its dump older than its end.
    aborts_peers: bool = False
    # The rule's own word that this finding is a consequence of another of its findings.
    caused_by: Finding | None = None
    # Proposed only for when nothing else explains the job: kept when every other root is a straggler.
    fallback: bool = False
