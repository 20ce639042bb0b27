"""Say what is unknown: a rank that left no dump while every survivor's last collective failed for want of it
(gloo retires a failed collective) left the job there, but whether it crashed or exited (out of data, after
`destroy_process_group`) only its exit says. Without an exit that says it failed it is named as the rank the
others' collective failed for want of (`RankNotJoined`), never as a crash; with one, it crashed (`RankStopped`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.records import RankExit, load_dumps
from tests.unit import builders as b

OLD = AnalysisOptions(now_ns=b.T0 + 3600 * 10**9)
WORLD = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}}


def _job(tmp_path: Path) -> Path:
    # ranks 0, 1, 3 finished all_reduce #1-#5 and stopped at #6, retired (it failed when rank 2 left); rank 2
    # wrote nothing
    per_rank = {r: [b.gloo_entry(s, 100 * s + r) for s in range(1, 7)] for r in (0, 1, 3)}
    return b.write_gloo_ranks(tmp_path, per_rank, WORLD)


def test_a_rank_gone_without_a_dump_or_an_exit_is_not_called_a_crash(tmp_path: Path) -> None:
    report = analyze(load_dumps([_job(tmp_path)]), OLD)
    top = report.findings[0]
    assert top.category is Category.RANK_NOT_JOINED and top.culprit_ranks == (2,)
    assert top.collective_seq_id == 6
    assert "crashed or exited" in top.summary and "crashing" not in top.summary


@pytest.mark.parametrize("exit", [RankExit(2, exit_code=137), RankExit(2, exit_code=1, reason="Error"),
                                  RankExit(2, reason="OOMKilled")])
def test_an_exit_that_says_the_rank_failed_makes_it_a_crash(tmp_path: Path, exit: RankExit) -> None:
    report = analyze(load_dumps([_job(tmp_path)]), OLD, exits={2: exit})
    top = report.findings[0]
    assert top.category is Category.RANK_STOPPED and top.culprit_ranks == (2,)

