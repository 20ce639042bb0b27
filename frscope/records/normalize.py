"""Raw decoded dump (pickle or JSON, any format version) -> RankDump.

Tolerance rules, all learnt from real dumps: JSON writes pg_status values as strings; older versions
lack fields, newer ones add some (the entries' rules are `rowwise`'s). Missing fields get a neutral
value and one warning per field per dump, never an exception; a dump is refused only when it has no
shape of a recorder at all. The entries go into columns the fast way (`fastcols`, or the C scanner's
table, `prebuilt`) where they are regular, else row by row (`rowwise.normalize_rows`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Any

from frscope import wire
from frscope.records.columns import EntryTable
from frscope.records.errors import DumpError, MalformedDump
from frscope.records.fastcols import table_from_entries
from frscope.records.fields import parse_profiling_name
from frscope.records.limits import MAX_RANK, describe, finite_float, text, valid_rank
from frscope.records.model import CAPTURED_SNAPSHOT, Entry, LazyFrames, PgConfig, PgStatus, RankDump, entries_from_rows
from frscope.records.rowwise import int_or, name_text, normalize_entries, normalize_rows, opt_int
from frscope.records.timings import apply_timings
from frscope.wire import unwrap_snapshot

# Versions whose fields this reader knows. Newer ones are read with a warning.
KNOWN_VERSION = (2, 10)
OLDEST_VERSION = (2, 0)

_RANK_TEXT = re.compile(r"-?\d{1,12}")


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
        key_text = name_text(key)
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
            name=name_text(value.get("name")) or key_text,
            desc=name_text(value.get("desc")) or "",
            ranks=ranks,
        )
    return out


def _pg_status(raw: Any) -> dict[str, PgStatus]:
    out: dict[str, PgStatus] = {}
    if not isinstance(raw, dict):
        return out
    for key, value in raw.items():
        key_text = name_text(key)
        if not isinstance(value, dict) or key_text is None:
            continue

        def seq(field: str, value: dict[str, Any] = value) -> int | None:
            got = value.get(field)
            if got is None:
                return None
            return int_or(got, -1)

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

    timings = meta.get(wire.TIMINGS_PIECE_KEY)
    if timings is not None and prebuilt is None:  # the rank's own times, beside the recorder
        problem = apply_timings(trace, timings)
        if problem:
            warnings.append(problem)

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
        table.compact()
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
    captured = opt_int(meta.get("captured_at_ns"))
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


__all__ = ["normalize_dump", "normalize_entries", "normalize_rows", "parse_profiling_name", "entries_of"]
