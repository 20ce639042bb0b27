"""The exits an incident bundle carries, read from its file with the loader's caps (`frscope analyze
BUNDLE` takes them as evidence, as it takes `--exits FILE`)."""

from __future__ import annotations

from pathlib import Path

from frscope.records.bundle import BUNDLE_SCHEMA, bundle_exits, is_bundle
from frscope.records.exits import RankExit
from frscope.records.loader import DEFAULT_MAX_BYTES, decode_bytes, gunzip_capped, read_capped


def read_bundle_exits(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> list[RankExit]:
    """How the ranks of the incident bundle at `path` ended; [] for no bundle (one names its schema in its
    first KiB). DumpError or BundleError, naming the file and field, when it cannot be read."""
    source = str(path)
    data = gunzip_capped(read_capped(path, max_bytes), source, max_bytes)
    if BUNDLE_SCHEMA.encode() not in data[:1024]:
        return []
    raw = decode_bytes(data, source, max_bytes)
    return bundle_exits(raw, source) if is_bundle(raw) else []
