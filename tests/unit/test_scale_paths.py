"""The shortcuts the loader and the analysis take at scale give exactly what the plain paths give.

- `_frscan.index_contiguous` (one C pass for the per-group index) against `index_groups`' Python loop, on every
  synthetic scenario and on shapes it must decline (coalesced ops, gaps, seqs out of order, the int64 edge);
- the scanner's stack frames against `frames_from_raw` for hostile frame dicts (long names, wrong types, junk);
- `EntryTable.open_mask` / `first_open` against a walk over the entries;
- rank lists travelling between processes by reference (`records.transfer`): one shared tuple per distinct
  list, a reference never met refused, and `build_groups` voting by content when equal lists are distinct
  objects.
"""

from __future__ import annotations

import copy
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

from frscope.records import group_index, load_dumps, scan, transfer
from frscope.records.columns import EntryTable
from frscope.records.membership import build_groups
from frscope.records.model import COMPLETED, LazyFrames, PgConfig, RankDump, frames_from_raw
from frscope.records.normalize import entries_of, normalize_dump, parse_profiling_name
from frscope.records.safe_pickle import safe_loads
from frscope.testing.synthetic import SCENARIOS, generate, iter_dumps, make_plan

needs_scanner = pytest.mark.skipif(scan._frscan is None, reason="the optional C scanner is not built")


def _raw_dumps(shape: str, scenario: str = "not_joined", ranks: int = 8) -> list[dict[str, Any]]:
    plan = make_plan(ranks, entries=80, shape=shape, scenario=scenario, seed=4, tp=2,
                     pp=2 if shape == "nccl" else 1)
    return [dump for _rank, dump in iter_dumps(plan)]


def _table(raw: dict[str, Any]) -> EntryTable:
    dump = normalize_dump(raw, "r", 1, LazyFrames(lambda: raw.get("entries")), columnar=True)
    assert isinstance(dump.entries, EntryTable)
    return dump.entries


def _index_state(table: EntryTable) -> tuple[Any, ...]:
    table._groups = None
    groups = table.groups()
    return ({name: tuple((slot, getattr(index, slot)) for slot in index.__slots__ if slot != "_position")
             for name, index in groups.items()}, table.sigs)


def _both_ways(table: EntryTable, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The index with the C pass and with the Python loop are equal; True when the C pass took it."""
    took = group_index._index_contiguous(table, *_index_args(table)) is not None
    fast = _index_state(table)
    with monkeypatch.context() as patch:
        patch.setattr(group_index, "_index_contiguous", lambda *args: None)
        slow = _index_state(table)
    assert fast == slow
    return took


def _index_args(table: EntryTable) -> tuple[Any, ...]:
    from array import array
    names = list(dict.fromkeys(name for name, _desc in table.pgs))
    of_code = [names.index(name) for name, _desc in table.pgs]
    gid = array("I", map(of_code.__getitem__, table.pg))
    ops = list(dict.fromkeys(op for _pn, op, _peer in table.names))
    return gid, names, [ops.index(op) for _pn, op, _peer in table.names], max(1, len(table.shapes))


@needs_scanner
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("shape", ["nccl", "gloo"])
def test_c_group_index_equals_the_python_loop(scenario: str, shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if scenario == "p2p_mismatch" and shape == "gloo":
        pytest.skip("p2p_mismatch needs the NCCL shape")
    took = [_both_ways(_table(raw), monkeypatch) for raw in _raw_dumps(shape, scenario)]
    assert any(took)  # the regular shape is the C pass's


@needs_scanner
def test_c_group_index_declines_what_it_does_not_handle(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _raw_dumps("nccl")[3]
    entries = raw["entries"]
    seq_of = [e["collective_seq_id"] for e in entries]
    cases = {
        "coalesced": {10: {"collective_seq_id": seq_of[9]}},
        "gap": {20: {"collective_seq_id": 10**12}},
        "int64 edge": {len(entries) - 1: {"collective_seq_id": (1 << 63) - 1}},
    }
    for what, changes in cases.items():
        changed = copy.deepcopy(raw)
        for i, fields in changes.items():
            changed["entries"][i] = {**changed["entries"][i], **fields}
        # Same group everywhere, so the changed entries are in one group's run.
        for i in changes:
            changed["entries"][i]["process_group"] = changed["entries"][9]["process_group"]
        assert not _both_ways(_table(changed), monkeypatch), what
    shuffled = copy.deepcopy(raw)
    random.Random(2).shuffle(shuffled["entries"])
    _both_ways(_table(shuffled), monkeypatch)
    # Completed, retired and open entries mixed: the first open seq per group.
    mixed = copy.deepcopy(raw)
    rng = random.Random(3)
    for entry in mixed["entries"]:
        entry["state"] = rng.choice(["scheduled", "started", COMPLETED])
        entry["retired"] = rng.choice([None, False, True])
    assert _both_ways(_table(mixed), monkeypatch)


def _pickled_with_frames(frames_of: list[Any]) -> bytes:
    raw = _raw_dumps("nccl")[1]
    for i, entry in enumerate(raw["entries"]):
        entry["frames"] = frames_of[i % len(frames_of)]
    return pickle.dumps(raw, protocol=2)


@needs_scanner
def test_scanned_frames_are_what_frames_from_raw_makes() -> None:
    long_name = "n" * 250 + "é"
    frames_of = [
        [{"name": long_name, "filename": "f" * 600, "line": 3}],
        [{"name": 7, "filename": None, "line": True}, "junk", 5, {"line": -1}],
        [{"name": "a", "filename": "b.py", "line": 1 << 31}, {"name": "a", "filename": "b.py", "line": (1 << 31) - 1}],
        [{"name": "x", "filename": "y", "line": 2.0, "extra": [1, 2]}],
        [{"name": "m" * 5000, "filename": "g" * 5000, "line": 9}],  # past the frame cache's key bound: not kept
        [],
    ]
    data = _pickled_with_frames(frames_of)
    got = scan.scan_dump(data, LazyFrames(lambda: entries_of(safe_loads(data, "x"))), parse_profiling_name)
    assert got is not None
    table = got[1]
    assert table.stacks is not None
    for i in range(len(table)):
        expected = tuple((f.name, f.filename, f.line) for f in frames_from_raw(frames_of[i % len(frames_of)]))
        assert table.stacks[table.stack[i]] == expected
        assert table.entry(i).frames == frames_from_raw(frames_of[i % len(frames_of)])


def test_open_mask_open_positions_and_first_open_match_a_walk() -> None:
    rng = random.Random(9)
    for trial in range(40):
        raw = copy.deepcopy(_raw_dumps("gloo" if trial % 2 else "nccl")[trial % 8])
        for entry in raw["entries"]:
            if rng.random() < 0.7:
                entry["state"] = rng.choice(["scheduled", "started", COMPLETED])
                entry["retired"] = rng.choice([None, False, True])
        table = _table(raw)
        walked = [not table.is_done(i) for i in range(len(table))]
        assert list(table.open_mask()) == [int(x) for x in walked]
        every = list(range(len(table)))
        for positions in (every, every[::7], every[:5], []):
            assert table.open_positions(positions) == [p for p in positions if walked[p]]
        first = next((i for i, x in enumerate(walked) if x), None)
        assert table.first_open() == first
        ids = list(table.record_id)
        for before in (ids[0], ids[len(ids) // 2], ids[-1] + 1, (first is not None and ids[first]) or 0):
            stop = next((i for i, r in enumerate(ids) if r >= before), len(ids))
            expected = first if first is not None and first < stop else None
            assert table.first_open(before) == expected


def _dump(rank: int, ranks: dict[str, tuple[int, ...]]) -> RankDump:
    return RankDump(rank=rank, source=f"r{rank}", version="2.10", backend="nccl", entries=[],
                    pg_config={k: PgConfig(k, k, "default_pg" if k == "0" else "x", v) for k, v in ranks.items()})


def test_rank_lists_travel_once_per_worker_and_arrive_shared() -> None:
    world = tuple(range(64))
    pair = (0, 1)
    lists = transfer._RankLists()
    session = object()
    first = [lists.ref(world, session), lists.ref(pair, session)]
    again = [lists.ref(world, session), lists.ref(tuple(range(64)), session)]
    assert [r for _d, r in first] == [world, pair]
    assert [r for _d, r in again] == [None, None]  # by digest: an equal list in another object too
    assert lists.ref(world, object())[1] == world  # a new load sends it again

    registry: dict[bytes, tuple[int, ...]] = {}
    frames: dict[Any, Any] = {}
    arrived = []
    for rank in range(3):
        # As between a worker and the parent (our own bytes, never a dump).
        shipped = pickle.loads(pickle.dumps(transfer.ship(_dump(rank, {"0": tuple(range(64)), "1": pair}), "s")))  # noqa: S301
        got = transfer.unship(shipped, registry, frames)
        assert isinstance(got, RankDump)
        arrived.append(got)
    assert all(d.pg_config["0"].ranks == world for d in arrived)
    assert len({id(d.pg_config["0"].ranks) for d in arrived}) == 1
    stray = transfer.ship(_dump(9, {"0": (5, 6)}), "other")
    assert isinstance(stray, tuple)
    stray[2]["0"] = (stray[2]["0"][0], None)
    with pytest.raises(transfer.UnknownRanks):
        transfer.unship(stray, registry, frames)


def test_parallel_load_shares_rank_lists_and_matches_serial(tmp_path: Path) -> None:
    generate(tmp_path, 40, entries=50, shape="nccl", scenario="not_joined", seed=1)
    serial = load_dumps([tmp_path], jobs=1)
    parallel = load_dumps([tmp_path], jobs=2)
    assert {r: d.pg_config for r, d in parallel.dumps.items()} == {r: d.pg_config for r, d in serial.dumps.items()}
    assert parallel.groups == serial.groups
    defaults = {id(d.pg_config["0"].ranks) for d in parallel.dumps.values()}
    assert len(defaults) == 1


def test_build_groups_votes_by_content_when_equal_lists_are_distinct_objects() -> None:
    dumps = {r: _dump(r, {"0": tuple(range(4)), "7": tuple([0, 1])}) for r in range(3)}
    dumps[3] = _dump(3, {"0": tuple(range(4)), "7": (0, 1, 2)})
    groups, world, warnings = build_groups(dumps)
    assert groups["7"].ranks == (0, 1)  # three votes to one, counted by content
    assert world == 4
    assert any("2 versions" in w for w in warnings)


@needs_scanner
def test_narrowed_keeps_every_int(monkeypatch: pytest.MonkeyPatch) -> None:
    from array import array
    cases = [("q", [-1, 5, 100]), ("q", [0, 40_000]), ("q", [-(1 << 31), (1 << 31) - 1]), ("q", [0, 1 << 40]),
             ("q", []), ("I", [1, 300]), ("I", [0, (1 << 32) - 1]), ("H", [7, 9]), ("q", [-5])]
    for typecode, values in cases:
        for signed in (True, False):
            column = array(typecode, values)
            fast = group_index.narrowed(column, signed)
            with monkeypatch.context() as patch:
                patch.setattr(group_index, "_frscan", None)
                slow = group_index.narrowed(column, signed)
            assert list(fast) == list(slow) == values
            assert fast.itemsize == slow.itemsize <= column.itemsize
