"""One pod's evidence: its sidecar's snapshot body, decoded and normalized right away.

A 1,024-rank job's snapshots are ~1 GiB of JSON (2,000 entries per rank): the operator never holds
them as raw dicts. Each body is decoded and normalized (`frscope.records.normalize_dump`) as soon as
it arrives, in a worker thread, and only the last `max_entries` entries of each rank are kept (a hang
is decided by the newest collectives of every group; the ring buffer is already a window).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from frscope.operator.sidecars import DEFAULT_MAX_SNAPSHOT_BYTES, SidecarError, gunzip_capped, parse_snapshot
from frscope.records import DumpError, LoadProblem, RankDump, normalize_dump
from frscope.wire import SidecarSnapshot

DEFAULT_MAX_ENTRIES = 200


@dataclass(slots=True)
class PodEvidence:
    namespace: str
    pod: str
    reason: str
    captured_at_ns: int | None
    dumps: list[RankDump] = field(default_factory=list)
    problems: list[LoadProblem] = field(default_factory=list)
    entries_dropped: int = 0
    size_bytes: int = 0

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(d.rank for d in self.dumps)


def from_snapshot(snapshot: SidecarSnapshot, *, origin: str, max_entries: int = DEFAULT_MAX_ENTRIES) -> PodEvidence:
    where = f"pod {snapshot.namespace}/{snapshot.pod} ({origin})"
    out = PodEvidence(snapshot.namespace, snapshot.pod, snapshot.reason, snapshot.captured_at_ns,
                      size_bytes=snapshot.size_bytes)
    for rank, message in snapshot.errors:
        out.problems.append(LoadProblem(where, message, rank=rank))
    for raw in snapshot.ranks:
        hint = raw.get("rank")
        source = f"{where} rank {hint}"
        try:
            dump = normalize_dump(raw, source, hint if isinstance(hint, int) and not isinstance(hint, bool) else None)
        except DumpError as exc:
            out.problems.append(LoadProblem(exc.source, exc.message, rank=exc.rank))
            continue
        if max_entries > 0 and len(dump.entries) > max_entries:
            out.entries_dropped += len(dump.entries) - max_entries
            dump.entries = dump.entries[-max_entries:]
        out.dumps.append(dump)
    return out


def from_bytes(raw: bytes, endpoint: str, *, origin: str, max_entries: int = DEFAULT_MAX_ENTRIES,
               pod: str | None = None, namespace: str | None = None) -> PodEvidence:
    """Inflate (if gzip), decode, validate and normalize one snapshot body (in a worker process or thread)."""
    raw = gunzip_capped(raw, DEFAULT_MAX_SNAPSHOT_BYTES, endpoint)
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise SidecarError(endpoint, f"answer is not JSON: {exc}", retryable=False) from exc
    snapshot = parse_snapshot(obj, endpoint, size_bytes=len(raw))
    del obj
    if pod:
        snapshot.pod = pod
    if namespace:
        snapshot.namespace = namespace
    return from_snapshot(snapshot, origin=origin, max_entries=max_entries)
