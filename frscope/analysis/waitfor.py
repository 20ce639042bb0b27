"""The wait-for model: where every rank stands, and whom it waits on, across all groups.

Every check that asks "who is this rank waiting for?" reads it here, from one reading of each rank:

- `MISSING`: no dump. What it does is unknown; it waits on nobody the evidence names.
- `BLOCKED`: an op it recorded is open (its oldest, across groups). In a collective it waits on the
  members of that group that never entered it; in a point-to-point op, on its peer (unnamed in a
  coalesced batch). Whether the op holds the rank's own thread (`blocks_caller`) matters: gloo's ops
  do, a GPU collective holds only the rank's stream unless its live stack shows it waiting.
- `IN_UNRECORDED`: nothing open, and its live stack sits in an op the recorder does not keep (gloo's
  send/recv, `monitored_barrier`): it waits on a peer that no evidence names.
- `IN_PYTHON`: nothing open, and its live stack is in no torch.distributed call: it waits on nobody.
- `IDLE`: nothing open and no live stack: it waits on nobody the evidence shows (or in an op gloo
  does not record, which `hidden_p2p` says may be so).

A rank that waits on nobody is a *sink*: wait chains end there, and a hang's culprit is a sink, never
a rank that merely had not joined because it waits on another. Chains are followed across groups
and through point-to-point peers (`chain`); a chain that comes back to a rank is a cycle (two groups
issued in different orders), which `rootcause` breaks at the rank whose own order differs.

Pure: reads records, tracks and stacks only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from frscope.analysis.stacks import GROUP_CREATION, P2P_FUNCTIONS, blocked_in
from frscope.analysis.tracks import Track, oldest_open
from frscope.records import DumpSet, Entry, Frame

# Ops gloo does not record whose waits show only in stacks: point-to-point, monitored_barrier (which
# gloo runs as sends and receives to and from rank 0), and creating a group (its ranks meet in the store).
UNRECORDED_OPS = P2P_FUNCTIONS | {"monitored_barrier"} | GROUP_CREATION
MAX_HOPS = 8  # p2p chains (pipeline stages) longer than this are not followed


class State(StrEnum):
    MISSING = "missing"
    BLOCKED = "blocked"
    IN_UNRECORDED = "in_unrecorded"
    IN_PYTHON = "in_python"
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class RankWait:
    """One rank's place in the wait-for graph."""

    rank: int
    state: State
    entry: Entry | None = None  # the open op it is held at (BLOCKED)
    inside: str | None = None  # the torch.distributed function its live stack is in
    # Whom it waits on: the members that never entered its collective, or its p2p peer. None where it
    # waits on someone the evidence does not name (a coalesced batch, an unrecorded send/recv, a gloo
    # group's member that never entered and that the group's entries do not show).
    on: frozenset[int] | None = frozenset()
    blocks_caller: bool = False  # the open op holds the rank's thread (gloo, or its stack shows it)

    @property
    def open(self) -> bool:
        return self.entry is not None

    @property
    def sink(self) -> bool:
        """It waits on nobody: missing, in Python, or idle with nothing open."""
        return self.state in (State.MISSING, State.IN_PYTHON, State.IDLE)

    @property
    def collective_waits(self) -> frozenset[int]:
        """The members of its open collective that never entered it, where the op holds its thread:
        the ranks its own thread waits on. Empty otherwise."""
        if self.entry is None or self.entry.is_p2p or not self.blocks_caller or not self.on:
            return frozenset()
        return self.on


@dataclass(slots=True)
class WaitGraph:
    """Each rank's `RankWait`, read on demand and kept."""

    dumpset: DumpSet
    tracks: dict[str, dict[int, Track]]
    live_stack: Callable[[int], tuple[Frame, ...]]
    _read: dict[int, RankWait] = field(default_factory=dict)
    _entered: dict[tuple[str, int], frozenset[int] | None] = field(default_factory=dict)
    _p2p_posted: dict[str, dict[int, int] | None] = field(default_factory=dict)
    _open: frozenset[int] | None = None

    def of(self, rank: int) -> RankWait:
        wait = self._read.get(rank)
        if wait is None:
            wait = self._read[rank] = self._wait_of(rank, None)
        return wait

    def open_ranks(self) -> frozenset[int]:
        """The ranks whose recorder shows an op not finished, in any group (read once)."""
        if self._open is None:
            self._open = frozenset(r for r, d in self.dumpset.dumps.items() if oldest_open(d.entries) is not None)
        return self._open

    def _wait_of(self, rank: int, before_record: int | None) -> RankWait:
        dump = self.dumpset.dumps.get(rank)
        if dump is None:
            return RankWait(rank, State.MISSING)
        inside = blocked_in(self.live_stack(rank))
        entry = oldest_open(dump.entries, before_record)
        if entry is None:
            if inside in UNRECORDED_OPS:
                on = self._barrier_waits(rank) if inside == "monitored_barrier" else None
                return RankWait(rank, State.IN_UNRECORDED, inside=inside, on=on)
            if inside is None and self.live_stack(rank):
                return RankWait(rank, State.IN_PYTHON)
            return RankWait(rank, State.IDLE, inside=inside)
        blocks = dump.backend == "gloo" or inside is not None
        if entry.is_p2p:
            group = self.dumpset.groups.get(entry.pg_name)
            peer = group.global_rank(entry.peer) if (group is not None and entry.peer is not None) else None
            return RankWait(rank, State.BLOCKED, entry, inside, None if peer is None else frozenset({peer}), blocks)
        return RankWait(rank, State.BLOCKED, entry, inside, self._not_entered(entry.pg_name, entry.collective_seq_id),
                        blocks)

    def barrier_group(self, rank: int) -> str | None:
        """The group the rank's monitored_barriers run on, where its recorder shows it: gloo's monitored_barrier
        records nothing and uses up two collective sequence numbers of its group, so a gap of exactly two
        between the rank's recorded collectives of a group is a barrier that ran there. None where no group,
        or more than one, shows such a gap (the barrier's group is unknown)."""
        found = [name for name, tracks in self.tracks.items()
                 if (t := tracks.get(rank)) is not None and _two_seq_gap(list(t.by_seq))]
        return found[0] if len(found) == 1 else None

    def _barrier_waits(self, rank: int) -> frozenset[int] | None:
        """Whom a rank in monitored_barrier waits on: the members of its barrier's group (`barrier_group`) that
        are not in a monitored_barrier themselves (the barrier completes once every member is in). None where
        the group is unknown, or every member is in it."""
        group = self.barrier_group(rank)
        info = self.dumpset.groups.get(group) if group is not None else None
        if info is None:
            return None
        on = frozenset(m for m in info.ranks if m != rank and blocked_in(self.live_stack(m)) != "monitored_barrier")
        return on or None

    def _not_entered(self, group: str, seq: int) -> frozenset[int] | None:
        """The members of `group` that never entered its collective `seq` (a rank blocked there is not among
        them); None where they are a member the entries do not show (`unseen_member_holds`). One set per
        collective, shared by every rank blocked in it (a group of N ranks costs O(N) once, not per rank)."""
        key = (group, seq)
        if key in self._entered:
            return self._entered[key]
        members = self.tracks.get(group, {})
        on: frozenset[int] | None = frozenset(r for r, t in members.items() if t.last_seq < seq)
        if not on and self.unseen_member_holds(group, seq):
            on = None
        self._entered[key] = on
        return on

    def named_waits(self, rank: int) -> frozenset[int] | None:
        """Whom the rank's open op waits on, where the evidence names them: the members that never entered
        its collective, its p2p peer, or for a batch whose peers the recorder does not name the members
        behind it (`batch_waits`). None where nothing names them; empty where nothing is open."""
        wait = self.of(rank)
        if wait.entry is not None and wait.entry.is_p2p and wait.on is None:
            return self.batch_waits(rank, wait.entry)
        return wait.on

    def batch_waits(self, rank: int, entry: Entry) -> frozenset[int] | None:
        """Whom a pending batch of point-to-point ops whose peers the recorder does not name (NCCL's
        `coalesced` entry of a `batch_isend_irecv`) waits on: the group's other members that posted fewer
        point-to-point calls there than the batch's number. `p2p_seq_id` counts a rank's point-to-point
        calls on a group (a batch once), and ranks that exchange step by step (a ring, a pipeline's pairs)
        meet in their k-th batches: a member that never reached its k-th has not posted the counterpart.
        None where that cannot be read: a member without a dump, or whose recorder wrapped past its
        point-to-point ops (its count is unknown), or no member behind (the batch waits on someone the
        counts do not show)."""
        if not entry.is_p2p or entry.peer is not None:
            return None
        counts = self._p2p_counts(entry.pg_name)
        if counts is None:
            return None
        behind = frozenset(r for r, n in counts.items() if r != rank and n < entry.p2p_seq_id)
        return behind or None

    def _p2p_counts(self, group: str) -> dict[int, int] | None:
        """Per member of `group`: how many point-to-point calls its recorder shows it posted there (the
        newest one's `p2p_seq_id`; 0 where a whole recorder holds none). None where a member's count is
        unknown. Read once per group."""
        if group in self._p2p_posted:
            return self._p2p_posted[group]
        info = self.dumpset.groups.get(group)
        tracks = self.tracks.get(group, {})
        counts: dict[int, int] = {}
        known = True
        for member in info.ranks if info is not None else ():
            dump = self.dumpset.dumps.get(member)
            track = tracks.get(member)
            if dump is None:
                known = False
                break
            if track is not None and len(track.p2p):
                counts[member] = track.p2p[-1].p2p_seq_id
            elif not len(dump.entries) or dump.entries[0].record_id == 0:
                counts[member] = 0  # nothing evicted: it posted none
            else:
                known = False
                break
        self._p2p_posted[group] = counts if known else None
        return self._p2p_posted[group]

    def unseen_member_holds(self, group: str, seq: int) -> bool:
        """Every member the evidence knows entered the group's collective `seq` on gloo and none finished it,
        while the group's members are known only from its entries (gloo's pg_config names none for
        `new_group`): a gloo collective completes once every member is in (there is no device to wait on),
        so they wait on a member that never entered it and recorded nothing of the group (principle 3: the
        group is a lower bound). Where a member finished it, or the group's members are known, no."""
        info = self.dumpset.groups.get(group)
        if info is None or info.membership_source != "entries":
            return False
        members = self.tracks.get(group, {})
        if not members or any(t.last_seq < seq or t.last_completed >= seq for t in members.values()):
            return False
        return all((d := self.dumpset.dumps.get(r)) is not None and d.backend == "gloo" for r in members)

    def unseen_member_candidates(self, group: str) -> tuple[list[int], bool]:
        """(the ranks that could be a group's unseen member, whether they wait on nobody): those that recorded
        nothing of it and whose own group ids leave room for it (`_may_belong`); of them, the ones that wait on
        nobody where there are any (the wait ends there), else all of them (each waits elsewhere, and the
        root-cause walk follows their waits)."""
        members = self.tracks.get(group, {})
        possible = [r for r in sorted(self.dumpset.dumps) if r not in members and self._may_belong(r, group)]
        sinks = [r for r in possible if self.of(r).state in (State.IN_PYTHON, State.IDLE)]
        return (sinks, True) if sinks else (possible, False)

    def _may_belong(self, rank: int, group: str) -> bool:
        """Whether the rank's own group ids leave room for a group it never recorded in. A rank numbers the
        groups it belongs to 0, 1, 2, ... in creation order (the default group first), and its recorder
        lists a group's status (`pg_status`, keyed by that number) from the group's first recorded op on;
        torch names groups by a job-wide creation count. So where the rank's numbers are 0..k without a
        gap and it recorded in a group created after `group` (a higher name), `group` would have taken a
        number below that one, unlisted: there is none, and the rank is no member. Likewise where the group's
        members finished a collective in it (so every member recorded one, and its recorder lists the group
        whatever its ring kept) while each of the rank's numbers is taken by a group it recorded collectives
        in. Unknown (True) where the recorder lists no status or the groups carry their own names."""
        dump = self.dumpset.dumps.get(rank)
        if dump is None or not dump.pg_status or not group.isdigit():
            return True
        numbers = {int(k) for k in dump.pg_status if k.isdigit()} | {0}
        if numbers != set(range(max(numbers) + 1)):
            return True  # a number never listed: a group it belongs to and never recorded in
        if any(t.last_completed >= 1 for t in self.tracks.get(group, {}).values()):
            recorded = sum(1 for tracks in self.tracks.values()
                           if (t := tracks.get(rank)) is not None and t.last_seq > 0)
            if len(numbers) <= recorded:
                return False
        later = int(group)
        return not any(name.isdigit() and int(name) > later and rank in tracks for name, tracks in self.tracks.items())

    def chain(self, rank: int, before_record: int | None = None) -> list[RankWait]:
        """The rank's wait, then its p2p peer's, and so on while each is blocked in a p2p op with a named
        peer: the last is where the chain leaves point-to-point (a collective, a sink, an unnamed peer).
        `before_record`: the first rank is read as it stood before that record (a NotCompleted culprit's
        device is busy with something older). Stops at a rank seen before (a cycle) or after MAX_HOPS."""
        hops: list[RankWait] = []
        seen: set[int] = set()
        wait = self._wait_of(rank, before_record) if before_record is not None else self.of(rank)
        for _ in range(MAX_HOPS):
            if wait.rank in seen:
                break
            seen.add(wait.rank)
            hops.append(wait)
            if wait.entry is None or not wait.entry.is_p2p or not wait.on:
                break
            wait = self.of(next(iter(wait.on)))
        return hops

    def reaches(self, start: Sequence[int], targets: frozenset[int], avoiding: frozenset[int] = frozenset()) -> bool:
        """Whether a wait chain from any of `start` ends at, or passes through, one of `targets`: the waits
        the evidence names (`named_waits`: the members that never entered a rank's open collective, its
        p2p peer, the members behind a batch), followed across groups, never through a rank in `avoiding`.
        A rank in `targets` itself counts only as reached from another."""
        seen: set[int] = set(avoiding)
        todo = [w for r in start for w in (self.named_waits(r) or ())]
        while todo:
            rank = todo.pop()
            if rank in targets:
                return True
            if rank in seen:
                continue
            seen.add(rank)
            todo.extend(self.named_waits(rank) or ())
        return False

    def went_on(self, rank: int, waiters: Iterable[int]) -> bool:
        """The rank ran a whole step after every one of `waiters` last recorded anything: its recorder holds
        one and the same collective (group, op, sizes) twice, both created after the waiters' newest entry.
        The waiters entered the op they wait in (one the recorder does not keep) after their newest entry, at
        most a step later; a rank that kept recording a step's collectives after that was running while they
        waited, not stopped before the op they wait for: their waits do not end at it (principle 1: a
        rank in Python waits on nobody, but is no culprit of a wait that is not on it). False where a time
        is missing."""
        since: int | None = None
        for waiter in waiters:
            dump = self.dumpset.dumps.get(waiter)
            newest = dump.entries[-1].time_created_ns if dump is not None and len(dump.entries) else None
            if newest is None:
                return False
            since = newest if since is None else max(since, newest)
        dump = self.dumpset.dumps.get(rank)
        if since is None or dump is None:
            return False
        seen: set[tuple[str, str, str]] = set()
        for k in range(len(dump.entries) - 1, -1, -1):
            entry = dump.entries[k]
            if entry.time_created_ns is None or entry.time_created_ns <= since:
                break
            if entry.is_p2p:
                continue
            key = (entry.pg_name, entry.op, repr(entry.input_sizes))
            if key in seen:
                return True
            seen.add(key)
        return False

    def sinks_among(self, not_joined: Sequence[int]) -> tuple[list[int], list[int]]:
        """(culprits, waiters) of the ranks that never joined a collective: a rank blocked in a p2p op whose
        peer the recorder does not name (a coalesced batch), or in one it does not keep (its live stack
        says so), or in an earlier collective that members never entered, waits on others; where the rest
        wait on nobody, the wait chains end at those. Where one of them is held elsewhere in a way that
        names no wait (a GPU stream), every rank that never joined stays a culprit."""
        sinks: list[int] = []
        waiters: list[int] = []
        for rank in not_joined:
            wait = self.of(rank)
            if wait.entry is None:
                (waiters if wait.inside in P2P_FUNCTIONS | GROUP_CREATION else sinks).append(rank)
            elif wait.entry.is_p2p and wait.on is None:
                waiters.append(rank)
            elif not wait.entry.is_p2p and (wait.collective_waits or (wait.on is None and wait.blocks_caller)):
                waiters.append(rank)
            else:
                return list(not_joined), []
        if sinks and waiters:
            return sinks, waiters
        return list(not_joined), []

    def held_in_collective(self, rank: int) -> Entry | None:
        """The open collective that holds the rank, where one does: its oldest open op is a collective and
        nothing says its thread is elsewhere (gloo holds the thread in the op; a live stack, where captured,
        sits in a torch.distributed call, not in Python). Such a rank posts nothing behind it (an NCCL rank's
        Python goes on only to the step's sync point, where it waits for that collective): a peer whose p2p
        op waits for the rank's counterpart waits, through it, on that collective's group. None otherwise
        (idle, in Python, missing, or held in a p2p op)."""
        wait = self.of(rank)
        if wait.state is not State.BLOCKED or wait.entry is None or wait.entry.is_p2p:
            return None
        if self.live_stack(rank) and wait.inside is None:
            return None  # its thread is in Python: it waits on nobody
        return wait.entry

    def hidden_p2p(self, ranks: Sequence[int]) -> bool:
        """The ranks are idle (nothing open in any group) and a point-to-point wait would be invisible:
        their backend records no p2p op (gloo) and no live stack says where they are. (Op ids in gloo's
        `pg_status` count p2p ops, but only in groups with a recorded collective, and a program's first p2p
        op leaves no trace before it: they cannot rule such a wait out.)"""
        for rank in ranks:
            dump = self.dumpset.dumps.get(rank)
            if dump is None or dump.backend != "gloo" or self.live_stack(rank) or self.of(rank).open:
                return False
        return True

    def failed_wait(self, rank: int) -> tuple[str, int] | None:
        """(group, seq) of an idle rank's last collective when a member of that group with a recorder never
        entered it: it cannot have finished without that member, so gloo retired it as it failed (timed
        out, or lost a peer), and the rank waited there until then. None otherwise."""
        dump = self.dumpset.dumps.get(rank)
        last = dump.entries[-1] if dump is not None and len(dump.entries) else None
        if last is None or last.is_p2p or not last.completed:
            return None
        tracks = self.tracks.get(last.pg_name, {})
        if any(r != rank and t.by_seq and t.last_seq < last.collective_seq_id for r, t in tracks.items()):
            return last.pg_name, last.collective_seq_id
        return None

    def last_group_may_lack_a_member(self, rank: int) -> bool:
        """The rank's last collective was in a group known only from the entries while some rank left no
        dump: such a group's members are those seen, and maybe missing ranks too (nothing else says who
        else belongs: not a description, which groups of different sizes share). That collective may
        have failed with a missing member, and the rank stopped there: it waits for the missing rank."""
        dump = self.dumpset.dumps.get(rank)
        last = dump.entries[-1] if dump is not None and len(dump.entries) else None
        if last is None or last.is_p2p or not self.dumpset.missing_ranks:
            return False
        group = self.dumpset.groups.get(last.pg_name)
        return group is not None and group.membership_source == "entries"


def _two_seq_gap(seqs: Sequence[int]) -> bool:
    """Two consecutive recorded collective sequence numbers three apart: two numbers used without an entry."""
    return any(b - a == 3 for a, b in zip(seqs, seqs[1:], strict=False))
