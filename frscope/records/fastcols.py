"""The fast way from a decoded entry list to an `EntryTable`: one pass, straight into columns.

`rowwise.normalize_rows` (the reference) builds a tuple of 23 normalized values per entry, and
`EntryTable.from_rows` then transposes them. Most dumps are regular: every entry has every field torch
writes, with the type torch writes, in range. For those, one loop reads each entry's fields once (one
`itemgetter` call), checks their types with `type(x) is int` and the like, and appends ints to the
id/seq/time columns and small codes to the others; strings, groups, threads and timeouts are checked
once per distinct value, shapes and stacks once per change of an op's shape or stack (an op mostly
repeats what it did last time: one C-level comparison). Anything else — a missing field, a float or
bool where an int belongs, a string past its cap, a malformed shape — raises, and the caller takes
the reference for that rank. So this path only ever accepts what the reference keeps unchanged, and
builds the same values (tests/unit/test_fast_path_equivalence.py and test_columns.py compare them).

One loop and not one pass per column: right after decoding, a rank's ~10 MB of objects are out of the
CPU caches, and a pass per column fetched every entry's objects again (measured: ~40% slower here).
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable
from operator import itemgetter, lt
from typing import Any

from frscope.records.columns import EntryTable, _code_type
from frscope.records.fields import (
    ID_MIN,
    MAX_DURATION_MS,
    MAX_FRAME_REFS,
    MAX_STACKS,
    MAX_STATE,
    REQUIRED,
    SEQ_MIN,
    TIME_MIN,
    regular_dtypes,
    regular_group,
    regular_sizes,
    regular_thread,
    short_text,
)
from frscope.records.limits import MAX_INT64
from frscope.records.model import LazyFrames, frames_from_raw

_GET = itemgetter(*REQUIRED)

_FLAG_OF = {
    (False, None): 0, (True, None): 1,
    (False, False): 2, (True, False): 3,
    (False, True): 4, (True, True): 5,
}


class _NotRegular(Exception):
    """This entry list needs the row-by-row reference."""


_Frame = tuple[str, str, int]


def _stack_content(raw: Any, one: dict[int, tuple[_Frame, ...]]) -> tuple[_Frame, ...]:
    """A raw stack (a list of frame dicts) as (name, filename, line) tuples, by `frames_from_raw`; `one`
    keeps each frame dict's tuples by identity (a rank's entries share their frame dicts)."""
    parts: list[_Frame] = []
    for item in raw:
        got = one.get(id(item))
        if got is None:
            got = one[id(item)] = tuple((f.name, f.filename, f.line) for f in frames_from_raw([item]))
        parts.extend(got)
    return tuple(parts)


class _Stacks:
    """Each entry's stack as a code into the rank's distinct stacks (as (name, filename, line) tuples).
    Exactly what `LazyFrames` gives: `frames_from_raw` of the frames of the last entry with the entry's
    record id. `failed`: frames that are not lists, or too many stacks: they stay in the file."""

    __slots__ = ("codes", "failed", "index", "last", "one", "refs")

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.index: dict[tuple[tuple[str, str, int], ...], int] = {}
        self.last: dict[int, tuple[Any, int]] = {}
        self.one: dict[int, tuple[tuple[str, str, int], ...]] = {}  # per frame dict, what frames_from_raw makes
        self.failed = False
        self.refs = 0

    def add(self, name: int, raw: Any) -> None:
        """A new stack for op `name` (the loop has compared it with that op's last one)."""
        if type(raw) is not list:
            self.failed = True
            return
        self.refs += len(raw)
        if self.refs > MAX_FRAME_REFS:  # checked before the list is walked: a crafted list can be long
            self.failed = True
            return
        content = _stack_content(raw, self.one)
        code = self.index.get(content)
        if code is None:
            if len(self.index) >= MAX_STACKS:
                self.failed = True
                return
            code = self.index[content] = len(self.index)
        self.last[name] = (raw, code)
        self.codes.append(code)

    def result(self, record_id: list[int]) -> tuple[array[int], list[Any]] | tuple[None, None]:
        if self.failed:
            return None, None
        codes = self.codes
        if not all(map(lt, record_id[:-1], record_id[1:])):  # ids repeat or go back: the last one's stack
            final = dict(zip(record_id, codes, strict=True))
            codes = list(map(final.__getitem__, record_id))
        return array(_code_type(len(self.index)), codes), list(self.index)


def table_from_entries(raw_entries: list[Any], lazy_frames: LazyFrames | None,
                       parse_name: Callable[[str], tuple[str | None, str, int | None]]
                       ) -> tuple[EntryTable, str | None] | None:
    """The table and the backend, or None when the entries are not all regular (see the module doc).
    `parse_name` is fields.parse_profiling_name."""
    if not raw_entries or lazy_frames is None:
        return None
    try:
        return _table(raw_entries, lazy_frames, parse_name)
    except (_NotRegular, KeyError, TypeError):  # a missing field, an entry that is not a dict
        return None


def _table(raw: list[Any], lazy_frames: LazyFrames,
           parse_name: Callable[[str], tuple[str | None, str, int | None]]) -> tuple[EntryTable, str | None]:
    top = MAX_INT64
    flag_of = _FLAG_OF
    nan = float("nan")
    record_id: list[int] = []
    seq: list[int] = []
    p2p_seq: list[int] = []
    created: list[int] = []
    started: list[int] = []
    completed: list[int] = []
    duration: list[float] = []
    flags: list[int] = []
    pg_codes: list[int] = []
    name_codes: list[int] = []
    state_codes: list[int] = []
    timeout_codes: list[int] = []
    thread_codes: list[int] = []
    shape_codes: list[int] = []
    pg_index: dict[tuple[str, str], int] = {}
    name_index: dict[str, int] = {}
    state_index: dict[str, int] = {}
    timeout_index: dict[int | None, int] = {}
    thread_index: dict[tuple[str | None, str | None], int] = {}
    shape_index: dict[Any, int] = {}
    shapes: list[tuple[Any, Any, Any, Any]] = []
    last_shape: dict[int, tuple[tuple[Any, Any, Any, Any], int]] = {}
    older_shape: dict[int, tuple[tuple[Any, Any, Any, Any], int]] = {}
    stacks = _Stacks()
    last_stack = stacks.last
    stack_codes = stacks.codes

    for entry in raw:
        (rid, pg, sq, p2p, is_p2p, name, t_created, input_sizes, input_dtypes, output_sizes, output_dtypes, state,
         t_started, t_completed, retired, timeout, thread_id, thread_name) = _GET(entry)
        if type(rid) is not int or not ID_MIN <= rid <= top or type(sq) is not int or not SEQ_MIN <= sq <= top \
                or type(p2p) is not int or not SEQ_MIN <= p2p <= top:
            raise _NotRegular
        record_id.append(rid)
        seq.append(sq)
        p2p_seq.append(p2p)
        # Times: None or 0 is 'not recorded' (stored as 0).
        if t_created is None:
            t_created = 0
        elif type(t_created) is not int or not TIME_MIN <= t_created <= top:
            raise _NotRegular
        if t_started is None:
            t_started = 0
        elif type(t_started) is not int or not TIME_MIN <= t_started <= top:
            raise _NotRegular
        if t_completed is None:
            t_completed = 0
        elif type(t_completed) is not int or not TIME_MIN <= t_completed <= top:
            raise _NotRegular
        created.append(t_created)
        started.append(t_started)
        completed.append(t_completed)

        if type(pg) is not tuple:
            if type(pg) is not list:  # JSON writes the (name, desc) pair as a list
                raise _NotRegular
            pg = tuple(pg)
        code = pg_index.get(pg)
        if code is None:
            if not regular_group(pg):
                raise _NotRegular
            code = pg_index[pg] = len(pg_index)
        pg_codes.append(code)

        # A string key never equals a non-string: a value found in an index was checked when it was added.
        op_code = name_index.get(name)
        if op_code is None:
            if type(name) is not str:
                raise _NotRegular
            op_code = name_index[name] = len(name_index)
        name_codes.append(op_code)

        if type(is_p2p) is not bool or (retired is not None and type(retired) is not bool):
            raise _NotRegular
        flags.append(flag_of[is_p2p, retired])

        code = state_index.get(state)
        if code is None:
            if not short_text(state, MAX_STATE):
                raise _NotRegular
            code = state_index[state] = len(state_index)
        state_codes.append(code)

        if timeout is not None and type(timeout) is not int:
            raise _NotRegular
        code = timeout_index.get(timeout)
        if code is None:
            code = timeout_index[timeout] = len(timeout_index)
        timeout_codes.append(code)

        pair = (thread_id, thread_name)
        code = thread_index.get(pair)
        if code is None:
            if not regular_thread(pair):
                raise _NotRegular
            code = thread_index[pair] = len(thread_index)
        thread_codes.append(code)

        spent = entry.get("duration_ms")
        if spent is None:
            spent = nan
        elif type(spent) is not float:
            raise _NotRegular
        elif not 0.0 <= spent <= MAX_DURATION_MS:
            spent = nan  # NaN, inf and out of range read 'not recorded'
        duration.append(spent)

        # Shapes: the op's last or second-to-last, else checked and keyed.
        quad = (input_sizes, input_dtypes, output_sizes, output_dtypes)
        seen = last_shape.get(op_code)
        if seen is not None and seen[0] == quad:
            shape_codes.append(seen[1])
        else:
            other = older_shape.get(op_code)
            if other is not None and other[0] == quad:
                older_shape[op_code], last_shape[op_code] = seen, other  # type: ignore[assignment]
                shape_codes.append(other[1])
            else:
                if not (regular_sizes(input_sizes) and regular_sizes(output_sizes) and regular_dtypes(input_dtypes)
                        and regular_dtypes(output_dtypes)):
                    raise _NotRegular
                key = (tuple(map(tuple, input_sizes)), tuple(input_dtypes), tuple(map(tuple, output_sizes)),
                       tuple(output_dtypes))
                code = shape_index.get(key)
                if code is None:
                    code = shape_index[key] = len(shapes)
                    shapes.append(quad)
                if seen is not None:
                    older_shape[op_code] = seen
                last_shape[op_code] = (quad, code)
                shape_codes.append(code)

        # Stacks: the op's last one (torch shares frame dicts: identity comparisons), else converted.
        if not stacks.failed:
            frames = entry.get("frames")
            held = last_stack.get(op_code)
            if held is not None and (held[0] is frames or held[0] == frames):
                stack_codes.append(held[1])
            else:
                stacks.add(op_code, frames)

    table = EntryTable.__new__(EntryTable)
    table.record_id = array("q", record_id)
    table.seq = array("q", seq)
    table.p2p_seq = array("q", p2p_seq)
    table.created = array("q", created)
    table.started = array("q", started)
    table.completed = array("q", completed)
    table.duration = array("d", duration)
    table.flags = array("B", flags)
    table.pgs = list(pg_index)
    table.pg = array(_code_type(len(pg_index)), pg_codes)
    distinct_names = list(name_index)
    parsed = [parse_name(n) for n in distinct_names]
    table.names = [(n, op, peer) for n, (_backend, op, peer) in zip(distinct_names, parsed, strict=True)]
    table.name = array(_code_type(len(name_index)), name_codes)
    table.states = list(state_index)
    table.state = array(_code_type(len(state_index)), state_codes)
    # As normalize: a timeout outside (0, int64 max] is 'not recorded'.
    table.timeouts = [t if t is None or 0 < t <= top else None for t in timeout_index]
    table.timeout = array(_code_type(len(timeout_index)), timeout_codes)
    table.threads = list(thread_index)
    table.thread = array(_code_type(len(thread_index)), thread_codes)
    table.shapes = shapes
    table.shape = array(_code_type(len(shapes)), shape_codes)
    table.frames, table.frames_each = lazy_frames, None
    table.stack, table.stacks = stacks.result(record_id)
    table._stack_frames = {}
    table.sigs, table.space, table._groups = [], None, None

    # The backend most entries name, ties to the first seen (as normalize counts it).
    counts = Counter(name_codes)
    backends: Counter[str] = Counter()
    for code, (backend, _op, _peer) in enumerate(parsed):
        if backend:
            backends[backend] += counts[code]
    most = backends.most_common(1)
    return table, (most[0][0] if most else None)
