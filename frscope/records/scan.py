"""The optional C scanner (`_frscan`): a regular pickle dump straight into an `EntryTable`, no dict per entry.

The reference for one pickle dump is `safe_pickle.safe_loads` (the allow-list unpickler) and then
`fastcols.table_from_entries` (or, for irregular entries, `rowwise.normalize_rows`). `_frscan.scan` walks the
pickle's opcodes itself (plain containers and scalars only: no global, no call, nothing else) and fills the same
columns, interning every field that is not an int or a float into a small table of distinct values. Here those
distinct values are checked with the field table's rules (`fields`, as fastcols applies them), so the scanner
accepts exactly the dumps fastcols keeps unchanged, and builds the same table. Whenever anything is not the
regular shape, the scanner or this module declines (None) and the caller reads the file the reference way, which
also reports whatever is wrong with it.

The extension is built by `pip install -e .` / `setup.py build_ext --inplace` where a C compiler exists, and
is in the released wheels and the image (built in its build stage). `FRSCOPE_NO_SCANNER=1` turns it off.
"""

from __future__ import annotations

import os
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from frscope.records.columns import EntryTable, _code_type
from frscope.records.fields import (
    MAX_STACKS,
    MAX_STATE,
    regular_dtypes,
    regular_group,
    regular_sizes,
    regular_thread,
    short_text,
)
from frscope.records.limits import MAX_INT64, MIN_JSON_BYTES_PER_CONTAINER, memory_budget
from frscope.records.model import LazyFrames
from frscope.wire import TIMINGS_PIECE_KEY, is_snapshot_piece

try:
    from frscope.records import _frscan  # type: ignore[attr-defined]
except ImportError:  # not built (no compiler): the reference path reads everything
    _frscan = None

ENV_OFF = "FRSCOPE_NO_SCANNER"


def available() -> bool:
    """The extension is built and not turned off by FRSCOPE_NO_SCANNER."""
    return _frscan is not None and os.environ.get(ENV_OFF, "") in ("", "0")


def describe() -> str:
    """Which reader plain pickle dumps get, for `frscope --version` (a wheel or image without the scanner shows)."""
    if _frscan is None:
        return "pure Python, the C scanner is not built"
    return "C scanner" if available() else f"pure Python, {ENV_OFF} is set"


def scan_dump(data: bytes, lazy_frames: LazyFrames,
              parse_name: Callable[[str], tuple[str | None, str, int | None]]
              ) -> tuple[dict[str, Any], EntryTable, str | None] | None:
    """(the dump's top level with 'entries' emptied, its entries as a table, the backend), or None: not a
    regular dump, or no scanner; read it the reference way. `parse_name` is normalize.parse_profiling_name."""
    if not available() or data[:1] != b"\x80":
        return None
    got = _frscan.scan(data, memory_budget(len(data)))
    if got is None:
        return None
    return _table(got, lazy_frames, parse_name)


def scan_json_dump(data: bytes, lazy_frames: LazyFrames,
                   parse_name: Callable[[str], tuple[str | None, str, int | None]]
                   ) -> tuple[dict[str, Any], EntryTable, str | None] | None:
    """As `scan_dump`, for JSON text (torch's `_dump_fr_trace_json`, `fr_trace_json`, or a frscope snapshot
    piece, whose entries are its trace's: the piece comes back whole, its trace's entries emptied). None: read
    it the reference way (`json.loads`), which also reports whatever is wrong with it. The reference refuses
    text with too many containers for its size before decoding (`json_too_dense`); so does this."""
    if not available() or data.lstrip()[:1] != b"{" or json_too_dense(data):
        return None
    got = _frscan.scan_json(data, memory_budget(len(data)), True)
    if got is None:
        return None
    if is_snapshot_piece(got[0]) and got[0].get(TIMINGS_PIECE_KEY) is not None:
        return None  # the rank's own times rewrite its entries (normalize's apply_timings): the reference's work
    return _table(got, lazy_frames, parse_name)


def scan_envelope(data: bytes, last: int, max_pieces: int,
                  parse_name: Callable[[str], tuple[str | None, str, int | None]]
                  ) -> tuple[int, int, list[tuple[int, int, ScannedPiece | None]]] | None:
    """A snapshot envelope's JSON text (a sidecar's `/v1/snapshot` body) parsed once: the byte span of its
    "ranks" array and, per piece, its byte span and its reading (`ScannedPiece`: the piece with its trace's
    entries emptied, their table cut to the newest `last` entries as wire.window_piece cuts them), or None for
    a piece to decode the reference way (from its span). None: not a regular envelope (more than `max_pieces`
    pieces, a piece that is not a JSON object or array, invalid or too dense JSON, ...): decode the body the
    reference way. Frames are not kept (the operator's pieces are read without them): a piece whose entries
    carry frames is left to the reference, as is one with its own timings."""
    if not available() or data.lstrip()[:1] != b"{" or json_too_dense(data):
        return None
    got = _frscan.scan_envelope(data, memory_budget(len(data)), last, max_pieces)
    if got is None:
        return None
    start, end, items = got
    return start, end, [(piece_start, piece_end, _piece(columns, parse_name) if columns is not None else None)
                        for piece_start, piece_end, columns in items]


def scan_piece(window: bytes, last: int, parse_name: Callable[[str], tuple[str | None, str, int | None]]
               ) -> tuple[ScannedPiece, int] | None:
    """The snapshot piece (a JSON object) at the start of `window`, which may go on past it (the operator reads
    a body piece by piece, `push_decode`): (its reading, as `scan_envelope`'s, its end in `window`), or None:
    decode it the reference way. A piece with more containers than its size allows is left to the reference
    too (it decides what such a piece is)."""
    if not available() or window[:1] != b"{":
        return None
    got = _frscan.scan_json(window, memory_budget(len(window)), True, last, True)
    if got is None or json_too_dense(window[: got[23]]):
        return None
    piece = _piece(got, parse_name)
    return (piece, got[23]) if piece is not None else None


def _piece(columns: tuple[Any, ...], parse_name: Callable[[str], tuple[str | None, str, int | None]]
           ) -> ScannedPiece | None:
    """A piece's columns as a `ScannedPiece`, or None: its entries carry frames (the operator reads a piece
    without lazy frames, each entry's "frames" as it is: only no entry's or every entry's an empty list is
    read here, as those), it has its own timings (normalize's apply_timings rewrites its entries first), or a
    value is not regular."""
    frames_state = columns[22]
    if frames_state == 2 or (is_snapshot_piece(columns[0]) and columns[0].get(TIMINGS_PIECE_KEY) is not None):
        return None
    read = _table(columns, None, parse_name)
    if read is None:
        return None
    table = read[1]
    if frames_state == 1:  # as rowwise keeps them: each entry its own empty list, no stacks
        table.stack, table.stacks = None, None
        table.frames, table.frames_each = None, tuple([] for _ in range(columns[1]))
    return ScannedPiece(read[0], (table, read[2]), columns[21] - columns[1])


class ScannedPiece(dict[str, Any]):
    """A snapshot piece read by the scanner: the piece itself (its trace's entries emptied), `prebuilt` (its
    entries' table and backend, for normalize_dump) and `cut` (the older entries the window left out)."""

    def __init__(self, meta: dict[str, Any], prebuilt: tuple[EntryTable, str | None], cut: int) -> None:
        super().__init__(meta)
        self.prebuilt = prebuilt
        self.cut = cut


def json_too_dense(data: bytes) -> bool:
    """More JSON objects/arrays than one per MIN_JSON_BYTES_PER_CONTAINER bytes (brackets inside strings count
    too): decoding it would take far more memory than a dump's text does; the reader refuses it."""
    containers = data.count(b"{") + data.count(b"[")
    return containers * MIN_JSON_BYTES_PER_CONTAINER > len(data)


def _codes(raw: bytes, distinct: int) -> array[int]:
    out = array(_code_type(distinct))
    out.frombytes(raw)
    return out


def _table(got: tuple[Any, ...], lazy_frames: LazyFrames | None,
           parse_name: Callable[[str], tuple[str | None, str, int | None]]
           ) -> tuple[dict[str, Any], EntryTable, str | None] | None:
    (meta, n, cols, dur, flags, pg_codes, pgs, names, name_codes, name_counts, states, state_codes, timeouts,
     timeout_codes, threads, thread_codes, shapes, shape_codes, stack_codes, stack_raws, ids_rise) = got[:21]
    # The table's checks (records.fields, as fastcols applies them), once per distinct value; the scanner
    # checked the types of ints, floats and flags and the ints' lowest values from the same table.
    if not all(map(regular_group, pgs)) or not all(short_text(s, MAX_STATE) for s in states):
        return None
    if not all(map(regular_thread, threads)):
        return None
    for input_sizes, input_dtypes, output_sizes, output_dtypes in shapes:
        if not (regular_sizes(input_sizes) and regular_sizes(output_sizes) and regular_dtypes(input_dtypes)
                and regular_dtypes(output_dtypes)):
            return None

    table = EntryTable.__new__(EntryTable)
    columns = []
    for k in range(6):
        column = array("q")
        column.frombytes(cols[k * n * 8 : (k + 1) * n * 8])
        columns.append(column)
    table.record_id, table.seq, table.p2p_seq, table.created, table.started, table.completed = columns
    table.duration = array("d")
    table.duration.frombytes(dur)
    table.flags = array("B")
    table.flags.frombytes(flags)
    table.pgs = pgs
    table.pg = _codes(pg_codes, len(pgs))
    parsed = [parse_name(name) for name in names]
    table.names = [(name, op, peer) for name, (_backend, op, peer) in zip(names, parsed, strict=True)]
    table.name = _codes(name_codes, len(names))
    table.states = states
    table.state = _codes(state_codes, len(states))
    top = MAX_INT64
    table.timeouts = [t if t is None or 0 < t <= top else None for t in timeouts]
    table.timeout = _codes(timeout_codes, len(timeouts))
    table.threads = threads
    table.thread = _codes(thread_codes, len(threads))
    table.shapes = shapes
    table.shape = _codes(shape_codes, len(shapes))
    table.frames, table.frames_each = lazy_frames, None
    table.stack, table.stacks = _stacks(stack_codes, stack_raws, table.record_id, ids_rise)
    if ids_rise and n and table.record_id[-1] - table.record_id[0] == n - 1:  # consecutive: `compact` keeps a range
        table.record_id = range(table.record_id[0], table.record_id[0] + n)
    table._stack_frames = {}
    table.sigs, table.space, table._groups = [], None, None

    backends: Counter[str] = Counter()
    for (backend, _op, _peer), count in zip(parsed, name_counts, strict=True):
        if backend:
            backends[backend] += count
    most = backends.most_common(1)
    return meta, table, (most[0][0] if most else None)


def _stacks(raw_codes: bytes | None, raws: list[Any] | None, record_id: Sequence[int], ids_rise: bool
            ) -> tuple[array[int], list[Any]] | tuple[None, None]:
    """As fastcols._Stacks.result: each entry's stack as a code into the rank's distinct stacks (contents by
    frames_from_raw: the scanner builds them so, `raws`), the last entry's stack per record id when ids repeat;
    None when frames are not lists or there are more than MAX_STACKS distinct stacks. The scanner keyed stacks by
    their frame dicts' identity: equal contents of different dicts become one stack here."""
    if raw_codes is None or raws is None:
        return None, None
    index: dict[tuple[tuple[str, str, int], ...], int] = {}
    remap: list[int] = []
    for content in raws:  # the scanner made each stack's frames as frames_from_raw does (mat_stack)
        code = index.get(content)
        if code is None:
            if len(index) >= MAX_STACKS:
                return None, None
            code = index[content] = len(index)
        remap.append(code)
    codes = array("I")
    codes.frombytes(raw_codes)
    if remap != list(range(len(remap))):
        codes = array("I", map(remap.__getitem__, codes))
    if not ids_rise:  # ids repeat or go back (the scanner compared them): the last one's stack
        final = dict(zip(record_id, codes, strict=True))
        codes = array("I", map(final.__getitem__, record_id))
    kind = _code_type(len(index))
    return (codes if kind == "I" else array(kind, codes)), list(index)
