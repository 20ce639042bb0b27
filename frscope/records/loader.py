"""Read per-rank dump files (any format, any version) into a DumpSet, safely and tolerantly.

Format is told by content, not by name: torch's on-timeout dumps are pickles with no extension,
`fr_trace_json` answers are JSON, people gzip both. One bad file becomes a LoadProblem naming the
file and the reason; it never stops the others from loading.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import multiprocessing
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from frscope import wire
from frscope.records import scan
from frscope.records.bundle import is_bundle
from frscope.records.columns import EntryTable, unify_signatures
from frscope.records.envelope import bundle_ranks, envelope_ranks
from frscope.records.errors import DumpError, DumpTooLarge, MalformedDump, TruncatedDump, UnknownFormat
from frscope.records.gcpause import gc_paused
from frscope.records.isolate import call_isolated, capped
from frscope.records.limits import MIN_JSON_BYTES_PER_CONTAINER, describe, file_cpu_budget_s, valid_rank
from frscope.records.membership import build_groups
from frscope.records.model import (
    CAPTURED_MTIME,
    DumpSet,
    LazyFrames,
    LoadProblem,
    RankDump,
)
from frscope.records.normalize import entries_of, normalize_dump, parse_profiling_name
from frscope.records.safe_pickle import safe_loads
from frscope.records.transfer import Shipped, UnknownRanks, ship, unship

DEFAULT_MAX_BYTES = 512 * 1024 * 1024

# Files that sit beside dumps and are not dumps; skipped when a directory is expanded.
_NOT_DUMPS = {".md", ".txt", ".log", ".yaml", ".yml", ".sock", ".py", ".sh", ".html", ".csv"}
_TRAILING_RANK = re.compile(r"(\d+)$")
_DUMP_SUFFIXES = (".gz", ".json", ".pkl", ".pickle", ".pt", ".bin")

ProgressCallback = Callable[[int, int], None]


def rank_from_name(path: str | Path) -> int | None:
    """torch names dumps <prefix><global rank> (e.g. nccl_trace_rank_12, or
    host-a-3_rank_12.json once a person adds host names and extensions)."""
    name = Path(path).name
    lowered = name.lower()
    changed = True
    while changed:
        changed = False
        for suffix in _DUMP_SUFFIXES:
            if lowered.endswith(suffix):
                name, lowered = name[: -len(suffix)], lowered[: -len(suffix)]
                changed = True
    match = _TRAILING_RANK.search(name)
    # More than 18 digits is no rank (and int() of 5,000 digits raises): the contents must say.
    return int(match.group(1)) if match and len(match.group(1)) <= 18 else None


def _not_a_file(path: Path) -> str | None:
    """Why `path` is not a dump to read, or None for a regular file (symlinks followed). Devices and
    FIFOs are never opened: a read from /dev/zero never ends, an open of a FIFO blocks."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if path.is_symlink():
            return f"broken symlink ({exc.strerror or exc})"
        return f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    what = (
        "a FIFO" if stat.S_ISFIFO(mode)
        else "a character device" if stat.S_ISCHR(mode)
        else "a block device" if stat.S_ISBLK(mode)
        else "a socket" if stat.S_ISSOCK(mode)
        else "not a regular file"
    )
    via = " (through a symlink)" if path.is_symlink() else ""
    return f"{what}{via}, not a dump file; not read"


def expand_paths(paths: Iterable[str | Path]) -> tuple[list[Path], list[LoadProblem]]:
    files: list[Path] = []
    problems: list[LoadProblem] = []

    def unreadable(exc: OSError) -> None:
        """A folder this user cannot read (the named one or one inside) is a problem, not silently nothing."""
        problems.append(LoadProblem(str(exc.filename), f"cannot read: {exc.strerror or exc}"))
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for root, dirnames, filenames in os.walk(path, onerror=unreadable):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for filename in sorted(filenames):
                    candidate = Path(root, filename)
                    if filename.startswith(".") or candidate.suffix.lower() in _NOT_DUMPS:
                        continue
                    if filename.endswith(".stacks"):
                        continue
                    why = _not_a_file(candidate)
                    if why is None:
                        files.append(candidate)
                    else:
                        problems.append(LoadProblem(str(candidate), why, rank=_safe_rank(candidate)))
        elif path.exists() or path.is_symlink():
            why = _not_a_file(path)
            if why is None:
                files.append(path)
            else:
                problems.append(LoadProblem(str(path), why, rank=_safe_rank(path)))
        else:
            problems.append(LoadProblem(str(path), "no such file or directory"))
    return files, problems


def _safe_rank(path: Path) -> int | None:
    return valid_rank(rank_from_name(path))


def read_capped(path: Path, max_bytes: int) -> bytes:
    source = str(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise DumpTooLarge(source, f"{size} bytes exceeds the cap of {max_bytes} bytes (--max-bytes)")
        with path.open("rb") as handle:
            # Asked for what stat said (+1 to see growth): read(max_bytes + 1) allocates the whole cap and then
            # shrinks it, a copy and fresh pages per file (0.2 ms of a 0.4 MB dump's 0.3 ms).
            data = handle.read(size + 1)
            if len(data) > size:  # it grew since: read on, up to the cap
                data += handle.read(max_bytes + 1 - len(data))
    except OSError as exc:
        raise DumpError(source, f"cannot read: {exc.strerror or exc}") from exc
    if len(data) > max_bytes:
        raise DumpTooLarge(source, f"grew past the cap of {max_bytes} bytes while being read")
    return data


def decode_bytes(data: bytes, source: str, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Bytes of a pickle / JSON / gzip of either -> the decoded object. Never executes anything."""
    if not data.strip():
        raise TruncatedDump(source, "empty file (still being written?)")
    data = gunzip_capped(data, source, max_bytes)
    if data[:1] == b"\x80":
        return safe_loads(data, source)
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        containers = data.count(b"{") + data.count(b"[")
        if containers * MIN_JSON_BYTES_PER_CONTAINER > len(data):
            raise MalformedDump(
                source,
                f"{containers} JSON objects/arrays in {len(data)} bytes: one per {len(data) // max(1, containers)} "
                f"bytes where a dump has ~80 (decoding would take ~30x the file's size in memory)",
            )
        try:
            return json.loads(data)
        except UnicodeDecodeError as exc:
            raise UnknownFormat(source, f"JSON is not valid UTF-8 at byte {exc.start}") from exc
        except RecursionError as exc:
            raise MalformedDump(source, "JSON nested too deeply: not a Flight Recorder dump") from exc
        except json.JSONDecodeError as exc:
            if exc.pos >= len(data.rstrip()) - 1 or "Unterminated" in exc.msg or "Expecting" in exc.msg:
                raise TruncatedDump(
                    source, f"JSON ends early at byte {exc.pos} ({exc.msg}): truncated or still being written"
                ) from exc
            raise UnknownFormat(source, f"invalid JSON at byte {exc.pos}: {exc.msg}") from exc
        except ValueError as exc:  # e.g. a number past Python's 4,300-digit limit
            raise MalformedDump(source, f"JSON value refused: {describe(str(exc), 100)}") from exc
    # The file's bytes are never printed (they may be anything, terminal escapes included).
    raise UnknownFormat(source, "neither a pickle (starts with 0x80), JSON (starts with '{' or '[') nor gzip")


def gunzip_capped(data: bytes, source: str, max_bytes: int) -> bytes:
    """A gzipped dump's bytes decompressed (capped); any other bytes as they are."""
    if data[:2] == b"\x1f\x8b":
        try:
            decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
            data = decompressor.decompress(data, max_bytes + 1)
        except zlib.error as exc:
            raise TruncatedDump(source, f"corrupt gzip: {exc}") from exc
        if len(data) > max_bytes:
            raise DumpTooLarge(source, f"decompresses past the cap of {max_bytes} bytes")
        if not decompressor.eof:
            raise TruncatedDump(source, "gzip stream ends early: truncated or still being written")
    return data


class _EntriesReader:
    """Reads a dump file's raw entries again (for its frames); picklable, unlike a closure."""

    __slots__ = ("max_bytes", "path")

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes

    def __reduce__(self) -> tuple[Any, ...]:
        return (_EntriesReader, (self.path, self.max_bytes))

    def __call__(self) -> Any:
        return entries_of(decode_bytes(read_capped(self.path, self.max_bytes), str(self.path), self.max_bytes))


def load_file(path: Path, max_bytes: int = DEFAULT_MAX_BYTES, *, keep_frames: bool = False) -> RankDump:
    """One file -> RankDump. Frames stay in the file (read again on demand) unless `keep_frames`."""
    source = str(path)
    rank = rank_from_name(path)
    lazy = None if keep_frames else LazyFrames(_EntriesReader(path, max_bytes))
    try:
        raw = decode_bytes(read_capped(path, max_bytes), source, max_bytes)
        return _one_rank(path, raw, rank, lazy)
    except DumpError as exc:
        if exc.rank is None:
            exc.rank = rank
        raise


def _one_rank(path: Path, raw: Any, rank: int | None, lazy: LazyFrames | None, columnar: bool = False,
              prebuilt: tuple[EntryTable, str | None] | None = None) -> RankDump:
    dump = normalize_dump(raw, str(path), rank, lazy, columnar=columnar, prebuilt=prebuilt)
    if dump.captured_at_ns is None:
        try:
            dump.captured_at_ns = path.stat().st_mtime_ns
            dump.captured_at_source = CAPTURED_MTIME
        except OSError:
            pass
    return dump


def _scanned(path: Path, data: bytes, rank: int | None, max_bytes: int) -> RankDump | None:
    """The scanner's reading of a plain dump (`records.scan`): a pickle, or JSON (a snapshot piece too), or
    None: read it the reference way."""
    lazy = LazyFrames(_EntriesReader(path, max_bytes))
    pickled = data[:1] == b"\x80"
    got = (scan.scan_dump if pickled else scan.scan_json_dump)(data, lazy, parse_profiling_name)
    if got is None:
        return None
    meta, table, backend = got
    if wire.is_snapshot_envelope(meta) or is_bundle(meta) or (pickled and wire.is_snapshot_piece(meta)):
        return None
    return _one_rank(path, meta, rank, lazy, True, (table, backend))


def load_path(path: Path, max_bytes: int = DEFAULT_MAX_BYTES, columnar: bool = False) -> list[RankDump | LoadProblem]:
    """One file -> its ranks: a per-rank dump or snapshot piece is one rank; a sidecar's snapshot
    envelope (`/v1/snapshot`, a push, a sidecar evidence capture: frscope.wire) holds a pod's ranks,
    each read on its own (one bad piece never sinks the others) and its errors become problems.
    `columnar`: entries as `EntryTable`s (see `load_dumps`)."""
    source = str(path)
    rank = rank_from_name(path)
    try:
        data = read_capped(path, max_bytes)
        if columnar and scan.available():
            data = gunzip_capped(data, source, max_bytes)
            scanned = _scanned(path, data, rank, max_bytes)
            if scanned is not None:
                return [scanned]
        raw = decode_bytes(data, source, max_bytes)
        if is_bundle(raw):
            return bundle_ranks(raw, source, columnar=columnar)
        if not wire.is_snapshot_envelope(raw):
            return [_one_rank(path, raw, rank, LazyFrames(_EntriesReader(path, max_bytes)), columnar)]
    except DumpError as exc:
        return [LoadProblem(exc.source, exc.what, rank=valid_rank(exc.rank if exc.rank is not None else rank))]
    return envelope_ranks(raw, source, columnar=columnar)


def assemble(dumps: Iterable[RankDump], problems: list[LoadProblem], world_size: int | None = None) -> DumpSet:
    """Put loaded ranks together: resolve duplicate ranks, reconstruct group membership."""
    by_rank: dict[int, RankDump] = {}
    for dump in dumps:
        for warning in dump.warnings:
            problems.append(LoadProblem(dump.source, warning, rank=dump.rank, kind="warning"))
        kept = by_rank.get(dump.rank)
        if kept is None:
            by_rank[dump.rank] = dump
            continue
        # Two files claim one rank (a re-dump, a copy): keep the one that saw more.
        newer, older = (dump, kept) if len(dump.entries) > len(kept.entries) else (kept, dump)
        by_rank[dump.rank] = newer
        problems.append(
            LoadProblem(
                older.source,
                f"rank {dump.rank} also in {newer.source}, which has more entries; this file is ignored",
                rank=dump.rank,
                kind="warning",
            )
        )
    groups, world, warnings = build_groups(by_rank, world_size)
    problems.extend(LoadProblem("(all dumps)", w, kind="warning") for w in warnings)
    # Columnar ranks: one signature code space for the whole set, so that ranks compare codes.
    unify_signatures(d.entries for d in by_rank.values() if isinstance(d.entries, EntryTable))
    return DumpSet(dumps=by_rank, groups=groups, world_size=world, problems=problems)


def _load_one(path: Path, max_bytes: int, columnar: bool = False) -> list[RankDump | LoadProblem]:
    """One file -> its ranks (`load_path`); whatever goes wrong is this file's problem, never the others'."""
    try:
        return load_path(path, max_bytes, columnar)
    except DumpError as exc:
        return [LoadProblem(exc.source, exc.what, rank=valid_rank(exc.rank))]
    except (RecursionError, MemoryError) as exc:
        return [LoadProblem(str(path), f"too deeply nested or too large to read ({type(exc).__name__})",
                            rank=_safe_rank(path))]
    except Exception as exc:  # a bug or a shape nobody foresaw
        return [LoadProblem(str(path), f"could not be read: {type(exc).__name__}: {describe(str(exc))}",
                            rank=_safe_rank(path))]


def _load_in_child(path: Path, max_bytes: int, columnar: bool = False) -> list[RankDump | LoadProblem]:
    """One file in a process of its own (`isolate`), CPU-capped: only the file that kills it is lost."""
    try:
        return call_isolated(str(path), _load_one, path, max_bytes, columnar, cpu_s=file_cpu_budget_s(path))
    except DumpError as exc:
        return [LoadProblem(exc.source, exc.message, rank=_safe_rank(path))]


def _load_chunk(paths: list[Path], max_bytes: int, columnar: bool = False, session: object = None
                ) -> list[list[Shipped]]:
    """In a worker process: decode and normalize a few files; results travel back pickled (entries
    as columns or constructor tuples, frames as a file reference), much smaller than the raw dumps."""
    gc.disable()
    faulthandler.disable()  # a crash on crafted input is reported by the parent, file by file
    # Past a file's CPU cap the kernel ends this worker; the parent then reads the rest one process each.
    return [[ship(result, session) for result in capped(path, _load_one, path, max_bytes, columnar)]
            for path in paths]


# Below this many files a pool costs more than it saves.
PARALLEL_MIN_FILES = 32


def _workers(jobs: int | None, files: int) -> int:
    """Decoding processes; 0 = decode in this process (`jobs=1`, or no fork on this platform).

    By default files are never decoded in the caller's process, even a few: a crafted pickle can
    crash the C unpickler (a tuple nested 10**6 deep overflows the C stack when hashed), and it must
    take down a worker, never the run."""
    if "fork" not in multiprocessing.get_all_start_methods() or files == 0:
        return 0
    if jobs is not None:
        return 0 if jobs <= 1 else jobs
    if files < PARALLEL_MIN_FILES:
        return 1
    return min(os.cpu_count() or 1, 8)


def load_dumps(
    paths: Sequence[str | Path],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    world_size: int | None = None,
    progress: ProgressCallback | None = None,
    jobs: int | None = None,
    columnar: bool = True,
) -> DumpSet:
    """Load every dump under `paths` (files or directories). Never raises for a bad file.

    Large sets are decoded by `jobs` worker processes (default: one per core, from 32 files on):
    unpickling and normalizing are CPU-bound and independent per file. Smaller sets by one worker
    process; `jobs=1` decodes in this process (fastest for a few files, but not isolated).

    `columnar` (the default): every rank's entries are an `EntryTable` indexed per group where the file
    is decoded (~47 bytes an entry instead of ~420, and what the analysis reads at scale); False: lists
    of `Entry`, built row by row (the reference the columnar path is tested against)."""
    files, problems = expand_paths(paths)
    dumps: list[RankDump] = []
    workers = _workers(jobs, len(files))
    with gc_paused():
        if workers == 0:
            results: Iterable[list[RankDump | LoadProblem]] = (_load_one(path, max_bytes, columnar) for path in files)
            pool = None
        else:
            chunk = max(1, min(16, len(files) // (workers * 4)))
            chunks = [files[i : i + chunk] for i in range(0, len(files), chunk)]
            pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
            rank_lists: dict[bytes, tuple[int, ...]] = {}
            shared_frames: dict[Any, Any] = {}
            session = os.urandom(8)
            results = ([unship(item, rank_lists, shared_frames) for item in items]
                       for batch in pool.map(_load_chunk, chunks, [max_bytes] * len(chunks), [columnar] * len(chunks),
                                             [session] * len(chunks))
                       for items in batch)
        done = 0

        def take(items: list[RankDump | LoadProblem]) -> None:
            nonlocal done
            done += 1
            for result in items:
                if isinstance(result, LoadProblem):
                    problems.append(result)
                else:
                    dumps.append(result)
            if progress is not None:
                progress(done, len(files))

        try:
            try:
                for items in results:
                    take(items)
            except (BrokenProcessPool, UnknownRanks):
                # A worker died or hit a CPU cap (results arrive in file order: the rest are not done).
                # Each remaining file gets a process of its own, so only the one that kills it is lost.
                for path in files[done:]:
                    take(_load_in_child(path, max_bytes, columnar))
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        return assemble(dumps, problems, world_size)
