"""One rank's entries as columns, with an index per process group: what the analysis reads at scale.

An `Entry` object costs ~420 bytes (its slots, its own ints for ids and times, a float); 8,192 ranks x
2,000 entries are 16 million of them, 7 GB. Here a rank's entries are a handful of `array`s (ids,
sequence numbers and times as int64, small-int codes into per-rank tables for group, op, shapes,
state, timeout and thread): ~70 bytes an entry. `EntryTable` is still a sequence of `Entry`: an
entry is built on demand when someone looks at it (a finding's culprits, a renderer), and is then
identical to the one the row-by-row path builds, because both come from the same normalized rows
(`normalize.normalize_rows`).

`GroupIndex` is one group's view of a rank, computed where the file is decoded (a loader worker):
its collective sequence numbers, the entries of each (coalesced ops share one), a signature code per
sequence number (op, sizes and dtypes of its entries) for the cross-rank mismatch scan, its p2p
entries, and the first / last / first-open sequence numbers. Signature codes of different ranks are
made comparable by `unify_signatures` (one shared table for a whole dump set): equal codes mean equal
contents; different codes are compared by content where it matters.

Everything here reads values normalization already checked: a table adds no path from a dump's
bytes to anything but ints, floats and the normalized objects.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from itertools import accumulate, compress, repeat
from operator import add, and_, eq, ge, mul, not_
from typing import Any, overload

from frscope.records.model import COMPLETED, Entry, EntryRow, Frame, LazyFrames

# flags: bit 0 is_p2p; bits 1-2 retired (0: None, 1: False, 2: True)
_FLAG_OF = {
    (False, None): 0, (True, None): 1,
    (False, False): 2, (True, False): 3,
    (False, True): 4, (True, True): 5,
}
_RETIRED_OF = (None, False, True)
_RETIRED_TRUE = 4


def _code_type(distinct: int) -> str:
    return "B" if distinct <= 1 << 8 else "H" if distinct <= 1 << 16 else "I"


def _intern(keys: Sequence[Hashable]) -> tuple[list[Any], array[int]]:
    """(distinct keys in order of first appearance, the code of every key)."""
    index: dict[Any, int] = {}
    for key in dict.fromkeys(keys):
        index[key] = len(index)
    return list(index), array(_code_type(len(index)), map(index.__getitem__, keys))


def _int64(values: Sequence[int | None]) -> array[int]:
    """Ids and times: int64; None (not recorded) as 0, which normalization never keeps as a value."""
    if None in values:
        return array("q", [0 if v is None else v for v in values])
    return array("q", values)  # type: ignore[arg-type]


def _float64(values: Sequence[float | None]) -> array[float]:
    """Durations: None as NaN, which normalization never keeps as a value."""
    if None in values:
        nan = float("nan")
        return array("d", [nan if v is None else v for v in values])
    return array("d", values)  # type: ignore[arg-type]


class EntryTable(Sequence[Entry]):
    """A rank's entries in columns (see the module docstring); a read-only sequence of `Entry`."""

    __slots__ = (
        "_groups", "_stack_frames", "completed", "created", "duration", "flags", "frames", "frames_each", "name",
        "names", "p2p_seq", "pg", "pgs", "record_id", "seq", "shape", "shapes", "sigs", "space", "stack", "stacks",
        "started", "state", "states", "thread", "threads", "timeout", "timeouts",
    )

    record_id: array[int]
    pg: array[int]
    seq: array[int]
    p2p_seq: array[int]
    flags: array[int]
    name: array[int]
    shape: array[int]
    state: array[int]
    created: array[int]
    started: array[int]
    completed: array[int]
    duration: array[float]
    timeout: array[int]
    thread: array[int]
    pgs: list[tuple[str, str]]
    names: list[tuple[str, str, int | None]]  # (profiling_name, op, peer)
    shapes: list[tuple[Any, Any, Any, Any]]  # (input_sizes, input_dtypes, output_sizes, output_dtypes)
    states: list[str]
    timeouts: list[int | None]
    threads: list[tuple[str | None, str | None]]
    frames: Any  # one object every entry shares (a LazyFrames, or None), unless frames_each or stack
    frames_each: tuple[Any, ...] | None
    # The distinct stacks of the rank as (name, filename, line) tuples, and each entry's: torch's pickler
    # shares frame dicts, so a rank has a few dozen stacks, kept here instead of re-reading the file.
    stack: array[int] | None
    stacks: list[tuple[tuple[str, str, int], ...]] | None
    _stack_frames: dict[int, tuple[Frame, ...]]
    sigs: list[Any]  # signature contents by local code (GroupIndex.sig), until unified into `space`
    space: SignatureSpace | None
    _groups: dict[str, GroupIndex] | None

    @classmethod
    def from_rows(cls, rows: Sequence[EntryRow]) -> EntryTable:
        """Normalized rows (`normalize.normalize_rows`) -> columns. C-level passes over each column."""
        table = cls.__new__(cls)
        cols: list[Sequence[Any]] = list(zip(*rows, strict=True)) if rows else [()] * len(Entry.__slots__)
        table.record_id = array("q", cols[0])
        table.pgs, table.pg = _intern(list(zip(cols[1], cols[2], strict=True)))
        table.seq = array("q", cols[3])
        table.p2p_seq = array("q", cols[4])
        table.flags = array("B", map(_FLAG_OF.__getitem__, zip(cols[5], cols[14], strict=True)))
        table.names, table.name = _intern(list(zip(cols[7], cols[6], cols[8], strict=True)))
        # Normalization shares one list object per distinct size/dtype content: identity names a shape.
        shape_objects = list(zip(cols[9], cols[10], cols[11], cols[12], strict=True))
        ids = list(zip(map(id, cols[9]), map(id, cols[10]), map(id, cols[11]), map(id, cols[12]), strict=True))
        by_id = dict(zip(ids, shape_objects, strict=True))
        keys, table.shape = _intern(ids)
        table.shapes = [by_id[k] for k in keys]
        table.states, table.state = _intern(cols[13])
        table.created = _int64(cols[15])
        table.started = _int64(cols[16])
        table.completed = _int64(cols[17])
        table.duration = _float64(cols[18])
        table.timeouts, table.timeout = _intern(cols[19])
        table.threads, table.thread = _intern(list(zip(cols[20], cols[21], strict=True)))
        frames = cols[22]
        first = frames[0] if frames else None
        if (first is None or isinstance(first, LazyFrames)) and all(f is first for f in frames):
            table.frames, table.frames_each = first, None
        else:
            table.frames, table.frames_each = None, tuple(frames)
        table.stack, table.stacks, table._stack_frames = None, None, {}
        table.sigs = []
        table.space = None
        table._groups = None
        return table

    # --- the sequence of Entry ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.record_id)

    def entry(self, i: int) -> Entry:
        """Entry `i` (0 <= i < len), built from the columns."""
        pg_name, pg_desc = self.pgs[self.pg[i]]
        profiling_name, op, peer = self.names[self.name[i]]
        input_sizes, input_dtypes, output_sizes, output_dtypes = self.shapes[self.shape[i]]
        thread_id, thread_name = self.threads[self.thread[i]]
        flags = self.flags[i]
        duration = self.duration[i]
        return Entry(
            self.record_id[i], pg_name, pg_desc, self.seq[i], self.p2p_seq[i], bool(flags & 1), op, profiling_name,
            peer, input_sizes, input_dtypes, output_sizes, output_dtypes, self.states[self.state[i]],
            _RETIRED_OF[flags >> 1], self.created[i] or None, self.started[i] or None, self.completed[i] or None,
            duration if duration == duration else None, self.timeouts[self.timeout[i]], thread_id, thread_name,
            self._frames_of(i),
        )

    def _frames_of(self, i: int) -> Any:
        if self.stack is not None:
            code = self.stack[i]
            frames = self._stack_frames.get(code)
            if frames is None:
                assert self.stacks is not None
                frames = self._stack_frames[code] = tuple(Frame(*f) for f in self.stacks[code])
            return frames
        return self.frames if self.frames_each is None else self.frames_each[i]

    @overload
    def __getitem__(self, index: int) -> Entry: ...

    @overload
    def __getitem__(self, index: slice) -> list[Entry]: ...

    def __getitem__(self, index: int | slice) -> Entry | list[Entry]:
        if isinstance(index, slice):
            return [self.entry(i) for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("entry index out of range")
        return self.entry(index)

    def __iter__(self) -> Iterator[Entry]:
        return map(self.entry, range(len(self)))

    def __reversed__(self) -> Iterator[Entry]:
        return map(self.entry, range(len(self) - 1, -1, -1))

    def __bool__(self) -> bool:
        return len(self) > 0

    def __repr__(self) -> str:
        return f"EntryTable({len(self)} entries, {len(self.pgs)} groups)"

    def view(self, positions: Sequence[int]) -> EntryView:
        return EntryView(self, positions)

    # --- column reads that need no Entry -------------------------------------------------------------

    def open_flags(self) -> Iterator[bool]:
        """Per entry: not completed from its rank's point of view (not `Entry.completed`)."""
        states = self.states
        completed = {(s, f): not (states[s] == COMPLETED or f >= _RETIRED_TRUE) for s in range(len(states))
                     for f in range(6)}
        return map(completed.__getitem__, zip(self.state, self.flags, strict=True))

    def is_done(self, i: int) -> bool:
        return self.states[self.state[i]] == COMPLETED or self.flags[i] >= _RETIRED_TRUE

    def open_positions(self, positions: Sequence[int]) -> list[int]:
        """Those of `positions` whose entry is not completed."""
        states = self.states
        open_of = {(s, f): not (states[s] == COMPLETED or f >= _RETIRED_TRUE) for s in range(len(states))
                   for f in range(6)}
        pairs = zip(map(self.state.__getitem__, positions), map(self.flags.__getitem__, positions), strict=True)
        return list(compress(positions, map(open_of.__getitem__, pairs)))

    def newest_created(self) -> int | None:
        """The creation time of the last entry that has one (the recorder's newest)."""
        created = self.created
        for i in range(len(created) - 1, -1, -1):
            if created[i]:
                return created[i]
        return None

    def first_open(self, before_record: int | None = None) -> int | None:
        """The position of the first entry not completed, or None; None too when an entry with a record
        id >= `before_record` comes first (the reference walks the entries in order and stops there)."""
        n = len(self)
        first = next(compress(range(n), self.open_flags()), None)
        if first is None or before_record is None:
            return first
        stop = next(compress(range(n), map(ge, self.record_id, repeat(before_record))), n)
        return first if first < stop else None

    def group_descs(self) -> dict[str, str]:
        """Each group's name -> the desc of its first entry, in order of first appearance."""
        out: dict[str, str] = {}
        for name, desc in self.pgs:
            out.setdefault(name, desc)
        return out

    # --- the per-group index -------------------------------------------------------------------------

    def groups(self) -> dict[str, GroupIndex]:
        """The index per group name, in order of first appearance (built once, where it is first asked)."""
        if self._groups is None:
            self._groups = _build_groups(self)
        return self._groups

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (tuple(getattr(self, name) for name in self.__slots__),))


def _rebuild(state: tuple[Any, ...]) -> EntryTable:
    table = EntryTable.__new__(EntryTable)
    for name, value in zip(EntryTable.__slots__, state, strict=True):
        setattr(table, name, value)
    return table


class EntryView(Sequence[Entry]):
    """Some entries of a table (a group's p2p ops), built on demand."""

    __slots__ = ("positions", "table")

    def __init__(self, table: EntryTable, positions: Sequence[int]) -> None:
        self.table = table
        self.positions = positions

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, index: int) -> Entry: ...

    @overload
    def __getitem__(self, index: slice) -> list[Entry]: ...

    def __getitem__(self, index: int | slice) -> Entry | list[Entry]:
        if isinstance(index, slice):
            return [self.table.entry(p) for p in self.positions[index]]
        return self.table.entry(self.positions[index])

    def __iter__(self) -> Iterator[Entry]:
        return map(self.table.entry, self.positions)


class GroupIndex:
    """One rank's view of one process group (see the module docstring).

    Buckets are numbered k = 0.. in order of first appearance; bucket k holds the entries of sequence
    number `seq_at(k)`. When the sequence numbers are exactly first_seq, first_seq + 1, ... (a ring
    buffer always shows such a run) no array of them is kept; when every bucket has one entry, no
    offsets."""

    __slots__ = (
        "_position", "contiguous", "count", "first_seq", "last_seq", "members", "name", "next_seq", "offsets",
        "p2p", "seqs", "sig",
    )

    def __init__(self, name: str, seqs: Sequence[int], members: Sequence[int], offsets: Sequence[int] | None,
                 sig: array[int], p2p: array[int], next_seq: int) -> None:
        """`seqs`: the distinct seqs in order of first appearance; bucket k is `members[k]` (offsets None)
        or `members[offsets[k]:offsets[k + 1]]`."""
        self.name = name
        self.count = len(seqs)
        self.first_seq = min(seqs) if seqs else 0
        self.last_seq = max(seqs) if seqs else 0
        self.next_seq = next_seq
        self.contiguous = not seqs or list(seqs) == list(range(self.first_seq, self.first_seq + len(seqs)))
        self.seqs: array[int] | None = None if self.contiguous else array("q", seqs)
        self.members = array("I", members)
        self.offsets: array[int] | None = None if offsets is None else array("I", offsets)
        self.sig = sig
        self.p2p = p2p
        self._position: dict[int, int] | None = None

    def seq_at(self, k: int) -> int:
        return self.first_seq + k if self.seqs is None else self.seqs[k]

    def seq_list(self) -> Iterable[int]:
        return range(self.first_seq, self.first_seq + self.count) if self.seqs is None else self.seqs

    def position(self, seq: int) -> int | None:
        """The bucket number of `seq`, or None when this rank has no entry of it."""
        if self.seqs is None:
            k = seq - self.first_seq
            return k if 0 <= k < self.count else None
        if self._position is None:
            self._position = {s: k for k, s in enumerate(self.seqs)}
        return self._position.get(seq)

    def bucket_positions(self, k: int) -> Sequence[int]:
        if self.offsets is None:
            return self.members[k : k + 1]
        return self.members[self.offsets[k] : self.offsets[k + 1]]

    def first_member(self, k: int) -> int:
        return self.members[k] if self.offsets is None else self.members[self.offsets[k]]

    def __getstate__(self) -> tuple[Any, ...]:
        return tuple(None if name == "_position" else getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(self.__slots__, state, strict=True):
            setattr(self, name, value)


def _shape_key(value: Any) -> Any:
    """Sizes (a list of lists of ints) or dtypes (a list of strings) as a hashable value that compares
    like the original (normalization made them well-formed)."""
    if isinstance(value, list):
        return tuple(_shape_key(v) for v in value)
    return value


def _sig_content(table: EntryTable, local: tuple[tuple[str, int], ...]) -> Any:
    out = []
    for op, shape in local:
        input_sizes, input_dtypes, output_sizes, output_dtypes = table.shapes[shape]
        out.append((op, _shape_key(input_sizes), _shape_key(output_sizes), _shape_key(input_dtypes),
                    _shape_key(output_dtypes)))
    return tuple(out)


def _build_groups(table: EntryTable) -> dict[str, GroupIndex]:
    """Per group name: its buckets by sequence number, p2p entries, first open seq, bucket signatures.

    The common case (a group's collectives carry consecutive seqs, one entry each) is C-level passes
    over the columns; anything else (coalesced ops sharing a seq, gaps, seqs out of order) one Python
    pass over that group's entries."""
    n = len(table)
    group_names = list(dict.fromkeys(name for name, _desc in table.pgs))
    group_of_code = [group_names.index(name) for name, _desc in table.pgs]
    gid = table.pg if group_of_code == list(range(len(group_of_code))) else array(
        "I", map(group_of_code.__getitem__, table.pg))
    op_names = list(dict.fromkeys(op for _pn, op, _peer in table.names))
    op_of_name = [op_names.index(op) for _pn, op, _peer in table.names]
    open_flags = list(table.open_flags())
    p2p_flags = list(map(and_, table.flags, repeat(1)))
    seq_col, name_col, shape_col = table.seq, table.name, table.shape
    shape_count = max(1, len(table.shapes))
    sig_index: dict[Any, int] = {}
    sig_keys: list[Any] = []
    out: dict[str, GroupIndex] = {}
    for g, name in enumerate(group_names):
        mine: Sequence[int] = range(n) if len(group_names) == 1 else list(compress(range(n), map(eq, gid, repeat(g))))
        p2p = array("I", compress(mine, map(p2p_flags.__getitem__, mine)))
        coll = list(compress(mine, map(not_, map(p2p_flags.__getitem__, mine)))) if p2p else list(mine)
        seqs = list(map(seq_col.__getitem__, coll))
        open_seqs = list(compress(seqs, map(open_flags.__getitem__, coll)))
        if seqs and seqs == list(range(seqs[0], seqs[0] + len(seqs))):
            # One entry per seq: a bucket's signature is its entry's (op, shape), one int.
            keys: Sequence[Any] = list(map(add, map(mul, map(op_of_name.__getitem__, map(name_col.__getitem__, coll)),
                                                  repeat(shape_count)), map(shape_col.__getitem__, coll)))
            members, offsets, distinct = coll, None, seqs
        else:
            buckets: dict[int, list[int]] = {}
            for position, seq in zip(coll, seqs, strict=True):
                bucket = buckets.get(seq)
                if bucket is None:
                    buckets[seq] = [position]
                else:
                    bucket.append(position)
            keys = [tuple(op_of_name[name_col[p]] * shape_count + shape_col[p] for p in b) for b in buckets.values()]
            keys = [k[0] if len(k) == 1 else k for k in keys]
            distinct = list(buckets)
            members = [p for b in buckets.values() for p in b]
            offsets = list(accumulate((len(b) for b in buckets.values()), initial=0))
            if len(offsets) - 1 == len(members):
                offsets = None
        for key in dict.fromkeys(keys):
            if key not in sig_index:
                sig_index[key] = len(sig_keys)
                sig_keys.append(key)
        sig = array("I", map(sig_index.__getitem__, keys))
        last = max(seqs) if seqs else 0
        next_seq = (min(open_seqs) if open_seqs else last + 1) if seqs else 1
        out[name] = GroupIndex(name, distinct, members, offsets, sig, p2p, next_seq)

    def content(key: Any) -> Any:
        items = key if isinstance(key, tuple) else (key,)
        return _sig_content(table, tuple((op_names[k // shape_count], k % shape_count) for k in items))

    table.sigs = [content(key) for key in sig_keys]
    return out


class SignatureSpace:
    """Signature contents of a whole dump set, one code each: tables unified into one space compare
    their codes directly. `facts(code)` caches what the analysis asks of a signature's contents."""

    __slots__ = ("_facts", "codes", "contents")

    def __init__(self) -> None:
        self.codes: dict[Any, int] = {}
        self.contents: list[Any] = []
        self._facts: dict[tuple[int, str], Any] = {}

    def code(self, content: Any) -> int:
        try:
            got = self.codes.get(content)
        except TypeError:  # not hashable (normalization never makes such a shape): equal to nothing
            got = None
            self.contents.append(content)
            return len(self.contents) - 1
        if got is None:
            got = self.codes[content] = len(self.contents)
            self.contents.append(content)
        return got

    def fact(self, code: int, what: str, compute: Callable[[Any], Any]) -> Any:
        key = (code, what)
        got = self._facts.get(key, self)
        if got is self:
            got = self._facts[key] = compute(self.contents[code])
        return got


def unify_signatures(tables: Iterable[EntryTable], space: SignatureSpace | None = None) -> SignatureSpace:
    """Re-code every table's bucket signatures into one shared space (a table already in it is skipped)."""
    space = space if space is not None else SignatureSpace()
    for table in tables:
        groups = table.groups()
        if table.space is space:
            continue
        contents = table.space.contents if table.space is not None else table.sigs
        remap = [space.code(content) for content in contents]
        if remap != list(range(len(remap))):
            for index in groups.values():
                index.sig = array("I", map(remap.__getitem__, index.sig))
        table.space, table.sigs = space, []
    return space


def space_of(tables: Iterable[EntryTable]) -> SignatureSpace | None:
    """The space all these tables were unified into, or None."""
    found: SignatureSpace | None = None
    for table in tables:
        if table.space is None or (found is not None and table.space is not found):
            return None
        found = table.space
    return found
