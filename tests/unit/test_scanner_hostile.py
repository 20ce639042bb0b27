"""Hostile dumps and bodies for the C scanners (`records/_frscan*.c`) and the readers around them: one test per
class of bug that the differential fuzzer (scripts/fuzz_scanners.py, `frscope.testing.scanfuzz`) and its review
found, and a short seeded fuzz. Each reading with the scanner must equal the pure-Python path's
(`FRSCOPE_NO_SCANNER=1`), or both must refuse alike with the typed error naming the field; nothing else may
escape, and a small input may not cost seconds."""

from __future__ import annotations

import json
import pickle
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest

from frscope.operator.evidence import push_decode
from frscope.operator.evidence.pod_evidence import from_bytes
from frscope.operator.evidence.sidecars import SidecarError
from frscope.records import scan
from frscope.records.limits import memory_budget
from frscope.records.loader import load_path
from frscope.records.model import LoadProblem
from frscope.testing.scanfuzz import TARGETS, check, inputs, seeds
from frscope.testing.scanfuzz.oracle import check_body, check_file
from tests.unit import builders as b
from tests.unit.operator.fakes import real_snapshots
from tests.unit.operator.test_http import body

pytestmark = pytest.mark.skipif(scan._frscan is None, reason="the optional C scanner is not built")

DATA = Path(__file__).resolve().parents[1] / "data"


def _scans(data: bytes) -> bool:
    """Whether the scanner reads `data` (a pickle or JSON dump) itself."""
    if data[:1] == b"\x80":
        return scan._frscan.scan(data, memory_budget(len(data))) is not None
    return scan._frscan.scan_json(data, memory_budget(len(data)), True) is not None


def _same_as_reference(data: bytes, tmp_path: Path, name: str = "trace_rank_1") -> None:
    findings = check_file(data, tmp_path, name, slow_s=60.0)  # time is asserted where it is the point
    assert not findings, [(f.kind, f.detail) for f in findings]


# -- the scanner's work on memo-shared dicts --------------------------------------------------------------------


def test_one_entry_dict_of_many_keys_listed_as_every_entry_is_declined(tmp_path: Path) -> None:
    """A pickle's memo lists one entry dict of 4,000 junk keys as each of 3,000 entries (2 bytes each): the
    extractor looked at every key of every entry (2.4e7 items for 73 KB; 0.9 MB took 114 s). Dict items looked
    at are bounded by the input's length: declined, and the reference reads it."""
    dump = b.dump([b.entry(1)], world=2)
    entry = dump["entries"][0] | {f"x{i}": 0 for i in range(4000)}
    dump["entries"] = [entry] * 3000
    data = pickle.dumps(dump, protocol=2)
    assert len(data) < 80 * 1024
    assert not _scans(data)
    _same_as_reference(data, tmp_path)
    dump["entries"] = [b.entry(1), b.entry(2)]  # the same dump without the shared dict: read by the scanner
    assert _scans(pickle.dumps(dump, protocol=2))


def test_one_frame_dict_of_many_keys_as_every_frame_is_declined(tmp_path: Path) -> None:
    """The same through a stack: one frame dict of 4,000 keys as each of 10,000 frames."""
    frame = {"name": "f", "filename": "x.py", "line": 3} | {f"x{i}": 0 for i in range(4000)}
    data = pickle.dumps(b.dump([b.entry(1, frames=[frame] * 10_000), b.entry(2)], world=2), protocol=2)
    assert not _scans(data)
    _same_as_reference(data, tmp_path)


# -- hash flooding ----------------------------------------------------------------------------------------------

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _colliding_names(count: int, prefix: bytes = b"nccl:al") -> list[str]:
    """15-character names whose interning keys (`intern_key` in _frscan.c: 'S', the length as 8 bytes, the
    bytes, hashed by `fnv`) hash alike in their low 20 bits: the last word is the hash's inverse at a chosen
    value. A fifth of a second in Python for a few hundred."""
    length = len(prefix) + 8
    h = 1469598103934665603 ^ (9 + length)
    for word in (b"S" + length.to_bytes(8, "little")[:7], length.to_bytes(8, "little")[7:] + prefix):
        h = ((h ^ int.from_bytes(word, "little")) * _GOLDEN) & _MASK
        h ^= h >> 29
    inverse = pow(_GOLDEN, -1, 1 << 64)
    rng = random.Random(7)
    out: list[str] = []
    while len(out) < count:
        target = rng.getrandbits(44) << 20
        x = target ^ (target >> 32)  # undo h ^= h >> 32
        x ^= (x >> 29) ^ (x >> 58)  # undo h ^= h >> 29
        raw = (((x * inverse) & _MASK) ^ h).to_bytes(8, "little")  # undo h = (h ^ w) * K
        if max(raw) < 0x80 and b'"' not in raw:
            out.append((prefix + raw).decode())
    return out


def test_profiling_names_crafted_to_collide_in_the_interning_table_are_declined(tmp_path: Path) -> None:
    """Distinct values whose hashes collide made every insertion walk one cluster: 60,000 such names in a
    7.5 MB pickle took 4.5 s to intern (quadratic). A lookup past 64 slots declines the scan."""
    names = _colliding_names(300)
    assert len(set(names)) == len(names)
    dump = b.dump([b.entry(i + 1) | {"profiling_name": name} for i, name in enumerate(names)], world=2)
    for data, name in ((pickle.dumps(dump, protocol=2), "trace_rank_1"), (json.dumps(dump).encode(), "rank_1.json")):
        assert not _scans(data)
        _same_as_reference(data, tmp_path, name)
    fair = b.dump([b.entry(i + 1) | {"profiling_name": f"nccl:op{i}"} for i in range(300)], world=2)
    assert _scans(pickle.dumps(fair, protocol=2)) and _scans(json.dumps(fair).encode())


def test_strings_crafted_to_collide_in_the_json_sharing_table_read_as_the_reference(tmp_path: Path) -> None:
    """The JSON parser shares equal short strings through a table with an unkeyed hash: 60,000 8-byte strings
    that land in one slot (1.3 MB) took 3.3 s (json.loads: 0.02 s). A lookup past 16 slots leaves the string
    unshared (0.01 s; the time is `scripts/fuzz_scanners.py`'s and the benchmarks' to measure, not a test's):
    the strings left unshared must still read exactly as the reference reads them. numpy inverts the hash for
    that many in a fraction of a second."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(3)
    found: list[Any] = []
    with np.errstate(over="ignore"):
        while sum(map(len, found)) < 40_000:
            target = rng.integers(0, 1 << 46, size=1 << 22, dtype=np.uint64) << np.uint64(17)
            x = target ^ (target >> np.uint64(29)) ^ (target >> np.uint64(58))  # str_hash, undone from its end
            x = x * np.uint64(pow(_GOLDEN, -1, 1 << 64))
            x = x ^ (x >> np.uint64(31)) ^ (x >> np.uint64(62))
            words = (x * np.uint64(pow(0xC2B2AE3D27D4EB4F, -1, 1 << 64))) ^ np.uint64(_GOLDEN ^ 8)
            found.append(words[(words & np.uint64(0x8080808080808080)) == 0])
    words = np.concatenate(found)[:40_000]
    strings = [int(w).to_bytes(8, "little").decode() for w in words]
    assert len(strings) == 40_000
    piece = json.loads((DATA / "real" / "hang" / "rank-0.json").read_bytes())
    piece["junk"] = strings
    data = json.dumps(piece).encode()
    assert _scans(data)
    _same_as_reference(data, tmp_path, "rank_0.json")


# -- the operator's body decoders around the scanner ----------------------------------------------------------


def _decoded(data: bytes, from_file: bool) -> Any:
    if not from_file:
        return from_bytes(data, "ep", origin="push", max_entries=3)
    with tempfile.NamedTemporaryFile(suffix=".json") as handle:
        handle.write(data)
        handle.flush()
        return push_decode.decode_file(handle.name, "ep", origin="push", max_entries=3)


def test_an_envelope_whose_errors_are_not_a_list_is_refused_naming_the_field(tmp_path: Path) -> None:
    """`"errors": 1.5` raised TypeError out of both decoders (the push handler catches SidecarError only: a 500,
    and a kept push that failed so stopped the operator's reload) and out of the CLI's loader."""
    data = body(real_snapshots("hang")).replace(b'"errors": []', b'"errors": 1.5', 1)
    assert b'"errors": 1.5' in data
    for from_file in (False, True):
        with pytest.raises(SidecarError, match="'errors' is not a list"):
            _decoded(data, from_file)
    (tmp_path / "pod.json").write_bytes(data)
    for off in ("", "1"):
        with pytest.MonkeyPatch.context() as m:
            m.setenv(scan.ENV_OFF, off)
            got = load_path(tmp_path / "pod.json", columnar=True)
        assert len(got) == 1 and isinstance(got[0], LoadProblem) and "'errors' is not a list" in got[0].message
    assert not check_body(data, slow_s=60.0)


def _deep_piece(depth: int) -> bytes:
    """A JSON array nested `depth` deep, padded so that it is not dense, with non-ASCII text in it."""
    return b'["\xc3\xa9\xc3\xa9",    ' * depth + b"1" + b"]" * depth


def test_a_piece_too_deep_for_json_that_goes_on_past_the_first_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file decoder reads a piece in windows; a piece too deep for json whose end lies past the window made
    `value_span` raise ValueError out of decode_file. It reads on (the piece is the rank's problem, as from
    bytes), counts the piece's end in bytes (it counted characters: the next piece was read from the wrong
    place), and refuses a piece that never ends with SidecarError, as from bytes."""
    monkeypatch.setattr(push_decode, "FIRST_READ", 4096)
    obj = json.loads(body(real_snapshots("hang")))
    good = json.dumps(obj["ranks"][0]).encode()
    deep = _deep_piece(3000)
    data = json.dumps(obj | {"ranks": []}).encode().replace(b'"ranks": []', b'"ranks": [' + deep + b", " + good + b"]")
    read = [_decoded(data, from_file) for from_file in (False, True)]
    for evidence in read:
        assert [d.rank for d in evidence.dumps] == [obj["ranks"][0]["rank"]]
        assert any("nested too deeply" in p.message for p in evidence.problems)
    assert not check_body(data, slow_s=60.0)
    cut = data[: data.index(deep) + len(deep) // 2]
    for from_file in (False, True):
        with pytest.raises(SidecarError):
            _decoded(cut, from_file)


# -- a short seeded fuzz ----------------------------------------------------------------------------------------

COUNTS = {"pickle": 120, "json": 60, "envelope": 12}


@pytest.fixture(scope="module")
def pools() -> dict[str, list[bytes]]:
    return seeds(DATA, max_bytes=64 * 1024)


@pytest.mark.parametrize("target", TARGETS)
def test_seeded_mutations_read_alike_with_and_without_the_scanner(tmp_path: Path, target: str,
                                                                  pools: dict[str, list[bytes]]) -> None:
    """A few seeded mutations per target (the fuzzer's, scripts/fuzz_scanners.py): no divergence, no foreign
    exception, no error out of the extension."""
    pool = pools[target]
    assert len(pool) >= 10
    rng = random.Random(20_260_607)
    done = 0
    for data, how in inputs(target, pool, rng):
        findings = [f for f in check(target, data, tmp_path, slow_s=60.0) if f.kind != "slow"]
        assert not findings, (how, len(data), [(f.kind, f.detail) for f in findings])
        done += 1
        if done >= COUNTS[target]:
            break
