"""The fast path (worker processes that decode each rank into columns, `records.columns.EntryTable`,
indexed per group, and the analysis that reads those columns) and the single-process, row-by-row
reference (a list of `Entry` per rank, the reference analysis loops) give the same DumpSet and the
same report, on every real fixture and every synthetic scenario. Any faster reader must keep this
test green: it is the "behaviour did not change" check."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from frscope.analysis import analyze
from frscope.records import DumpSet, Entry, RankExit, exits_from_json, load_dumps, scan
from frscope.records.columns import EntryTable
from frscope.report.serialize import report_to_dict
from frscope.testing.synthetic import SCENARIOS, generate, make_plan, write_plan

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
FIXTURES = sorted(p.name for p in REAL.iterdir() if p.is_dir())
# Small but wrapped ring buffers and a 3-D layout (NCCL: tp 2 x pp 2 x dp 8, every rank in 4 groups;
# gloo records no p2p, so pp 1 there).
RANKS = 32
ENTRIES = 120


def _entry(entry: Entry) -> tuple[Any, ...]:
    # Every attribute, frames included (re-read from the file on demand in the loading process).
    return tuple(getattr(entry, name) for name in Entry.__slots__ if name != "_frames") + (entry.frames,)


def _dumpset(dumpset: DumpSet) -> dict[str, Any]:
    return {
        "ranks": dumpset.ranks_loaded,
        "world": dumpset.world_size,
        "groups": dumpset.groups,
        "problems": sorted((p.source, p.rank, p.kind, p.message) for p in dumpset.problems),
        "dumps": {
            rank: (d.source, d.version, d.backend, d.pg_config, d.pg_status, d.comm_lib_version, d.stacks,
                   d.captured_at_ns, d.host, d.warnings, [_entry(e) for e in d.entries])
            for rank, d in dumpset.dumps.items()
        },
    }


def _same(path: Path) -> None:
    reference = load_dumps([path], jobs=1, columnar=False)
    assert not any(isinstance(d.entries, EntryTable) for d in reference.dumps.values())
    fast = load_dumps([path], jobs=2)  # the C scanner first where it is built (records.scan)
    assert all(isinstance(d.entries, EntryTable) for d in fast.dumps.values())
    assert _dumpset(fast) == _dumpset(reference)
    assert report_to_dict(analyze(fast)) == report_to_dict(analyze(reference))
    if scan.available():  # and the columnar path without it (safe unpickler, fastcols), the same again
        os.environ[scan.ENV_OFF] = "1"
        try:
            plain = load_dumps([path], jobs=2)
        finally:
            del os.environ[scan.ENV_OFF]
        assert _dumpset(plain) == _dumpset(reference)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_real_fixture(fixture: str) -> None:
    _same(REAL / fixture)


# JSON decoding is shared by both paths (and covered by the real fixtures): JSON for the NCCL shape only.
CASES = [(s, shape, fmt) for s in SCENARIOS for shape in ("nccl", "gloo") for fmt in ("pickle", "json")
         if not (s == "p2p_mismatch" and shape == "gloo") and not (fmt == "json" and shape == "gloo")]


@pytest.mark.parametrize(("scenario", "shape", "fmt"), CASES)
def test_synthetic_scenario(tmp_path: Path, scenario: str, shape: str, fmt: str) -> None:
    generate(tmp_path, RANKS, entries=ENTRIES, shape=shape, fmt=fmt, scenario=scenario, seed=5, tp=2,
             pp=2 if shape == "nccl" else 1)
    _same(tmp_path)


NODE = Path(__file__).resolve().parents[1] / "data" / "node"
_RAISED = RankExit(3, exit_code=1, message="RuntimeError: this rank lost its data shard", first_failure=True)
_PEER = "RuntimeError: [pair.cc:553] Connection closed by peer. This is typically caused by a remote worker crashing."
# What the runner says of the ranks' processes (the crash reasoning reads it: empty recorders of failed
# ranks counted as missing, 'finished and then failed', the stale check's failed member).
EXITS: list[tuple[Path, dict[int, RankExit]]] = [
    (REAL / "crash-pickle", {e.rank: e for e in exits_from_json(
        json.loads((REAL / "crash-exits.json").read_text()), "crash-exits.json")}),
    (REAL / "stale-pickle", {e.rank: e for e in exits_from_json(
        json.loads((REAL / "crash-exits.json").read_text()), "crash-exits.json")}),
    *((NODE / name, {2: RankExit(2, exit_code=1, message=_PEER), 3: _RAISED})
      for name in ("torchrun-crash", "torchrun-crash-unread", "torchrun-crash-victim")),
]


@pytest.mark.parametrize(("path", "exits"), EXITS, ids=[p.name for p, _ in EXITS])
def test_with_the_runners_exits(path: Path, exits: dict[int, RankExit]) -> None:
    reference = load_dumps([path], jobs=1, columnar=False)
    fast = load_dumps([path], jobs=2)
    assert all(isinstance(d.entries, EntryTable) for d in fast.dumps.values())
    assert report_to_dict(analyze(fast, exits=exits)) == report_to_dict(analyze(reference, exits=exits))
    assert analyze(fast, exits=exits).findings  # the exits make it a finding (none are young-and-clean)


# Every comm library that records into torch's Flight Recorder prefixes its profiling names with its own
# name: NCCL ('nccl', 'nccl2' the newer default ProcessGroup, Meta's 'ncclx', ROCm's 'rccl'), Intel's 'xccl',
# Ascend's 'hccl', 'gloo', and torchcomms' backend-neutral hook ('torchcomms').
COMM_LIBS = ("nccl", "nccl2", "ncclx", "xccl", "rccl", "hccl", "gloo", "torchcomms")


@pytest.mark.parametrize("comm_lib", COMM_LIBS)
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_every_comm_library_prefix_reads_and_diagnoses_alike(tmp_path: Path, comm_lib: str, fmt: str) -> None:
    """The same hung job recorded by each library: the readers agree (C scanner, columnar, row by row), the
    backend is the library, and the diagnosis is the NCCL one, word for word but the backend's name."""
    reports = {}
    for lib in ("nccl", comm_lib):
        plan = make_plan(8, entries=60, shape="nccl", scenario="not_joined", seed=7, tp=2, pp=2,
                         now_ns=1_796_582_553_000_000_000)
        plan.comm_lib = lib
        write_plan(plan, tmp_path / lib, fmt=fmt)
        _same(tmp_path / lib)
        dumpset = load_dumps([tmp_path / lib], jobs=1)
        assert {d.backend for d in dumpset.dumps.values()} == {lib}
        assert all(e.profiling_name.startswith(f"{lib}:") and ":" not in e.op for d in dumpset.dumps.values()
                   for e in d.entries)
        report = report_to_dict(analyze(dumpset))
        assert report["findings"], report  # the hang is found
        reports[lib] = json.dumps(report, sort_keys=True).replace(f'"{lib}:', '"LIB:').replace(f'"{lib}"', '"LIB"')
    assert reports[comm_lib] == reports["nccl"]
