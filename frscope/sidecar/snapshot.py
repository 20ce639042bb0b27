"""Snapshot assembly: which evidence of each rank `/v1/snapshot` serves, and the stall capture.

Per rank the best evidence wins: a dump file newer than anything else, else the current stall
capture, else the last good poll. Bodies are frscope.wire's snapshot envelope, assembled from
per-rank pieces kept zlib-compressed, within --max-snapshot-bytes; rendering runs in worker threads.
Each answer carries an ETag (`validator`: what identifies each rank's evidence, not the bytes), and a
request whose If-None-Match names it is answered without rendering anything (the live windows ask every
second for what changes at full polls only).
"""

from __future__ import annotations

import asyncio
import copy
import gzip
import json
import logging
import secrets
import time
import zlib
from dataclasses import dataclass
from typing import Any

from frscope import wire
from frscope.sidecar.client import source_of
from frscope.sidecar.config import SidecarConfig
from frscope.sidecar.dumpdir import DumpDirWatcher
from frscope.sidecar.evidence import Capture, EvidenceStore
from frscope.sidecar.metrics import SidecarMetrics
from frscope.sidecar.poller import Poller
from frscope.sidecar.progress import StallTracker
from frscope.sidecar.ranks import RankState
from frscope.wire import SnapshotError

log = logging.getLogger("frscope.sidecar")


def live_piece(state: RankState) -> bytes | None:
    """The rank's last good poll as a snapshot piece (zlib), with its stacks if they are of that poll."""
    if state.raw_z is None or state.raw_ns is None:
        return None
    stacks = state.stacks if state.stacks_for_ns == state.raw_ns else None
    piece = wire.snapshot_piece_bytes(state.rank, state.raw_ns, source_of(state.endpoint), stacks,
                                      zlib.decompress(state.raw_z), state.timings_json)
    return zlib.compress(piece, 1)


def newest_entries(piece_z: bytes, last: int) -> bytes:
    """`?entries=N`: keep each rank's newest N recorder entries (a hang is decided by the newest ones;
    the operator keeps no more than that, so sending the whole ring is wasted work at 1,024 ranks).
    The cut itself is frscope.wire's (`window_piece`), the same the operator applies."""
    piece = zlib.decompress(piece_z)
    try:
        obj = json.loads(piece)
    except ValueError:
        return piece_z
    if not isinstance(obj, dict) or not wire.window_piece(obj, last):
        return piece_z
    return zlib.compress(json.dumps(obj, separators=(",", ":")).encode(), 1)


def assemble(head: dict[str, Any], pieces: list[tuple[int, bytes]], errors: list[SnapshotError],
             max_bytes: int) -> tuple[bytes, bytes]:
    """The snapshot body (docs/sidecar-api.md) and its gzip, within `max_bytes` (worker thread)."""
    parts: list[bytes] = []
    used = 512 + len(json.dumps(errors))
    for rank, piece_z in pieces:
        piece = zlib.decompress(piece_z)
        if used + len(piece) + 1 > max_bytes:
            error: SnapshotError = {
                "rank": rank, "message": f"left out: the snapshot would exceed --max-snapshot-bytes "
                                         f"({max_bytes} bytes); rank's piece is {len(piece)} bytes"}
            errors.append(error)
            used += len(json.dumps(error)) + 2
            continue
        used += len(piece) + 1
        parts.append(piece)
    body = wire.snapshot_envelope_bytes(head, parts, errors)
    return body, gzip.compress(body, 6)


@dataclass(frozen=True, slots=True)
class SnapshotAnswer:
    """A `/v1/snapshot` answer: the body and its gzip (both b"" when not `modified`: the request's
    If-None-Match named `etag`), the reason it carries, its ETag (in the coding asked)."""

    body: bytes
    body_gz: bytes
    reason: str
    etag: str
    modified: bool = True


def validator(instance: str, reason: str, last_entries: int | None, chosen: list[tuple[int, bytes | RankState]],
              errors: list[SnapshotError], *, gzip: bool) -> str:
    """The ETag of the answer rendered from `chosen` (worker thread): a piece kept as bytes (a dump file,
    a capture) by its checksum; a rank's last good poll by when it was fetched (its recorder and own times
    are replaced together, at each full fetch) and its stacks' checksum (taken again for the same fetch
    at a capture); `instance`: this sidecar process (a restarted one tags anew)."""
    parts: list[object] = [instance, reason, last_entries, len(chosen), json.dumps(errors)]
    for rank, item in chosen:
        if isinstance(item, bytes):
            parts.append((rank, "piece", len(item), zlib.crc32(item)))
        else:
            stacks = item.stacks if item.stacks_for_ns == item.raw_ns and item.stacks is not None else None
            parts.append((rank, "poll", item.raw_ns, str(item.endpoint),
                          None if stacks is None else zlib.crc32(stacks.encode("utf-8", "replace"))))
    return wire.snapshot_etag(parts, gzip=gzip)


class Snapshots:
    """Renders the pod's snapshot from what the poller, the dump dir and the evidence store hold."""

    def __init__(self, config: SidecarConfig, poller: Poller, tracker: StallTracker, evidence: EvidenceStore,
                 dumps: DumpDirWatcher | None, metrics: SidecarMetrics) -> None:
        self.config = config
        self.poller = poller
        self.tracker = tracker
        self.evidence = evidence
        self.dumps = dumps
        self.metrics = metrics
        self.stale_captures: set[int] = set()  # captured_at_ns of captures no longer current
        self.instance = secrets.token_hex(8)  # in every ETag: another process of the sidecar tags anew

    def head(self, reason: str, now_ns: int) -> dict[str, Any]:
        return wire.snapshot_head(pod=self.config.pod, namespace=self.config.namespace, node=self.config.node,
                                  captured_at_ns=now_ns, reason=reason)

    def current_capture(self) -> Capture | None:
        """The newest stall capture while it is still the truth: none of the groups stalled at capture
        time has enqueued a collective since (gloo retires a failed collective, which looks like
        progress; a new enqueue does not happen after a failure)."""
        capture = self.evidence.latest()
        if capture is None or capture.captured_at_ns in self.stale_captures:
            return None
        for (rank, pg), seq in capture.stalled_groups.items():
            state = self.tracker.groups.get((rank, pg))
            if state is not None and (state.sample.last_enqueued_seq or 0) != seq:
                self.stale_captures.add(capture.captured_at_ns)
                return None
        return capture

    def unrecorded_capture_held(self) -> bool:
        current = self.current_capture()
        return current is not None and current.unrecorded

    def retire_unrecorded(self) -> None:
        """A hang the recorder cannot see is over: its capture is no longer the truth."""
        current = self.current_capture()
        if current is not None and current.unrecorded:
            self.stale_captures.add(current.captured_at_ns)

    async def capture(self, reason: str, with_stacks: int, *, unrecorded: bool = False) -> Capture:
        """This round's recorders (and the stacks just taken of `with_stacks` ranks) as one capture,
        kept in memory and on disk. `unrecorded`: a hang the recorder cannot see; every group of the
        pod's ranks is watched (one that enqueues again ends it), and its end retires it."""
        ranks = self.poller.ranks
        now_ns = self.poller.last_round_ns or time.time_ns()
        states = [s for s in ranks.values() if s.raw_z is not None]

        def build() -> dict[int, bytes]:
            out: dict[int, bytes] = {}
            for state in states:
                piece = live_piece(state)
                if piece is not None:
                    out[state.rank] = piece
            return out

        pieces = await asyncio.to_thread(build)
        errors: list[SnapshotError] = [
            {"rank": s.rank, "message": s.error} for s in ranks.values() if not s.up and s.error
        ]
        head = self.head(reason, now_ns)
        _body, body_gz = await asyncio.to_thread(
            assemble, head, sorted(pieces.items()), errors, self.config.max_snapshot_bytes
        )
        stalled = {  # (suspected groups: a confirmed stall is one too)
            (g.rank, g.sample.pg): g.sample.last_enqueued_seq or 0
            for g in (self.tracker.groups.values() if unrecorded else self.tracker.suspected)
        }
        capture = Capture(reason, now_ns, pieces, body_gz, stalled, unrecorded=unrecorded)
        written = await asyncio.to_thread(self.evidence.write, capture)
        if not written:
            self.metrics.evidence_write_errors.inc()
        self.metrics.show_evidence(self.evidence)
        self.metrics.dumps_collected.labels(kind="stall_capture").inc(len(pieces))
        log.warning(
            "captured recorders of %d rank(s) and stacks of %d at the %s (%d bytes compressed)%s",
            len(pieces), with_stacks, reason, len(body_gz),
            f"; kept in {capture.path}" if capture.path else "; kept in memory",
        )
        return capture

    def _choose(self, prefer_live: bool) -> tuple[list[tuple[int, bytes | RankState]], list[SnapshotError], bool]:
        """Per rank, the best evidence: a dump file newer than anything else; else the current stall
        capture; else the last good poll. Returns (pieces or states to render, errors, from_capture)."""
        ranks = self.poller.ranks
        capture = None if prefer_live else self.current_capture()
        by_rank = self.dumps.by_rank() if self.dumps is not None else {}
        chosen: list[tuple[int, bytes | RankState]] = []
        errors: list[SnapshotError] = []
        used_capture = False
        for rank in sorted(set(ranks) | set(by_rank) | (set(capture.pieces) if capture else set())):
            state = ranks.get(rank)
            dump = by_rank.get(rank)
            in_capture = capture is not None and rank in capture.pieces
            live_ns = state.raw_ns if state is not None and state.raw_z is not None else None
            best_other_ns = capture.captured_at_ns if in_capture and capture else live_ns
            if dump is not None and dump.piece is not None and (best_other_ns is None or dump.mtime_ns > best_other_ns):
                chosen.append((rank, dump.piece))
            elif in_capture and capture is not None:
                chosen.append((rank, capture.pieces[rank]))
                used_capture = True
            elif state is not None and state.raw_z is not None:
                chosen.append((rank, state))
            if state is not None and not state.up and state.error:
                errors.append({"rank": rank, "message": state.error})
        if self.dumps is not None:
            for item in self.dumps.files.values():
                if item.state == "rejected":
                    errors.append({"rank": item.rank, "message": f"{item.path}: {item.error}"})
        return chosen, errors, used_capture

    async def render(
        self, reason: str, *, prefer_live: bool = False, last_entries: int | None = None,
        gzip_asked: bool = True, if_none_match: str | None = None,
    ) -> SnapshotAnswer:
        """The answer (frscope.wire's envelope, gzipped too): `poll` becomes the capture's reason (`stall`,
        or `suspect` before the stall is confirmed) when a capture is served. Not rendered when
        `if_none_match` names its ETag (`gzip_asked`: the coding the ETag is for)."""
        chosen, errors, used_capture = self._choose(prefer_live)
        # Each rank's state as it is now, on the loop: a poll round that replaces its recorder while the
        # worker thread renders changes neither the ETag nor the piece under it (they name the same fetch).
        chosen = [(rank, item if isinstance(item, bytes) else copy.copy(item)) for rank, item in chosen]
        if used_capture and reason == "poll":
            current = self.current_capture()
            reason = current.reason if current is not None else "stall"
        head = self.head(reason, self.poller.last_round_ns or time.time_ns())
        if not chosen and not self.poller.ranks:
            # A sidecar restarted after the trainer died: serve the newest capture it kept on disk.
            on_disk = await asyncio.to_thread(self.evidence.read_latest_from_disk)
            if on_disk is not None:
                etag = wire.snapshot_etag([self.instance, "kept", len(on_disk), zlib.crc32(on_disk)], gzip=gzip_asked)
                if wire.etag_matches(if_none_match, etag):
                    return SnapshotAnswer(b"", b"", "stall", etag, modified=False)
                return SnapshotAnswer(await asyncio.to_thread(gzip.decompress, on_disk), on_disk, "stall", etag)

        def render() -> tuple[str, bytes, bytes]:
            etag = validator(self.instance, reason, last_entries, chosen, errors, gzip=gzip_asked)
            if wire.etag_matches(if_none_match, etag):
                return etag, b"", b""
            pieces: list[tuple[int, bytes]] = []
            for rank, item in chosen:
                piece = item if isinstance(item, bytes) else live_piece(item)
                if piece is not None:
                    if last_entries is not None:
                        piece = newest_entries(piece, last_entries)
                    pieces.append((rank, piece))
            return (etag, *assemble(head, pieces, list(errors), self.config.max_snapshot_bytes))

        etag, body, body_gz = await asyncio.to_thread(render)
        return SnapshotAnswer(body, body_gz, reason, etag, modified=bool(body))

    async def render_gz(self, reason: str) -> bytes:
        return (await self.render(reason)).body_gz
