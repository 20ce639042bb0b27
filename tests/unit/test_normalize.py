"""Version tolerance: every real variation of the dump format reads into the same model."""

from __future__ import annotations

import json
from pathlib import Path

from frscope.records import load_dumps, load_file
from frscope.records.normalize import parse_profiling_name
from tests.unit import builders as b


def test_json_shape_matches_pickle_shape(tmp_path: Path) -> None:
    raw = b.dump([b.entry(1, state="scheduled", retired=True)], world=2)
    b.write_pickle(tmp_path, 0, raw)
    as_json = json.loads(json.dumps(raw))  # tuples become lists
    as_json["pg_status"] = {"0": {"last_enqueued_collective": "1", "last_completed_collective": "1"}}
    as_json["entries"][0]["time_discovered_started_ns"] = 0  # JSON writes None as 0
    (tmp_path / "rank_1.json").write_text(json.dumps(as_json))
    d0, d1 = load_file(tmp_path / "nccl_trace_rank_0"), load_file(tmp_path / "rank_1.json")
    e0, e1 = d0.entries[0], d1.entries[0]
    assert (e0.pg_name, e0.pg_desc) == (e1.pg_name, e1.pg_desc) == ("0", "default_pg")
    assert e0.time_started_ns is None and e1.time_started_ns is None
    assert e0.completed and e1.completed
    assert d1.pg_status["0"].last_enqueued == 1


def test_old_versions_missing_fields_and_newer_versions(tmp_path: Path) -> None:
    old = b.entry(3)
    for key in ("is_p2p", "input_dtypes", "output_dtypes", "timeout_ms", "thread_id", "thread_name", "retired"):
        old.pop(key)
    old["seq_id"] = old.pop("collective_seq_id")
    b.write_pickle(tmp_path, 0, b.dump([old], world=1, version="2.0"))
    dump = load_file(tmp_path / "nccl_trace_rank_0")
    assert dump.entries[0].collective_seq_id == 3 and dump.entries[0].input_dtypes == []
    assert any("collective_seq_id" in w for w in dump.warnings)

    newer = b.dump([b.entry(1) | {"brand_new_field": 1}], world=1, version="2.15")
    b.write_pickle(tmp_path, 1, newer)
    dump = load_file(tmp_path / "nccl_trace_rank_1")
    assert len(dump.entries) == 1
    assert any("newer than 2.10" in w for w in dump.warnings)


def test_non_dict_entries_and_missing_keys_do_not_fail(tmp_path: Path) -> None:
    raw = b.dump([b.entry(1), "garbage", {"profiling_name": "nccl:all_reduce"}], world=1)
    b.write_pickle(tmp_path, 0, raw)
    dump = load_file(tmp_path / "nccl_trace_rank_0")
    assert len(dump.entries) == 2
    assert any("not objects" in w for w in dump.warnings)


def test_profiling_names() -> None:
    assert parse_profiling_name("nccl:send 0->1") == ("nccl", "send", 1)
    assert parse_profiling_name("nccl:recv 1<-0") == ("nccl", "recv", 0)
    assert parse_profiling_name("gloo:all_reduce") == ("gloo", "all_reduce", None)
    assert parse_profiling_name("nccl:all_reduce_barrier") == ("nccl", "all_reduce_barrier", None)
    assert parse_profiling_name("weird") == (None, "weird", None)


def test_gloo_default_group_bug_is_reconstructed(tmp_path: Path) -> None:
    """gloo keys the default group '' with ranks '[]'; entries say ('0', 'default_pg')."""
    gloo_cfg = {"": {"name": "", "desc": "", "ranks": "[]"}}
    for rank in range(3):
        entries = [b.entry(s, backend="gloo", state="scheduled", retired=True) for s in (1, 2)]
        entries.append(b.entry(1, backend="gloo", pg=("1", "undefined"), state="scheduled", retired=True, record_id=2))
        b.write_pickle(tmp_path, rank, b.dump(entries, world=3, pg_config=gloo_cfg))
    dumpset = load_dumps([tmp_path])
    assert dumpset.groups["0"].ranks == (0, 1, 2) and dumpset.groups["0"].membership_source == "world"
    assert dumpset.groups["1"].ranks == (0, 1, 2) and dumpset.groups["1"].membership_source == "entries"
    assert dumpset.world_size == 3


def test_duplicate_rank_keeps_the_richer_dump(tmp_path: Path) -> None:
    b.write_pickle(tmp_path, 0, b.dump([b.entry(1)], world=1))
    b.write_json(tmp_path, 0, b.dump([b.entry(1), b.entry(2)], world=1), name="again_rank_0.json")
    dumpset = load_dumps([tmp_path])
    assert len(dumpset.dumps[0].entries) == 2
    assert any("also in" in p.message for p in dumpset.problems)
