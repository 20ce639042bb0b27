"""Captures taken at a stall: kept in memory (the last few) and on disk (bounded), so the recorders
and stacks outlive the trainer.

Disk rules: a capture is written to a temporary name and renamed into place; old captures are
removed only *after* a new one was written, so a full or read-only disk never costs a capture that
was already kept. Every method here does file I/O: call it from a worker thread.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("frscope.sidecar")

_NAME = re.compile(r"^capture-(\d+)-([a-z]+)\.json\.gz$")


@dataclass(slots=True)
class Capture:
    """One capture: per-rank snapshot pieces (zlib-compressed JSON) and the whole body, gzipped."""

    reason: str
    captured_at_ns: int
    pieces: dict[int, bytes]  # rank -> zlib(JSON of the frscope snapshot of that rank)
    body_gz: bytes  # gzip of the full snapshot body as served by /v1/snapshot
    # (rank, pg) -> last enqueued seq of the groups stalled at capture time: the capture stays the
    # current evidence until one of them enqueues again.
    stalled_groups: dict[tuple[int, str], int] = field(default_factory=dict)
    path: Path | None = None
    # A hang the recorder cannot see (frscope.sidecar.unrecorded): current until that suspicion ends.
    unrecorded: bool = False

    @property
    def name(self) -> str:
        return f"capture-{self.captured_at_ns}-{self.reason}.json.gz"


@dataclass(frozen=True, slots=True)
class DiskCapture:
    path: Path
    captured_at_ns: int
    reason: str
    size: int


class EvidenceStore:
    def __init__(self, directory: Path | None, *, max_files: int, max_bytes: int, memory: int) -> None:
        self.directory = directory
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.memory: deque[Capture] = deque(maxlen=memory)
        self.on_disk: list[DiskCapture] = []
        self.last_error: str | None = None

    # -- disk -------------------------------------------------------------------------------------

    def scan(self) -> list[DiskCapture]:
        """Index the captures already on disk (a restarted sidecar keeps serving them)."""
        if self.directory is None:
            return []
        found: list[DiskCapture] = []
        try:
            with os.scandir(self.directory) as it:
                for item in it:
                    match = _NAME.match(item.name)
                    if match and item.is_file(follow_symlinks=False):
                        found.append(
                            DiskCapture(Path(item.path), int(match.group(1)), match.group(2), item.stat().st_size)
                        )
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("evidence dir %s cannot be read (%s); captures are kept in memory only",
                        self.directory, exc.strerror or exc)
        found.sort(key=lambda c: c.captured_at_ns)
        self.on_disk = found
        return found

    def write(self, capture: Capture) -> bool:
        """Write one capture, then prune the oldest beyond the bounds. False (and a log line) on failure."""
        self.memory.append(capture)
        if self.directory is None:
            return True
        target = self.directory / capture.name
        tmp = self.directory / f".{capture.name}.partial"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as handle:
                handle.write(capture.body_gz)
            os.replace(tmp, target)
        except OSError as exc:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            code = errno.errorcode.get(exc.errno or 0, "?")
            self.last_error = f"{target}: {code}: {exc.strerror or exc}"
            log.error(
                "evidence: cannot write %s (%s: %s); the capture is kept in memory (last %d), %d earlier "
                "captures on disk are untouched",
                target, code, exc.strerror or exc, self.memory.maxlen or 0, len(self.on_disk),
            )
            return False
        capture.path = target
        self.last_error = None
        self.on_disk.append(DiskCapture(target, capture.captured_at_ns, capture.reason, len(capture.body_gz)))
        self._prune(keep=target)
        return True

    def _prune(self, keep: Path) -> None:
        def over() -> bool:
            return len(self.on_disk) > self.max_files or self.total_bytes > self.max_bytes

        while over() and len(self.on_disk) > 1:
            oldest = self.on_disk[0]
            if oldest.path == keep:
                break
            try:
                oldest.path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("evidence: cannot remove old capture %s: %s", oldest.path, exc.strerror or exc)
                break
            self.on_disk.pop(0)

    @property
    def total_bytes(self) -> int:
        return sum(c.size for c in self.on_disk)

    def read_latest_from_disk(self) -> bytes | None:
        """The newest capture on disk, gzipped (for a sidecar restarted after the trainer died)."""
        for item in reversed(self.on_disk):
            try:
                return item.path.read_bytes()
            except OSError:
                continue
        return None

    # -- memory -----------------------------------------------------------------------------------

    def latest(self) -> Capture | None:
        return self.memory[-1] if self.memory else None
