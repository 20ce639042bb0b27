"""Terminal text: the verdict in one sentence first, then the evidence.

Every line goes through `frscope.report.printable` before it is joined: a function name, file name, group
description or exit message from a dump or bundle cannot move the cursor, retitle the window, write the
clipboard or start a new line."""

from __future__ import annotations

from frscope.analysis import Finding, Report, fmt_ranks
from frscope.records import Frame
from frscope.report.filters import Filters
from frscope.report.printable import printable
from frscope.report.verdict import verdict

MAX_FRAMES = 12


def _frames(frames: tuple[Frame, ...], indent: str) -> list[str]:
    lines = [f"{indent}{f.name} ({f.filename}:{f.line})" for f in frames[:MAX_FRAMES]]
    if len(frames) > MAX_FRAMES:
        lines.append(f"{indent}... {len(frames) - MAX_FRAMES} more frames")
    return lines


def _finding(finding: Finding, number: str, indent: str = "") -> list[str]:
    group = finding.process_group
    head = f"{indent}[{number}] {finding.category.value} ({finding.bucket.value})"
    if finding.ambiguous:
        head += " - no majority, culprits are candidates"
    lines = [head, f"{indent}    {finding.summary}"]
    if finding.would_decide:
        lines.append(f"{indent}    what would decide: {finding.would_decide}")
    what = []
    if finding.op:
        what.append(finding.op)
    if finding.collective_seq_id is not None:
        what.append(f"collective #{finding.collective_seq_id}")
    if finding.p2p_seq_id is not None:
        what.append(f"p2p #{finding.p2p_seq_id}")
    if finding.input_sizes:
        what.append(f"sizes {finding.input_sizes}")
    if finding.input_dtypes:
        what.append(f"dtypes {finding.input_dtypes}")
    lines.append(f"{indent}    culprit ranks: {fmt_ranks(finding.culprit_ranks)}")
    lines.append(f"{indent}    group: {group.label()}, {len(group.ranks)} ranks [{fmt_ranks(group.ranks)}]")
    if what:
        lines.append(f"{indent}    collective: {', '.join(what)}")
    for item in finding.evidence:
        lines.append(f"{indent}    - {item}")
    if finding.late_at:
        shown = ", ".join(f"{a.op} #{a.collective_seq_id} (+{a.late_by_ms:.0f} ms)" for a in finding.late_at)
        lines.append(f"{indent}    late at: {shown}")
    if finding.age_source and finding.stalled_for_s is not None:
        lines.append(f"{indent}    age from: {finding.age_source}")
    for rank, exit in sorted(finding.exits.items())[:4]:
        if rank not in finding.culprit_ranks or not exit.failed:  # failed culprits are in the evidence
            lines.append(f"{indent}    rank {rank}: {exit.describe()}")
    for rank, stack in list(finding.culprit_stacks.items())[:2]:
        lines.append(f"{indent}    rank {rank} now (most recent call first):")
        lines.extend(_frames(stack, indent + "      "))
    for rank, frames in list(finding.culprit_frames.items())[:2]:
        lines.append(f"{indent}    rank {rank} enqueued its op from:")
        lines.extend(_frames(frames, indent + "      "))
    for i, consequence in enumerate(finding.consequences, 1):
        lines.append(f"{indent}    consequence:")
        lines.extend(_finding(consequence, f"{number}.{i}", indent + "    "))
    return lines


def render_text(report: Report, findings: list[Finding] | None = None, filters: Filters | None = None) -> str:
    """The report; `findings`: those `filters` kept (a line under the verdict says which, and what they hid).
    The verdict is always the whole job's."""
    shown = report.findings if findings is None else findings
    lines = [verdict(report), ""]
    if filters is not None and filters.active:
        lines += [filters.note(len(shown), len(report.findings)), ""]
    for i, finding in enumerate(shown, 1):
        lines.extend(_finding(finding, str(i)))
        lines.append("")
    loaded = report.ranks_loaded
    lines.append(
        f"Loaded {len(loaded)} of {report.world_size} ranks ({report.backend or 'unknown backend'}, "
        f"format {', '.join(report.versions) or '?'}); missing: {fmt_ranks(report.missing_ranks)}; "
        f"{len(report.groups)} process groups."
    )
    errors = [p for p in report.problems if p.kind == "error"]
    warnings = [p for p in report.problems if p.kind != "error"]
    if errors:
        lines.append(f"{len(errors)} file(s) could not be used:")
        lines.extend(f"  - {p}" for p in errors[:20])
        if len(errors) > 20:
            lines.append(f"  ... and {len(errors) - 20} more")
    if warnings:
        lines.append(f"{len(warnings)} warning(s):")
        lines.extend(f"  - {p}" for p in warnings[:10])
        if len(warnings) > 10:
            lines.append(f"  ... and {len(warnings) - 10} more")
    return "\n".join(map(printable, lines)) + "\n"
