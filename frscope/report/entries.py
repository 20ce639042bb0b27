"""`--entries`: the collectives side by side across ranks (what `torchfrtrace -j` prints), compact:
ranks that agree share one cell, so 1,024 ranks fit on a line.

`build_entries` makes the view as data (the JSON of `--entries --format json`, docs/report-json.md);
`render_entries` (text) and `render_entries_markdown` print it, every string from the dumps through
`frscope.report.printable`."""

from __future__ import annotations

from typing import Any

from frscope.analysis import fmt_ranks
from frscope.analysis.tracks import build_tracks
from frscope.analysis.wording import plural
from frscope.records import DumpSet, Entry
from frscope.report.filters import Filters
from frscope.report.printable import md_code, md_text, printable

ENTRIES_SCHEMA = "frscope.entries/v1"


def _entry(entry: Entry) -> dict[str, Any]:
    return {
        "op": entry.op,
        "input_sizes": entry.input_sizes or None,
        "input_dtypes": entry.input_dtypes or None,
        "state": "completed" if entry.completed else entry.state,
    }


def _cell_text(cell: dict[str, Any]) -> str:
    if cell["absent"]:
        return f"({cell['absent']})"
    parts = []
    for e in cell["entries"]:
        sizes = f" {e['input_sizes']}" if e["input_sizes"] else ""
        dtypes = f" {','.join(e['input_dtypes'])}" if e["input_dtypes"] else ""
        parts.append(f"{e['op']}{sizes}{dtypes} {e['state']}")
    return " + ".join(parts)


def build_entries(dumpset: DumpSet, filters: Filters, last: int | None = None) -> dict[str, Any]:
    """Per group the filters keep: its collectives by sequence id (the last `last` per group), each a list of
    cells (`ranks` that recorded the same thing, or `absent`: 'not entered' / 'evicted'), `agree` when
    there is one cell; and its p2p ops."""
    tracks = build_tracks(dumpset)
    groups: list[dict[str, Any]] = []
    for name, group in dumpset.groups.items():
        if not filters.group_ok(name, group.desc):
            continue
        members = [r for r in group.ranks if filters.rank_ok(r)]
        group_tracks = {r: t for r, t in tracks.get(name, {}).items() if r in members}
        if not group_tracks:
            continue
        hi = max(t.last_seq for t in group_tracks.values())
        lo = min(t.first_seq for t in group_tracks.values() if t.by_seq) if hi else 0
        if last is not None:
            lo = max(lo, hi - last + 1)
        collectives: list[dict[str, Any]] = []
        # Recorded seqs only (a crafted seq of 10**15 must not make this loop that long).
        for seq in sorted({s for t in group_tracks.values() for s in t.by_seq if lo <= s <= hi}):
            cells: dict[str, dict[str, Any]] = {}
            shown = False
            for rank in members:
                track = group_tracks.get(rank)
                bucket = track.by_seq.get(seq) if track else None
                if bucket is None:
                    absent = "not entered" if track is None or track.last_seq < seq else "evicted"
                    cell: dict[str, Any] = {"ranks": [], "entries": None, "absent": absent}
                else:
                    shown = shown or any(filters.op_ok(e.op) for e in bucket)
                    cell = {"ranks": [], "entries": [_entry(e) for e in bucket], "absent": None}
                cells.setdefault(_cell_text(cell), cell)["ranks"].append(rank)
            if shown:
                collectives.append({"collective_seq_id": seq, "agree": len(cells) == 1, "cells": list(cells.values())})
        p2p = [(r, e) for r, t in group_tracks.items() for e in t.p2p if filters.op_ok(e.op)]
        groups.append({
            "name": name,
            "desc": group.desc,
            "ranks": list(group.ranks),
            "collectives": collectives,
            "p2p": [
                {"p2p_seq_id": e.p2p_seq_id, "rank": rank,
                 "peer": group.global_rank(e.peer) if e.peer is not None else None, **_entry(e)}
                for rank, e in sorted(p2p, key=lambda x: (x[1].p2p_seq_id, x[0]))
            ],
        })
    return {"schema": ENTRIES_SCHEMA, "groups": groups}


def _p2p_text(op: dict[str, Any]) -> str:
    cell = {"absent": None, "entries": [op]}
    return f"rank {op['rank']}: {op['op']} peer {op['peer']} {_cell_text(cell)}"


def render_entries(dumpset: DumpSet, filters: Filters, last: int | None = None) -> str:
    """Text: a line per group, a line per collective (`!!` where the ranks disagree), a line per p2p op."""
    lines: list[str] = []
    for group in build_entries(dumpset, filters, last)["groups"]:
        lines.append(f"== group {group['name']} ({group['desc'] or '-'}) ranks {fmt_ranks(group['ranks'])}")
        for c in group["collectives"]:
            parts = [f"{plural(cell['ranks'])}: {_cell_text(cell)}" for cell in c["cells"]]
            lines.append(f"{'  ' if c['agree'] else '!!'} #{c['collective_seq_id']:<6} " + " | ".join(parts))
        for op in group["p2p"]:
            lines.append(f"   p2p #{op['p2p_seq_id']:<4} {_p2p_text(op)}")
    return "".join(printable(line) + "\n" for line in lines) or "\n"


def render_entries_markdown(dumpset: DumpSet, filters: Filters, last: int | None = None) -> str:
    """Markdown: a section and a table per group (a collective per row; **differ** where ranks disagree)."""
    lines = ["# frscope: collectives side by side", ""]
    for group in build_entries(dumpset, filters, last)["groups"]:
        lines += [f"## group {md_text(group['name'])} ({md_text(group['desc'] or '-')}), "
                  f"ranks {fmt_ranks(group['ranks'])}", ""]
        if group["collectives"]:
            lines += ["| collective | ranks agree | what each rank recorded |", "|---|---|---|"]
            for c in group["collectives"]:
                cells = "; ".join(f"{plural(cell['ranks'])}: {md_code(_cell_text(cell))}" for cell in c["cells"])
                lines.append(f"| #{c['collective_seq_id']} | {'yes' if c['agree'] else '**differ**'} | {cells} |")
            lines.append("")
        if group["p2p"]:
            lines += [f"- p2p #{op['p2p_seq_id']}: {md_code(_p2p_text(op))}" for op in group["p2p"]] + [""]
    return "\n".join(lines) + "\n"
