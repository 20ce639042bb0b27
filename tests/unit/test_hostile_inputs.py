"""Hostile input (issue 12): every class from tests/hostile.py, each beside good ranks, through the
CLI, the sidecar's dump-dir watcher and the operator's snapshot decoding. The good ranks are
analyzed, each bad file is a problem naming it, nothing crashes, memory and time stay bounded."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from frscope import analyze_command, cli
from frscope.operator.evidence.pod_evidence import from_bytes
from frscope.sidecar.dumpdir import DumpDirWatcher
from tests import hostile
from tests.unit import builders as b

GOOD = (0, 1, 2, 3)
REPO = Path(__file__).resolve().parents[2]
# The CLI process may use at most this much address space with every hostile file in its folder.
ADDRESS_SPACE = 3 << 30


def _job(directory: Path, *, bombs: bool) -> list[hostile.Case]:
    for rank in GOOD:
        b.write_pickle(directory, rank, b.dump([b.entry(s) for s in range(1, 4)], world=len(GOOD)))
    cases = list(hostile.cases(len(GOOD), len(GOOD), bombs=bombs))
    for case in cases:
        (directory / f"nccl_trace_rank_{case.rank}").write_bytes(case.data)
    return cases


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _analyze(directory: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "frscope", "analyze", str(directory), "--format", "json", "-o", str(out), *extra],
        capture_output=True, text=True, timeout=100, env=env, preexec_fn=_limit_memory,
    )


def _no_nan(name: str) -> Any:
    raise AssertionError(f"bare {name} in the JSON report")


def _check_report(proc: subprocess.CompletedProcess[str], out: Path, cases: list[hostile.Case]) -> dict[str, Any]:
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads(out.read_text(), parse_constant=_no_nan)
    assert set(GOOD) <= set(report["ranks_loaded"])
    errors = {p["source"]: p for p in report["problems"] if p["kind"] == "error"}
    for case in cases:
        source = str(out.parent / "dumps" / f"nccl_trace_rank_{case.rank}")
        if case.refused:
            assert source in errors, f"{case.name}: not reported"
            assert errors[source]["rank"] == case.rank
        else:
            assert source in errors or case.rank in report["ranks_loaded"], f"{case.name}: neither loaded nor reported"
    for problem in report["problems"]:
        # Never the file's bytes, never a terminal escape, never an unbounded repr.
        assert "SECRET-BYTES" not in problem["message"] and "\x1b" not in problem["message"]
        assert len(problem["message"]) < 600
    return report


def test_cli_analyzes_good_ranks_beside_every_hostile_class(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    cases = _job(dumps, bombs=False)
    (dumps / f"nccl_trace_rank_{10**12}").write_bytes((dumps / "nccl_trace_rank_0").read_bytes())
    os.symlink("/dev/zero", dumps / "nccl_trace_rank_90")
    os.mkfifo(dumps / "nccl_trace_rank_91")
    out = tmp_path / "report.json"
    proc = _analyze(dumps, out, "--html", str(tmp_path / "t.html"))
    report = _check_report(proc, out, cases)
    by_source = {p["source"]: p["message"] for p in report["problems"] if p["kind"] == "error"}
    assert "character device (through a symlink)" in by_source[str(dumps / "nccl_trace_rank_90")]
    assert "FIFO" in by_source[str(dumps / "nccl_trace_rank_91")]
    assert "not a rank in [0, 1048576)" in by_source[str(dumps / f"nccl_trace_rank_{10**12}")]
    assert "died" in by_source[str(dumps / f"nccl_trace_rank_{_rank_of(cases, 'deep-tuple-key-pickle')}")]
    assert "BUILD" in by_source[str(dumps / f"nccl_trace_rank_{_rank_of(cases, 'build-shadows-get')}")]
    # 10**12 as a rank (in the name, the contents or a group) never sizes the world.
    assert report["world_size"] < 100
    assert (tmp_path / "t.html").stat().st_size > 0  # with a NaN duration among the ranks


def _rank_of(cases: list[hostile.Case], name: str) -> int:
    return next(c.rank for c in cases if c.name == name and c.rank is not None)


def test_memory_bombs_are_refused_within_the_stated_multiple(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    cases = [c for c in _job(dumps, bombs=True) if c.name.endswith("bomb")]
    for other in dumps.iterdir():  # only the good ranks and the bombs
        if other.name.rsplit("_", 1)[1] not in {str(r) for r in GOOD} | {str(c.rank) for c in cases}:
            other.unlink()
    out = tmp_path / "report.json"
    started = time.monotonic()
    proc = _analyze(dumps, out)
    report = _check_report(proc, out, cases)
    assert report["ranks_loaded"] == list(GOOD)
    assert time.monotonic() - started < 90  # bounded (the test's own limit is the real bound)


def test_dump_dir_scan_goes_on_past_every_hostile_file(tmp_path: Path) -> None:
    cases = _job(tmp_path, bombs=False)
    past = time.time() - 60
    for path in tmp_path.iterdir():
        os.utime(path, (past, past))
    watcher = DumpDirWatcher(tmp_path, settle_s=0.0, max_bytes=1 << 26, give_up_after_s=0.0)
    watcher.scan(now=0.0)
    watcher.scan(now=1.0)
    parsed = watcher.by_rank()
    assert set(GOOD) <= set(parsed)
    states = {f.path.name: f.state for f in watcher.files.values()}
    for case in cases:
        state = states[f"nccl_trace_rank_{case.rank}"]
        assert state in (("rejected",) if case.refused else ("rejected", "parsed")), case.name
    assert all(state != "pending" for state in states.values())


def _piece(rank: str, trace: str) -> str:
    return (f'{{"frscope_snapshot": 1, "rank": {rank}, "captured_at_ns": 1, "source": "x", "stacks": null, '
            f'"trace": {trace}}}')


def test_operator_keeps_a_pods_good_ranks_beside_bad_ones() -> None:
    good = json.dumps(b.dump([b.entry(s) for s in range(1, 4)], world=4))
    nan = good.replace('"duration_ms": null', '"duration_ms": NaN').replace(
        '"time_created_ns": ', '"time_created_ns": Infinity, "x": ')
    deep = good[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    pieces = [_piece("0", good), _piece("1", nan), _piece("9" * 5000, good), _piece("3", deep),
              _piece("2", good), _piece(str(10**12), good), _piece("-1", good)]
    body = ('{"schema": "frscope.sidecar.snapshot/v1", "pod": "p", "namespace": "n", "captured_at_ns": 1, '
            '"reason": "stall", "ranks": [' + ",".join(pieces) + '], "errors": []}')
    evidence = from_bytes(body.encode(), "http://pod", origin="sidecar")
    assert evidence.ranks == (0, 1, 2)
    assert all(e.duration_ms is None and e.time_created_ns is None for e in evidence.dumps[1].entries)
    messages = [str(p) for p in evidence.problems]
    assert len(messages) == 4, messages
    assert any("nested too deeply" in m for m in messages)
    assert sum("not a rank in [0, 1048576)" in m for m in messages) == 2, messages


def test_a_crash_of_frscope_itself_has_its_own_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    b.job(tmp_path, {r: [b.entry(1)] for r in range(2)})

    def broken(*_args: object, **_kwargs: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(analyze_command, "analyze", broken)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.main(["analyze", str(tmp_path), "--no-progress"]) == cli.EXIT_CRASH == 3
    err = capsys.readouterr().err
    assert "internal error (KeyError" in err and "Traceback" not in err
    assert cli.EXIT_CRASH not in (cli.EXIT_FINDINGS, cli.EXIT_USAGE)
