"""A sidecar's snapshot envelope (`frscope.wire`: `/v1/snapshot`, a push, a sidecar evidence capture,
a window of an incident bundle) -> one `RankDump` per rank piece, or the problem naming the piece. The
CLI's loader and the operator's evidence both read envelopes with these functions; one bad piece never
sinks the others."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from frscope import wire
from frscope.records.bundle import BundleError, bundle_windows
from frscope.records.columns import EntryTable
from frscope.records.errors import DumpError
from frscope.records.limits import printable, valid_rank
from frscope.records.model import LoadProblem, RankDump
from frscope.records.normalize import normalize_dump


def envelope_problems(errors: Iterable[tuple[Any, Any]], where: str) -> list[LoadProblem]:
    """The ranks the sidecar could not read (rank, message), as problems of the envelope's `where`."""
    return [LoadProblem(where, printable(str(message)), rank=valid_rank(rank)) for rank, message in errors]


def piece_dump(piece: dict[str, Any], where: str, index: int, *, columnar: bool,
               captured_at_ns: int | None = None, prebuilt: tuple[EntryTable, str | None] | None = None
               ) -> RankDump | LoadProblem:
    """One rank's piece (the `index`th of an envelope from `where`) -> its RankDump, named by the rank it
    says it is (or by its index when that is no rank), with `captured_at_ns` (the envelope's) where the
    piece has no capture time of its own; or the problem that names why not. `prebuilt`: its entries, already
    read by the scanner (`scan.scan_envelope`)."""
    hint = piece.get("rank")
    rank = valid_rank(hint) if isinstance(hint, int) and not isinstance(hint, bool) else None
    source = f"{where} rank {rank}" if rank is not None else f"{where} piece {index}"
    try:
        dump = normalize_dump(piece, source, rank, columnar=columnar, prebuilt=prebuilt)
    except DumpError as exc:
        return LoadProblem(exc.source, exc.what, rank=valid_rank(exc.rank))
    if dump.captured_at_ns is None:
        dump.captured_at_ns = captured_at_ns
    return dump


def bundle_ranks(raw: Any, source: str, *, columnar: bool) -> list[RankDump | LoadProblem]:
    """An incident bundle's windows (records.bundle), each read as the envelope it is."""
    try:
        windows = bundle_windows(raw, source)
    except BundleError as exc:
        return [LoadProblem(source, printable(str(exc)))]
    out: list[RankDump | LoadProblem] = []
    for index, window in enumerate(windows):
        out.extend(envelope_ranks(window, f"{source} windows[{index}]", columnar=columnar))
    if not windows:
        out.append(LoadProblem(source, "an incident bundle with no window in it (field 'windows' is empty)"))
    return out


def envelope_ranks(raw: Any, source: str, *, columnar: bool) -> list[RankDump | LoadProblem]:
    """A snapshot envelope (decoded) from `source` -> its ranks and the problems naming its bad pieces."""
    try:
        envelope = wire.parse_snapshot(raw)
    except wire.WireError as exc:
        return [LoadProblem(source, printable(str(exc)))]
    del raw
    pod = f"{printable(str(envelope.namespace))}/{printable(str(envelope.pod))}"
    where = f"{source} (pod {pod})" if envelope.pod else source
    out: list[RankDump | LoadProblem] = [*envelope_problems(envelope.errors, where)]
    for index, piece in enumerate(envelope.ranks):
        out.append(piece_dump(piece, where, index, columnar=columnar, captured_at_ns=envelope.captured_at_ns))
    if not envelope.ranks and not envelope.errors:
        out.append(LoadProblem(where, "a sidecar snapshot with no rank in it (no rank had answered the sidecar)"))
    return out
