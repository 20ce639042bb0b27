"""Watch the directory torch writes on-timeout dumps into (`TORCH_FR_DUMP_TEMP_FILE=<dir>/<prefix>`).

torch writes `<prefix><rank>` in place (no temporary name), so a reader can see half a file. A file
is parsed only once its size and mtime have not changed for `settle_s`; a parse that finds it cut
short leaves it pending until it changes again (or, unchanged for long, rejects it). Decoding is
frscope.records' safe loader: pickles go through the allow-list unpickler, never `pickle.load`.

`scan()` does file I/O and parsing: call it from a worker thread.
"""

from __future__ import annotations

import json
import logging
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frscope.records import DumpError, DumpTooLarge, MalformedDump, TruncatedDump, decode_bytes, normalize_dump
from frscope.records.isolate import call_isolated, can_isolate
from frscope.records.limits import describe, file_cpu_budget_s
from frscope.records.loader import rank_from_name, read_capped
from frscope.wire import snapshot_piece_bytes, unwrap_snapshot

log = logging.getLogger("frscope.sidecar")

_SKIP_SUFFIXES = (".pipe", ".partial", ".tmp", ".sock", ".lock", ".swp")
MAX_TRACKED_FILES = 4096


def jsonable(value: Any) -> Any:
    """json.dumps fallback for what a decoded pickle may hold besides JSON types."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return repr(value)


def _json_size_at_most(trace: Any, limit: int) -> bool:
    """Whether `trace` written out (shared references repeated, as JSON does) stays within about
    `limit` characters: a pickle of a list holding the same list twice, 100 levels down, is a few
    hundred bytes whose JSON is 2**100. One iterative walk that stops at the limit."""
    total = 0
    stack = [trace]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            total += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            total += 2 + 2 * len(item)
            stack.extend(item)
        elif isinstance(item, (str, bytes)):
            total += 2 + len(item)
        else:
            total += 8
        if total > limit:
            return False
    return True


def _bounded_json(trace: Any, source: str, limit: int) -> bytes:
    """The decoded trace as JSON, refused when it would exceed about `limit` bytes."""
    if not _json_size_at_most(trace, limit):
        raise DumpTooLarge(source, f"its JSON form would exceed {limit} bytes (shared references repeated)")
    try:
        return json.dumps(trace, default=jsonable).encode()
    except (TypeError, ValueError, RecursionError) as exc:  # cycles, depth
        raise MalformedDump(
            source, f"cannot be re-encoded as JSON ({type(exc).__name__}: {describe(str(exc))})"
        ) from exc


@dataclass(frozen=True, slots=True)
class _Parsed:
    rank: int
    entries: int
    backend: str | None
    trace_json: bytes
    stacks: str | None


def _decode_file(path: Path, max_bytes: int) -> _Parsed:
    """Read, decode, normalize and re-encode one dump file. Raises only DumpError (run in a child
    process where possible: see frscope.records.isolate)."""
    source = str(path)
    raw = decode_bytes(read_capped(path, max_bytes), source, max_bytes)
    dump = normalize_dump(raw, source, rank_from_name(path))
    trace, _meta = unwrap_snapshot(raw)
    stacks = raw.get("stacks") if isinstance(raw, dict) and isinstance(raw.get("stacks"), str) else None
    # JSON is ~7x a pickle's size; far past that it is not a recorder but shared references expanding.
    trace_json = _bounded_json(trace, source, 16 * path.stat().st_size + (1 << 20))
    return _Parsed(dump.rank, len(dump.entries), dump.backend, trace_json, stacks)


@dataclass(slots=True)
class DumpFile:
    path: Path
    size: int
    mtime_ns: int
    changed_at: float  # monotonic time the size/mtime last changed
    state: str = "pending"  # pending | parsed | rejected
    rank: int | None = None
    piece: bytes | None = None  # zlib of the snapshot piece
    error: str | None = None
    entries: int = 0


@dataclass(frozen=True, slots=True)
class ScanResult:
    parsed: list[DumpFile]
    rejected: list[tuple[DumpFile, str]]  # (file, DumpError kind)


class DumpDirWatcher:
    def __init__(self, directory: Path, *, settle_s: float, max_bytes: int,
                 give_up_after_s: float | None = None) -> None:
        self.directory = directory
        self.settle_s = settle_s
        self.max_bytes = max_bytes
        # A file still cut short after this long unchanged is rejected (its writer died mid-write).
        self.give_up_after_s = give_up_after_s if give_up_after_s is not None else max(30.0, 10 * settle_s)
        self.files: dict[str, DumpFile] = {}
        # Decode each file in a child process (a crafted pickle can crash the C unpickler).
        self.isolate = can_isolate()
        self._missing_logged = False
        self.exists = False

    def by_rank(self) -> dict[int, DumpFile]:
        """The newest parsed dump of each rank."""
        out: dict[int, DumpFile] = {}
        for item in self.files.values():
            if item.state == "parsed" and item.rank is not None:
                kept = out.get(item.rank)
                if kept is None or item.mtime_ns > kept.mtime_ns:
                    out[item.rank] = item
        return out

    def prepare(self) -> None:
        """Create the dump dir when its parent exists (torch does not create it; the shared volume is
        there before the trainer starts). A missing parent is left to `scan()` to report."""
        try:
            self.directory.mkdir()
            # Made by the sidecar's user, written by the trainer's (another uid, often not root): the
            # same rights as the shared volume itself (an emptyDir is world-writable).
            self.directory.chmod(0o1777)
        except OSError:
            pass

    def scan(self, now: float | None = None) -> ScanResult:
        """One pass over the directory. Runs in a worker thread while the event loop reads `files`:
        new entries go into a copy that replaces `files` at the end (one reference swap)."""
        files = dict(self.files)
        try:
            return self._scan(files, time.monotonic() if now is None else now)
        finally:
            self.files = files

    def _scan(self, files: dict[str, DumpFile], now: float) -> ScanResult:
        parsed: list[DumpFile] = []
        rejected: list[tuple[DumpFile, str]] = []
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            if not self._missing_logged:
                log.warning("dump dir %s does not exist (yet); watching for it", self.directory)
                self._missing_logged = True
            self.exists = False
            return ScanResult(parsed, rejected)
        except OSError as exc:
            if not self._missing_logged:
                log.warning("dump dir %s cannot be read: %s", self.directory, exc.strerror or exc)
                self._missing_logged = True
            self.exists = False
            return ScanResult(parsed, rejected)
        if self._missing_logged:
            log.info("dump dir %s is there now", self.directory)
            self._missing_logged = False
        self.exists = True
        for item in entries:
            name = item.name
            if name.startswith(".") or name.endswith(_SKIP_SUFFIXES) or name == "dump-request":
                continue
            try:
                if not item.is_file(follow_symlinks=False):
                    continue
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue
            known = files.get(item.path)
            if known is None:
                if len(files) >= MAX_TRACKED_FILES:
                    continue
                files[item.path] = DumpFile(Path(item.path), st.st_size, st.st_mtime_ns, now)
                continue
            if (known.size, known.mtime_ns) != (st.st_size, st.st_mtime_ns):
                known.size, known.mtime_ns, known.changed_at = st.st_size, st.st_mtime_ns, now
                if known.state != "pending":
                    log.info("dump file %s changed; reading it again once it stops growing", known.path)
                known.state = "pending"
                continue
            if known.state != "pending":
                continue
            quiet_for = now - known.changed_at
            age = (time.time_ns() - known.mtime_ns) / 1e9
            if quiet_for < self.settle_s or age < self.settle_s:
                continue
            kind = self._parse(known, quiet_for)
            if known.state == "parsed":
                parsed.append(known)
            elif known.state == "rejected" and kind is not None:
                rejected.append((known, kind))
        return ScanResult(parsed, rejected)

    def _parse(self, item: DumpFile, quiet_for: float) -> str | None:
        source = str(item.path)
        try:
            if self.isolate:
                parsed = call_isolated(source, _decode_file, item.path, self.max_bytes,
                                       cpu_s=file_cpu_budget_s(item.path))
            else:
                parsed = _decode_file(item.path, self.max_bytes)
        except TruncatedDump as exc:
            if quiet_for < self.give_up_after_s:
                log.debug("dump file %s looks cut short (%s); waiting for it to change", source, exc.message)
                return None
            item.state, item.error = "rejected", exc.message
            log.error("dump file %s: %s; unchanged for %.0f s, giving up on it", source, exc.message, quiet_for)
            return exc.kind
        except DumpError as exc:
            item.state, item.error = "rejected", exc.message
            log.error("dump file %s cannot be used: %s", source, exc.message)
            return exc.kind
        except Exception as exc:  # never let one file stop the scan: later files would stay pending forever
            item.state, item.error = "rejected", f"cannot be read: {type(exc).__name__}: {describe(str(exc))}"
            log.error("dump file %s: %s", source, item.error)
            return "malformed"
        piece = snapshot_piece_bytes(parsed.rank, item.mtime_ns, f"file:{source}", parsed.stacks, parsed.trace_json)
        item.piece = zlib.compress(piece, 6)
        item.rank = parsed.rank
        item.entries = parsed.entries
        item.state = "parsed"
        item.error = None
        log.warning(
            "dump file %s: rank %d, %d entries (%s); kept for /v1/snapshot",
            source, parsed.rank, parsed.entries, parsed.backend or "unknown backend",
        )
        return None
