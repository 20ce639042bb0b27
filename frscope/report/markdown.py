"""Markdown: for tickets, PR comments and post-mortems.

Every string that comes from the dumps, a bundle or an exit (summaries and evidence name functions, files,
groups; exits carry a termination message) goes through `frscope.report.printable`: no terminal escape
survives, and nothing in it changes the Markdown around it."""

from __future__ import annotations

from frscope.analysis import Finding, Report, fmt_ranks
from frscope.report.filters import Filters
from frscope.report.printable import md_code, md_fence, md_text, printable
from frscope.report.verdict import verdict


def _finding(finding: Finding, level: int) -> list[str]:
    group = finding.process_group
    out = [
        f"{'#' * level} {finding.category.value} — {finding.bucket.value}",
        "",
        md_text(finding.summary),
        "",
        "| | |",
        "|---|---|",
        f"| culprit ranks | {fmt_ranks(finding.culprit_ranks)}{' (no majority)' if finding.ambiguous else ''} |",
        f"| process group | {md_text(group.label())}, ranks {fmt_ranks(group.ranks)} |",
    ]
    if finding.would_decide:
        out.append(f"| what would decide | {md_text(finding.would_decide)} |")
    if finding.op:
        out.append(f"| op | {md_code(finding.op)} |")
    if finding.collective_seq_id is not None:
        out.append(f"| collective seq | {finding.collective_seq_id} |")
    if finding.input_sizes:
        out.append(f"| sizes | {md_code(str(finding.input_sizes))} |")
    if finding.input_dtypes:
        out.append(f"| dtypes | {md_code(str(finding.input_dtypes))} |")
    if finding.late_at:
        shown = ", ".join(f"{md_code(a.op)} #{a.collective_seq_id} (+{a.late_by_ms:.0f} ms)" for a in finding.late_at)
        out.append(f"| late at | {shown} |")
    if finding.stalled_for_s is not None and finding.age_source:
        out.append(f"| age from | {md_text(finding.age_source)} |")
    for rank, exit in sorted(finding.exits.items())[:4]:
        out.append(f"| rank {rank} | {md_text(exit.describe())} |")
    out.append("")
    out.extend(f"- {md_text(item)}" for item in finding.evidence)
    for rank, stack in list(finding.culprit_stacks.items())[:2]:
        out += ["", f"Rank {rank} now:", ""]
        out += md_fence([printable(f"{f.name} ({f.filename}:{f.line})") for f in stack[:12]])
    for consequence in finding.consequences:
        out.append("")
        out.extend(_finding(consequence, min(level + 1, 6)))
    return out


def render_markdown(report: Report, findings: list[Finding] | None = None, filters: Filters | None = None) -> str:
    """The report; `findings`: those `filters` kept (a line under the verdict says which, and what they hid).
    The verdict is always the whole job's."""
    shown = report.findings if findings is None else findings
    lines = ["# frscope report", "", f"**{md_text(verdict(report))}**", ""]
    if filters is not None and filters.active:
        lines += [md_text(filters.note(len(shown), len(report.findings))), ""]
    for finding in shown:
        lines.extend(_finding(finding, 2))
        lines.append("")
    lines.append(
        f"Loaded {len(report.ranks_loaded)} of {report.world_size} ranks; missing: {fmt_ranks(report.missing_ranks)}."
    )
    errors = [p for p in report.problems if p.kind == "error"]
    if errors:
        lines += ["", "## Files not used", ""] + [f"- {md_code(p.source)}: {md_text(p.message)}" for p in errors]
    return "\n".join(lines) + "\n"
