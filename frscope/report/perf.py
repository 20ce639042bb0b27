"""Renderers of `frscope.analysis.perf` (where the time goes): JSON-able dict, terminal text and Markdown (group
names and descriptions come from the dumps: through `frscope.report.printable`)."""

from __future__ import annotations

from typing import Any

from frscope.analysis.perf import PerfReport
from frscope.report.printable import md_text, printable

PERF_SCHEMA = "frscope.perf/v1"
TEXT_ROWS = 15


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def perf_to_dict(report: PerfReport) -> dict[str, Any]:
    return {
        "schema": PERF_SCHEMA,
        "headline": report.headline,
        "timing": report.timing,
        "window_ms": _r(report.window_ms),
        "ranks": report.ranks,
        "collectives": report.collectives,
        "wait_ms": _r(report.wait_ms),
        "transfer_ms": _r(report.transfer_ms),
        "rank_time_ms": _r(report.rank_time_ms),
        "clock_skew_ms": report.clock_skew_ms,
        "rows": [
            {
                "group": row.group,
                "group_desc": row.group_desc,
                "op_label": row.op_label,
                "size_bucket": row.size_bucket,
                "collectives": row.collectives,
                "wait_ms": _r(row.wait_ms),
                "transfer_ms": _r(row.transfer_ms),
                "bytes": row.bytes,
                "bandwidth_gbps": _r(row.bandwidth_gbps),
                "busiest_rank_wait_ms": _r(row.busiest_rank_wait_ms),
            }
            for row in report.rows
        ],
        "costs": [
            {
                "rank": c.rank,
                "cost_ms": _r(c.cost_ms),
                "share_of_window": _r(c.cost_ms / report.window_ms, 4) if report.window_ms else None,
                "last_count": c.last_count,
                "collectives": c.collectives,
                "median_gap_ms": _r(c.median_gap_ms),
                "waited_ms": _r(c.waited_ms),
                "groups": {g: _r(ms) for g, ms in sorted(c.groups.items(), key=lambda x: -x[1])},
            }
            for c in report.costs
        ],
    }


def _ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    return f"{ms:.1f} ms" if ms >= 1 else f"{ms * 1000:.0f} us"


def _timing(report: PerfReport) -> str:
    return {
        "durations": "from the ranks' durations (NCCL timing): wait = a rank's duration - the shortest one "
        "(the transfer)",
        "creation times": "from creation times only (no durations recorded, e.g. gloo): wait = the last rank's "
        "creation - this rank's; transfer not recorded",
        "none": "no times recorded",
    }[report.timing]


def _totals(report: PerfReport) -> list[str]:
    timing = _timing(report)
    lines: list[str] = []
    lines.append(f"{report.collectives} collectives over {report.ranks} ranks, {_ms(report.window_ms)} recorded; "
                 f"times {timing}.")
    share = (f" ({100 * report.wait_ms / report.rank_time_ms:.0f}% of the ranks' time)"
             if 0 < report.wait_ms <= report.rank_time_ms else "")
    lines.append(f"waiting for late peers (compute side): {_ms(report.wait_ms)} rank-time{share}"
                 + (f"; transfer once all were there (network side): {_ms(report.transfer_ms)}"
                    if report.transfer_ms is not None else ""))
    return lines


def render_perf_text(report: PerfReport) -> str:
    lines = [report.headline, "", *_totals(report)]
    if report.costs:
        lines += ["", "Ranks that make the others wait (wall time lost: the gap to the next-latest rank where it "
                  "came last):"]
        lines.append(f"  {'rank':>6}  {'costs':>10}  {'last at':>12}  {'median gap':>10}  {'it waited':>10}  groups")
        for c in report.costs[:8]:
            groups = ", ".join(sorted(c.groups, key=lambda g: -c.groups[g])[:3])
            lines.append(f"  {c.rank:>6}  {_ms(c.cost_ms):>10}  {f'{c.last_count}/{c.collectives}':>12}  "
                         f"{_ms(c.median_gap_ms):>10}  {_ms(c.waited_ms):>10}  {groups}")
    if report.rows:
        lines += ["", "Per group, op and size (wait: rank-time summed over the ranks; transfer: per collective):"]
        lines.append(f"  {'group':<22} {'op':<15} {'size':<13} {'count':>6} {'wait':>10} {'transfer':>10} {'GB/s':>7}")
        for row in report.rows[:TEXT_ROWS]:
            group = row.group + (f" ({row.group_desc})" if row.group_desc and row.group_desc != "undefined" else "")
            bw = f"{row.bandwidth_gbps:.2f}" if row.bandwidth_gbps is not None else "-"
            lines.append(f"  {group[:22]:<22} {row.op_label:<15} {row.size_bucket:<13} {row.collectives:>6} "
                         f"{_ms(row.wait_ms):>10} {_ms(row.transfer_ms):>10} {bw:>7}")
        if len(report.rows) > TEXT_ROWS:
            lines.append(f"  ... {len(report.rows) - TEXT_ROWS} more (--format json has them all)")
    return "\n".join(map(printable, lines)) + "\n"


def render_perf_markdown(report: PerfReport) -> str:
    """The same as the text, as Markdown tables (every row: `--format json` has them too)."""
    lines = ["# frscope: where the time goes", "", f"**{md_text(report.headline)}**", ""]
    lines += [md_text(line) for line in _totals(report)]
    if report.costs:
        lines += ["", "## Ranks that make the others wait", "",
                  "Wall time lost: the gap to the next-latest rank where it came last.", "",
                  "| rank | costs | last at | median gap | it waited | groups |", "|---:|---:|---:|---:|---:|---|"]
        for c in report.costs:
            groups = ", ".join(md_text(g) for g in sorted(c.groups, key=lambda g: -c.groups[g])[:3])
            lines.append(f"| {c.rank} | {_ms(c.cost_ms)} | {c.last_count}/{c.collectives} | {_ms(c.median_gap_ms)} "
                         f"| {_ms(c.waited_ms)} | {groups} |")
    if report.rows:
        lines += ["", "## Per group, op and size", "",
                  "Wait: rank-time summed over the ranks; transfer: per collective.", "",
                  "| group | op | size | count | wait | transfer | GB/s |", "|---|---|---|---:|---:|---:|---:|"]
        for row in report.rows:
            group = row.group + (f" ({row.group_desc})" if row.group_desc and row.group_desc != "undefined" else "")
            bw = f"{row.bandwidth_gbps:.2f}" if row.bandwidth_gbps is not None else "-"
            lines.append(f"| {md_text(group)} | {md_text(row.op_label)} | {md_text(row.size_bucket)} | "
                         f"{row.collectives} | {_ms(row.wait_ms)} | {_ms(row.transfer_ms)} | {bw} |")
    return "\n".join(lines) + "\n"
