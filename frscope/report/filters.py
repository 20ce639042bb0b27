"""`--op`, `--pg`, `--rank` filters, shared by the findings output and the side-by-side entries view."""

from __future__ import annotations

from dataclasses import dataclass

from frscope.analysis import Finding, op_label


def parse_ranks(text: str) -> frozenset[int]:
    """'0-7,12,14-15' -> {0..7, 12, 14, 15}. Raises ValueError with the offending part."""
    ranks: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                start, end = int(lo), int(hi)
                if end < start:
                    raise ValueError
                ranks.update(range(start, end + 1))
            else:
                ranks.add(int(part))
        except ValueError:
            raise ValueError(f"bad rank range {part!r} (expected e.g. 0-7,12)") from None
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
