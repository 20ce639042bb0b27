"""The C scanner's JSON front-end (`_frscan.scan_json`, wrapped by `records.scan.scan_json_dump`) against the
reference reader.

For every JSON text it either declines (None: the loader then reads the file the reference way) or gives exactly
what the reference gives: `json.loads` (as `loader.decode_bytes` calls it) then `normalize_dump(columnar=True)`.
Every JSON fixture in tests/data, every synthetic scenario in both backends' shapes, random programs' JSON and
snapshot-piece forms, the ways Python's json writes one dump (indented, ASCII-escaped, sorted), and hostile text
(truncations, byte flips, deep nesting, huge numbers, NaN / Infinity, duplicate keys, a BOM, bad escapes and bad
UTF-8): declined or identical, never a crash."""

from __future__ import annotations

import copy
import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

from frscope.records import load_dumps, scan
from frscope.records.errors import DumpError
from frscope.records.loader import decode_bytes
from frscope.records.model import Entry, LazyFrames
from frscope.records.normalize import entries_of, normalize_dump, parse_profiling_name
from frscope.testing.randprog.case import make_case, write_form
from frscope.testing.synthetic import SCENARIOS, generate

pytestmark = pytest.mark.skipif(
    scan._frscan is None,
    reason="the optional C scanner is not built (no compiler at install time; `python setup.py build_ext "
    "--inplace` builds it): the reference path reads every dump",
)

DATA = Path(__file__).resolve().parents[1] / "data"
JSONS = sorted(DATA.rglob("*.json"))
PIECES = sorted(p for p in (DATA / "real").glob("*/rank-*.json"))


def _entry(entry: Entry) -> tuple[Any, ...]:
    return tuple(getattr(entry, name) for name in Entry.__slots__ if name != "_frames") + (entry.frames,)


def _summary(dump: Any) -> tuple[Any, ...]:
    return (dump.rank, dump.version, dump.backend, dump.pg_config, dump.pg_status, dump.comm_lib_version,
            dump.stacks, dump.captured_at_ns, dump.captured_at_source, dump.host, dump.warnings,
            [_entry(e) for e in dump.entries])


def _lazy(data: bytes) -> LazyFrames:
    return LazyFrames(lambda: entries_of(decode_bytes(data, "x")))


def _reference(data: bytes) -> Any:
    try:
        return _summary(normalize_dump(decode_bytes(data, "x"), "x", 7, _lazy(data), columnar=True))
    except DumpError as exc:
        return ("refused", type(exc).__name__)


def _scanned(data: bytes) -> Any:
    got = scan.scan_json_dump(data, _lazy(data), parse_profiling_name)
    if got is None:
        return None
    meta, table, backend = got
    return _summary(normalize_dump(meta, "x", 7, _lazy(data), columnar=True, prebuilt=(table, backend)))


def _declined_or_same(data: bytes) -> bool:
    """True when the scanner read it (and then it must equal the reference), False when it declined."""
    got = _scanned(data)
    if got is None:
        return False
    assert got == _reference(data)
    return True


def _piece() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(PIECES[0].read_bytes())
    return raw


def _dumps(obj: Any, **kw: Any) -> bytes:
    return json.dumps(obj, **kw).encode()


@pytest.mark.parametrize("path", JSONS, ids=[str(p.relative_to(DATA)) for p in JSONS])
def test_every_json_fixture_is_declined_or_identical(path: Path) -> None:
    read = _declined_or_same(path.read_bytes())
    if path in PIECES:  # frscope's snapshot pieces of real torch jobs: the regular shape, read by the scanner
        assert read


def test_what_pythons_json_writes() -> None:
    for path in PIECES[::4]:
        raw = json.loads(path.read_bytes())
        for kw in ({}, {"indent": 2}, {"sort_keys": True, "separators": (",", ":")}, {"ensure_ascii": False},
                   {"indent": "\t", "ensure_ascii": True}):
            assert _declined_or_same(_dumps(raw, **kw)), kw
        assert _declined_or_same(_dumps(raw["trace"]))  # the bare recorder, as torch answers it


CASES = [(s, shape) for s in SCENARIOS for shape in ("nccl", "gloo") if not (s == "p2p_mismatch" and shape == "gloo")]


@pytest.mark.parametrize(("scenario", "shape"), CASES)
def test_synthetic_scenario(tmp_path: Path, scenario: str, shape: str) -> None:
    generate(tmp_path, 16, entries=80, shape=shape, fmt="json", scenario=scenario, seed=3, tp=2,
             pp=2 if shape == "nccl" else 1)
    read = sum(_declined_or_same(path.read_bytes()) for path in sorted(tmp_path.iterdir()))
    assert read > 0


def test_random_programs_json_and_snapshot_forms(tmp_path: Path) -> None:
    """Random programs' files in every recorder format version they write (older ones lack fields the scanner
    needs: declined, read the reference way)."""
    read = 0
    for seed in (1, 2, 3, 5, 8, 13, 21, 34):
        case = make_case(seed)
        for form in ("json", "snapshot"):
            for path in write_form(case, form, tmp_path / str(seed) / form):
                read += _declined_or_same(path.read_bytes())
    assert read > 0


def test_strings_with_escapes_and_non_ascii_agree() -> None:
    raw = _piece()
    entries = raw["trace"]["entries"]
    texts = ["caf\u00e9 \u20ac", "emoji \U0001f600 pair", 'quote " back \\ slash / tab \t nl \n', "\x00nul\x1f",
             "\u2028\u2029", "plain"]
    for i, text in enumerate(texts):
        entries[i % len(entries)]["thread_name"] = text
    raw["stacks"] = "".join(texts)
    raw["trace"]["pg_config"]["x\u00e9"] = {"name": "\U0001f600", "desc": "d", "ranks": "[0, 1]"}
    for ensure_ascii in (True, False):
        assert _declined_or_same(_dumps(raw, ensure_ascii=ensure_ascii))
    # Escapes written by hand: upper- and lower-case hex, an escaped solidus, a pair for U+1F600.
    text = _dumps(raw).replace(b'"plain"', b'"\\u00E9\\u00e9\\/\\uD83D\\uDE00"')
    assert _declined_or_same(text)


def test_numbers_agree_with_pythons_json() -> None:
    raw = _piece()
    entry = raw["trace"]["entries"][0]
    text = _dumps(raw)
    read = 0
    for literal in (b"0", b"-0", b"0.5", b"-0.0", b"1e3", b"1E+3", b"2.5e-3", b"1e400", b"-1e400",
                    b"0.1000000000000000055511151231257827", b"123456789012345678", b"9223372036854775807",
                    b"-9223372036854775808"):
        for field in ("duration_ms", "timeout_ms", "time_created_ns", "record_id"):
            changed = copy.deepcopy(raw)
            changed["trace"]["entries"][0][field] = "@@"
            data = _dumps(changed).replace(b'"@@"', literal)
            read += _declined_or_same(data)
    assert read > 0
    assert entry  # the fixture has entries to change
    assert _declined_or_same(text)


def test_duplicate_keys_keep_the_last_as_pythons_json_does() -> None:
    raw = _piece()
    text = _dumps(raw)
    entry_start = text.index(b'{"', text.index(b'"entries"'))
    for dup in (b'"state": "scheduled", ', b'"record_id": 999999, ', b'"profiling_name": "nccl:broadcast", ',
                b'"process_group": ["9", "x"], ', b'"duration_ms": 1.5, '):
        assert _declined_or_same(text[: entry_start + 1] + dup + text[entry_start + 1:])
    # A repeated "entries" in the trace, a repeated "trace" in the piece, a repeated "rank": the last wins.
    trace_at = text.index(b'"trace": {') + len(b'"trace": {')
    assert _declined_or_same(text[:trace_at] + b'"entries": [], ' + text[trace_at:])
    assert _declined_or_same(text[:1] + b'"trace": {"entries": [1]}, "rank": 3, ' + text[1:])
    last = _dumps(raw["trace"])
    assert _declined_or_same(last[:-1] + b', "entries": ' + json.dumps(raw["trace"]["entries"][:2]).encode() + b"}")


def test_hostile_text_is_declined() -> None:
    trace = _dumps(_piece()["trace"])
    hostile = [
        b"\xef\xbb\xbf" + trace,  # a BOM
        trace.replace(b'"python"', b'"\\ud800"', 1),  # a lone high surrogate, escaped
        trace.replace(b'"python"', b'"\\udc00x"', 1),  # a lone low surrogate
        trace.replace(b'"python"', b'"\\ud800\\u0041"', 1),  # a high surrogate and no low one
        trace.replace(b'"python"', b'"\xed\xa0\x80"', 1),  # a surrogate encoded in UTF-8
        trace.replace(b'"python"', b'"\xc3\x28"', 1),  # invalid UTF-8
        trace.replace(b'"python"', b'"\xc0\xaf"', 1),  # an overlong form
        trace.replace(b'"python"', b'"\xf4\x90\x80\x80"', 1),  # past U+10FFFF
        trace.replace(b'"python"', b'"a\tb"', 1),  # a raw control character
        trace.replace(b'"python"', b'"\\x41"', 1),  # an escape JSON has not
        trace.replace(b'"python"', b'"\\u12G4"', 1),  # a bad hex digit
        trace.replace(b'"timeout_ms": ', b'"timeout_ms": 1' + b"0" * 30 + b", \"x\": ", 1),  # an int past int64
        trace.replace(b'"timeout_ms": ', b'"timeout_ms": NaN, "x": ', 1),
        trace.replace(b'"timeout_ms": ', b'"timeout_ms": -Infinity, "x": ', 1),
        trace.replace(b'"timeout_ms": ', b'"timeout_ms": 01, "x": ', 1),  # a leading zero
        trace.replace(b'"timeout_ms": ', b'"timeout_ms": 1., "x": ', 1),
        trace.replace(b'"timeout_ms": ', b'"timeout_ms": .5, "x": ', 1),
        trace.replace(b'"timeout_ms": ', b'"timeout_ms": 1e, "x": ', 1),
        trace.replace(b'"is_p2p": false', b'"is_p2p": False', 1),
        trace + b" x",  # something after the value
        trace + b"\x0b",  # whitespace JSON has not
        trace[:-1] + b",}",  # a trailing comma
        b'{"entries": [' + b"[" * 100000 + b"]" * 100000 + b"]}",  # nested 100,000 deep
        b'{"entries": [{"record_id": ' + b"9" * 5000 + b"}]}",  # past Python's int() digit limit
        b'{"entries": [], "x": ' + b'"' + b"a" * 1000,  # an unterminated string
        b"[]", b"{}", b"", b"   ", b"null",
    ]
    for data in hostile:
        assert _scanned(data) is None, data[:60]


def test_truncated_at_every_97th_byte_is_declined() -> None:
    data = min((p.read_bytes() for p in PIECES), key=len)
    for cut in range(0, len(data), 97):
        assert _scanned(data[:cut]) is None


def test_byte_flips_are_declined_or_identical() -> None:
    rng = random.Random(36)
    read = 0
    for path in PIECES[:8]:
        data = _dumps(json.loads(path.read_bytes())["trace"])
        for _ in range(60):
            buf = bytearray(data)
            for _ in range(rng.choice((1, 1, 2, 8))):
                buf[rng.randrange(1, len(buf))] = rng.choice((rng.randrange(256), rng.choice(b'{}[],:"\\0123456789')))
            read += _declined_or_same(bytes(buf))
    assert read > 0  # some flips land in a digit of a time or a letter of a string and stay regular


def test_deep_nesting_inside_an_entry_is_declined() -> None:
    raw = _piece()
    deep: Any = [[1]]
    for _ in range(200):
        deep = [deep]
    raw["trace"]["entries"][0]["input_sizes"] = deep
    assert _scanned(_dumps(raw)) is None


def test_too_many_containers_for_the_size_is_left_to_the_reference() -> None:
    """decode_bytes refuses text with more containers than its size allows before decoding it: so does the
    scanner (it declines; the reference then reports it)."""
    dense = b'{"entries": [' + b",".join([b"[]"] * 5000) + b"]}"
    assert _reference(dense) == ("refused", "MalformedDump")
    assert _scanned(dense) is None


def test_memory_budget_is_respected() -> None:
    data = PIECES[0].read_bytes()
    assert scan._frscan.scan_json(data, 1024, True) is None
    assert scan._frscan.scan_json(data, 1 << 30, True) is not None
    assert scan._frscan.scan_json(data, 1 << 30) is None  # a piece's entries are its trace's: only when asked


def test_pieces_with_their_own_timings_are_left_to_the_reference() -> None:
    raw = _piece()
    raw["timings"] = {"format": 1, "rows": []}
    assert _scanned(_dumps(raw)) is None


def test_loader_reads_json_dumps_with_the_scanner_as_without(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    for path in PIECES[:4]:
        (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / "rank-4.json.gz").write_bytes(gzip.compress(_dumps(json.loads(PIECES[0].read_bytes())["trace"])))
    calls: list[int] = []
    real = scan._frscan.scan_json

    def counting(data: bytes, budget: int, pieces: bool = False) -> Any:
        calls.append(len(data))
        return real(data, budget, pieces)

    monkeypatch.setattr(scan._frscan, "scan_json", counting)
    fast = load_dumps([tmp_path], jobs=1)
    assert len(calls) == 5
    monkeypatch.setenv(scan.ENV_OFF, "1")
    reference = load_dumps([tmp_path], jobs=1)
    assert len(calls) == 5
    assert sorted(fast.dumps) == sorted(reference.dumps) == [0, 1, 2, 3, 4]
    for rank, dump in fast.dumps.items():
        assert _summary(dump) == _summary(reference.dumps[rank])
    assert [(p.source, p.message) for p in fast.problems] == [(p.source, p.message) for p in reference.problems]
