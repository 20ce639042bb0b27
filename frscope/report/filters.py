"""`--op`, `--pg`, `--rank` filters, shared by the findings output, the side-by-side entries view and the
perf view.

A filter narrows what is *shown*, never what the job *is*: the verdict, `healthy` and the exit code stay
those of the whole report (a filter that hides the hung rank must not make the job look healthy), and a
filter value that names nothing in the dumps is a usage error (`unmatched`), not an empty report."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from frscope.analysis import Finding, Report, fmt_ranks, op_label
from frscope.records import DumpSet
from frscope.records.columns import EntryTable
from frscope.records.limits import MAX_RANK
from frscope.report.printable import printable

# At most this many existing values are listed in a "matches nothing" message.
LISTED = 20

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

    @property
    def active(self) -> bool:
        return bool(self.ops or self.groups or self.ranks is not None)

    def flags(self) -> str:
        """The filters as command-line flags: '--op broadcast --rank 0-1'."""
        parts = []
        if self.ops:
            parts.append(f"--op {','.join(sorted(self.ops))}")
        if self.groups:
            parts.append(f"--pg {','.join(sorted(self.groups))}")
        if self.ranks is not None:
            parts.append(f"--rank {fmt_ranks(self.ranks).replace(' ', '')}")
        return printable(" ".join(parts))

    def to_dict(self) -> dict[str, Any]:
        """The report JSON's `filters` (docs/report-json.md)."""
        return {
            "op": sorted(self.ops) or None,
            "pg": sorted(self.groups) or None,
            "rank": sorted(self.ranks) if self.ranks is not None else None,
        }

    def unmatched(self, dumpset: DumpSet, report: Report) -> str | None:
        """None when every `--op` and `--pg` value names an op or group of the dumps (or of a finding) and
        `--rank` names at least one rank of the job; else one line naming the value and what exists."""
        findings = list(_walk(report.findings))
        if self.ops:
            ops = _ops_recorded(dumpset) | {f.op for f in findings if f.op}
            known = {o.lower() for o in ops} | {op_label(o).lower() for o in ops}
            missing = sorted(self.ops - known)
            if missing:
                listed = _listing(sorted(ops))
                return (f"--op {printable(','.join(missing))} matches no collective of the dumps; "
                        f"ops recorded: {listed or 'none'} (or their labels, e.g. ALLREDUCE)")
        if self.groups:
            groups = {(g.name, g.desc) for g in dumpset.groups.values()}
            groups |= {(f.process_group.name, f.process_group.desc) for f in findings}
            missing = sorted(self.groups - {n for n, _ in groups} - {d for _, d in groups})
            if missing:
                listed = _listing(f"{n} ({d})" if d and d != n else n for n, d in sorted(groups))
                return (f"--pg {printable(','.join(missing))} matches no process group of the dumps; "
                        f"groups (name (description)): {listed or 'none'}")
        if self.ranks is not None:
            ranks = set(range(report.world_size)) | set(report.ranks_loaded) | set(report.missing_ranks)
            if not self.ranks & ranks:
                return (f"--rank {fmt_ranks(self.ranks)} matches no rank of this job; "
                        f"ranks: {fmt_ranks(ranks) if ranks else 'none'} (world size {report.world_size})")
        return None

    def note(self, shown: int, total: int) -> str:
        """One line under the verdict: which filters, what they kept, and that the verdict is the whole job's."""
        if total == 0:
            return f"Filtered by {self.flags()}: the job has no findings."
        if shown == 0:
            return (f"Filtered by {self.flags()}: none of the job's {total} finding(s) matches; the job is not "
                    "healthy (the verdict above is the whole job's).")
        return f"Filtered by {self.flags()}: {shown} of the job's {total} finding(s) shown."


def _walk(findings: Iterable[Finding]) -> Iterator[Finding]:
    for finding in findings:
        yield finding
        yield from _walk(finding.consequences)


def _ops_recorded(dumpset: DumpSet) -> set[str]:
    """Every op name in the dumps (a columnar rank keeps its distinct names in a table: no entry is built)."""
    ops: set[str] = set()
    for dump in dumpset.dumps.values():
        if isinstance(dump.entries, EntryTable):
            ops.update(op for _, op, _ in dump.entries.names if op)
        else:
            ops.update(e.op for e in dump.entries if e.op)
    return ops


def _listing(values: Iterable[str]) -> str:
    items = list(values)
    shown = ", ".join(printable(v) for v in items[:LISTED])
    return shown + (f", ... ({len(items) - LISTED} more)" if len(items) > LISTED else "")
