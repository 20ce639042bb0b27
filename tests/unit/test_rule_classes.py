"""The fault classes of issue 23, each as the recorder shape a real gloo job leaves (hand-built with
the builders; the randomized real-torch sweep checks the same classes on real jobs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from frscope.analysis import AnalysisOptions, Category, Report, analyze
from frscope.records import load_dumps
from tests.unit import builders as b

MS = 1_000_000
OLD = AnalysisOptions(now_ns=b.T0 + 3600 * 10**9)
GLOO_DEFAULT = ("0", "default_pg")


def gloo(seq: int, *, done: bool = True, pg: tuple[str, str] = GLOO_DEFAULT, **kw: Any) -> dict[str, Any]:
    """A gloo entry: always 'scheduled'; a finished collective is 'retired'."""
    return b.entry(seq, backend="gloo", pg=pg, state="scheduled", retired=done, **kw)


def write(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]], pg_config: dict[str, Any]) -> Path:
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e.setdefault("record_id", i)
        b.write_pickle(tmp_path, rank, b.dump(entries, world=0, pg_config=pg_config))
    return tmp_path


def run(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]], pg_config: dict[str, Any],
        options: AnalysisOptions = OLD) -> Report:
    return analyze(load_dumps([write(tmp_path, per_rank, pg_config)]), options)


def test_a_crash_seen_only_in_its_peers_error_path_dump_is_named(tmp_path: Path) -> None:
    """2 ranks; rank 1 died; rank 0 dumped on its error path (gloo retired the failed collective).
    Gloo keys the default group '' in pg_config, here with the ranks [0, 1]: the world is 2, rank 1
    is missing."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
    report = run(tmp_path, {0: [gloo(s) for s in range(1, 6)]}, config)
    assert report.world_size == 2 and report.missing_ranks == (1,)
    [root] = report.findings
    assert root.culprit_ranks == (1,)
    assert root.category in (Category.RANK_STOPPED, Category.MISSING_DUMPS)
