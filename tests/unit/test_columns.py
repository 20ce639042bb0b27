"""The columnar form of a rank (`records.columns.EntryTable`, filled by `records.fastcols` or from the
reference rows) holds exactly what the row-by-row reference builds: every Entry attribute, the
backend, the warnings — also for entries no real dump has (junk types, out-of-range numbers, bools,
NaN, missing fields), which the fast path must either read identically or hand to the reference."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from frscope.records import Entry, load_dumps
from frscope.records.columns import EntryTable, unify_signatures
from frscope.records.model import LazyFrames
from frscope.records.normalize import normalize_dump
from frscope.testing.synthetic import iter_dumps, make_plan


def _key(value: Any) -> Any:
    """NaN never equals itself: compare it as a marker (no table keeps a NaN as a value)."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def _attrs(entry: Entry) -> tuple[Any, ...]:
    return tuple(_key(getattr(entry, name)) for name in Entry.__slots__ if name != "_frames") + (entry.frames,)


def _lazy(raw: dict[str, Any]) -> LazyFrames:
    """Frames left 'in the file': read again from the raw dump, as the loader's reader does."""
    return LazyFrames(lambda: raw.get("entries"))


def _both(raw: dict[str, Any], lazy: bool = True) -> None:
    reference = normalize_dump(raw, "r", 3, _lazy(raw) if lazy else None)
    columnar = normalize_dump(raw, "r", 3, _lazy(raw) if lazy else None, columnar=True)
    assert isinstance(columnar.entries, EntryTable)
    assert [_attrs(e) for e in columnar.entries] == [_attrs(e) for e in reference.entries]
    assert (columnar.backend, columnar.warnings) == (reference.backend, reference.warnings)
    assert [_attrs(e) for e in reversed(columnar.entries)] == [_attrs(e) for e in reversed(reference.entries)]
    if reference.entries:
        assert _attrs(columnar.entries[-1]) == _attrs(reference.entries[-1])


JUNK: list[Any] = [
    None, True, False, 0, -1, -2, 1, 2**63, 2**63 - 1, -(2**63) - 1, 10**30, 1.0, 1.5, -0.0, float("nan"),
    float("inf"), float("-inf"), "", "7", "x" * 300, "nccl:send 0->1", [], [1], [[1.0]], [[True]], [[2**70]],
    [[1, 2]] * 1100, [["a"]], [(1, 2)], ("a", "b"), ["a", "b"], ("a", 1), ("a", "b", "c"), {"a": 1}, [""],
    ["x" * 50], ["Float"], [[-2]], [[1] * 70], [{"name": "f", "filename": "a.py", "line": 3}],
    [{"name": 1, "filename": None, "line": "x"}, "junk"],
]


def _dumps(shape: str) -> list[dict[str, Any]]:
    plan = make_plan(8, entries=60, shape=shape, scenario="not_joined", seed=3, tp=2,
                     pp=2 if shape == "nccl" else 1)
    return [dump for _rank, dump in iter_dumps(plan)]


@pytest.mark.parametrize("shape", ["nccl", "gloo"])
def test_regular_dumps_take_the_fast_path_and_match(shape: str) -> None:
    for raw in _dumps(shape):
        _both(raw)
        _both(raw, lazy=False)  # frames kept: the reference rows fill the table


@pytest.mark.parametrize("shape", ["nccl", "gloo"])
def test_every_kind_of_junk_in_every_field_matches_the_reference(shape: str) -> None:
    rng = random.Random(11)
    base = _dumps(shape)[1]
    fields = sorted({k for e in base["entries"] for k in e})
    for trial in range(300):
        raw = {**base, "entries": [dict(e) for e in base["entries"]]}
        for _ in range(rng.choice((1, 1, 2, 5))):
            entry = rng.choice(raw["entries"])
            field = rng.choice(fields)
            if rng.random() < 0.1:
                entry.pop(field, None)
            else:
                entry[field] = rng.choice(JUNK)
        if trial % 50 == 0:
            raw["entries"].append("not an entry")
        _both(raw)


def test_empty_and_odd_entry_lists() -> None:
    for entries in ([], [None], [{}], ({"record_id": 1},)):
        _both({"version": "2.10", "entries": entries})


def test_group_index_matches_the_entries(tmp_path: Path) -> None:
    """Per group: buckets by seq in order of appearance, p2p ops, first / last / first-open seq; equal
    signature codes only for equal op, sizes and dtypes (after unify_signatures)."""
    rng = random.Random(5)
    raw = _dumps("nccl")[2]
    entries = raw["entries"]
    # Coalesced ops (two entries, one seq), a gap, and seqs out of order, in one group.
    entries[10] = {**entries[10], "collective_seq_id": entries[9]["collective_seq_id"]}
    entries[20] = {**entries[20], "collective_seq_id": 10**12}
    rng.shuffle(entries[30:40])
    dump = normalize_dump(raw, "r", 2, _lazy(raw), columnar=True)
    table = dump.entries
    assert isinstance(table, EntryTable)
    space = unify_signatures([table])
    listed = list(table)
    for name, index in table.groups().items():
        mine = [e for e in listed if e.pg_name == name]
        buckets: dict[int, list[Entry]] = {}
        for e in mine:
            if not e.is_p2p:
                buckets.setdefault(e.collective_seq_id, []).append(e)
        assert list(index.seq_list()) == list(buckets)
        for k, (seq, bucket) in enumerate(buckets.items()):
            assert index.position(seq) == k
            assert [_attrs(table.entry(p)) for p in index.bucket_positions(k)] == [_attrs(e) for e in bucket]
        assert [_attrs(table.entry(p)) for p in index.p2p] == [_attrs(e) for e in mine if e.is_p2p]
        if buckets:
            open_seqs = [s for s, b in buckets.items() for e in b if not e.completed]
            assert (index.first_seq, index.last_seq) == (min(buckets), max(buckets))
            assert index.next_seq == min(open_seqs, default=max(buckets) + 1)
        sigs = {}
        for k, bucket in enumerate(buckets.values()):
            content = tuple((e.op, e.input_sizes, e.output_sizes, e.input_dtypes, e.output_dtypes) for e in bucket)
            sigs.setdefault(index.sig[k], content)
            assert sigs[index.sig[k]] == content
        assert len(set(map(repr, sigs.values()))) == len(sigs)
    assert table.space is space


def test_tables_travel_between_processes_whole(tmp_path: Path) -> None:
    from frscope.testing.synthetic import generate

    generate(tmp_path, 16, entries=80, shape="nccl", fmt="pickle", scenario="size_mismatch", seed=2, tp=2, pp=2)
    inline = load_dumps([tmp_path], jobs=1)
    workers = load_dumps([tmp_path], jobs=2)
    for rank, dump in inline.dumps.items():
        other = workers.dumps[rank].entries
        assert isinstance(dump.entries, EntryTable) and isinstance(other, EntryTable)
        assert [_attrs(e)[:-1] for e in other] == [_attrs(e)[:-1] for e in dump.entries]
        assert set(dump.entries.groups()) == set(other.groups())


def test_stacks_in_the_table_are_the_frames_the_file_holds() -> None:
    """A rank's stacks become a few in the table, whether its frame dicts are shared (torch's pickler) or
    not (JSON); repeated or backwards record ids give the frames of the last entry with that id (what
    re-reading the file gives); frames that are not lists stay in the file."""
    raw = _dumps("nccl")[4]
    entries = raw["entries"]
    dump = normalize_dump(raw, "r", 4, _lazy(raw), columnar=True)
    assert isinstance(dump.entries, EntryTable) and dump.entries.stacks is not None
    assert len(dump.entries.stacks) <= 16  # a few dozen in a 2,000-entry ring buffer
    _both(raw)
    entries[7] = {**entries[7], "record_id": entries[3]["record_id"]}
    entries[9] = {**entries[9], "frames": entries[2]["frames"][:1]}
    _both(raw)
    plan = make_plan(8, entries=800, shape="nccl", scenario="healthy", seed=3, tp=2, pp=2)
    big = next(dump for _rank, dump in iter_dumps(plan))
    unshared = {**big, "entries": [{**e, "frames": [dict(f) for f in e["frames"]]} for e in big["entries"]]}
    table = normalize_dump(unshared, "r", 0, _lazy(unshared), columnar=True).entries
    assert isinstance(table, EntryTable) and table.stacks is not None and len(table.stacks) <= 16
    _both(unshared)
    odd = {**big, "entries": [dict(e) for e in big["entries"]]}
    odd["entries"][5]["frames"] = "not a list"
    table = normalize_dump(odd, "r", 0, _lazy(odd), columnar=True).entries
    assert isinstance(table, EntryTable) and table.stacks is None
    _both(odd)


def test_a_crafted_long_frames_list_is_left_in_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the cap on frame references a rank's stacks stay in the file, checked before a list is walked."""
    import frscope.records.fastcols as fastcols

    monkeypatch.setattr(fastcols, "MAX_FRAME_REFS", 500)
    raw = _dumps("gloo")[1]
    frame = raw["entries"][0]["frames"][0]
    raw["entries"][3] = {**raw["entries"][3], "frames": [frame] * 600}
    table = normalize_dump(raw, "r", 1, _lazy(raw), columnar=True).entries
    assert isinstance(table, EntryTable) and table.stacks is None
    _both(raw)
