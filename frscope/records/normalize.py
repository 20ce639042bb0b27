"""Raw decoded dump (pickle or JSON, any format version) -> RankDump.

Tolerance rules, all learnt from real dumps: JSON writes tuples as lists, `None` as 0 and pg_status
values as strings; older versions lack fields (`is_p2p`, dtypes, `timeout_ms`, thread fields) or call
`collective_seq_id` `seq_id`; newer ones add fields. Missing fields get a neutral value and one
warning per field per dump, never an exception; a dump is refused only when it has no shape of a
recorder at all.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from frscope.records.columns import EntryTable
from frscope.records.errors import DumpError, MalformedDump
from frscope.records.fastcols import table_from_entries
from frscope.records.limits import MAX_INT64, MAX_RANK, bounded_int, describe, finite_float, text, valid_rank
from frscope.records.model import (
    CAPTURED_SNAPSHOT,
    P2P_OPS,
    SCHEDULED,
    Entry,
    EntryRow,
    LazyFrames,
    PgConfig,
    PgStatus,
    RankDump,
    entries_from_rows,
)
from frscope.wire import unwrap_snapshot

# Versions whose fields this reader knows. Newer ones are read with a warning.
KNOWN_VERSION = (2, 10)
OLDEST_VERSION = (2, 0)

# Peers have at most 9 digits: int() of a 5,000-digit peer raises (Python's 4,300-digit limit).
_P2P_NAME = re.compile(r"^(?P<op>\w+)\s+(?P<a>-?\d{1,9})\s*(?P<arrow>->|<-)\s*(?P<b>-?\d{1,9})$")
_RANK_TEXT = re.compile(r"-?\d{1,12}")


def parse_profiling_name(profiling_name: str) -> tuple[str | None, str, int | None]:
    """'nccl:send 0->1' -> ('nccl', 'send', 1); 'gloo:all_reduce' -> ('gloo', 'all_reduce', None).

    For p2p the peer is the group-local rank on the other side: 'send a->b' is sent by a to b,
    'recv a<-b' is received by a from b.
    """
    backend, sep, rest = profiling_name.partition(":")
    if not sep:
        backend, rest = "", profiling_name
    rest = rest.strip()
    match = _P2P_NAME.match(rest)
    if match:
        return backend or None, match.group("op"), int(match.group("b"))
    op = rest.split(" ", 1)[0] if rest else "unknown"
    return backend or None, op, None


def version_text(version: Any) -> str | None:
    """The version as text, type-checked first: only a string or a number is a version (str() of an
    arbitrary decoded object can take exponential time)."""
    if isinstance(version, str):
        return text(version.strip(), 40)
    if isinstance(version, float):
        return repr(version) if finite_float(version) is not None else None
    if isinstance(version, int) and not isinstance(version, bool):
        return str(version) if version.bit_length() <= 64 else None
    return None


def parse_version(version: Any) -> tuple[int, int] | None:
    shown = version_text(version)
    if shown is None:
        return None
    match = re.match(r"^(\d{1,6})\.(\d{1,6})", shown)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2))


def parse_ranks(value: Any) -> tuple[int, ...] | None:
    """pg_config 'ranks' is a string like '[0, 1]' in torch's dumps; accept lists too."""
    if isinstance(value, str):
        return _parse_ranks_text(str(value))
    if isinstance(value, (list, tuple)):
        return _rank_tuple(value)
    return None


@functools.lru_cache(maxsize=4096)
def _parse_ranks_text(value: str) -> tuple[int, ...] | None:
    """Every rank's dump repeats the same strings (the default group's lists all N ranks): parse each
    once and share the tuple. Without this, N dumps of N ranks cost N^2 int objects (2.4 GB at 8,192)."""
    try:
        items = json.loads(value)
    except (ValueError, RecursionError):  # not JSON, a 5,000-digit number, '[' * 10**6
        found = _RANK_TEXT.findall(value)
        if not found:
            return None
        items = [int(x) for x in found]
    return _rank_tuple(items)


def _rank_tuple(items: Any) -> tuple[int, ...] | None:
    """Every item a rank in [0, MAX_RANK), else None (the dump's ranks are not used): a group naming
    rank 10**12 would make the world that large."""
    if not isinstance(items, (list, tuple)):
        return None
    out: list[int] = []
    for item in items:
        rank = valid_rank(item)
        if rank is None:
            return None
        out.append(rank)
    return tuple(out) if out else None


def _opt_int(value: Any) -> int | None:
    """None, '', 0 and junk mean 'not recorded' for times; int64 ints and numeric strings are kept
    (NaN, inf and out-of-range numbers are junk)."""
    return bounded_int(value, 1) or None


def _int_or(value: Any, default: int) -> int:
    """Sequence numbers and ids: int64 (or -1, torch's 'none yet'), else `default`."""
    got = bounded_int(value, -1)
    return default if got is None else got


def _opt_duration(value: Any) -> float | None:
    got = finite_float(value)
    return got if got is not None and 0.0 <= got <= _MAX_MS else None


def _name(value: Any, limit: int = 200) -> str | None:
    """A group key, name, description or thread id: a string (capped) or a small int; else None."""
    if isinstance(value, str):
        return text(value, limit)
    got = bounded_int(value, -MAX_INT64) if isinstance(value, int) else None
    return None if got is None else str(got)


# Most dims are well below this; anything larger (or a non-int) is not a tensor shape.
_MAX_DIM = MAX_INT64


def _sizes(value: Any) -> list[list[int]]:
    return value if isinstance(value, list) else (list(value) if isinstance(value, tuple) else [])


def _dtypes(value: Any) -> list[str]:
    return value if isinstance(value, list) else (list(value) if isinstance(value, tuple) else [])


def _clean_sizes(value: list[Any]) -> list[list[int]]:
    """A list of shapes, each a list of int64 dims; a malformed shape (nested deeper, a huge or
    non-int dim) becomes [-1], so that entries still compare (and mismatch) by == and hash."""
    out: list[list[int]] = []
    for shape in value[:1024]:
        if isinstance(shape, (list, tuple)) and len(shape) <= 64 and all(
            type(d) is int and -1 <= d <= _MAX_DIM for d in shape
        ):
            out.append(list(shape))
        else:
            out.append([-1])
    return out


def _clean_dtypes(value: list[Any]) -> list[str]:
    return [text(d, 40) or "?" for d in value[:1024]]


# Fields every 2.x entry has; their absence is worth one warning per dump.
_EXPECTED_FIELDS = (
    "record_id",
    "process_group",
    "collective_seq_id",
    "profiling_name",
    "input_sizes",
    "output_sizes",
    "state",
    "time_created_ns",
)


_EXPECTED_SET = frozenset(_EXPECTED_FIELDS)
# A duration is >= 0 and below ~30 years: sums of larger finite floats overflow to inf.
_MAX_MS = 1e12
# Every field a torch 2.x entry carries (all but `duration_ms` and `frames`, which may be absent).
_FAST_FIELDS = itemgetter(
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
                for key in _EXPECTED_FIELDS:
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
            pg_name, pg_desc = _name(pg[0]) or "?", _name(pg[1]) or ""
        elif isinstance(pg, (list, tuple)) and len(pg) == 1:
            pg_name, pg_desc = _name(pg[0]) or "?", ""
        else:
            pg_name, pg_desc = _name(get("pg_id")) or "0", ""
        if len(pg_name) > 200 or len(pg_desc) > 200:
            pg_name, pg_desc = text(pg_name, 200) or "?", text(pg_desc, 200) or ""

        # Type and range in one test (ints past int64, floats, NaN go the slow way).
        if type(seq) is not int or not -1 <= seq <= MAX_INT64:
            seq = _int_or(seq if seq is not None else get("seq_id"), 0)
        if type(p2p_seq) is not int or not -1 <= p2p_seq <= MAX_INT64:
            p2p_seq = _int_or(p2p_seq, 0)
        if type(is_p2p) is not bool:
            is_p2p = op in P2P_OPS
        if type(record_id) is not int or not 0 <= record_id <= MAX_INT64:
            record_id = _int_or(record_id, index)
        if type(state) is not str or len(state) > 40:
            state = SCHEDULED
        if type(retired) is not bool:
            retired = None
        if thread_id is not None and (type(thread_id) is not str or len(thread_id) > 200):
            thread_id = _name(thread_id)
        if thread_name is not None and (type(thread_name) is not str or len(thread_name) > 200):
            thread_name = text(thread_name, 200)

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
            created = _opt_int(created)
        if started is not None and (type(started) is not int or not 0 < started <= MAX_INT64):
            started = _opt_int(started)
        if completed is not None and (type(completed) is not int or not 0 < completed <= MAX_INT64):
            completed = _opt_int(completed)
        duration = get("duration_ms")
        if duration is not None and (type(duration) is not float or not 0.0 <= duration <= _MAX_MS):
            duration = _opt_duration(duration)  # NaN and inf too (NaN fails every comparison)
        if type(timeout) is int and 0 < timeout <= MAX_INT64:
            timeout = small_ints.setdefault(timeout, timeout)
        elif timeout is not None:
            timeout = _opt_int(timeout)

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


def _pg_config(raw: Any, warnings: list[str]) -> dict[str, PgConfig]:
    out: dict[str, PgConfig] = {}
    if raw is None:
        return out
    if not isinstance(raw, dict):
        warnings.append("field 'pg_config' is not a mapping; ignored")
        return out
    for key, value in raw.items():
        if not isinstance(value, dict):
            continue
        key_text = _name(key)
        if key_text is None:
            warnings.append(f"pg_config key {describe(key)} is not a group key; ignored")
            continue
        ranks_raw = value.get("ranks")
        ranks = parse_ranks(ranks_raw)
        if ranks is None and ranks_raw not in (None, "", "[]", [], ()):
            warnings.append(
                f"pg_config {key_text!r}: field 'ranks' is not a list of ranks in [0, {MAX_RANK}); ignored"
            )
        out[key_text] = PgConfig(
            key=key_text,
            name=_name(value.get("name")) or key_text,
            desc=_name(value.get("desc")) or "",
            ranks=ranks,
        )
    return out


def _pg_status(raw: Any) -> dict[str, PgStatus]:
    out: dict[str, PgStatus] = {}
    if not isinstance(raw, dict):
        return out
    for key, value in raw.items():
        key_text = _name(key)
        if not isinstance(value, dict) or key_text is None:
            continue

        def seq(field: str, value: dict[str, Any] = value) -> int | None:
            got = value.get(field)
            if got is None:
                return None
            return _int_or(got, -1)

        out[key_text] = PgStatus(
            key=key_text,
            last_enqueued=seq("last_enqueued_collective"),
            last_started=seq("last_started_collective"),
            last_completed=seq("last_completed_collective"),
        )
    return out


def entries_of(raw: Any) -> Any:
    """The raw entry list of a decoded dump or snapshot (for re-reading frames)."""
    trace, _ = unwrap_snapshot(raw)
    return trace.get("entries") if isinstance(trace, dict) else None


def normalize_dump(raw: Any, source: str, rank: int | None, lazy_frames: LazyFrames | None = None, *,
                   columnar: bool = False, prebuilt: tuple[EntryTable, str | None] | None = None) -> RankDump:
    """Build a RankDump. `rank` comes from the file name; the contents may correct it. `columnar`: the
    entries as an `EntryTable` with its per-group index (large sets), else a list of `Entry`. `prebuilt`:
    the entries' table and backend, already read by the scanner (`records.scan`); `raw`'s entries are then
    not looked at.

    Raises only DumpError: whatever else a crafted dump provokes (deep nesting, odd types) is
    reported as that dump's problem, never as a crash of the reader of all the others."""
    try:
        return _normalize_dump(raw, source, rank, lazy_frames, columnar, prebuilt)
    except DumpError:
        raise
    except (RecursionError, MemoryError) as exc:
        raise MalformedDump(source, f"too deeply nested or too large to normalize ({type(exc).__name__})",
                            rank=rank) from exc
    except Exception as exc:  # a shape this reader did not foresee: that dump's problem only
        raise MalformedDump(source, f"cannot be normalized: {type(exc).__name__}: {describe(str(exc))}",
                            rank=rank) from exc


def _normalize_dump(raw: Any, source: str, rank: int | None, lazy_frames: LazyFrames | None,
                    columnar: bool, prebuilt: tuple[EntryTable, str | None] | None = None) -> RankDump:
    if rank is not None and valid_rank(rank) is None:
        raise MalformedDump(source, f"{describe(rank)} (from the file name or transport) is not a rank in "
                            f"[0, {MAX_RANK})", field="rank")
    trace, meta = unwrap_snapshot(raw)
    if not isinstance(trace, dict):
        raise MalformedDump(source, f"top level is {type(trace).__name__}, expected a mapping", rank=rank)
    if "entries" not in trace and "version" not in trace and "pg_config" not in trace:
        raise MalformedDump(source, "no 'entries', 'version' or 'pg_config': not a Flight Recorder dump", rank=rank)
    warnings: list[str] = []

    version = trace.get("version")
    parsed = parse_version(version) if version is not None else None
    if version is None:
        warnings.append("no 'version' field; read as the newest known format")
    elif parsed is None:
        warnings.append(f"unparsable version {describe(version)}; read as the newest known format")
    elif parsed > KNOWN_VERSION:
        warnings.append(
            f"format version {version} is newer than {KNOWN_VERSION[0]}.{KNOWN_VERSION[1]}; "
            "reading the fields it shares with that version"
        )
    elif parsed < OLDEST_VERSION:
        warnings.append(f"format version {version} predates 2.0; fields may be missing")

    raw_entries = trace.get("entries") if prebuilt is None else []
    if raw_entries is None:
        raw_entries = []
        warnings.append("no 'entries' field (recorder empty or disabled?)")
    elif isinstance(raw_entries, tuple):
        raw_entries = list(raw_entries)
    elif not isinstance(raw_entries, list):
        raise MalformedDump(source, f"is {type(raw_entries).__name__}, expected a list", rank=rank, field="entries")
    entries: Sequence[Entry]
    table: EntryTable | None
    fast = prebuilt if prebuilt is not None else (
        table_from_entries(raw_entries, lazy_frames, parse_profiling_name) if columnar else None)
    if fast is not None:  # every entry regular: straight into columns, no per-entry Python
        table, backend = fast
    else:
        rows, backend, entry_warnings = normalize_rows(raw_entries, source, lazy_frames)
        warnings.extend(entry_warnings)
        table = EntryTable.from_rows(rows) if columnar else None
        entries = entries_from_rows(rows) if table is None else table
        del rows
    if table is not None:
        table.groups()  # indexed here, where the file is decoded (a loader worker), not in the parent
        entries = table

    content_rank = meta.get("rank", trace.get("rank"))
    if isinstance(content_rank, int) and not isinstance(content_rank, bool):
        if valid_rank(content_rank) is None:
            raise MalformedDump(source, f"{describe(content_rank)} is not a rank in [0, {MAX_RANK})",
                                rank=rank, field="rank")
        if rank is not None and rank != content_rank:
            warnings.append(
                f"file name says rank {rank} but the contents say rank {content_rank}; using {content_rank}"
            )
        rank = content_rank
    if rank is None:
        raise MalformedDump(
            source,
            "cannot tell which rank this is: the file name has no trailing rank number "
            "(torch writes <prefix><rank>) and the contents do not say",
        )

    stacks = meta.get("stacks")
    captured = _opt_int(meta.get("captured_at_ns"))
    host = meta.get("host")
    return RankDump(
        rank=rank,
        source=source,
        version=(version_text(version) or "?") if version is not None else "",
        backend=backend,
        entries=entries,
        pg_config=_pg_config(trace.get("pg_config"), warnings),
        pg_status=_pg_status(trace.get("pg_status")),
        comm_lib_version=version_text(trace.get("comm_lib_version")) or "",
        stacks=stacks if isinstance(stacks, str) and stacks else None,
        captured_at_ns=captured,
        captured_at_source=CAPTURED_SNAPSHOT if captured is not None else None,
        host=text(host, 253),
        warnings=warnings,
    )
