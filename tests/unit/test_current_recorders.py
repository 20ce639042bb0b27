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

WORLD = ("0", "default_pg")
GLOO_CONFIG = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}  # what gloo writes: no group's members


_gloo = b.gloo_entry


def _analyze(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]]) -> list[Any]:
    return analyze(load_dumps([b.write_gloo_ranks(tmp_path, per_rank, GLOO_CONFIG)])).findings


def test_a_recorder_read_before_collectives_it_took_part_in_is_no_evidence_it_never_joined(tmp_path: Path) -> None:
    """Rank 1's recorder ends at #2, yet every other rank finished #3-#6 (which need it) and went on: it was
    read before them. The others wait in #7, which rank 3, whose recorder is current, never joined."""
    steps = [_gloo(s, 100 * s) for s in range(1, 7)]
    per_rank = {r: [*steps, _gloo(7, 700, done=False)] for r in (0, 2)}
    per_rank[1] = steps[:2]
    per_rank[3] = list(steps)
    [root] = _analyze(tmp_path, per_rank)
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (3,) and root.collective_seq_id == 7
    assert any("rank 1's recorder ends at #2" in e for e in root.evidence)


def test_a_rank_whose_newest_op_is_not_yet_marked_finished_is_not_stale(tmp_path: Path) -> None:
    """Pairs {0, 1}, {2, 3} and the world, each step a pair all_reduce then a world one. Rank 3 left after
    step 3's pair all_reduce and dumped at once: gloo had not marked it finished yet (rank 2 finished it and
    went on). Ranks 0-2 wait in the world's #3, which rank 3 never joined: that, not a stale dump, nor a pair
    all_reduce that never completed."""
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in range(4):
        pair = ("1", "undefined") if rank < 2 else ("2", "undefined")
        entries = []
        for step in range(1, 4):
            entries += [_gloo(step, 100 * step, pg=pair), _gloo(step, 100 * step + 10)]
        entries[-1] = _gloo(3, 310, done=False)  # the world's #3, where the others wait
        per_rank[rank] = entries
    per_rank[3] = [*per_rank[3][:-2], _gloo(3, 300, pg=("2", "undefined"), done=False)]
    [root] = _analyze(tmp_path, per_rank)
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (3,)
    assert root.process_group.name == "0" and root.collective_seq_id == 3


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
