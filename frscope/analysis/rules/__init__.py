"""The diagnosis as rules over shared facts, ranked in one step (`precedence`).

Each rule takes the facts (`facts.Facts`) and returns proposals (`proposal.Proposal`): findings
with the evidence they used and the stuck points they explain. Rules never see each other's output.
"""

from __future__ import annotations

from collections.abc import Callable

from frscope.analysis.rules import exits, group_rules, job_rules, missing, partial
from frscope.analysis.rules.facts import Facts
from frscope.analysis.rules.proposal import Proposal

Rule = Callable[[Facts], list[Proposal]]

RULES: tuple[Rule, ...] = (
    missing.missing_dumps,
    group_rules.mismatches,
    group_rules.hangs,
    group_rules.stale,
    exits.left_after_finish,
    exits.left_early,
    partial.ended_alone,
    group_rules.p2p_recorded,
    job_rules.p2p_from_stacks,
    job_rules.stragglers,
    exits.unrecorded_failures,
    exits.failed_after_records,
    exits.gone_among_live,
)
