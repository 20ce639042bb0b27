"""The normalized Flight Recorder model: one shape for every dump version, backend and transport.

Everything downstream (analysis, reports, sidecar, operator) consumes these objects and never the
raw dicts torch produced. Entries are the hot path (millions of them at 10k-GPU scale), so they are
slotted, built positionally, and keep sizes/frames in the cheap form the dump already had.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import starmap
from operator import attrgetter
from typing import Any

# States as torch writes them. Gloo on CPU only ever writes SCHEDULED (plus `retired`).
SCHEDULED = "scheduled"
STARTED = "started"
COMPLETED = "completed"

CAPTURED_SNAPSHOT = "snapshot"
CAPTURED_MTIME = "mtime"

# Point-to-point ops: matched by p2p_seq_id and peer, never by collective_seq_id.
P2P_OPS = frozenset({"send", "recv", "isend", "irecv"})


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python frame of the stack captured when the collective was enqueued."""

    name: str
    filename: str
    line: int

    def __str__(self) -> str:
        return f"{self.name} ({self.filename}:{self.line})"


def frames_from_raw(raw: Any) -> tuple[Frame, ...]:
    """The dump's list of {name, filename, line} dicts -> Frames (tolerating junk)."""
    out: list[Frame] = []
    if isinstance(raw, (list, tuple)):
        for item in raw:
            if isinstance(item, dict):
                # Type-checked, capped: a frame is evidence shown to people, never str() of junk.
                name, filename, line = item.get("name"), item.get("filename"), item.get("line")
                out.append(
                    Frame(
                        name[:200] if isinstance(name, str) else "?",
                        filename[:500] if isinstance(filename, str) else "?",
                        line if type(line) is int and 0 <= line < 1 << 31 else -1,
                    )
                )
    return tuple(out)


class LazyFrames:
    """Frames left in the file they came from, read again only for the entries someone looks at.

    Frames are most of a dump (8-50 dicts per entry); holding them for 1,024 ranks x 2,000 entries
    costs gigabytes, and only the culprits' are ever shown. One instance per file, shared by its
    entries; `reader` re-decodes the file (safely) the first time a frame is asked for."""

    __slots__ = ("_by_record", "_reader")

    def __init__(self, reader: Callable[[], Any]) -> None:
        self._reader = reader
        self._by_record: dict[int, Any] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # Travels between processes as its reader alone; the cache is rebuilt where it is used.
        return (LazyFrames, (self._reader,))

    def raw_frames(self, record_id: int) -> Any:
        if self._by_record is None:
            self._by_record = {}
            try:
                entries = self._reader()
            except Exception:  # the file changed or vanished since: frames are evidence, not essential
                entries = []
            if isinstance(entries, list):
                for index, item in enumerate(entries):
                    if isinstance(item, dict):
                        rid = item.get("record_id", index)
                        self._by_record[rid if isinstance(rid, int) else index] = item.get("frames")
        return self._by_record.get(record_id)


class Entry:
    """One recorder entry (one collective or p2p op as seen by one rank).

    `op` is the profiling name without its backend prefix and peer suffix ('all_reduce', 'send');
    `peer` is the group-local peer rank of a p2p op ('nccl:send 0->1' on local rank 0 -> 1).
    `sizes` are lists of shapes exactly as recorded; compare them with ==, never mutate them.
    """

    __slots__ = (
        "record_id",
        "pg_name",
        "pg_desc",
        "collective_seq_id",
        "p2p_seq_id",
        "is_p2p",
        "op",
        "profiling_name",
        "peer",
        "input_sizes",
        "input_dtypes",
        "output_sizes",
        "output_dtypes",
        "state",
        "retired",
        "time_created_ns",
        "time_started_ns",
        "time_completed_ns",
        "duration_ms",
        "timeout_ms",
        "thread_id",
        "thread_name",
        "_frames",
    )

    def __init__(
        self,
        record_id: int,
        pg_name: str,
        pg_desc: str,
        collective_seq_id: int,
        p2p_seq_id: int,
        is_p2p: bool,
        op: str,
        profiling_name: str,
        peer: int | None,
        input_sizes: list[list[int]],
        input_dtypes: list[str],
        output_sizes: list[list[int]],
        output_dtypes: list[str],
        state: str,
        retired: bool | None,
        time_created_ns: int | None,
        time_started_ns: int | None,
        time_completed_ns: int | None,
        duration_ms: float | None,
        timeout_ms: int | None,
        thread_id: str | None,
        thread_name: str | None,
        frames: Any,
    ) -> None:
        self.record_id = record_id
        self.pg_name = pg_name
        self.pg_desc = pg_desc
        self.collective_seq_id = collective_seq_id
        self.p2p_seq_id = p2p_seq_id
        self.is_p2p = is_p2p
        self.op = op
        self.profiling_name = profiling_name
        self.peer = peer
        self.input_sizes = input_sizes
        self.input_dtypes = input_dtypes
        self.output_sizes = output_sizes
        self.output_dtypes = output_dtypes
        self.state = state
        self.retired = retired
        self.time_created_ns = time_created_ns
        self.time_started_ns = time_started_ns
        self.time_completed_ns = time_completed_ns
        self.duration_ms = duration_ms
        self.timeout_ms = timeout_ms
        self.thread_id = thread_id
        self.thread_name = thread_name
        # Raw frame dicts as dumped; converted on first use (only culprits' frames are ever read).
        self._frames = frames

    def __reduce__(self) -> tuple[Any, ...]:
        # Positional, like the constructor (the operator's decode processes send entries back this way).
        return (Entry, _ENTRY_ROW(self))

    @property
    def completed(self) -> bool:
        """Done from this rank's point of view: NCCL marks `completed`; gloo only sets `retired`
        (after `wait()` returned, or after the op failed: see DESIGN.md)."""
        return self.state == COMPLETED or self.retired is True

    @property
    def frames(self) -> tuple[Frame, ...]:
        raw = self._frames
        if isinstance(raw, tuple):
            return raw
        if isinstance(raw, LazyFrames):
            raw = raw.raw_frames(self.record_id)
        frames = frames_from_raw(raw)
        self._frames = frames
        return frames

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (used by the JSON report and the sidecar's snapshot API)."""
        return {
            "record_id": self.record_id,
            "process_group": [self.pg_name, self.pg_desc],
            "collective_seq_id": self.collective_seq_id,
            "p2p_seq_id": self.p2p_seq_id,
            "is_p2p": self.is_p2p,
            "op": self.op,
            "profiling_name": self.profiling_name,
            "peer": self.peer,
            "input_sizes": self.input_sizes,
            "input_dtypes": self.input_dtypes,
            "output_sizes": self.output_sizes,
            "output_dtypes": self.output_dtypes,
            "state": self.state,
            "retired": self.retired,
            "time_created_ns": self.time_created_ns,
            "time_discovered_started_ns": self.time_started_ns,
            "time_discovered_completed_ns": self.time_completed_ns,
            "duration_ms": self.duration_ms,
            "timeout_ms": self.timeout_ms,
            "thread_id": self.thread_id,
            "thread_name": self.thread_name,
            "frames": [{"name": f.name, "filename": f.filename, "line": f.line} for f in self.frames],
        }

    def __repr__(self) -> str:
        seq = self.p2p_seq_id if self.is_p2p else self.collective_seq_id
        return f"Entry({self.pg_name}#{seq} {self.op} {self.state}{' retired' if self.retired else ''})"


# An Entry's constructor arguments, in order (frames last): what normalization produces per entry.
EntryRow = tuple[Any, ...]

# Every slot, in constructor order (frames last), read in one C call. Rows are how the loader's worker
# processes ship entries back: a tuple pickles in C, where `__reduce__` costs a Python call per entry.
_ENTRY_ROW = attrgetter(*Entry.__slots__)


def entry_rows(entries: Iterable[Entry]) -> list[EntryRow]:
    """Entries -> plain tuples (their constructor arguments), for cheap transfer between processes."""
    return list(map(_ENTRY_ROW, entries))


def entries_from_rows(rows: Iterable[EntryRow]) -> list[Entry]:
    """The inverse of `entry_rows`."""
    return list(starmap(Entry, rows))


@dataclass(frozen=True, slots=True)
class PgConfig:
    """A `pg_config` item as the rank dumped it. `ranks` is None when the dump did not say or said
    something unusable (gloo's default group: key '' and ranks '[]')."""

    key: str
    name: str
    desc: str
    ranks: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class PgStatus:
    """A `pg_status` item, keyed by the rank-local pg id (gloo and NCCL alike), not the group name."""

    key: str
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None


@dataclass(slots=True)
class RankDump:
    """One rank's recorder, normalized."""

    rank: int
    source: str  # file path, or 'socket:<path>' for a live capture
    version: str
    backend: str | None  # 'nccl', 'gloo', ... from the profiling names; None when no entries
    entries: Sequence[Entry]  # a list, or a columnar `columns.EntryTable` (large sets)
    pg_config: dict[str, PgConfig] = field(default_factory=dict)
    pg_status: dict[str, PgStatus] = field(default_factory=dict)
    comm_lib_version: str = ""
    # Every Python thread's stack (torch worker server `dump_traceback`), when a collector took it.
    stacks: str | None = None
    # When the recorder was read (ns since the epoch): capture time, or the dump file's mtime.
    captured_at_ns: int | None = None
    # Where `captured_at_ns` came from: CAPTURED_SNAPSHOT (a collector's own clock when it read the
    # recorder) or CAPTURED_MTIME (the file's mtime: a copy resets it, so it is only a hint).
    captured_at_source: str | None = None
    host: str | None = None
    warnings: list[str] = field(default_factory=list)

    def share_group_ranks(self, shared: dict[tuple[int, ...], tuple[int, ...]]) -> None:
        """Point each `pg_config` rank list at the one equal tuple in `shared` (added if new). Every rank
        lists its default group's N members: a rank decoded in a worker process arrives with its own
        copy, N int objects (at 8,192 ranks ~300 KiB a rank), where one copy serves the whole set."""
        for key, cfg in self.pg_config.items():
            if cfg.ranks is not None:
                ranks = shared.setdefault(cfg.ranks, cfg.ranks)
                if ranks is not cfg.ranks:
                    self.pg_config[key] = PgConfig(cfg.key, cfg.name, cfg.desc, ranks)


@dataclass(frozen=True, slots=True)
class LoadProblem:
    """A file that could not be used (or was used with reservations). Never fatal for the others."""

    source: str
    message: str
    rank: int | None = None
    kind: str = "error"  # 'error' (not loaded) or 'warning' (loaded, with reservations)

    def __str__(self) -> str:
        who = f" (rank {self.rank})" if self.rank is not None else ""
        return f"{self.source}{who}: {self.message}"


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A process group with the membership frscope believes, and where that belief comes from."""

    name: str
    desc: str
    ranks: tuple[int, ...]  # global ranks, sorted; position = group-local rank
    membership_source: str  # 'pg_config', 'entries', 'world'

    def global_rank(self, local_rank: int) -> int | None:
        if 0 <= local_rank < len(self.ranks):
            return self.ranks[local_rank]
        return None


@dataclass(slots=True)
class DumpSet:
    """Every rank that could be loaded, the problems of those that could not, and the groups."""

    dumps: dict[int, RankDump]
    groups: dict[str, GroupInfo]
    world_size: int
    problems: list[LoadProblem] = field(default_factory=list)

    @property
    def ranks_loaded(self) -> tuple[int, ...]:
        return tuple(sorted(self.dumps))

    @property
    def missing_ranks(self) -> tuple[int, ...]:
        expected: set[int] = set(range(self.world_size))
        for group in self.groups.values():
            expected.update(group.ranks)
        return tuple(sorted(expected - set(self.dumps)))
