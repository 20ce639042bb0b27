"""The C scanner (`frscope.records._frscan`, wrapped by `records.scan`) against the reference reader.

For every pickle it either declines (None: the loader then reads the file the reference way) or gives exactly
what the reference gives: `safe_pickle.safe_loads` then `normalize_dump(columnar=True)`. Real fixtures,
every synthetic scenario in both backends' shapes, the protocols Python's pickler writes, and hostile bytes
(truncations, byte flips, huge lengths and memo indexes, deep nesting, globals): declined or identical, never
a crash."""

from __future__ import annotations

import copy
import gzip
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

from frscope.records import load_dumps, scan
from frscope.records.errors import DumpError
from frscope.records.model import Entry, LazyFrames
from frscope.records.normalize import entries_of, normalize_dump, parse_profiling_name
from frscope.records.safe_pickle import safe_loads
from frscope.testing.synthetic import SCENARIOS, generate

pytestmark = pytest.mark.skipif(
    scan._frscan is None,
    reason="the optional C scanner is not built (no compiler at install time; `python setup.py build_ext "
    "--inplace` builds it): the reference path reads every dump",
)

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
PICKLES = sorted(p for d in REAL.iterdir() if d.is_dir() for p in d.iterdir() if p.read_bytes()[:1] == b"\x80")


def _entry(entry: Entry) -> tuple[Any, ...]:
    return tuple(getattr(entry, name) for name in Entry.__slots__ if name != "_frames") + (entry.frames,)


def _summary(dump: Any) -> tuple[Any, ...]:
    return (dump.rank, dump.version, dump.backend, dump.pg_config, dump.pg_status, dump.comm_lib_version,
            dump.warnings, [_entry(e) for e in dump.entries])


def _lazy(data: bytes) -> LazyFrames:
    return LazyFrames(lambda: entries_of(safe_loads(data, "x")))


def _reference(data: bytes) -> Any:
    try:
        return _summary(normalize_dump(safe_loads(data, "x"), "x", 7, _lazy(data), columnar=True))
    except DumpError as exc:
        return ("refused", type(exc).__name__)


def _scanned(data: bytes) -> Any:
    got = scan.scan_dump(data, _lazy(data), parse_profiling_name)
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


@pytest.mark.parametrize("path", PICKLES, ids=[f"{p.parent.name}/{p.name}" for p in PICKLES])
def test_real_fixture_is_read_and_identical(path: Path) -> None:
    assert _declined_or_same(path.read_bytes())


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_what_pythons_pickler_writes(protocol: int) -> None:
    for path in PICKLES[::5]:
        raw = safe_loads(path.read_bytes(), str(path))
        assert _declined_or_same(pickle.dumps(raw, protocol=protocol))


CASES = [(s, shape) for s in SCENARIOS for shape in ("nccl", "gloo") if not (s == "p2p_mismatch" and shape == "gloo")]


@pytest.mark.parametrize(("scenario", "shape"), CASES)
def test_synthetic_scenario(tmp_path: Path, scenario: str, shape: str) -> None:
    generate(tmp_path, 16, entries=80, shape=shape, fmt="pickle", scenario=scenario, seed=3, tp=2,
             pp=2 if shape == "nccl" else 1)
    read = 0
    for path in sorted(tmp_path.iterdir()):
        data = path.read_bytes()
        if data[:1] == b"\x80":
            read += _declined_or_same(data)
    assert read > 0


def test_irregular_entries_are_declined_and_read_the_reference_way() -> None:
    raw = safe_loads(PICKLES[0].read_bytes(), "x")
    variants = []
    for field, value in [("record_id", 1.5), ("state", 3), ("is_p2p", 1), ("time_created_ns", -5),
                         ("input_sizes", [[True]]), ("process_group", ("a",)), ("thread_id", 12),
                         ("duration_ms", 2), ("timeout_ms", True), ("collective_seq_id", 1 << 70)]:
        changed = copy.deepcopy(raw)
        changed["entries"][-1][field] = value
        variants.append(changed)
    missing = copy.deepcopy(raw)
    del missing["entries"][0]["state"]
    variants.append(missing)
    for variant in variants:
        data = pickle.dumps(variant, protocol=2)
        assert _scanned(data) is None
        assert _reference(data) is not None


def test_stacks_that_are_not_lists_keep_frames_in_the_file() -> None:
    raw = safe_loads(PICKLES[0].read_bytes(), "x")
    raw["entries"][0]["frames"] = None
    data = pickle.dumps(raw, protocol=2)
    assert _declined_or_same(data)


def test_truncated_at_every_byte_is_declined() -> None:
    data = min((p.read_bytes() for p in PICKLES), key=len)
    for cut in range(len(data)):
        assert scan.scan_dump(data[:cut], _lazy(data), parse_profiling_name) is None


def test_byte_flips_are_declined_or_identical() -> None:
    rng = random.Random(15)
    read = 0
    for path in PICKLES[:12]:
        data = path.read_bytes()
        for _ in range(150):
            buf = bytearray(data)
            for _ in range(rng.choice((1, 1, 2, 8))):
                buf[rng.randrange(2, len(buf))] = rng.randrange(256)
            read += _declined_or_same(bytes(buf))
    assert read > 0  # some flips land in values (a time, a digit of a string) and stay regular


def test_hostile_pickles_are_declined() -> None:
    frame = b"\x80\x02}q\x00(X\x07\x00\x00\x00entriesq\x01]q\x02"
    hostile = [
        b"\x80\x02X\xff\xff\xff\x7fabc.",  # a string longer than the file
        b"\x80\x02r\xff\xff\xff\x7f.",  # LONG_BINPUT of an index far past the file
        b"\x80\x02j\x05\x00\x00\x00.",  # a memo index never put
        b"\x80\x02" + b"]" * 100000 + b".",  # many values left on the stack
        b"\x80\x02" + b"(" * 100000 + b"t" * 100000 + b".",  # tuples nested 100,000 deep
        b"\x80\x02" + b"]q\x00" + b"(h\x00e" * 10 + b"h\x00.",  # a list inside itself
        b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85R.",  # GLOBAL + REDUCE
        b"\x80\x02ctorch.jit._pickle\nrestore_type_tag\n}X\x03\x00\x00\x00Anyq\x00\x86R.",  # the JIT's wrapper
        b"\x80\x02}(K\x01K\x02u.",  # a non-str key
        b"\x80\x02X\x02\x00\x00\x00\xc3\x28.",  # invalid UTF-8
        b"\x80\x02\x8a\x09" + b"\xff" * 9 + b".",  # an int past int64
        b"\x80\x02N.junk",  # bytes after STOP
        b"\x80\x02(N.",  # STOP with a mark open
        b"\x80\x02Ne.",  # APPENDS without a mark
        b"\x80\x02NNa.",  # APPEND to a non-list
        b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7fN.",  # a frame longer than the file
        b"\x80\x06N.",  # an unknown protocol
        b"\x80\x02P0\n.",  # a persistent id
        frame + b"(}q\x03(" + b"X\x09\x00\x00\x00record_idK\x01" + b"u" + b"e" + b"u.",  # an entry lacking fields
        frame + b"e" + b"u.",  # no entries
    ]
    # A list referenced 2**40 times over (shared references would make a naive walk exponential).
    bomb = b"\x80\x02]q\x00"
    for i in range(40):
        bomb += b"]q" + bytes([i + 1]) + b"(h" + bytes([i]) + b"h" + bytes([i]) + b"e"
    hostile.append(frame + b"(}(X\x0b\x00\x00\x00input_sizes" + bomb[2:] + b"ue" + b"u.")
    for data in hostile:
        assert scan.scan_dump(data, _lazy(data), parse_profiling_name) is None, data[:40]


def test_deep_nesting_inside_an_entry_is_declined() -> None:
    raw = safe_loads(PICKLES[0].read_bytes(), "x")
    deep: Any = [[1]]
    for _ in range(200):
        deep = [deep]
    raw["entries"][0]["input_sizes"] = deep
    data = pickle.dumps(raw, protocol=2)
    assert _scanned(data) is None


def test_memory_budget_is_respected() -> None:
    data = PICKLES[0].read_bytes()
    assert scan._frscan.scan(data, 1024) is None  # far too little: declined, not a crash
    assert scan._frscan.scan(data, 1 << 30) is not None


def test_env_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: Any) -> None:
        raise AssertionError("the scanner ran")

    monkeypatch.setenv(scan.ENV_OFF, "1")
    monkeypatch.setattr(scan._frscan, "scan", refuse)
    assert not scan.available()
    dumps = load_dumps([PICKLES[0].parent], jobs=1)
    assert dumps.dumps and not dumps.problems


def test_gzipped_pickles_are_scanned(tmp_path: Path) -> None:
    source = PICKLES[0]
    (tmp_path / source.name).write_bytes(gzip.compress(source.read_bytes()))
    calls: list[int] = []
    real = scan._frscan.scan

    def counting(data: bytes, budget: int) -> Any:
        calls.append(len(data))
        return real(data, budget)

    scan_mod: Any = scan
    original = scan_mod._frscan.scan
    scan_mod._frscan.scan = counting
    try:
        fast = load_dumps([tmp_path], jobs=1)
    finally:
        scan_mod._frscan.scan = original
    assert calls and fast.dumps
    reference = load_dumps([tmp_path], jobs=1, columnar=False)
    assert [_entry(e) for e in fast.dumps[next(iter(fast.dumps))].entries] == [
        _entry(e) for e in reference.dumps[next(iter(reference.dumps))].entries]

