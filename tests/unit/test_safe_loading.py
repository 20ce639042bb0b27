"""Loading untrusted dumps: never execute, never let one bad file sink the others."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import pytest

from frscope.records import (
    DumpTooLarge,
    TruncatedDump,
    UnknownFormat,
    UnsafePickle,
    decode_bytes,
    load_dumps,
    load_file,
    rank_from_name,
)
from tests.unit import builders as b


class _Exploit:
    """A pickle payload that, if ever unpickled by plain pickle.load, creates a file."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.target}",))


def _healthy(world: int = 2) -> dict[int, list[dict[str, object]]]:
    return {r: [b.entry(s) for s in range(1, 4)] for r in range(world)}


def test_malicious_pickle_executes_nothing_and_names_the_file(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    payload = b.dump([b.entry(1)], world=2)
    payload["entries"][0]["frames"] = _Exploit(target)  # buried deep inside a plausible dump
    bad = tmp_path / "nccl_trace_rank_1"
    bad.write_bytes(pickle.dumps(payload, protocol=2))

    with pytest.raises(UnsafePickle) as info:
        load_file(bad)
    assert "posix.system" in str(info.value) or "os.system" in str(info.value)
    assert str(bad) in str(info.value)
    assert not target.exists()

    # In a directory, the bad rank is a named problem and the good rank still loads.
    b.write_pickle(tmp_path, 0, b.dump([b.entry(1)], world=2))
    dumpset = load_dumps([tmp_path])
    assert not target.exists()
    assert dumpset.ranks_loaded == (0,)
    [problem] = [p for p in dumpset.problems if p.kind == "error"]
    assert problem.source == str(bad) and problem.rank == 1 and "refused" in problem.message
    assert dumpset.missing_ranks == (1,)


def _jit_wrapped(obj: object) -> bytes:
    """What torch's JIT pickler writes: containers wrapped in torch.jit._pickle helpers."""
    body = pickle.dumps(obj, protocol=2)[2:-1]  # strip PROTO and STOP
    ints = pickle.dumps([1, 2, 3], protocol=2)[2:-1]
    tag = pickle.dumps("Dict[str, Any]", protocol=2)[2:-1]
    return (
        b"\x80\x02"
        + b"ctorch.jit._pickle\nrestore_type_tag\n"
        + body
        + tag
        + b"\x86R"  # TUPLE2, REDUCE
        + b"."
    ), ints


def test_jit_pickler_wrappers_are_understood(tmp_path: Path) -> None:
    data, _ = _jit_wrapped(b.dump([b.entry(1), b.entry(2)], world=1))
    path = tmp_path / "trace_rank_0"
    path.write_bytes(data)
    dump = load_file(path)
    assert dump.rank == 0 and [e.collective_seq_id for e in dump.entries] == [1, 2]
    intlist = b"\x80\x02ctorch.jit._pickle\nbuild_intlist\n" + pickle.dumps([1, 2], protocol=2)[2:-1] + b"\x85R."
    assert decode_bytes(intlist, "x") == [1, 2]


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b"", TruncatedDump),
        (b"   \n", TruncatedDump),
        (b"\x80\x02}q\x00(X\x07\x00\x00\x00version", TruncatedDump),  # cut mid-write
        (b'{"version": "2.10", "entries": [', TruncatedDump),
        (b"hello world", UnknownFormat),
        (b"\x1f\x8b\x08\x00garbage", TruncatedDump),
    ],
)
def test_unreadable_files_get_clear_errors(tmp_path: Path, content: bytes, error: type[Exception]) -> None:
    path = tmp_path / "nccl_trace_rank_3"
    path.write_bytes(content)
    with pytest.raises(error) as info:
        load_file(path)
    assert str(path) in str(info.value)


def test_partial_file_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    full = pickle.dumps(b.dump([b.entry(s) for s in range(1, 50)], world=3), protocol=2)
    (tmp_path / "nccl_trace_rank_0").write_bytes(full)
    (tmp_path / "nccl_trace_rank_1").write_bytes(full[: len(full) // 2])  # still being written
    (tmp_path / "nccl_trace_rank_2").write_bytes(b"")
    dumpset = load_dumps([tmp_path])
    assert dumpset.ranks_loaded == (0,)
    errors = {p.rank: p.message for p in dumpset.problems if p.kind == "error"}
    assert set(errors) == {1, 2}
    assert "truncated" in errors[1] and "empty" in errors[2]


def test_size_cap(tmp_path: Path) -> None:
    path = b.write_pickle(tmp_path, 0, b.dump([b.entry(s) for s in range(1, 100)], world=1))
    with pytest.raises(DumpTooLarge) as info:
        load_file(path, max_bytes=1000)
    assert "cap of 1000 bytes" in str(info.value)
    gz = tmp_path / "rank_1.json.gz"
    gz.write_bytes(gzip.compress(b" " * 5000 + json.dumps(b.dump([], world=1)).encode()))
    with pytest.raises(DumpTooLarge):
        load_file(gz, max_bytes=2000)


def test_format_told_by_content_not_name(tmp_path: Path) -> None:
    # JSON where a pickle was expected, and the reverse; gzip of either.
    (tmp_path / "nccl_trace_rank_0").write_text(json.dumps(b.dump([b.entry(1)], world=3)))
    (tmp_path / "rank_1.json").write_bytes(pickle.dumps(b.dump([b.entry(1)], world=3), protocol=2))
    (tmp_path / "rank_2.json.gz").write_bytes(gzip.compress(json.dumps(b.dump([b.entry(1)], world=3)).encode()))
    dumpset = load_dumps([tmp_path])
    assert dumpset.ranks_loaded == (0, 1, 2)
    assert not [p for p in dumpset.problems if p.kind == "error"]


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("nccl_trace_rank_12", 12),
        ("comm_lib_trace_rank_0", 0),
        ("gpu-node-17_rank_5.json", 5),
        ("host-a-3_rank_12.pkl.gz", 12),
        ("dump.json", None),
    ],
)
def test_rank_from_file_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_rank_from_contents_when_name_does_not_tell(tmp_path: Path) -> None:
    snapshot = {"frscope_snapshot": 1, "rank": 7, "captured_at_ns": b.T0, "trace": b.dump([b.entry(1)], world=8)}
    (tmp_path / "latest.json").write_text(json.dumps(snapshot))
    (tmp_path / "mystery.json").write_text(json.dumps(b.dump([b.entry(1)], world=8)))
    dumpset = load_dumps([tmp_path])
    assert dumpset.ranks_loaded == (7,)
    [problem] = [p for p in dumpset.problems if p.kind == "error"]
    assert "mystery.json" in problem.source and "which rank" in problem.message


def test_one_directory_with_readme_and_missing_path(tmp_path: Path) -> None:
    b.write_pickle(tmp_path, 0, b.dump([b.entry(1)], world=1))
    (tmp_path / "README.md").write_text("notes")
    dumpset = load_dumps([tmp_path, tmp_path / "nope"])
    assert dumpset.ranks_loaded == (0,)
    assert [p.message for p in dumpset.problems if p.kind == "error"] == ["no such file or directory"]
