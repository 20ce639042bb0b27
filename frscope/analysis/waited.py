"""Lateness a rank passes on: where a rank came from when it reached a collective late.

A rank that waits, in one group, for a late peer leaves that collective only when the peer arrives, and
so reaches its next collective, in another group, late by as much (a tensor-parallel peer of a slow rank
reaches the data-parallel all_reduce as late as the slow rank). The same holds across a step: a rank that
waits at the end of a step (NCCL's sync point, gloo's last collective) for a peer's late send or
collective starts its next step, and everything in it, that much late. Its lateness is the peer's, passed
on along the wait chain (issue 33, principle 1), not its own.

`Handoffs.waited_for` answers that for one arrival from the records alone. A rank's *release* before a
collective is the latest end, before it arrived there, of its ops just before in its own record order
(any group; its program order, never guessed from clocks): a collective ends when its last member
arrives (NCCL: its recorded completion), a recorded send/recv (NCCL) when it completed. A late rank whose
time from its release to its arrival is about the on-time ranks' (it spent no more time on its own) was
late because it was released late: by the rank that held the op that released it (the last to arrive
there, or the p2p peer), followed back through ops where it was itself among the last. Pure: reads the
dumps and tracks, no I/O.
"""

from __future__ import annotations

from statistics import median
from typing import NamedTuple

from frscope.analysis.arrivals import Arrivals, arrivals
from frscope.analysis.context import Context
from frscope.records.columns import EntryTable

LOOK_BACK = 8  # ops looked back through for a release (a step's ops after the one that waited)
PEERS = 5  # on-time ranks compared with (their median): a few tell the usual time on one's own


class _Op(NamedTuple):
    group: str
    seq: int
    p2p: bool
    created: int
    completed: int  # 0: not recorded
    peer: int | None  # a p2p op's group-local peer


class _Row:
    """One collective's arrivals by rank (ns), read in place from the window's row."""

    __slots__ = ("row", "where")

    def __init__(self, where: dict[int, int], row: tuple[int, ...]) -> None:
        self.where = where
        self.row = row

    def __contains__(self, rank: int) -> bool:
        return rank in self.where

    def __getitem__(self, rank: int) -> int:
        return self.row[self.where[rank]]


class Handoffs:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._orders: dict[int, tuple[list[_Op], dict[tuple[str, int], int]]] = {}
        self._last: dict[tuple[str, int], tuple[int, int, _Row] | None] = {}
        # keyed by the margin too: whether a rank was among the last at an op depends on it, and the checks
        # ask with different margins (the step check's two thresholds, half of a consistent lateness)
        self._releases: dict[tuple[int, int, int, float], tuple[int, int] | None] = {}
        self._windows: dict[str, tuple[Arrivals, dict[int, int], dict[int, int]]] = {}

    def _order(self, rank: int) -> tuple[list[_Op], dict[tuple[str, int], int]]:
        """The rank's ops in record order, and where each collective (group, seq) first is in it."""
        got = self._orders.get(rank)
        if got is None:
            entries = self.ctx.dumpset.dumps[rank].entries
            if isinstance(entries, EntryTable):
                t = entries
                ops = [_Op(t.pgs[t.pg[i]][0], t.seq[i], bool(t.flags[i] & 1), t.created[i] or 0, t.completed[i] or 0,
                           t.names[t.name[i]][2]) for i in sorted(range(len(t.seq)), key=t.record_id.__getitem__)]
            else:
                ops = [_Op(e.pg_name, e.collective_seq_id, e.is_p2p, e.time_created_ns or 0, e.time_completed_ns or 0,
                           e.peer) for e in sorted(entries, key=lambda e: e.record_id)]
            where: dict[tuple[str, int], int] = {}
            for i, op in enumerate(ops):
                if not op.p2p:
                    where.setdefault((op.group, op.seq), i)
            got = self._orders[rank] = (ops, where)
        return got

    def _arrivals(self, group: str, seq: int) -> tuple[int, int, _Row] | None:
        """Who arrived last at (group, seq), when (ns), and every member's arrival; None outside the window
        the straggler checks read (`arrivals`: the group's last collectives every member completed and
        dated), read once per group as columns."""
        key = (group, seq)
        if key in self._last:
            return self._last[key]
        window = self._windows.get(group)
        if window is None:
            arrived = arrivals(self.ctx.tracks.get(group, {}))
            window = self._windows[group] = (arrived, {s: i for i, s in enumerate(arrived.seqs)},
                                             {r: i for i, r in enumerate(arrived.ranks)})
        arrived, index, where = window
        found: tuple[int, int, _Row] | None = None
        i = index.get(seq)
        if i is not None:
            row = arrived.rows[i]
            newest = max(row)
            at = len(row) - 1 - row[::-1].index(newest)  # a tie: the higher rank
            found = (arrived.ranks[at], newest, _Row(where, row))
        self._last[key] = found
        return found

    def _peer(self, group: str, local: int | None) -> int | None:
        info = self.ctx.dumpset.groups.get(group)
        if info is None or local is None or not 0 <= local < len(info.ranks):
            return None
        return info.ranks[local]

    def _release(self, rank: int, at: int, arrival: int, within_ns: float, hops: int = 0) -> tuple[int, int] | None:
        """(when, by whom) the rank was released before its op `at` (arriving at `arrival`): the latest end
        before `arrival` of its ops just before, and the rank that held that op; where the rank was itself
        among the last there, whoever held its own arrival there (followed back at most LOOK_BACK times).
        None: not known."""
        key = (rank, at, arrival, within_ns)
        if key in self._releases:
            return self._releases[key]
        ops, _ = self._order(rank)
        best: tuple[int, int, int] | None = None  # (end, index, holder)
        for i in range(at - 1, max(-1, at - 1 - LOOK_BACK), -1):
            op = ops[i]
            if op.p2p:
                end, holder = op.completed, self._peer(op.group, op.peer)
            else:
                there = self._arrivals(op.group, op.seq)
                if there is None or rank not in there[2]:
                    continue
                end, holder = op.completed or there[1], there[0]
                if there[1] - there[2][rank] < within_ns:
                    holder = rank  # among the last itself: nobody held it there
            if holder is not None and 0 < end <= arrival and (best is None or end > best[0]):
                best = (end, i, holder)
        found: tuple[int, int] | None = None
        if best is not None:
            end, i, holder = best
            found = (end, holder)
            if holder == rank and not ops[i].p2p:
                mine = self._arrivals(ops[i].group, ops[i].seq)
                if mine is not None and hops < LOOK_BACK:
                    further = self._release(rank, i, mine[2][rank], within_ns, hops + 1)
                    if further is not None:
                        found = (end, further[1])
        self._releases[key] = found
        return found

    def waited_for(self, rank: int, group: str, seq: int, within_ms: float, peers: list[int]) -> int | None:
        """The rank whose lateness `rank` passed on when it reached (group, seq) late, measured against
        the on-time `peers` of that collective: it spent about as long on its own since its release as
        they did (less than `within_ms` more), and another rank held that release. None: its lateness
        here is its own, or the records cannot tell."""
        _, where = self._order(rank)
        here = self._arrivals(group, seq)
        at = where.get((group, seq))
        if at is None or here is None or rank not in here[2]:
            return None
        within_ns = within_ms * 1e6
        mine = self._release(rank, at, here[2][rank], within_ns)
        if mine is None or mine[1] == rank:
            return None
        sample = [p for p in peers if p in here[2]]
        sample = sample[:: max(1, len(sample) // PEERS)][:PEERS]
        theirs = []
        for peer in sample:
            p_at = self._order(peer)[1].get((group, seq))
            released = None if p_at is None else self._release(peer, p_at, here[2][peer], within_ns)
            if released is not None:
                theirs.append(here[2][peer] - released[0])
        if not theirs:
            return None
        own = here[2][rank] - mine[0]
        return mine[1] if own - median(theirs) < within_ns else None
