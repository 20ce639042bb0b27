"""An incident bundle: one file holding everything one incident's diagnosis used, so that
`frscope analyze BUNDLE` diagnoses it again anywhere (`frscope.incident-bundle/v1`, JSON, usually gzip).

    {"schema": "frscope.incident-bundle/v1",
     "job": {"namespace", "name", "uid", "kind"}, "incident": {"id", "category", "verdict", "at"},
     "windows": [<snapshot envelope>, ...],   # frscope.wire: each pod's recorders and stacks, as gathered
     "exits": {"<rank>": {"exit_code": 137, "reason": "OOMKilled"}, ...},
     "report": {...}, "timeline": {...} | null}

The windows are the same envelopes a sidecar serves or pushes, so they are read by the same code
(`records.envelope`), each window and piece on its own: one bad window never sinks the others. Pure:
dicts in, dicts out (no I/O); the caller reads the file within the loader's byte cap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from frscope import wire
from frscope.records.exits import RankExit, exits_from_json
from frscope.records.model import RankDump

BUNDLE_SCHEMA = "frscope.incident-bundle/v1"
# A bundle holds one envelope per pod; no job has more pods than ranks, and none has a million.
MAX_WINDOWS = 1 << 16


class BundleError(ValueError):
    """The bundle is not one; the message names the field."""


def is_bundle(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("schema") == BUNDLE_SCHEMA


def make_bundle(*, job: Mapping[str, str], incident: Mapping[str, str], windows: Sequence[Any],
                exits: Mapping[int, RankExit], report: Mapping[str, Any] | None,
                timeline: Mapping[str, Any] | None) -> dict[str, Any]:
    """The bundle as a JSON-ready dict; `windows` are snapshot envelopes (frscope.wire) as dicts."""
    return {
        "schema": BUNDLE_SCHEMA,
        "job": dict(job),
        "incident": dict(incident),
        "windows": list(windows),
        "exits": {str(rank): {"exit_code": e.exit_code, "reason": e.reason, "message": e.message,
                              "restart_count": e.restart_count, "finished_at_ns": e.finished_at_ns}
                  for rank, e in sorted(exits.items())},
        "report": dict(report) if report is not None else None,
        "timeline": dict(timeline) if timeline is not None else None,
    }


def dump_piece(dump: RankDump) -> dict[str, Any]:
    """One loaded rank as the snapshot piece it was read from: the recorder in torch's JSON form (what
    `records.normalize` reads back into the same RankDump), with its stacks and capture time."""
    trace = {
        "version": dump.version or None,
        "comm_lib_version": dump.comm_lib_version,
        "pg_config": {key: {"name": cfg.name, "desc": cfg.desc, "ranks": list(cfg.ranks) if cfg.ranks is not None
                            else []} for key, cfg in dump.pg_config.items()},
        "pg_status": {key: {"last_enqueued_collective": st.last_enqueued, "last_started_collective": st.last_started,
                            "last_completed_collective": st.last_completed} for key, st in dump.pg_status.items()},
        "entries": [entry.to_dict() for entry in dump.entries],
    }
    piece = wire.snapshot_piece(dump.rank, dump.captured_at_ns or 0, dump.source, dump.stacks, trace)
    if dump.captured_at_ns is None:
        del piece["captured_at_ns"]
    if dump.host:
        piece["host"] = dump.host
    return piece


def window(*, namespace: str, pod: str, dumps: Sequence[RankDump], reason: str = "incident") -> dict[str, Any]:
    """A pod's loaded ranks as one snapshot envelope (frscope.wire), as a bundle holds them."""
    captured = [d.captured_at_ns for d in dumps if d.captured_at_ns is not None]
    head = wire.snapshot_head(pod=pod, namespace=namespace, node="", captured_at_ns=max(captured, default=0),
                              reason=reason)
    return {**head, "ranks": [dump_piece(d) for d in dumps], "errors": []}


def bundle_windows(obj: Any, source: str) -> list[Any]:
    """The bundle's windows (each still to be checked as an envelope), or BundleError naming the field."""
    if not is_bundle(obj):
        raise BundleError(f"{source}: not a {BUNDLE_SCHEMA} object (field 'schema')")
    windows = obj.get("windows")
    if not isinstance(windows, list):
        raise BundleError(f"{source}: field 'windows' is {type(windows).__name__}, expected a list")
    if len(windows) > MAX_WINDOWS:
        raise BundleError(f"{source}: field 'windows' has {len(windows)} items, more than {MAX_WINDOWS}")
    return windows


def bundle_exits(obj: Any, source: str) -> list[RankExit]:
    """How the bundle's ranks ended (field 'exits'), or BundleError naming the field."""
    raw = obj.get("exits") if isinstance(obj, dict) else None
    if raw is None:
        return []
    try:
        return exits_from_json(raw, f"{source} field 'exits'")
    except ValueError as exc:
        raise BundleError(str(exc)) from exc
