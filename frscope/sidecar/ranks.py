"""Which local ranks there are, and what the sidecar keeps about each one between polls.

A rank is a worker-server socket `rank-<r>.sock` in the socket dir (the bootstrap creates it), or, where the
job started torch's own debug server (`torch.distributed.debug.start_debug_server()`), the file
`rank-<r>.debug-server` the bootstrap writes instead: `{"port": N, "pid": P}`, the TCP port of the rank's
worker server that torch started, which the sidecar reads on the pod's loopback (the bootstrap then serves no
socket of its own for that rank). What the bootstrap wrote about the process (torch version, pid) sits
beside them in `.rank-<r>.json`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frscope.sidecar.client import DebugServerPort, Endpoint, Fingerprint, WorkerClient
from frscope.sidecar.progress import GroupSample

_SOCKET = re.compile(r"^rank-(\d+)\.sock$")
_DEBUG_SERVER = re.compile(r"^rank-(\d+)\.debug-server$")
DEBUG_SERVER_FILE_MAX_BYTES = 4096


@dataclass(slots=True)
class RankState:
    rank: int
    endpoint: Endpoint
    client: WorkerClient
    up: bool = False
    ever_up: bool = False
    error: str | None = None
    reason: str | None = None
    last_poll_ns: int | None = None
    last_ok_ns: int | None = None
    raw_ns: int | None = None  # when the kept full recorder (raw_z) was fetched
    raw_hash: bytes | None = None
    raw_z: bytes | None = None  # zlib of the last good fr_trace_json answer
    stacks: str | None = None
    stacks_for_ns: int | None = None  # the last_ok_ns the stacks belong to
    count_watermark: int = -1
    duration_watermark: int = -1
    # Its recorder dates durations (NCCL with timing): frscope_collective_wait_seconds adds those and
    # stops sampling. Sampling: when the previous poll that saw the rank up was (None: no such poll).
    timed: bool = False
    wait_sampled_ns: int | None = None
    samples: dict[str, GroupSample] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    # The cheap progress probe (client.PROGRESS_PROBES): which one the rank answers ("" none: full polls only;
    # None: not asked yet since the rank (re)appeared), and what it showed.
    probe: tuple[str, str] | None = None
    probe_fp: Fingerprint | None = None
    probe_ns: int | None = None  # the latest probe
    probe_first_ns: int | None = None  # the first probe that showed probe_fp
    probe_before_ns: int | None = None  # the probe before that one (a change happened after it)
    full_fp: Fingerprint | None = None  # probe_fp when the kept full recorder was fetched
    polls_since_full: int = 0
    # The rank's own collective times (the bootstrap's frscope_timings, frscope.wire.timings) as the
    # piece's `timings` JSON, of the same full fetch as raw_z; None: the rank dates none. `dates`:
    # whether the rank answers frscope_timings (None: not asked since it (re)appeared).
    timings_json: bytes | None = None
    dates: bool | None = None


def scan_ranks(socket_dir: Path) -> dict[int, Endpoint] | None:
    """rank -> where its worker server answers, for every rank-<r>.sock that is a socket and every
    rank-<r>.debug-server that names a port (that one wins: the bootstrap writes it once torch's debug
    server runs in the rank, and removes its own socket then). None if the dir is missing."""
    found: dict[int, Endpoint] = {}
    ports: dict[int, Path] = {}
    try:
        with os.scandir(socket_dir) as it:
            for item in it:
                match = _SOCKET.match(item.name)
                if match:
                    try:
                        if stat.S_ISSOCK(item.stat(follow_symlinks=True).st_mode):
                            found.setdefault(int(match.group(1)), Path(item.path))
                    except OSError:
                        continue
                elif (match := _DEBUG_SERVER.match(item.name)) is not None:
                    ports[int(match.group(1))] = Path(item.path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    for rank, path in ports.items():
        port = read_debug_server_port(path)
        if port is not None:
            found[rank] = DebugServerPort(port)
    return found


def read_debug_server_port(path: Path) -> int | None:
    """The port in a rank-<r>.debug-server file, or None where the file is not one (gone, too long, not
    a JSON object with an integer port in 1..65535): the rank is then read where else it answers."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(DEBUG_SERVER_FILE_MAX_BYTES + 1)
        if len(raw) > DEBUG_SERVER_FILE_MAX_BYTES:
            return None
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    port = data.get("port") if isinstance(data, dict) else None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        return None
    return port


def read_meta(socket_dir: Path, rank: int) -> dict[str, Any]:
    """What the bootstrap wrote about the rank (torch version, pid), if anything."""
    path = socket_dir / f".rank-{rank}.json"
    try:
        data = json.loads(path.read_bytes()[:65536])
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
