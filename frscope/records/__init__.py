"""The recorder's data model, safe loaders and version-tolerant normalization (pure: no I/O but files)."""

from frscope.records.errors import (
    DumpError,
    DumpTooLarge,
    DumpTooSlow,
    MalformedDump,
    TruncatedDump,
    UnknownFormat,
    UnsafePickle,
)
from frscope.records.exits import RankExit, exits_from_json
from frscope.records.loader import DEFAULT_MAX_BYTES, assemble, decode_bytes, load_dumps, load_file, rank_from_name
from frscope.records.model import (
    CAPTURED_MTIME,
    CAPTURED_SNAPSHOT,
    COMPLETED,
    P2P_OPS,
    SCHEDULED,
    STARTED,
    DumpSet,
    Entry,
    Frame,
    GroupInfo,
    LoadProblem,
    PgConfig,
    PgStatus,
    RankDump,
)
from frscope.records.normalize import normalize_dump

__all__ = [
    "CAPTURED_MTIME",
    "CAPTURED_SNAPSHOT",
    "COMPLETED",
    "DEFAULT_MAX_BYTES",
    "P2P_OPS",
    "SCHEDULED",
    "STARTED",
    "DumpError",
    "DumpSet",
    "DumpTooLarge",
    "DumpTooSlow",
    "Entry",
    "Frame",
    "GroupInfo",
    "LoadProblem",
    "MalformedDump",
    "PgConfig",
    "PgStatus",
    "RankDump",
    "RankExit",
    "TruncatedDump",
    "UnknownFormat",
    "UnsafePickle",
    "assemble",
    "decode_bytes",
    "exits_from_json",
    "load_dumps",
    "load_file",
    "normalize_dump",
    "rank_from_name",
]
