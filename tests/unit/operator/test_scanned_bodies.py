"""A sidecar's snapshot body through the C scanner gives the same evidence as the reference decoder
(`loads_json`, `window_piece`, the normalizer), which `FRSCOPE_NO_SCANNER=1` selects, in both of the
operator's decoders: from bytes (`pod_evidence._scanned_body`: one parse of the body, each regular piece
straight into columns cut to the window) and from the file a body was streamed into, piece by piece
(`push_decode._piece`: `scan.scan_piece` on each piece's window): real bodies at every
window, pieces the scanner leaves to the reference (timings, frames, odd shapes), and hostile bodies
(truncations, byte flips, too many pieces, duplicate keys): the same evidence, or the same refusal."""

from __future__ import annotations

import copy
import gzip
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest

from frscope.operator.evidence import pod_evidence, push_decode
from frscope.operator.evidence.pod_evidence import MAX_PIECES, from_bytes
from frscope.records import scan
from frscope.records.model import Entry
from tests.unit.operator.fakes import real_snapshots
from tests.unit.operator.test_http import body

pytestmark = pytest.mark.skipif(scan._frscan is None, reason="the optional C scanner is not built")

NODE = Path(__file__).resolve().parents[2] / "data" / "node"


def _entry(entry: Entry) -> tuple[Any, ...]:
    return tuple(getattr(entry, name) for name in Entry.__slots__ if name != "_frames") + (entry.frames,)


def _evidence(data: bytes, max_entries: int, from_file: bool) -> Any:
    try:
        if from_file:
            with tempfile.NamedTemporaryFile(suffix=".json") as handle:
                handle.write(data)
                handle.flush()
                ev = push_decode.decode_file(handle.name, "ep", origin="push", max_entries=max_entries)
        else:
            ev = from_bytes(data, "ep", origin="push", max_entries=max_entries)
    except Exception as exc:  # the same refusal either way
        return ("refused", type(exc).__name__, str(exc))
    return (ev.namespace, ev.pod, ev.reason, ev.captured_at_ns, ev.entries_dropped, ev.cut_here, ev.size_bytes,
            [(d.rank, d.source, d.version, d.backend, d.pg_config, d.pg_status, d.comm_lib_version, d.stacks,
              d.captured_at_ns, d.host, d.warnings, [_entry(e) for e in d.entries]) for d in ev.dumps],
            [(p.source, p.message, p.rank, p.kind) for p in ev.problems])


def _same(data: bytes, monkeypatch: pytest.MonkeyPatch, max_entries: int = 200) -> int:
    """The evidence with the scanner equals the reference's, from bytes and from a file; returns how many
    pieces the scanner read (the least of the two decoders)."""
    read = [0, 0]
    real_envelope, real_piece = scan.scan_envelope, scan.scan_piece

    def envelope(*args: Any) -> Any:
        got = real_envelope(*args)
        read[0] += 0 if got is None else sum(piece is not None for _s, _e, piece in got[2])
        return got

    def piece(*args: Any) -> Any:
        got = real_piece(*args)
        read[1] += got is not None
        return got

    for from_file in (False, True):
        with monkeypatch.context() as m:
            m.setattr(scan, "scan_envelope", envelope)
            m.setattr(scan, "scan_piece", piece)
            fast = _evidence(data, max_entries, from_file)
        with monkeypatch.context() as m:
            m.setenv(scan.ENV_OFF, "1")
            reference = _evidence(data, max_entries, from_file)
        assert fast == reference, from_file
    return min(read)


def _obj() -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(body(real_snapshots("hang")))
    return obj


@pytest.mark.parametrize("max_entries", [0, 1, 3, 200])
def test_real_bodies_at_every_window(monkeypatch: pytest.MonkeyPatch, max_entries: int) -> None:
    for fault in ("hang", "crash", "straggler", "p2p"):
        data = body(real_snapshots(fault))
        assert _same(data, monkeypatch, max_entries) > 0
        assert _same(gzip.compress(data), monkeypatch, max_entries) > 0
    for path in sorted(NODE.glob("*/*.json")):  # sidecar evidence captures (envelopes with errors)
        _same(path.read_bytes(), monkeypatch, max_entries)


def test_pieces_left_to_the_reference_beside_scanned_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    obj = _obj()
    ranks = obj["ranks"]
    odd = [copy.deepcopy(ranks[0]) for _ in range(8)]
    for entry in odd[6]["trace"]["entries"]:
        entry["frames"] = []  # every entry's frames an empty list: read as the reference keeps them
    odd[7]["trace"]["entries"][0]["frames"] = []  # one entry's only
    odd[0]["timings"] = {"format": 1, "rows": []}  # the rank's own times: apply_timings' work
    odd[1]["trace"]["entries"][0]["frames"] = [{"name": "f", "filename": "x.py", "line": 3}]
    odd[2]["trace"]["entries"][0]["duration_ms"] = 5  # an int where the scanner takes a float only
    odd[3]["trace"]["entries"] = []
    odd[4]["entries_dropped"] = 7
    odd[5]["trace"]["entries"][1]["state"] = 5  # irregular: read row by row
    obj["ranks"] = [*ranks, *odd, [1, 2], {"no": "trace"}]
    data = json.dumps(obj).encode()
    for max_entries in (0, 2, 200):
        assert _same(data, monkeypatch, max_entries) >= len(ranks)


def test_duplicate_keys_and_what_surrounds_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    data = json.dumps(_obj()).encode()
    at = data.index(b'"ranks"')
    _same(data[:at] + b'"ranks": [{"x": 1}], "pod": "earlier", ' + data[at:], monkeypatch)  # the file decoder
    # reads the first "ranks", json (and the bytes decoder) the last: each the same with the scanner as without
    assert _same(data[:-1] + b', "pod": "later", "errors": [{"rank": 3, "message": "gone"}]}', monkeypatch) > 0
    assert _same(b" \n" + data + b"\r\n\t", monkeypatch) > 0


def test_hostile_bodies_are_refused_or_read_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    obj = _obj()
    data = json.dumps(obj).encode()
    many = dict(obj, ranks=[obj["ranks"][0]] * (MAX_PIECES + 1))
    for hostile in (
        json.dumps(many).encode(),  # more pieces than a pod hosts
        data.replace(b'"ranks": [', b'"ranks": [' + b"[" * 300 + b"]" * 300 + b", ", 1),  # a piece nested deep
        data.replace(b'"ranks": [', b'"ranks": [' + b",".join([b"[]"] * 20000) + b", ", 1),  # a dense piece
        data.replace(b'"ranks": [', b'"ranks": 5, "x": [', 1),
        data.replace(b'"reason": "stall"', b'"reason": 1' + b"0" * 40, 1),  # an int past int64: read as null
        data.replace(b'"stall"', b'"\\ud800"', 1),
        data.replace(b'"reason": "stall"', b'"reason": NaN', 1),  # NaN: the operator reads it as null
        b"\xef\xbb\xbf" + data,
        data + b"x",
    ):
        _same(hostile, monkeypatch)
    for cut in range(0, len(data), max(97, len(data) // 150)):
        _same(data[:cut], monkeypatch)
    rng = random.Random(36)
    for _ in range(120):
        buf = bytearray(data)
        for _ in range(rng.choice((1, 2, 8))):
            buf[rng.randrange(len(buf))] = rng.choice((rng.randrange(256), rng.choice(b'{}[],:"\\0123456789')))
        _same(bytes(buf), monkeypatch)


def test_windows_that_end_inside_a_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file decoder reads a piece's window at the size of the piece before it, from a first read: a
    window that ends inside the piece is declined by the scanner and read again larger."""
    monkeypatch.setattr(push_decode, "FIRST_READ", 512)
    obj = _obj()
    big = copy.deepcopy(obj["ranks"][1])
    big["trace"]["entries"] = big["trace"]["entries"] * 40
    obj["ranks"][1:1] = [big]
    assert _same(json.dumps(obj).encode(), monkeypatch, 0) > 0


def test_not_built_or_turned_off_reads_the_reference_way(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(scan.ENV_OFF, "1")
    assert pod_evidence._scanned_body(json.dumps(_obj()).encode(), 200) is None
    assert scan.scan_piece(json.dumps(_obj()["ranks"][0]).encode(), 200, lambda name: (None, name, None)) is None
