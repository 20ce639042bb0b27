"""Which recorder is evidence of what (the hand-written jobs' second batch): a recorder read before collectives
that the others finished with it says nothing of where its rank stands now; the finish mark of a rank's
newest op lags the call's return; a part that ended alone beside a rank without a dump lost that rank.
Gloo-shaped dumps, read as copies (the read times lost)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from frscope.analysis import Category, analyze
from frscope.records import load_dumps
from tests.unit import builders as b

MS = 1_000_000
WORLD = ("0", "default_pg")
GLOO_CONFIG = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}  # what gloo writes: no group's members


def _gloo(seq: int, t_ms: int, *, done: bool = True, pg: tuple[str, str] = WORLD) -> dict[str, Any]:
    return b.entry(seq, backend="gloo", pg=pg, state="scheduled", retired=done, created_ns=b.T0 + t_ms * MS)


def _analyze(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]]) -> list[Any]:
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e["record_id"] = i
        b.write_pickle(tmp_path, rank, b.dump(entries, world=0, pg_config=GLOO_CONFIG))
    return analyze(load_dumps([tmp_path])).findings


def test_a_part_that_ended_alone_beside_a_rank_without_a_dump_lost_that_rank(tmp_path: Path) -> None:
    """Rank 2 left no dump. In a subgroup's #1, rank 3's part is retired while ranks 0 and 1 wait: gloo fails a
    part when a peer's connection closes, and the subgroup's members are known only from its entries (gloo's
    pg_config names none), so rank 2 may be one. The missing rank, not rank 3's part ending on its own."""
    steps = [_gloo(s, 100 * s) for s in range(1, 3)]
    sub = ("1", "undefined")
    per_rank = {r: [*steps, _gloo(1, 300, pg=sub, done=False)] for r in (0, 1)}
    per_rank[3] = [*steps, _gloo(1, 300, pg=sub)]
    findings = _analyze(tmp_path, per_rank)
    assert findings[0].category is Category.MISSING_DUMPS and findings[0].culprit_ranks == (2,)
