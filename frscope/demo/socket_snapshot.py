"""Take one rank's frscope snapshot over its worker-server socket, and write it to disk.

A snapshot file, `rank-<r>.json`, is exactly frscope.wire's snapshot piece::

    {"frscope_snapshot": 1, "rank": r, "captured_at_ns": <time.time_ns()>,
     "source": "socket:<path>", "stacks": "<dump_traceback text>", "trace": <fr_trace_json object>}

`trace` is the recorder as torch serialized it, untouched: normalization belongs to frscope.records.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frscope.demo.unix_http import WorkerServerError, call_handler
from frscope.wire import snapshot_piece


@dataclass(frozen=True)
class Snapshot:
    rank: int
    captured_at_ns: int
    source: str
    stacks: str
    trace: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return snapshot_piece(self.rank, self.captured_at_ns, self.source, self.stacks, self.trace)


def fetch_trace(socket_path: Path, timeout: float) -> dict[str, Any]:
    """The rank's live recorder, parsed (`fr_trace_json`)."""
    body = call_handler(socket_path, "fr_trace_json", timeout)
    try:
        trace = json.loads(body)
    except ValueError as exc:
        raise WorkerServerError(f"{socket_path}: fr_trace_json: not JSON: {exc}") from exc
    if not isinstance(trace, dict):
        raise WorkerServerError(f"{socket_path}: fr_trace_json: not a JSON object")
    return trace


def fetch_stacks(socket_path: Path, timeout: float) -> str:
    """Every Python thread's stack, faulthandler format (`dump_traceback`)."""
    return call_handler(socket_path, "dump_traceback", timeout).decode("utf-8", "replace")


def take_snapshot(rank: int, socket_path: Path, timeout: float) -> Snapshot:
    """Recorder first, then stacks: the stacks then show where the rank sits after the last entry."""
    captured_at_ns = time.time_ns()
    trace = fetch_trace(socket_path, timeout)
    stacks = fetch_stacks(socket_path, timeout)
    return Snapshot(rank, captured_at_ns, f"socket:{socket_path}", stacks, trace)


def snapshot_path(out_dir: Path, rank: int) -> Path:
    return out_dir / f"rank-{rank}.json"


def write_snapshot(snapshot: Snapshot, out_dir: Path) -> Path:
    """Write `rank-<r>.json` whole: renamed into place, so a reader never sees half a file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = snapshot_path(out_dir, snapshot.rank)
    tmp = out_dir / f".{path.name}.partial"
    tmp.write_text(json.dumps(snapshot.to_json(), indent=1) + "\n")
    tmp.replace(path)
    return path


def progress_signature(trace: dict[str, Any]) -> tuple[int, int, int]:
    """What changes while a rank makes progress: entry count, last record id, retired entries.

    Retired entries count because gloo retires an entry a moment after `wait()` returns; a
    snapshot taken between the two would show a finished collective as still running.
    """
    entries = trace.get("entries") or []
    if not isinstance(entries, list):
        return (0, -1, 0)
    last = entries[-1].get("record_id", -1) if entries and isinstance(entries[-1], dict) else -1
    retired = sum(1 for e in entries if isinstance(e, dict) and e.get("retired"))
    return (len(entries), int(last) if isinstance(last, int) else -1, retired)
