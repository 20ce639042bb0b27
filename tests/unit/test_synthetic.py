"""The synthetic generator writes dumps in torch's shapes, with the answer it claims built in."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from frscope.records import load_dumps
from frscope.testing import synthetic
from frscope.testing.synthetic import GroundTruth, Plan, generate, make_plan, write_plan

ENTRIES = 150


def _read_pickle(path: Path) -> Any:
    # Our own freshly generated file, not an untrusted dump.
    return pickle.loads(path.read_bytes())  # noqa: S301


def _entries_at(dump: dict[str, Any], truth: GroundTruth) -> list[dict[str, Any]]:
    """The entries of the truth's group at the truth's sequence id."""
    out = []
    for e in dump["entries"]:
        if e["process_group"][0] != truth.group_name:
            continue
        if truth.p2p_seq_id is not None:
            if e["is_p2p"] and e["p2p_seq_id"] == truth.p2p_seq_id:
                out.append(e)
        elif not e["is_p2p"] and e["collective_seq_id"] == truth.collective_seq_id:
            out.append(e)
    return out


def test_nccl_pickle_loads_and_has_torchs_shape(tmp_path: Path) -> None:
    truth = generate(tmp_path, 16, entries=ENTRIES, scenario="not_joined", seed=3)
    files = sorted(tmp_path.iterdir())
    assert len(files) == 16
    assert all(f.name.startswith("nccl_trace_rank_") for f in files)

    raw = _read_pickle(tmp_path / "nccl_trace_rank_0")
    assert raw["version"] == "2.10"
    assert set(raw) == {"version", "pg_config", "comm_lib_version", "pg_status", "entries"}
    # pg_config: keyed by group name, every group this rank is in, ranks written as a string.
    assert raw["pg_config"]["0"] == {
        "name": "0",
        "desc": "default_pg",
        "ranks": str(list(range(16))),
    }
    assert all(isinstance(cfg["ranks"], str) for cfg in raw["pg_config"].values())
    assert {cfg["desc"] for cfg in raw["pg_config"].values()} == {"default_pg", "mesh_tp", "mesh_dp"}
    # pg_status: keyed by the local uid (the entries' pg_id), int values.
    assert set(raw["pg_status"]) == {str(e["pg_id"]) for e in raw["entries"]}
    assert all(isinstance(v, int) for s in raw["pg_status"].values() for v in s.values())

    entries = raw["entries"]
    assert len(entries) == ENTRIES
    first = entries[0]
    assert isinstance(first["process_group"], tuple)
    assert first["record_id"] > 0
    assert 4 <= len(first["frames"]) <= 12
    assert set(first["frames"][0]) == {"name", "filename", "line"}
    assert {e["state"] for e in entries} <= {"scheduled", "started", "completed"}
    done = [e for e in entries if e["state"] == "completed"]
    assert done and all(e["duration_ms"] > 0 and e["retired"] for e in done)
    assert all(e["time_discovered_completed_ns"] >= e["time_discovered_started_ns"] >= e["time_created_ns"]
               for e in done)
    # Record ids are consecutive per rank, across groups.
    assert [e["record_id"] for e in entries] == list(range(first["record_id"], first["record_id"] + ENTRIES))

    dumps = load_dumps([tmp_path])
    assert dumps.ranks_loaded == tuple(range(16))
    assert [p for p in dumps.problems if p.kind == "error"] == []
    assert dumps.world_size == 16
    assert all(d.backend == "nccl" and len(d.entries) == ENTRIES for d in dumps.dumps.values())
    assert truth.group_name is not None
    group = dumps.groups[truth.group_name]
    assert group.ranks == truth.group_ranks
    assert group.membership_source == "pg_config"


def test_ring_buffer_wrapped_sequence_ids_do_not_start_at_one() -> None:
    plan = make_plan(16, entries=ENTRIES, scenario="healthy")
    dump = plan.dump(5)
    first_seen: dict[str, int] = {}
    for e in dump["entries"]:
        first_seen.setdefault(e["process_group"][0], e["collective_seq_id"])
    assert all(seq > 1 for seq in first_seen.values())
    assert dump["entries"][0]["record_id"] > 0

    unwrapped = make_plan(16, entries=ENTRIES, scenario="healthy", wrap=False).dump(5)
    assert unwrapped["entries"][0]["record_id"] == 0
    assert unwrapped["entries"][0]["collective_seq_id"] == 1
    assert len(unwrapped["entries"]) < ENTRIES


def test_gloo_shape_has_the_pg_config_bug_and_only_scheduled_state(tmp_path: Path) -> None:
    truth = generate(tmp_path, 16, entries=ENTRIES, shape="gloo", scenario="not_joined", seed=1)
    raw = _read_pickle(tmp_path / "nccl_trace_rank_2")
    assert raw["pg_config"] == {"": {"name": "", "desc": "", "ranks": "[]"}}
    assert raw["comm_lib_version"] == ""
    entries = raw["entries"]
    assert {e["state"] for e in entries} == {"scheduled"}
    assert all(e["time_discovered_started_ns"] is None and e["time_discovered_completed_ns"] is None
               for e in entries)
    assert all("duration_ms" not in e for e in entries)
    assert not any(e["is_p2p"] for e in entries)
    assert all(e["profiling_name"].startswith("gloo:") for e in entries)
    assert entries[0]["process_group"] in {("0", "default_pg"), *((str(i), "mesh_tp") for i in range(1, 3)),
                                          *((str(i), "mesh_dp") for i in range(3, 11))}
    assert all(s["last_started_collective"] == -1 for s in raw["pg_status"].values())
    # Finished ops are retired; the one rank 2 is blocked in (if any) is not.
    assert sum(1 for e in entries if not e["retired"]) <= 1

    dumps = load_dumps([tmp_path])
    assert dumps.ranks_loaded == tuple(range(16))
    assert [p for p in dumps.problems if p.kind == "error"] == []
    # Membership comes from elsewhere than the broken pg_config.
    assert dumps.groups["0"].ranks == tuple(range(16))
    assert truth.group_name is not None
    assert dumps.groups[truth.group_name].ranks == truth.group_ranks


def test_json_shape(tmp_path: Path) -> None:
    generate(tmp_path, 8, entries=ENTRIES, fmt="json", scenario="not_completed", seed=2)
    files = sorted(tmp_path.iterdir())
    assert len(files) == 8 and all(f.suffix == ".json" for f in files)
    text = (tmp_path / "nccl_trace_rank_1.json").read_text()
    raw = json.loads(text)
    assert list(raw) == sorted(raw)
    assert all(isinstance(v, str) for s in raw["pg_status"].values() for v in s.values())
    entries = raw["entries"]
    assert all(isinstance(e["process_group"], list) for e in entries)
    assert all(isinstance(e["time_discovered_started_ns"], int) for e in entries)
    assert any(e["time_discovered_completed_ns"] == 0 for e in entries)  # None written as 0
    assert all("frames" not in e for e in entries)  # fr_trace_json carries no stacks

    dumps = load_dumps([tmp_path])
    assert dumps.ranks_loaded == tuple(range(8))
    assert [p for p in dumps.problems if p.kind == "error"] == []


def test_missing_rank_has_no_file(tmp_path: Path) -> None:
    truth = generate(tmp_path, 16, entries=ENTRIES, scenario="missing", culprit=9)
    assert truth.category == "MissingDumps"
    assert truth.culprit_ranks == (9,) and truth.missing_ranks == (9,)
    assert not (tmp_path / "nccl_trace_rank_9").exists()
    dumps = load_dumps([tmp_path])
    assert dumps.missing_ranks == (9,)


def _plan(scenario: str, shape: str = "nccl", ranks: int = 32, **kw: Any) -> Plan:
    return make_plan(ranks, entries=ENTRIES, shape=shape, scenario=scenario, seed=7, **kw)


@pytest.mark.parametrize("shape", ["nccl", "gloo"])
def test_not_joined_truth_is_in_the_dumps(shape: str) -> None:
    plan = _plan("not_joined", shape, ranks=24)
    truth = plan.truth
    (k,) = truth.culprit_ranks
    assert truth.category == "RankNotJoined" and k in truth.group_ranks and k != 0
    assert _entries_at(plan.dump(k), truth) == []
    for rank in truth.group_ranks:
        if rank == k:
            continue
        (e,) = _entries_at(plan.dump(rank), truth)
        assert e["state"] == ("started" if shape == "nccl" else "scheduled")
        assert e["retired"] is False
        assert e["profiling_name"].endswith(truth.op or "?")


@pytest.mark.parametrize(
    ("scenario", "field"),
    [("type_mismatch", "profiling_name"), ("size_mismatch", "input_sizes"), ("dtype_mismatch", "input_dtypes")],
)
@pytest.mark.parametrize("shape", ["nccl", "gloo"])
def test_mismatch_truth_is_in_the_dumps(scenario: str, field: str, shape: str) -> None:
    plan = _plan(scenario, shape)
    truth = plan.truth
    (k,) = truth.culprit_ranks
    assert len(truth.group_ranks) >= 3  # a majority names the odd one out
    seen = {}
    for rank in truth.group_ranks:
        (e,) = _entries_at(plan.dump(rank), truth)
        assert e["retired"] is False
        seen[rank] = e[field]
    others = {json.dumps(v) for r, v in seen.items() if r != k}
    assert len(others) == 1 and json.dumps(seen[k]) not in others


@pytest.mark.parametrize("scenario", ["not_completed", "cross_group"])
def test_not_completed_truth_is_in_the_dumps(scenario: str) -> None:
    plan = _plan(scenario)
    truth = plan.truth
    assert truth.category == "NotCompleted"
    assert truth.culprit_ranks == truth.group_ranks
    for rank in truth.group_ranks:
        (e,) = _entries_at(plan.dump(rank), truth)
        assert e["state"] == "started" and e["time_discovered_completed_ns"] is None
    if scenario == "cross_group":
        assert truth.group_desc == "mesh_tp"
        assert truth.consequence_groups
        # The stuck TP ranks never enqueue the data-parallel collective that follows.
        for rank in truth.group_ranks:
            last = plan.dump(rank)["entries"][-1]
            assert last["process_group"][0] == truth.group_name


def test_p2p_mismatch_truth_is_in_the_dumps() -> None:
    plan = _plan("p2p_mismatch")
    truth = plan.truth
    (b,) = truth.culprit_ranks
    a, b_again = truth.group_ranks  # pipeline stages 0 and 1
    assert b == b_again
    assert truth.category == "P2PMismatch" and truth.p2p_seq_id is not None
    (send,) = _entries_at(plan.dump(a), truth)
    assert send["profiling_name"] == "nccl:send 0->1" and send["is_p2p"]
    assert send["state"] == "started"
    # b never posted the recv: its op at that p2p sequence id is its own send back.
    (other,) = _entries_at(plan.dump(b), truth)
    assert other["profiling_name"] == "nccl:send 1->0"


@pytest.mark.parametrize("shape", ["nccl", "gloo"])
def test_straggler_is_late_and_others_wait(shape: str) -> None:
    plan = _plan("straggler", shape, straggle_ms=300.0)
    (k,) = plan.truth.culprit_ranks
    assert plan.truth.straggle_ms == 300.0
    late = plan.dump(k)["entries"]
    peer = k - 1 if k % 8 else k + 1  # same TP group
    early = plan.dump(peer)["entries"]
    by_record = {e["record_id"]: e for e in early}
    gaps = [e["time_created_ns"] - by_record[e["record_id"]]["time_created_ns"]
            for e in late if e["record_id"] in by_record]
    assert gaps and min(gaps) > 250 * 1_000_000
    if shape == "nccl":
        tp_name = late[-1]["process_group"][0]
        waits = [e["duration_ms"] for e in early if e["process_group"][0] == tp_name and "duration_ms" in e]
        own = [e["duration_ms"] for e in late if e["process_group"][0] == tp_name and "duration_ms" in e]
        assert min(waits) > 250 and max(own) < 50


@pytest.mark.parametrize("shape", ["nccl", "gloo"])
def test_healthy_has_nothing_old_in_flight(shape: str) -> None:
    now = 1_800_000_000 * 10**9
    plan = make_plan(16, entries=ENTRIES, shape=shape, scenario="healthy", now_ns=now)
    assert plan.truth.category is None and plan.truth.culprit_ranks == ()
    for rank in range(16):
        for e in plan.dump(rank)["entries"]:
            if not (e["state"] == "completed" or e["retired"]):
                assert now - e["time_created_ns"] < 1_000_000_000


def test_straggler_skew_and_determinism() -> None:
    one = make_plan(16, entries=50, scenario="type_mismatch", seed=11, now_ns=10**18, clock_skew_ms=5)
    two = make_plan(16, entries=50, scenario="type_mismatch", seed=11, now_ns=10**18, clock_skew_ms=5)
    assert one.truth == two.truth
    assert pickle.dumps(one.dump(3)) == pickle.dumps(two.dump(3))


def test_bad_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="p2p"):
        make_plan(32, shape="gloo", scenario="p2p_mismatch")
    with pytest.raises(ValueError, match="scenario"):
        make_plan(16, scenario="nope")
    with pytest.raises(ValueError, match="culprit"):
        make_plan(16, scenario="not_joined", culprit=16)
    with pytest.raises(ValueError, match="position"):
        make_plan(16, scenario="not_joined", position="nowhere")


def test_pool_of_two_writes_the_same_files(tmp_path: Path) -> None:
    plan = make_plan(40, entries=40, scenario="not_joined", now_ns=10**18)
    write_plan(plan, tmp_path / "one", jobs=1)
    write_plan(plan, tmp_path / "two", jobs=2)
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert len(names) == 40
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir())
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_cli_prints_the_truth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dumps"
    truth_file = tmp_path / "truth.json"
    rc = synthetic.main([str(out), "--ranks", "16", "--entries", "30", "--scenario", "dtype_mismatch",
                         "--seed", "4", "--jobs", "1", "--truth", str(truth_file), "--prefix", "host_rank_"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(truth_file.read_text())
    assert printed["category"] == "DtypeMismatch"
    assert len(list(out.iterdir())) == 16 and (out / "host_rank_15").exists()


@pytest.mark.parametrize("shape", ["nccl", "gloo"])
@pytest.mark.parametrize("json_shape", [False, True])
@pytest.mark.parametrize("scenario", ["not_joined", "not_completed", "size_mismatch"])
def test_newest_window_is_the_whole_dump_cut(shape: str, json_shape: bool, scenario: str) -> None:
    """`dump(newest=N)` (what the bench's simulated sidecars serve for ?entries=N) is the whole dump with
    its entries cut to the newest N, everything else (pg_status, pg_config, counters) unchanged."""
    plan = make_plan(16, entries=ENTRIES, shape=shape, scenario=scenario, seed=3)
    for rank in (0, *plan.truth.culprit_ranks, 15):
        whole = plan.dump(rank, json_shape=json_shape)
        assert plan.dump_length(rank) == len(whole["entries"])
        for newest in (1, 7, ENTRIES - 1, ENTRIES, ENTRIES + 50):
            cut = plan.dump(rank, json_shape=json_shape, newest=newest)
            assert cut["entries"] == whole["entries"][-newest:]
            assert {k: v for k, v in cut.items() if k != "entries"} == \
                {k: v for k, v in whole.items() if k != "entries"}
        assert plan.dump(rank, json_shape=json_shape, newest=0) == whole
        assert plan.dump(rank, json_shape=json_shape, newest=None) == whole
