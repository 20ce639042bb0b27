"""The fast way from a decoded entry list to an `EntryTable`: column by column, in C-level passes.

`normalize.normalize_rows` looks at every field of every entry in Python (~4 us an entry here, as
much as decoding it). Most dumps are regular: every entry has every field torch writes, with the
type torch writes, in range. For those, each field is pulled out as a column (`itemgetter` over the
entry list, transposed by `zip`), its types checked once per column (`set(map(type, ...))`), ranges
with `min`/`max`, strings and tuples interned with `dict.fromkeys` and checked once per distinct
value. Anything else — a missing field, a float where an int belongs, a bool, a string past its
cap, a malformed shape — returns None, and the caller takes the row-by-row reference for that rank.
So this path only ever accepts what the reference would keep unchanged, and builds the same values
(tests/unit/test_fast_path_equivalence.py and test_fastcols.py compare them entry by entry).
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter, lt
from typing import Any

from frscope.records.columns import EntryTable, _code_type, _float64, _int64
from frscope.records.limits import MAX_INT64
from frscope.records.model import LazyFrames, frames_from_raw

_FIELDS = (
    "record_id",
    "process_group",
    "collective_seq_id",
    "p2p_seq_id",
    "is_p2p",
    "profiling_name",
    "time_created_ns",
    "input_sizes",
    "input_dtypes",
    "output_sizes",
    "output_dtypes",
    "state",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "retired",
    "timeout_ms",
    "thread_id",
    "thread_name",
)
_GET = itemgetter(*_FIELDS)
_MAX_MS = 1e12  # as normalize: a duration is >= 0 and below ~30 years
_MAX_SHAPES = 1024  # as normalize._clean_sizes / _clean_dtypes
_MAX_DIMS = 64
_MAX_DTYPE = 40
_MAX_NAME = 200
_MAX_STACKS = 64  # distinct stacks a rank keeps in its table (more: frames stay in the file)
_MAX_FRAME_REFS = 1 << 20  # frame references in a rank's entries, at most (~500 a entry for 2,000 entries)

_FLAG_OF = {
    (False, None): 0, (True, None): 1,
    (False, False): 2, (True, False): 3,
    (False, True): 4, (True, True): 5,
}
_INT = frozenset({int})
_INT_OR_NONE = frozenset({int, type(None)})
_BOOL_OR_NONE = frozenset({bool, type(None)})
_FLOAT_OR_NONE = frozenset({float, type(None)})


class _NotRegular(Exception):
    """This entry list needs the row-by-row reference."""


def _types(column: Sequence[Any]) -> set[type]:
    return set(map(type, column))


def _ids(column: Sequence[Any], low: int) -> array[int]:
    """Ints in [low, int64 max], never bools (the reference replaces those)."""
    if _types(column) != _INT:
        raise _NotRegular
    try:
        out = array("q", column)
    except OverflowError:
        raise _NotRegular from None
    if min(out) < low:
        raise _NotRegular
    return out


def _times(column: Sequence[Any]) -> array[int]:
    """Times: ints in [0, int64 max] or None; 0 and None both read 'not recorded' (stored as 0)."""
    if not _types(column) <= _INT_OR_NONE:
        raise _NotRegular
    try:
        out = _int64(column)
    except OverflowError:
        raise _NotRegular from None
    if min(out) < 0:
        raise _NotRegular
    return out


def _intern(column: Sequence[Any]) -> tuple[list[Any], array[int]]:
    index: dict[Any, int] = {}
    for key in dict.fromkeys(column):
        index[key] = len(index)
    return list(index), array(_code_type(len(index)), map(index.__getitem__, column))


def _short_text(value: Any, limit: int) -> bool:
    return type(value) is str and len(value) <= limit


def _clean_sizes(value: list[Any]) -> bool:
    """What normalize keeps as it is: at most 1,024 shapes, each a list of at most 64 int64 dims >= -1."""
    if len(value) > _MAX_SHAPES:
        return False
    for shape in value:
        if type(shape) is not list or len(shape) > _MAX_DIMS:
            return False
        for dim in shape:
            if type(dim) is not int or not -1 <= dim <= MAX_INT64:
                return False
    return True


def _clean_dtypes(value: list[Any]) -> bool:
    if len(value) > _MAX_SHAPES:
        return False
    return all(type(d) is str and 0 < len(d) <= _MAX_DTYPE for d in value)


def _shape_codes(name_codes: Sequence[int], quads: list[tuple[Any, Any, Any, Any]]) -> tuple[list[Any], array[int]]:
    """A code per entry for its (input_sizes, input_dtypes, output_sizes, output_dtypes). An op mostly
    repeats one of the two shapes it had last (a layer's call and the grad-norm one): one or two
    C-level comparisons. A new content is checked (what normalize keeps unchanged) and keyed."""
    codes: list[int] = []
    append = codes.append
    last: dict[int, tuple[Any, int]] = {}
    older: dict[int, tuple[Any, int]] = {}
    index: dict[Any, int] = {}
    shapes: list[Any] = []
    for name, quad in zip(name_codes, quads, strict=True):
        seen = last.get(name)
        if seen is not None:
            if seen[0] == quad:
                append(seen[1])
                continue
            other = older.get(name)
            if other is not None and other[0] == quad:
                older[name], last[name] = seen, other
                append(other[1])
                continue
        input_sizes, input_dtypes, output_sizes, output_dtypes = quad
        if type(input_sizes) is not list or type(output_sizes) is not list or type(input_dtypes) is not list \
                or type(output_dtypes) is not list:
            raise _NotRegular
        if not (_clean_sizes(input_sizes) and _clean_sizes(output_sizes) and _clean_dtypes(input_dtypes)
                and _clean_dtypes(output_dtypes)):
            raise _NotRegular
        key = (tuple(map(tuple, input_sizes)), tuple(input_dtypes), tuple(map(tuple, output_sizes)),
               tuple(output_dtypes))
        code = index.get(key)
        if code is None:
            code = index[key] = len(shapes)
            shapes.append(quad)
        if seen is not None:
            older[name] = seen
        last[name] = (quad, code)
        append(code)
    return shapes, array(_code_type(len(shapes)), codes)


def _stacks(frames: list[Any], record_id: Sequence[int]) -> tuple[array[int], list[Any]] | None:
    """Each entry's stack as a code into the rank's distinct stacks, or None (then frames stay in the file,
    `LazyFrames`). Torch's pickler shares frame dicts between entries, so the ids of an entry's frame
    dicts name its stack. Exactly what LazyFrames gives: `frames_from_raw` of the frames of the last entry
    with the entry's record id. JSON has no shared dicts (a stack per entry): left in the file."""
    if _types(frames) != {list} or sum(map(len, frames)) > _MAX_FRAME_REFS:
        return None
    keys: list[tuple[int, ...]] = list(map(tuple, map(map, repeat(id), frames)))
    if not all(map(lt, record_id[:-1], record_id[1:])):  # record ids repeat or go back: the last one's frames
        last = dict(zip(record_id, keys, strict=True))
        keys = list(map(last.__getitem__, record_id))
    distinct, codes = _intern(keys)
    if len(distinct) > max(_MAX_STACKS, len(frames) // 8):
        return None
    raw_of = dict(zip(keys, frames, strict=True))  # equal keys: the same dict objects, the same frames
    one: dict[int, tuple[tuple[str, str, int], ...]] = {}  # per frame dict: what frames_from_raw makes of it

    def frame(item: Any) -> tuple[tuple[str, str, int], ...]:
        got = one.get(id(item))
        if got is None:
            got = one[id(item)] = tuple((f.name, f.filename, f.line) for f in frames_from_raw([item]))
        return got

    stacks = [tuple(f for item in raw_of[key] for f in frame(item)) for key in distinct]
    return codes, stacks


def table_from_entries(raw_entries: list[Any], lazy_frames: LazyFrames | None,
                       parse_name: Any) -> tuple[EntryTable, str | None] | None:
    """The table and the backend, or None when the entries are not all regular (see the module doc).
    `parse_name` is normalize.parse_profiling_name (passed in: normalize imports this module)."""
    if not raw_entries or lazy_frames is None:
        return None  # (an entry that is not a dict makes the field getter raise TypeError: the reference)
    try:
        return _table(raw_entries, lazy_frames, parse_name)
    except (_NotRegular, KeyError, TypeError):
        return None


def _table(raw: list[dict[str, Any]], lazy_frames: LazyFrames, parse_name: Any) -> tuple[EntryTable, str | None]:
    cols = list(zip(*map(_GET, raw), strict=True))
    (record_id, process_group, seq, p2p_seq, is_p2p, profiling_name, created, input_sizes, input_dtypes,
     output_sizes, output_dtypes, state, started, completed, retired, timeout, thread_id, thread_name) = cols
    table = EntryTable.__new__(EntryTable)
    table.record_id = _ids(record_id, 0)
    table.seq = _ids(seq, -1)
    table.p2p_seq = _ids(p2p_seq, -1)
    table.created = _times(created)
    table.started = _times(started)
    table.completed = _times(completed)

    # Groups: (name, desc) tuples (pickle) or 2-lists (JSON) of short strings.
    kinds = _types(process_group)
    if kinds == {list}:
        process_group = tuple(map(tuple, process_group))
    elif kinds != {tuple}:
        raise _NotRegular
    pgs, table.pg = _intern(process_group)
    for pg in pgs:
        if len(pg) != 2 or not _short_text(pg[0], _MAX_NAME) or not _short_text(pg[1], _MAX_NAME):
            raise _NotRegular
    table.pgs = pgs

    if _types(is_p2p) != {bool} or not _types(retired) <= _BOOL_OR_NONE:
        raise _NotRegular
    # Strings and None equal nothing of another type, so their columns are type-checked per distinct value.
    distinct_names, name_codes = _intern(profiling_name)
    if _types(distinct_names) != {str}:
        raise _NotRegular
    parsed = [parse_name(n) for n in distinct_names]
    table.names = [(n, op, peer) for n, (_backend, op, peer) in zip(distinct_names, parsed, strict=True)]
    table.name = name_codes
    table.flags = array("B", map(_FLAG_OF.__getitem__, zip(is_p2p, retired, strict=True)))

    table.states, table.state = _intern(state)
    if any(type(s) is not str or len(s) > _MAX_DTYPE for s in table.states):
        raise _NotRegular

    table.threads, table.thread = _intern(tuple(zip(thread_id, thread_name, strict=True)))
    for pair in table.threads:
        for value in pair:
            if value is not None and (type(value) is not str or len(value) > _MAX_NAME):
                raise _NotRegular

    if not _types(timeout) <= _INT_OR_NONE:
        raise _NotRegular
    timeouts, table.timeout = _intern(timeout)
    # As normalize: a timeout outside (0, int64 max] is 'not recorded'.
    table.timeouts = [t if t is None or 0 < t <= MAX_INT64 else None for t in timeouts]

    durations = list(map(dict.get, raw, repeat("duration_ms")))
    if not _types(durations) <= _FLOAT_OR_NONE:
        raise _NotRegular
    duration = _float64(durations)
    if any(map(_MAX_MS.__lt__, duration)) or any(map((0.0).__gt__, duration)):
        nan = float("nan")  # out of range (inf included) reads 'not recorded', as NaN does
        duration = array("d", [d if 0.0 <= d <= _MAX_MS else nan for d in duration])
    table.duration = duration

    quads = list(zip(input_sizes, input_dtypes, output_sizes, output_dtypes, strict=True))
    table.shapes, table.shape = _shape_codes(name_codes, quads)

    table.frames, table.frames_each = lazy_frames, None
    stacks = _stacks(list(map(dict.get, raw, repeat("frames"))), record_id)
    table.stack, table.stacks = stacks if stacks is not None else (None, None)
    table._stack_frames = {}
    table.sigs, table.space, table._groups = [], None, None

    # The backend most entries name, ties to the first seen (as normalize counts it).
    counts = Counter(profiling_name)
    backends: Counter[str] = Counter()
    for name, (backend, _op, _peer) in zip(distinct_names, parsed, strict=True):
        if backend:
            backends[backend] += counts[name]
    most = backends.most_common(1)
    return table, (most[0][0] if most else None)
