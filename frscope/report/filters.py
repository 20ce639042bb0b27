"""`--op`, `--pg`, `--rank` filters, shared by the findings output and the side-by-side entries view."""

from __future__ import annotations

import re
from dataclasses import dataclass

from frscope.analysis import Finding, op_label
from frscope.records.limits import MAX_RANK

# One part of a rank list ('3' or '0-7'); the web page's rank box matches its parts with this same
# pattern (frscope/report/html.py sends it; timeline_list.js parseRankList), so both read `0-7,12` alike.
RANK_PART = r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?"
_RANK_PART = re.compile(RANK_PART)


def parse_ranks(text: str) -> frozenset[int]:
    """'0-7,12,14-15' -> {0..7, 12, 14, 15}. Raises ValueError with the offending part."""
    ranks: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            continue
        m = _RANK_PART.fullmatch(part)
        lo = int(m[1]) if m else 0
        hi = int(m[2]) if m and m[2] is not None else lo
        if m is None or hi < lo or hi >= MAX_RANK:
            raise ValueError(f"bad rank range {part.strip()!r} (expected e.g. 0-7,12)")
        ranks.update(range(lo, hi + 1))
    return frozenset(ranks)


@dataclass(frozen=True, slots=True)
class Filters:
    ops: frozenset[str] = frozenset()  # op names or labels, lower-cased: 'all_reduce', 'allreduce'
    groups: frozenset[str] = frozenset()  # group name or desc
    ranks: frozenset[int] | None = None

    @classmethod
    def parse(cls, ops: str | None, groups: str | None, ranks: str | None) -> Filters:
        return cls(
            ops=frozenset(o.strip().lower() for o in ops.split(",") if o.strip()) if ops else frozenset(),
            groups=frozenset(g.strip() for g in groups.split(",") if g.strip()) if groups else frozenset(),
            ranks=parse_ranks(ranks) if ranks else None,
        )

    def op_ok(self, op: str | None) -> bool:
        if not self.ops:
            return True
        if op is None:
            return False
        return op.lower() in self.ops or op_label(op).lower() in self.ops

    def group_ok(self, name: str, desc: str) -> bool:
        return not self.groups or name in self.groups or desc in self.groups

    def rank_ok(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def finding_ok(self, finding: Finding) -> bool:
        group = finding.process_group
        return (
            self.op_ok(finding.op)
            and self.group_ok(group.name, group.desc)
            and (self.ranks is None or bool(self.ranks & set(finding.culprit_ranks)))
        )

    def apply(self, findings: list[Finding]) -> list[Finding]:
        """Root findings that match, or whose consequences match (shown with their root)."""
        return [f for f in findings if self.finding_ok(f) or any(self.finding_ok(c) for c in f.consequences)]
