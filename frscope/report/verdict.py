"""The report's verdict in one sentence: the top finding's summary, or what was checked when nothing is
wrong. Every renderer leads with it (text, Markdown, the JSON's `verdict`, the HTML title)."""

from __future__ import annotations

from frscope.analysis import Report


def verdict(report: Report) -> str:
    if report.findings:
        return report.findings[0].summary
    groups = len(report.groups)
    return (
        f"No problem found: {len(report.ranks_loaded)} rank{'s' if len(report.ranks_loaded) != 1 else ''}, "
        f"{groups} process group{'s' if groups != 1 else ''}; no collective is stuck or mismatched."
    )
