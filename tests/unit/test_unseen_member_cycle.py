"""Principle 1 where a gloo group's members are known only from its entries (issue 33): two groups waiting on
each other, one of them waiting on a member that never recorded anything of it. The culprit is the rank whose
own order differs from its peers', never the ranks that kept the common order. Gloo-shaped dumps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from frscope.analysis import Category, analyze
from frscope.records import load_dumps
from tests.unit import builders as b

MS = 1_000_000
WORLD = ("0", "default_pg")
GLOO_CONFIG = {"": {"name": "", "desc": "", "ranks": "[]"}}  # what gloo writes for a new_group: no members


_gloo = b.gloo_entry


def _analyze(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]]) -> list[Any]:
    return analyze(load_dumps([b.write_gloo_ranks(tmp_path, per_rank, GLOO_CONFIG)])).findings


def test_principle1_the_unseen_member_of_a_cycle_is_the_rank_that_broke_the_common_order(tmp_path: Path) -> None:
    """Six ranks, two dp groups (even and odd ranks), gloo. Every rank broadcasts (#1 of the world), all-reduces
    in its dp group, then enters the world's barrier #2. Rank 3 went to the barrier first: its odd peers wait
    in their dp group's #1 for it, the rest wait in the barrier for them. Nobody ever recorded rank 3 in the
    odd dp group, so its entries show members 1 and 5 only, and every rank that recorded nothing of it could be
    the member that never came (0, 2, 3, 4): each waits in the barrier. Ranks 0, 2 and 4 all-reduced in their
    own dp group first, as everyone did; rank 3 alone went on to the barrier where the others issued a dp
    collective: it is the culprit, not one of four."""
    even, odd = ("1", "dp"), ("2", "dp")
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in range(6):
        entries = [_gloo(1, 100, op="broadcast")]
        if rank == 3:
            entries.append(_gloo(2, 150, op="barrier", done=False))
        elif rank % 2:
            entries.append(_gloo(1, 110, pg=odd, done=False))
        else:
            entries += [_gloo(1, 110, pg=even), _gloo(2, 150, op="barrier", done=False)]
        per_rank[rank] = entries
    root = _analyze(tmp_path, per_rank)[0]
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (3,), root.summary
    assert root.process_group.name == "2" and not root.ambiguous
    assert any("own order differs" in e for e in root.evidence)


def test_ranks_that_all_kept_the_common_order_stay_candidates(tmp_path: Path) -> None:
    """The same, but every rank that recorded nothing of the odd group issued the dp collective first (rank 3
    as well, in a dp group of its own that nobody else recorded): no order tells them apart, so each stays a
    candidate."""
    even, odd, third = ("1", "dp"), ("2", "dp"), ("3", "dp")
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in range(6):
        entries = [_gloo(1, 100, op="broadcast")]
        if rank % 2 and rank != 3:
            entries.append(_gloo(1, 110, pg=odd, done=False))
        else:
            entries += [_gloo(1, 110, pg=third if rank == 3 else even), _gloo(2, 150, op="barrier", done=False)]
        per_rank[rank] = entries
    root = _analyze(tmp_path, per_rank)[0]
    assert root.category is Category.RANK_NOT_JOINED and root.process_group.name == "2", root.summary
    assert set(root.culprit_ranks) == {0, 2, 3, 4} and root.ambiguous


def test_principle1_the_cycle_is_rooted_at_the_rank_that_broke_the_order_whatever_came_first(
        tmp_path: Path) -> None:
    """The same cycle, the odd ranks reaching their dp all_reduce after the others entered the barrier: the
    barrier's finding (ranks 1 and 5 never joined it) is the older one, yet rank 3, which went to the barrier
    where everyone else issued a dp collective first, is the root; the barrier's finding is its consequence."""
    even, odd = ("1", "dp"), ("2", "dp")
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in range(6):
        entries = [_gloo(1, 100, op="broadcast")]
        if rank == 3:
            entries.append(_gloo(2, 150, op="barrier", done=False))
        elif rank % 2:
            entries.append(_gloo(1, 200, pg=odd, done=False))
        else:
            entries += [_gloo(1, 110, pg=even), _gloo(2, 150, op="barrier", done=False)]
        per_rank[rank] = entries
    findings = _analyze(tmp_path, per_rank)
    root = findings[0]
    assert root.culprit_ranks == (3,) and root.process_group.name == "2", root.summary
    assert any("broke the order its peers kept" in e for e in root.evidence)
    assert [f.culprit_ranks for f in root.consequences] == [(1, 5)]


def test_principle1_the_unseen_member_is_among_the_ranks_behind_on_the_groups_kind() -> None:
    """Four ranks, gloo, captured live: strided groups {0, 2} and {1, 3}, and one more that rank 0 reduces in.
    Each broadcasts (#1 of the world), reduces in a strided group, then all-reduces in the world. Rank 2 waits
    in its pair's first reduce, whose other member never recorded anything of it.
    Ranks 0 and 1 recorded nothing of that pair either, but each issued a strided reduce of its own (as many
    strided collectives as rank 2) and waits in the world's #2; rank 3 issued none: its stack sits in a recv
    (gloo records none). All three wait elsewhere; rank 3 alone is behind on the pair's kind: the candidate."""
    from frscope import wire
    from frscope.records import assemble, normalize_dump
    from tests.unit.test_p2p_stack_pairs import _op

    per_rank: dict[int, list[dict[str, Any]]] = {r: [_gloo(1, 100, op="broadcast")] for r in range(4)}
    per_rank[2].append(_gloo(1, 110, op="reduce", pg=("1", "strided"), done=False))
    per_rank[0] += [_gloo(1, 110, op="reduce", pg=("3", "strided")), _gloo(2, 150, done=False)]
    per_rank[1] += [_gloo(1, 110, op="reduce", pg=("2", "strided")), _gloo(2, 150, done=False)]
    stacks = {0: _op("all_reduce", "sync", 120), 1: _op("all_reduce", "sync", 120), 2: _op("reduce", "sync", 110),
              3: _op("recv", "exchange", 210)}
    pieces = []
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e["record_id"] = i
        pieces.append(wire.snapshot_piece(rank, b.T0 + 900 * MS * 1000, f"socket:/run/rank-{rank}.sock", stacks[rank],
                                          b.dump(entries, world=0, pg_config=GLOO_CONFIG)))
    findings = analyze(assemble([normalize_dump(p, p["source"], p["rank"]) for p in pieces], [])).findings
    unseen = next(f for f in [*findings, *(c for f in findings for c in f.consequences)]
                  if f.process_group.name == "1")
    assert unseen.culprit_ranks == (3,), unseen.summary
    assert any("issued as many collectives of strided" in e for e in unseen.evidence), unseen.evidence


def test_a_lone_group_of_its_kind_gives_no_order_to_read(tmp_path: Path) -> None:
    """The first test's cycle, but the odd ranks' group is the only one of its description (pp): no family of
    such groups says every rank has one, so a rank that issued none where others did may simply be no member of
    any. Every rank that recorded nothing of it stays a candidate."""
    even, odd = ("1", "dp"), ("2", "pp")
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in range(6):
        entries = [_gloo(1, 100, op="broadcast")]
        if rank == 3:
            entries.append(_gloo(2, 150, op="barrier", done=False))
        elif rank % 2:
            entries.append(_gloo(1, 110, pg=odd, done=False))
        else:
            entries += [_gloo(1, 110, pg=even), _gloo(2, 150, op="barrier", done=False)]
        per_rank[rank] = entries
    unseen = next(f for f in _analyze(tmp_path, per_rank) if f.process_group.name == "2")
    assert set(unseen.culprit_ranks) == {0, 2, 3, 4} and unseen.ambiguous, unseen.summary
