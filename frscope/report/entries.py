"""`--entries`: the collectives side by side across ranks (what `torchfrtrace -j` prints), compact:
ranks that agree share one cell, so 1,024 ranks fit on a line."""

from __future__ import annotations

from frscope.analysis import fmt_ranks
from frscope.analysis.tracks import build_tracks
from frscope.analysis.wording import plural
from frscope.records import DumpSet, Entry
from frscope.report.filters import Filters


def _cell(entry: Entry) -> str:
    state = "completed" if entry.completed else entry.state
    sizes = f" {entry.input_sizes}" if entry.input_sizes else ""
    dtypes = f" {','.join(entry.input_dtypes)}" if entry.input_dtypes else ""
    return f"{entry.op}{sizes}{dtypes} {state}"


def render_entries(dumpset: DumpSet, filters: Filters, last: int | None = None) -> str:
    tracks = build_tracks(dumpset)
    lines: list[str] = []
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
        lines.append(f"== group {name} ({group.desc or '-'}) ranks {fmt_ranks(group.ranks)}")
        # Recorded seqs only (a crafted seq of 10**15 must not make this loop that long).
        for seq in sorted({s for t in group_tracks.values() for s in t.by_seq if lo <= s <= hi}):
            cells: dict[str, list[int]] = {}
            shown = False
            for rank in members:
                track = group_tracks.get(rank)
                bucket = track.by_seq.get(seq) if track else None
                if bucket is None:
                    text = "(not entered)" if track is None or track.last_seq < seq else "(evicted)"
                else:
                    if any(filters.op_ok(e.op) for e in bucket):
                        shown = True
                    text = " + ".join(_cell(e) for e in bucket)
                cells.setdefault(text, []).append(rank)
            if not shown:
                continue
            parts = [f"{plural(ranks)}: {text}" for text, ranks in cells.items()]
            marker = "  " if len(cells) == 1 else "!!"
            lines.append(f"{marker} #{seq:<6} " + " | ".join(parts))
        p2p = [(r, e) for r, t in group_tracks.items() for e in t.p2p if filters.op_ok(e.op)]
        for rank, entry in sorted(p2p, key=lambda x: (x[1].p2p_seq_id, x[0])):
            peer = group.global_rank(entry.peer) if entry.peer is not None else None
            lines.append(f"   p2p #{entry.p2p_seq_id:<4} rank {rank}: {entry.op} peer {peer} {_cell(entry)}")
    return "\n".join(lines) + "\n"
