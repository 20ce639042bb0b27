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

from frscope.records.exits import RankExit, exits_from_json

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
