"""Per (process group, rank) view of the recorder, built in one pass over every entry.

Matching is by `collective_seq_id` within a group (and p2p by `p2p_seq_id` and peer), never by
`record_id`: record ids count every op of a rank across all its groups.

A rank loaded as columns (`records.columns.EntryTable`) already carries this view per group (built
where its file was decoded); its Track reads it in place and builds `Entry` objects only for the
sequence numbers someone asks about. The row-by-row form (a list of Entry) is the reference.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from frscope.records import COMPLETED, DumpSet, Entry
from frscope.records.columns import EntryTable, GroupIndex

_NAN = float("nan")
# Track.single_positions: no entry of the seq, or several (coalesced ops).
NONE, SEVERAL = -1, -2


class Buckets(Mapping[int, list[Entry]]):
    """`Track.by_seq` of a columnar rank: seq -> its entries, built on first access (then kept)."""

    __slots__ = ("_built", "index", "table")

    def __init__(self, table: EntryTable, index: GroupIndex) -> None:
        self.table = table
        self.index = index
        self._built: dict[int, list[Entry]] = {}

    def get(self, seq: int, default: list[Entry] | None = None) -> list[Entry] | None:  # type: ignore[override]
        got = self._built.get(seq)
        if got is not None:
            return got
        k = self.index.position(seq)
        if k is None:
            return default
        got = self._built[seq] = [self.table.entry(p) for p in self.index.bucket_positions(k)]
        return got

    def peek(self, seq: int) -> list[Entry]:
        """`get(seq, [])` without keeping what it built: for a look at a rank's oldest few seqs, which no later
        step reads; kept, they held every rank's entries of them until the analysis ended (~5 KiB a rank of
        a 200-entry window, bench/RESULTS.md, "Operator: a gathered rank's evidence")."""
        got = self._built.get(seq)
        if got is not None:
            return got
        k = self.index.position(seq)
        return [] if k is None else [self.table.entry(p) for p in self.index.bucket_positions(k)]

    def __getitem__(self, seq: int) -> list[Entry]:
        got = self.get(seq)
        if got is None:
            raise KeyError(seq)
        return got

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, int) and self.index.position(seq) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(self.index.seq_list())

    def __len__(self) -> int:
        return self.index.count


@dataclass(slots=True)
class Track:
    """One rank's collectives in one group."""

    rank: int
    by_seq: Mapping[int, list[Entry]] = field(default_factory=dict)  # coalesced ops share a seq id
    p2p: Sequence[Entry] = field(default_factory=list)
    first_seq: int = 0
    last_seq: int = 0  # highest collective_seq_id enqueued; 0: none visible
    next_seq: int = 1  # first collective not completed on this rank (last_seq + 1 when all done)
    # Columnar ranks: the table and this group's index in it (the fast paths read these).
    table: EntryTable | None = None
    index: GroupIndex | None = None

    def peek(self, seq: int) -> list[Entry]:
        """The entries of `seq` on the rank, without a columnar rank's buckets keeping them (`Buckets.peek`)."""
        by_seq = self.by_seq
        return by_seq.peek(seq) if isinstance(by_seq, Buckets) else by_seq.get(seq, [])

    @property
    def last_completed(self) -> int:
        return self.next_seq - 1

    def _first_members(self, seqs: range) -> Sequence[int] | None:
        """Columnar: the position of each seq's first entry, when every seq of `seqs` is there."""
        index = self.index
        if index is None or not seqs:
            return None
        if index.seqs is None and index.offsets is None and index.first_seq <= seqs[0] and seqs[-1] <= index.last_seq:
            return index.members[seqs[0] - index.first_seq : seqs[-1] - index.first_seq + 1]
        out: list[int] = []
        for seq in seqs:
            k = index.position(seq)
            if k is None:
                return None
            out.append(index.first_member(k))
        return out

    def single_positions(self, seqs: Sequence[int]) -> list[int] | None:
        """Columnar: for each seq, the table position of its one entry (NONE: no entry of it, SEVERAL:
        coalesced entries, read its bucket); None for a row-by-row rank."""
        index = self.index
        if index is None or self.table is None:
            return None
        position, members, offsets = index.position, index.members, index.offsets
        out: list[int] = []
        for seq in seqs:
            k = position(seq)
            if k is None:
                out.append(NONE)
            elif offsets is None:
                out.append(members[k])
            else:
                start = offsets[k]
                out.append(members[start] if offsets[k + 1] - start == 1 else SEVERAL)
        return out

    def first_created(self, seqs: range) -> list[int | None]:
        """For each seq: the creation time of its first entry (None or 0: no entry, or none recorded)."""
        if self.table is not None:
            positions = self._first_members(seqs)
            if positions is not None:
                return list(map(self.table.created.__getitem__, positions))
        by_seq = self.by_seq
        return [(b[0].time_created_ns if (b := by_seq.get(seq)) else None) for seq in seqs]

    def first_duration(self, seqs: range) -> list[float]:
        """For each seq: its first entry's duration_ms (NaN: no entry, or none recorded)."""
        if self.table is not None:
            positions = self._first_members(seqs)
            if positions is not None:
                return list(map(self.table.duration.__getitem__, positions))
        by_seq = self.by_seq
        return [(_NAN if (b := by_seq.get(seq)) is None or b[0].duration_ms is None else b[0].duration_ms)
                for seq in seqs]

    def open_p2p(self) -> list[Entry]:
        """Its p2p ops not completed, oldest first."""
        if self.table is not None and self.index is not None:
            table = self.table
            return [table.entry(p) for p in table.open_positions(self.index.p2p)]
        return [e for e in self.p2p if not e.completed]


def build_tracks(dumpset: DumpSet) -> dict[str, dict[int, Track]]:
    tracks: dict[str, dict[int, Track]] = {}
    for rank, dump in dumpset.dumps.items():
        if isinstance(dump.entries, EntryTable):
            table = dump.entries
            for name, index in table.groups().items():
                tracks.setdefault(name, {})[rank] = Track(
                    rank, Buckets(table, index), table.view(index.p2p), index.first_seq, index.last_seq,
                    index.next_seq, table, index,
                )
            continue
        mine: dict[str, Track] = {}
        by_seqs: dict[str, dict[int, list[Entry]]] = {}
        p2ps: dict[str, list[Entry]] = {}
        open_seq: dict[str, int] = {}
        for entry in dump.entries:
            name = entry.pg_name
            track = mine.get(name)
            if track is None:
                track = mine[name] = Track(rank)
                by_seqs[name] = {}
                p2ps[name] = []
                track.by_seq, track.p2p = by_seqs[name], p2ps[name]
            if entry.is_p2p:
                p2ps[name].append(entry)
                continue
            seq = entry.collective_seq_id
            by_seq = by_seqs[name]
            bucket = by_seq.get(seq)
            if bucket is None:
                by_seq[seq] = [entry]
            else:
                bucket.append(entry)
            # Inlined Entry.completed: this loop sees every entry of every rank.
            if not (entry.state == COMPLETED or entry.retired is True):
                known = open_seq.get(name)
                if known is None or seq < known:
                    open_seq[name] = seq
        for name, track in mine.items():
            if track.by_seq:
                seqs = track.by_seq.keys()
                track.first_seq, track.last_seq = min(seqs), max(seqs)
                track.next_seq = open_seq.get(name, track.last_seq + 1)
            tracks.setdefault(name, {})[rank] = track
    return tracks


def blocked_entry(entries: Sequence[Entry]) -> Entry | None:
    """Where a rank is blocked: its oldest op (by record id, across groups) not completed."""
    if isinstance(entries, EntryTable):
        at = entries.first_open()
        return None if at is None else entries.entry(at)
    for entry in entries:
        if not entry.completed:
            return entry
    return None


def newest_created(entries: Sequence[Entry]) -> int | None:
    """The creation time of the newest entry that has one."""
    if isinstance(entries, EntryTable):
        return entries.newest_created()
    for entry in reversed(entries):
        if entry.time_created_ns:
            return entry.time_created_ns
    return None


def oldest_open(entries: Sequence[Entry], before_record: int | None = None) -> Entry | None:
    """The rank's oldest op not finished (before record `before_record`, when given); None when idle."""
    if isinstance(entries, EntryTable):
        at = entries.first_open(before_record)
        return None if at is None else entries.entry(at)
    for entry in entries:
        if before_record is not None and entry.record_id >= before_record:
            return None
        if not entry.completed:
            return entry
    return None
