"""The reference reader of a recorder's entry list: any entry, row by row, into `Entry` constructor rows.

Tolerance rules, all learnt from real dumps: JSON writes tuples as lists and `None` as 0; older
versions lack fields (`is_p2p`, dtypes, `timeout_ms`, thread fields) or call `collective_seq_id`
`seq_id`; newer ones add fields. Missing fields get a neutral value and one warning per field per
dump, never an exception. The fields, their bounds and caps are `records.fields`' table, which the
column reader (`fastcols`) and the C scanner read too: they accept only what this reader keeps
unchanged.
"""

from __future__ import annotations

from collections import Counter
from operator import itemgetter
from typing import Any

from frscope.records.fields import (
    EXPECTED,
    ID_MIN,
    MAX_DIM,
    MAX_DIMS,
    MAX_DTYPE,
    MAX_DURATION_MS,
    MAX_NAME,
    MAX_SHAPES,
    MAX_STATE,
    REQUIRED,
    SEQ_MIN,
    parse_profiling_name,
)
from frscope.records.limits import MAX_INT64, bounded_int, finite_float, text
from frscope.records.model import P2P_OPS, SCHEDULED, Entry, EntryRow, LazyFrames, entries_from_rows


def opt_int(value: Any) -> int | None:
    """None, '', 0 and junk mean 'not recorded' for times; int64 ints and numeric strings are kept
    (NaN, inf and out-of-range numbers are junk)."""
    return bounded_int(value, 1) or None


def int_or(value: Any, default: int) -> int:
    """Sequence numbers and ids: int64 (or -1, torch's 'none yet'), else `default`."""
    got = bounded_int(value, -1)
    return default if got is None else got


def _opt_duration(value: Any) -> float | None:
    got = finite_float(value)
    return got if got is not None and 0.0 <= got <= MAX_DURATION_MS else None


def name_text(value: Any, limit: int = MAX_NAME) -> str | None:
    """A group key, name, description or thread id: a string (capped) or a small int; else None."""
    if isinstance(value, str):
        return text(value, limit)
    got = bounded_int(value, -MAX_INT64) if isinstance(value, int) else None
    return None if got is None else str(got)


def _sizes(value: Any) -> list[list[int]]:
    return value if isinstance(value, list) else (list(value) if isinstance(value, tuple) else [])


def _dtypes(value: Any) -> list[str]:
    return value if isinstance(value, list) else (list(value) if isinstance(value, tuple) else [])


def _clean_sizes(value: list[Any]) -> list[list[int]]:
    """A list of shapes, each a list of int64 dims; a malformed shape (nested deeper, a huge or
    non-int dim) becomes [-1], so that entries still compare (and mismatch) by == and hash."""
    out: list[list[int]] = []
    for shape in value[:MAX_SHAPES]:
        if isinstance(shape, (list, tuple)) and len(shape) <= MAX_DIMS and all(
            type(d) is int and -1 <= d <= MAX_DIM for d in shape
        ):
            out.append(list(shape))
        else:
            out.append([-1])
    return out


def _clean_dtypes(value: list[Any]) -> list[str]:
    return [text(d, MAX_DTYPE) or "?" for d in value[:MAX_SHAPES]]



_EXPECTED_SET = frozenset(EXPECTED)
# Every field a torch 2.x entry carries (all but `duration_ms` and `frames`, which may be absent).
_FAST_FIELDS = itemgetter(*REQUIRED)


def _shared(cache: dict[Any, Any], value: list[Any], key_of: Any, clean: Any = None) -> list[Any]:
    """One list object per distinct content (the model's sizes/dtypes/frames are never mutated).
    `clean` checks each distinct content once: what the model keeps is well-formed and hashable."""
    try:
        key = key_of(value)
        got = cache.get(key)
    except (TypeError, RecursionError, ValueError):  # unhashable or deep junk: made well-formed
        return clean(value) if clean is not None else value
    if got is None:
        got = clean(value) if clean is not None else value
        cache[key] = got
    return got


def _sizes_key(value: list[Any]) -> tuple[Any, ...]:
    return tuple(map(tuple, value))


def _frames_key(value: list[Any]) -> tuple[int, ...]:
    # Frame dicts are shared objects in a dump (torch memoizes them), so their ids name the stack.
    # Keys stay valid: the cached list keeps those dicts alive for as long as the cache lives.
    return tuple(map(id, value))


def normalize_entries(
    raw_entries: list[Any], source: str, lazy_frames: LazyFrames | None = None
) -> tuple[list[Entry], str | None, list[str]]:
    """Normalize the entry list; returns (entries, backend, warnings)."""
    rows, backend, warnings = normalize_rows(raw_entries, source, lazy_frames)
    return entries_from_rows(rows), backend, warnings


def normalize_rows(
    raw_entries: list[Any], source: str, lazy_frames: LazyFrames | None = None
) -> tuple[list[EntryRow], str | None, list[str]]:
    """Normalize the entry list into `Entry` constructor rows (the one place the tolerance rules live:
    `Entry` objects and the columnar `EntryTable` are both built from these rows); returns (rows,
    backend, warnings). Linear, no per-entry regex.

    Hot path (millions of entries): fields that already have the type torch writes are taken as they
    are, anything else goes through the tolerant converters. Equal sizes, dtypes and stacks become one
    shared list: a rank repeats a handful of shapes thousands of times, and sharing them halves the
    memory of a large load.
    """
    entries: list[EntryRow] = []
    append = entries.append
    missing: Counter[str] = Counter()
    skipped = 0
    name_counts: dict[str, int] = {}
    names: dict[str, tuple[str | None, str, int | None]] = {}
    sizes_cache: dict[Any, Any] = {}
    dtypes_cache: dict[Any, Any] = {}
    frames_cache: dict[Any, Any] = {}
    small_ints: dict[int, int] = {}
    last_shapes: dict[str, tuple[Any, Any, Any, Any]] = {}
    older_shapes: dict[str, tuple[Any, Any, Any, Any]] = {}
    last_frames: dict[str, list[Any]] = {}
    counters: dict[str, tuple[int, int]] = {}  # group -> (collective seq, p2p seq) of its previous entry
    expected = _EXPECTED_SET
    fast = _FAST_FIELDS
    for index, raw in enumerate(raw_entries):
        if not isinstance(raw, dict):
            skipped += 1
            continue
        get = raw.get
        try:  # every field a 2.x entry always has, in one C call
            (record_id, pg, seq, p2p_seq, is_p2p, profiling_name, created, input_sizes, input_dtypes,
             output_sizes, output_dtypes, state, started, completed, retired, timeout, thread_id,
             thread_name) = fast(raw)
        except KeyError:  # an older or odd entry: field by field, with the defaults
            if not expected <= raw.keys():
                for key in EXPECTED:
                    if key not in raw:
                        missing[key] += 1
            record_id = get("record_id", index)
            pg = get("process_group")
            seq = get("collective_seq_id")
            p2p_seq = get("p2p_seq_id", 0)
            is_p2p = get("is_p2p")
            profiling_name = get("profiling_name")
            created = get("time_created_ns")
            input_sizes = get("input_sizes")
            input_dtypes = get("input_dtypes")
            output_sizes = get("output_sizes")
            output_dtypes = get("output_dtypes")
            state = get("state")
            started = get("time_discovered_started_ns")
            completed = get("time_discovered_completed_ns")
            retired = get("retired")
            timeout = get("timeout_ms")
            thread_id = get("thread_id")
            thread_name = get("thread_name")

        if not isinstance(profiling_name, str):
            profiling_name = "unknown"
        parsed = names.get(profiling_name)
        if parsed is None:
            parsed = parse_profiling_name(profiling_name)
            names[profiling_name] = parsed
            name_counts[profiling_name] = 1
        else:
            name_counts[profiling_name] += 1
        _backend, op, peer = parsed

        pg_type = type(pg)
        if (pg_type is tuple or pg_type is list) and len(pg) == 2 and type(pg[0]) is str and type(pg[1]) is str:
            pg_name, pg_desc = pg
        elif isinstance(pg, (list, tuple)) and len(pg) >= 2:
            pg_name, pg_desc = name_text(pg[0]) or "?", name_text(pg[1]) or ""
        elif isinstance(pg, (list, tuple)) and len(pg) == 1:
            pg_name, pg_desc = name_text(pg[0]) or "?", ""
        else:
            pg_name, pg_desc = name_text(get("pg_id")) or "0", ""
        if len(pg_name) > MAX_NAME or len(pg_desc) > MAX_NAME:
            pg_name, pg_desc = text(pg_name, MAX_NAME) or "?", text(pg_desc, MAX_NAME) or ""

        # Type and range in one test (ints past int64, floats, NaN go the slow way).
        if type(seq) is not int or not SEQ_MIN <= seq <= MAX_INT64:
            seq = int_or(seq if seq is not None else get("seq_id"), 0)
        if type(p2p_seq) is not int or not SEQ_MIN <= p2p_seq <= MAX_INT64:
            p2p_seq = int_or(p2p_seq, 0)
        if type(is_p2p) is not bool:
            # (format 2.2 has no is_p2p) A recorder numbers a group's collectives from 1: an entry numbered 0
            # that counts as a point-to-point call (NCCL's `coalesced` entry of a batch_isend_irecv before the
            # group's first collective) is one, whatever its name. So is an entry that advanced the group's
            # point-to-point count over its previous entry's and left the collective count where it was: only
            # a point-to-point call counts there, and such a format records a step's batch_isend_irecv under
            # the collective seq of the collective before it.
            prev = counters.get(pg_name)
            is_p2p = op in P2P_OPS or (seq == 0 and p2p_seq > 0) or (
                prev is not None and seq == prev[0] and p2p_seq > prev[1])
            counters[pg_name] = (seq, p2p_seq)
        if type(record_id) is not int or not ID_MIN <= record_id <= MAX_INT64:
            record_id = int_or(record_id, index)
        if type(state) is not str or len(state) > MAX_STATE:
            state = SCHEDULED
        if type(retired) is not bool:
            retired = None
        if thread_id is not None and (type(thread_id) is not str or len(thread_id) > MAX_NAME):
            thread_id = name_text(thread_id)
        if thread_name is not None and (type(thread_name) is not str or len(thread_name) > MAX_NAME):
            thread_name = text(thread_name, MAX_NAME)

        if type(input_sizes) is not list:
            input_sizes = _sizes(input_sizes)
        if type(output_sizes) is not list:
            output_sizes = _sizes(output_sizes)
        if type(input_dtypes) is not list:
            input_dtypes = _dtypes(input_dtypes)
        if type(output_dtypes) is not list:
            output_dtypes = _dtypes(output_dtypes)
        # Most ops repeat the shapes they had last time: compare with those (C-level ==) and share
        # them; only on a change build hashable keys.
        last = last_shapes.get(profiling_name)
        if (
            last is not None
            and last[0] == input_sizes
            and last[1] == output_sizes
            and last[2] == input_dtypes
            and last[3] == output_dtypes
        ):
            input_sizes, output_sizes, input_dtypes, output_dtypes = last
        else:
            # An op often alternates between two shapes (a layer's all_reduce and the grad-norm one).
            other = older_shapes.get(profiling_name)
            if (
                other is not None
                and other[0] == input_sizes
                and other[1] == output_sizes
                and other[2] == input_dtypes
                and other[3] == output_dtypes
            ):
                input_sizes, output_sizes, input_dtypes, output_dtypes = other
            else:
                input_sizes = _shared(sizes_cache, input_sizes, _sizes_key, _clean_sizes)
                output_sizes = _shared(sizes_cache, output_sizes, _sizes_key, _clean_sizes)
                input_dtypes = _shared(dtypes_cache, input_dtypes, tuple, _clean_dtypes)
                output_dtypes = _shared(dtypes_cache, output_dtypes, tuple, _clean_dtypes)
                other = (input_sizes, output_sizes, input_dtypes, output_dtypes)
            if last is not None:
                older_shapes[profiling_name] = last
            last_shapes[profiling_name] = other
        if lazy_frames is not None:  # frames stay in the file; read again for the entries shown
            frames: Any = lazy_frames
        else:
            frames = get("frames")
            if type(frames) is list and frames:
                same = last_frames.get(profiling_name)
                if same is not None and same == frames:  # same stack as last time: identity checks only
                    frames = same
                else:
                    frames = _shared(frames_cache, frames, _frames_key)
                    last_frames[profiling_name] = frames

        if created is not None and (type(created) is not int or not 0 < created <= MAX_INT64):
            created = opt_int(created)
        if started is not None and (type(started) is not int or not 0 < started <= MAX_INT64):
            started = opt_int(started)
        if completed is not None and (type(completed) is not int or not 0 < completed <= MAX_INT64):
            completed = opt_int(completed)
        duration = get("duration_ms")
        if duration is not None and (type(duration) is not float or not 0.0 <= duration <= MAX_DURATION_MS):
            duration = _opt_duration(duration)  # NaN and inf too (NaN fails every comparison)
        if type(timeout) is int and 0 < timeout <= MAX_INT64:
            timeout = small_ints.setdefault(timeout, timeout)
        elif timeout is not None:
            timeout = opt_int(timeout)

        append((record_id, pg_name, pg_desc, seq, p2p_seq, is_p2p, op, profiling_name, peer, input_sizes,
                input_dtypes, output_sizes, output_dtypes, state, retired, created, started, completed, duration,
                timeout, thread_id, thread_name, frames))
    warnings = [f"{count} entries lack field {key!r}" for key, count in sorted(missing.items())]
    if skipped:
        warnings.append(f"{skipped} entries are not objects and were skipped")
    backends: Counter[str] = Counter()
    for profiling_name, count in name_counts.items():
        backend = names[profiling_name][0]
        if backend:
            backends[backend] += count
    most = backends.most_common(1)
    return entries, (most[0][0] if most else None), warnings
