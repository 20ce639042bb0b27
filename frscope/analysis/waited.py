"""Lateness a rank passes on: where a rank came from when it reached a collective late.

A rank that waits, in one group, for a late peer leaves that collective only when the peer arrives, and
so reaches its next collective, in another group, late by as much (a tensor-parallel peer of a slow rank
reaches the data-parallel all_reduce as late as the slow rank). Its lateness there is the peer's, passed
on along the wait chain (issue 33, principle 1), not its own.

`Handoffs.waited_for` answers that for one arrival from the records alone: the rank's previous
collective in its own record order (any group; its program order, never guessed from clocks), who
arrived last there and when. Pure: reads the tracks, no I/O.
"""

from __future__ import annotations

from frscope.analysis.context import Context
from frscope.records.columns import EntryTable

LOOK_BACK = 4  # entries looked at before a collective for the rank's previous collective


class Handoffs:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._orders: dict[int, tuple[list[tuple[str, int]], dict[tuple[str, int], int]]] = {}
        self._last: dict[tuple[str, int], tuple[int, int, dict[int, int]] | None] = {}

    def _order(self, rank: int) -> tuple[list[tuple[str, int]], dict[tuple[str, int], int]]:
        """The rank's collectives (group, seq) in record order, and where each first is in it."""
        got = self._orders.get(rank)
        if got is None:
            entries = self.ctx.dumpset.dumps[rank].entries
            if isinstance(entries, EntryTable):
                pgs, pg, seqs, flags = entries.pgs, entries.pg, entries.seq, entries.flags
                order = [(pgs[pg[i]][0], seqs[i]) for i in sorted(range(len(seqs)), key=entries.record_id.__getitem__)
                         if not flags[i] & 1]
            else:
                order = [(e.pg_name, e.collective_seq_id) for e in sorted(entries, key=lambda e: e.record_id)
                         if not e.is_p2p]
            where: dict[tuple[str, int], int] = {}
            for i, key in enumerate(order):
                where.setdefault(key, i)
            got = self._orders[rank] = (order, where)
        return got

    def _arrivals(self, group: str, seq: int) -> tuple[int, int, dict[int, int]] | None:
        """Who arrived last at (group, seq), when (ns), and every member's arrival; None when a member's
        entry is missing or undated."""
        key = (group, seq)
        if key in self._last:
            return self._last[key]
        found: tuple[int, int, dict[int, int]] | None = None
        tracks = self.ctx.tracks.get(group, {})
        times: dict[int, int] = {}
        for rank, track in tracks.items():
            created = track.first_created(range(seq, seq + 1))[0]
            if not created:
                break
            times[rank] = created
        else:
            if len(times) >= 2:
                last = max(times, key=lambda r: (times[r], r))
                found = (last, times[last], times)
        self._last[key] = found
        return found

    def waited_for(self, rank: int, group: str, seq: int, within_ms: float) -> int | None:
        """The rank whose lateness `rank` passed on when it reached (group, seq): in its previous collective
        it waited at least `within_ms` for that rank (the last to arrive there), and it reached (group, seq)
        less than `within_ms` after that rank arrived there. None: its lateness here is its own."""
        order, where = self._order(rank)
        at = where.get((group, seq))
        here = self._arrivals(group, seq)
        if at is None or here is None or rank not in here[2]:
            return None
        prev = next((order[i] for i in range(at - 1, max(-1, at - 1 - LOOK_BACK), -1) if order[i] != (group, seq)),
                    None)
        if prev is None:
            return None
        there = self._arrivals(*prev)
        if there is None or rank not in there[2]:
            return None
        last, last_ns, times = there
        within_ns = within_ms * 1e6
        if last == rank or last_ns - times[rank] < within_ns:
            return None  # it came last there itself, or hardly waited
        gone_on = here[2][rank] - last_ns  # from the moment it could leave to its arrival here
        return last if 0 <= gone_on < within_ns else None
