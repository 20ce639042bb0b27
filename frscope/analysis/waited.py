"""Lateness a rank passes on: where a rank came from when it reached a collective late.

A rank that waits, in one group, for a late peer leaves that collective only when the peer arrives, and
so reaches its next collective, in another group, late by as much (a tensor-parallel peer of a slow rank
reaches the data-parallel all_reduce as late as the slow rank). Its lateness there is the peer's, passed
on along the wait chain (issue 33, principle 1), not its own.

`Handoffs.waited_for` answers that for one arrival from the records alone: the rank's collectives before
it in its own record order (any group; its program order, never guessed from clocks), who arrived last
at each and when. Pure: reads the tracks, no I/O.
"""

from __future__ import annotations

from frscope.analysis.context import Context
from frscope.records.columns import EntryTable

LOOK_BACK = 8  # collectives looked back through (a step's lockstep collectives after the one that waited)


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
        """The rank whose lateness `rank` passed on when it reached (group, seq): going back through the
        rank's collectives before it (its record order) while it came on from each at once (less than
        `within_ms` after the last arrival there; in lockstep collectives, nobody waited), the first where
        it waited at least `within_ms` for the rank that came last. None: its lateness here is its own
        (it spent the time between on its own, or came last where it waited)."""
        order, where = self._order(rank)
        at = where.get((group, seq))
        here = self._arrivals(group, seq)
        if at is None or here is None or rank not in here[2]:
            return None
        arrival, within_ns = here[2][rank], within_ms * 1e6
        seen = {(group, seq)}
        for i in range(at - 1, max(-1, at - 1 - LOOK_BACK), -1):
            if order[i] in seen:
                continue  # a coalesced op's other entries
            seen.add(order[i])
            there = self._arrivals(*order[i])
            if there is None or rank not in there[2]:
                return None
            last, last_ns, times = there
            if not 0 <= arrival - last_ns < within_ns:
                return None  # it spent the time since on its own
            if last != rank and last_ns - times[rank] >= within_ns:
                return last
            if last == rank and last_ns - min(times.values()) >= within_ns:
                return None  # it came last there itself, and others waited for it
            arrival = times[rank]
        return None
