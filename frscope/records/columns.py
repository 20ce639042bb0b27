"""One rank's entries as columns, with an index per process group: what the analysis reads at scale.

An `Entry` object costs ~420 bytes (its slots, its own ints for ids and times, a float); 8,192 ranks x
2,000 entries are 16 million of them, 7 GB. Here a rank's entries are a handful of `array`s (ids,
sequence numbers and times as int64, small-int codes into per-rank tables for group, op, shapes,
state, timeout and thread), compacted once indexed (`compact`): ~47 bytes an entry. `EntryTable` is
still a sequence of `Entry`: an entry is built on demand when someone looks at it (a finding's culprits,
a renderer), and is then identical to the one the row-by-row path builds, because both come from the same
normalized rows (`rowwise.normalize_rows`).

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
from collections.abc import Hashable, Iterator, Sequence
from itertools import compress
from operator import lt
from typing import Any, overload

from frscope.records.group_index import (
    GroupIndex,
    SignatureSpace,
    index_groups,
    narrow_codes,
    narrowed,
    space_of,
    unify_signatures,
)
from frscope.records.model import COMPLETED, Entry, EntryRow, Frame, LazyFrames

# flags: bit 0 is_p2p; bits 1-2 retired (0: None, 1: False, 2: True)
_FLAG_OF = {
    (False, None): 0, (True, None): 1,
    (False, False): 2, (True, False): 3,
    (False, True): 4, (True, True): 5,
}
_RETIRED_OF = (None, False, True)
_RETIRED_TRUE = RETIRED_TRUE = 4  # flags at or past it: the entry is retired (the timeline reads them in place)
# flags -> 1 where the entry is retired (flags >= _RETIRED_TRUE), for bytes.translate
_RETIRED_BYTE = bytes(int(f >= _RETIRED_TRUE) for f in range(256))


def _code_type(distinct: int) -> str:
    return "B" if distinct <= 1 << 8 else "H" if distinct <= 1 << 16 else "I"


def _intern(keys: Sequence[Hashable]) -> tuple[list[Any], array[int]]:
    """(distinct keys in order of first appearance, the code of every key)."""
    index: dict[Any, int] = {}
    for key in dict.fromkeys(keys):
        index[key] = len(index)
    return list(index), array(_code_type(len(index)), map(index.__getitem__, keys))


def _compact_ids(column: Sequence[int], rising: bool | None) -> Sequence[int]:
    """Record ids: a `range` when they are consecutive (a ring buffer's usually are: no array at all), else
    narrowed. `rising`: whether they strictly rise, when the caller knows (the scanner compared them)."""
    if isinstance(column, range) or not column:
        return column
    first, n = column[0], len(column)
    if column[-1] - first == n - 1 and (rising if rising is not None else all(map(lt, column[:-1], column[1:]))):
        return range(first, first + n)  # strictly rising over exactly n values: every id once, in order
    return narrowed(column, True) if isinstance(column, array) else column


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
        "_groups", "_open", "_stack_frames", "completed", "created", "duration", "flags", "frames", "frames_each",
        "name", "names", "p2p_seq", "pg", "pgs", "record_id", "seq", "shape", "shapes", "sigs", "space", "stack",
        "stacks", "started", "state", "states", "thread", "threads", "timeout", "timeouts",
    )

    record_id: Sequence[int]  # int64 as read; after `compact`, a range (consecutive ids) or a narrower array
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
    _open: bytes | None

    @classmethod
    def from_rows(cls, rows: Sequence[EntryRow]) -> EntryTable:
        """Normalized rows (`rowwise.normalize_rows`) -> columns. C-level passes over each column."""
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

    def open_mask(self) -> bytes:
        """Per entry, 1 where it is not completed (as `open_flags`), as bytes: C-level passes over the codes
        (`bytes.translate`, one big-int OR), no Python per entry."""
        got: bytes | None = getattr(self, "_open", None)  # a table never changes: computed once
        if got is not None:
            return got
        n = len(self)
        if self.state.typecode != "B" or len(self.states) > 256:
            got = bytes(self.open_flags())
        else:
            done = bytes(state == COMPLETED for state in self.states).ljust(256, b"\0")
            closed = int.from_bytes(self.state.tobytes().translate(done), "little") | int.from_bytes(
                self.flags.tobytes().translate(_RETIRED_BYTE), "little")
            got = (int.from_bytes(b"\1" * n, "little") ^ closed).to_bytes(n, "little")
        self._open = got
        return got

    def open_positions(self, positions: Sequence[int]) -> list[int]:
        """Those of `positions` whose entry is not completed."""
        if not positions:
            return []
        if len(positions) < 16:  # a few: cheaper than the whole table's mask
            return [p for p in positions if not self.is_done(p)]
        mask = self.open_mask()
        return list(compress(positions, map(mask.__getitem__, positions)))

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
        found = self.open_mask().find(1)
        first = None if found < 0 else found
        if first is None or before_record is None:
            return first
        # The walk stops at the first entry with a record id >= before_record: `first` counts when no entry up
        # to it has one.
        return first if max(self.record_id[: first + 1]) < before_record else None

    def group_descs(self) -> dict[str, str]:
        """Each group's name -> the desc of its first entry, in order of first appearance."""
        out: dict[str, str] = {}
        for name, desc in self.pgs:
            out.setdefault(name, desc)
        return out

    def compact(self, ids_rise: bool | None = None) -> None:
        """Hold the same values in less memory, once the group index is built (normalize, where the file is
        decoded): at 32,768 ranks x 2,000 entries every byte an entry is 65 MB. Record ids become a `range`
        when consecutive, sequence numbers the narrowest signed array type that holds them, each group's
        positions and signature codes in the narrowest unsigned type.
        Every read (`[i]`, slices, iteration, `len`) gives the same ints as before."""
        self.record_id = _compact_ids(self.record_id, ids_rise)
        self.seq = narrowed(self.seq, True)
        self.p2p_seq = narrowed(self.p2p_seq, True)
        for index in self.groups().values():
            index.members = narrowed(index.members, False)
            index.p2p = narrowed(index.p2p, False)
            index.sig = narrow_codes(index.sig)

    # --- the per-group index -------------------------------------------------------------------------

    def groups(self) -> dict[str, GroupIndex]:
        """The index per group name, in order of first appearance (built once, where it is first asked)."""
        if self._groups is None:
            self._groups = index_groups(self)
        return self._groups

    def __reduce__(self) -> tuple[Any, ...]:
        # The open mask is a cache: not sent (nor unset slots).
        return (_rebuild, (tuple(None if name == "_open" else getattr(self, name, None) for name in self.__slots__),))


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


__all__ = ["EntryTable", "EntryView", "GroupIndex", "SignatureSpace", "space_of", "unify_signatures"]
