"""The sidecar <-> operator wire format (docs/sidecar-api.md): this package is the only place that
spells it, one sub-module per document.

Three documents travel between frscope's parts:

- the **snapshot piece** (`snapshot`): one rank's recorder with its capture metadata
  (``{"frscope_snapshot": 1, "rank", "captured_at_ns", "source", "stacks", "trace"}``); the sidecar
  serves it, the demo writes it as ``rank-<r>.json``, frscope.records reads it like a torch dump;
- the **snapshot envelope** (`snapshot`, ``frscope.sidecar.snapshot/v1``): a pod's pieces plus
  per-rank errors, served at ``/v1/snapshot`` (with an ETag: `If-None-Match` gets 304 while its ranks
  and errors are the same), pushed to the operator's ``/v1/push`` and kept on disk by the sidecar;
- a rank's **own collective times** (`timings`): the bootstrap's `frscope_timings` answer, carried in
  a snapshot piece's ``timings`` field beside the recorder;
- the **status document** (`status`, ``frscope.sidecar.status/v1``): per rank and group progress and
  recent arrivals, ``/v1/status``.

`common` holds what they share (schema names, the per-pod token audience, `WireError`, bounded value
readers). Writers (the sidecar, the demo) and readers (the operator, the CLI, frscope.records) import
the names below, so a field renamed here is renamed for all of them. Pure: no I/O, no frscope imports
outside this package, nothing but the standard library (import-linter keeps it so).
"""

from frscope.wire.common import (
    CERTIFICATE_PATH,
    ENTRIES_DROPPED_KEY,
    ETAG_MAX_CHARS,
    IF_NONE_MATCH_MAX_CHARS,
    IF_NONE_MATCH_MAX_TAGS,
    SIDECAR_AUDIENCE,
    SIDECAR_TLS_SUFFIX,
    SNAPSHOT_FORMAT,
    SNAPSHOT_KEY,
    SNAPSHOT_PIECE_KEYS,
    SNAPSHOT_SCHEMA,
    SNAPSHOT_WINDOW_MAX,
    SNAPSHOT_WINDOW_MIN,
    STATUS_MAX_BYTES,
    STATUS_SCHEMA,
    WireError,
    sidecar_audience,
    sidecar_tls_name,
)
from frscope.wire.snapshot import (
    SidecarSnapshot,
    SnapshotError,
    entries_dropped,
    etag_matches,
    is_snapshot_envelope,
    is_snapshot_piece,
    parse_snapshot,
    parse_window,
    read_etag,
    snapshot_envelope_bytes,
    snapshot_etag,
    snapshot_head,
    snapshot_piece,
    snapshot_piece_bytes,
    unwrap_snapshot,
    window_piece,
    window_query,
)
from frscope.wire.status import (
    STATUS_ARRIVALS,
    STATUS_ARRIVALS_TOTAL,
    DumpDirDoc,
    DumpFileDoc,
    EvidenceDoc,
    GroupStall,
    GroupStatusDoc,
    LatenessDoc,
    RankLate,
    RankStatusDoc,
    RankUp,
    SidecarStatus,
    StatusDoc,
    UnrecordedWaitDoc,
    loads_status,
    parse_status,
    status_arrivals_each,
)
from frscope.wire.timings import (
    TIMINGS_KEY,
    TIMINGS_MAX_BYTES,
    TIMINGS_PIECE_KEY,
    TimingRow,
    Timings,
    loads_timings,
    parse_timings,
    timings_document,
    window_timings,
)

__all__ = [
    "CERTIFICATE_PATH", "DumpDirDoc", "DumpFileDoc", "ENTRIES_DROPPED_KEY", "ETAG_MAX_CHARS", "EvidenceDoc",
    "IF_NONE_MATCH_MAX_CHARS", "IF_NONE_MATCH_MAX_TAGS", "etag_matches", "read_etag", "snapshot_etag", "GroupStall",
    "GroupStatusDoc", "LatenessDoc", "RankLate", "RankStatusDoc", "RankUp", "SIDECAR_AUDIENCE",
    "SIDECAR_TLS_SUFFIX", "SNAPSHOT_FORMAT", "SNAPSHOT_KEY", "SNAPSHOT_PIECE_KEYS", "SNAPSHOT_SCHEMA",
    "SNAPSHOT_WINDOW_MAX", "SNAPSHOT_WINDOW_MIN", "STATUS_ARRIVALS", "STATUS_ARRIVALS_TOTAL", "STATUS_MAX_BYTES",
    "STATUS_SCHEMA", "TIMINGS_KEY", "TIMINGS_MAX_BYTES", "TIMINGS_PIECE_KEY", "TimingRow", "Timings",
    "loads_timings", "parse_timings", "timings_document", "window_timings", "SidecarSnapshot", "SidecarStatus",
    "SnapshotError", "StatusDoc", "UnrecordedWaitDoc", "WireError",
    "entries_dropped", "is_snapshot_envelope", "is_snapshot_piece", "loads_status", "parse_snapshot",
    "parse_status", "parse_window", "sidecar_audience", "sidecar_tls_name", "snapshot_envelope_bytes",
    "snapshot_head", "snapshot_piece", "snapshot_piece_bytes", "status_arrivals_each", "unwrap_snapshot",
    "window_piece", "window_query",
]
