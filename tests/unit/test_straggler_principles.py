"""Issue 33's principle 5 and the wait chains behind it, on small exact jobs: a straggler is the rank whose
own lateness makes the others wait, never a rank late only because it waited for the straggler in
another group first, nor a rank whose usual head start is taken for a clock offset. Each test builds
torch-shaped dumps from a tiny blocking schedule: every rank runs the same steps, a collective ends when
its last member arrives, and a rank goes on from there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.records import load_dumps
from tests.unit import builders as b

MS = 1_000_000
Groups = dict[str, tuple[int, ...]]
Dumps = dict[int, list[dict[str, Any]]]


def _run(groups: Groups, step: list[str], steps: int, compute_ms: Callable[[int, int], float], *,
         backend: str = "gloo", timing: bool = False, prologue: tuple[str, ...] = ()) -> Dumps:
    """Each step: every rank computes `compute_ms(rank, step)`, then runs the collectives of `step` (group
    names, "~name" an async one; a rank skips the groups it is not in; "send A B": rank A sends to rank B over
    the world group,
    recorded by NCCL only). gloo blocks in each op until its last party arrives; NCCL ranks go on after
    enqueuing and wait for the step's ops at its end (the step's sync); `timing`: NCCL records each
    collective's duration (TORCH_NCCL_ENABLE_TIMING), from its kernel's start: once it is enqueued and the
    rank's previous collective ended (one stream)."""
    world = 1 + max(r for ranks in groups.values() for r in ranks)
    now = dict.fromkeys(range(world), 0.0)
    seqs = dict.fromkeys(groups, 0)
    per_rank: Dumps = {r: [] for r in range(world)}
    nccl = backend == "nccl"
    stream_free = dict.fromkeys(range(world), 0.0)  # NCCL: when each rank's last collective kernel ended

    def collective(name: str, done_by: dict[int, float]) -> None:
        blocking = not name.startswith("~")  # "~group": an async op (gloo's CPU goes on too)
        name = name.lstrip("~")
        seqs[name] += 1
        ranks = groups[name]
        end = max(now[r] for r in ranks) + 0.2
        for r in ranks:
            state: dict[str, Any] = {"state": "scheduled", "retired": True}
            if nccl:
                state = {"state": "completed", "duration_ms": end - max(now[r], stream_free[r]) if timing else None}
                stream_free[r] = end
            per_rank[r].append(b.entry(seqs[name], backend=backend, pg=(name, name), op="all_reduce",
                                       created_ns=b.T0 + int(now[r] * MS), **state))
            done_by[r] = max(done_by.get(r, 0.0), end)
            now[r] = (now[r] + 0.02) if nccl or not blocking else end + 0.05

    p2p_seqs = dict.fromkeys(range(world), 0)

    def send(src: int, dst: int, done_by: dict[int, float]) -> None:
        end = max(now[src], now[dst]) + 0.2
        for r, op, peer in ((src, "send", f" {src}->{dst}"), (dst, "recv", f" {dst}<-{src}")):
            p2p_seqs[r] += 1
            if nccl:
                entry = b.entry(0, backend=backend, pg=("world", "world"), op=op, peer=peer, p2p_seq=p2p_seqs[r],
                                created_ns=b.T0 + int(now[r] * MS))
                entry["time_discovered_completed_ns"] = b.T0 + int(end * MS)
                per_rank[r].append(entry)
            done_by[r] = max(done_by.get(r, 0.0), end)
            now[r] = (now[r] + 0.02) if nccl else end + 0.05

    for name in prologue:
        collective(name, {})
    for s in range(steps):
        for r in now:
            now[r] += compute_ms(r, s)
        done_by: dict[int, float] = {}
        for name in step:
            if name.startswith("send "):
                send(int(name.split()[1]), int(name.split()[2]), done_by)
            else:
                collective(name, done_by)
        if nccl:
            for r, end in done_by.items():
                now[r] = max(now[r], end) + 0.05
    return per_rank


def _findings(tmp_path: Path, groups: Groups, per_rank: Dumps) -> list[tuple[Category, tuple[int, ...]]]:
    world = len(per_rank)
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e["record_id"] = i
        config = {name: {"name": name, "desc": name, "ranks": str(list(ranks))} for name, ranks in groups.items()
                  if rank in ranks}
        b.write_pickle(tmp_path, rank, b.dump(entries, world=world, pg_config=config))
    report = analyze(load_dumps([tmp_path]), AnalysisOptions(now_ns=b.T0 + 3600 * 10**9))
    return [(f.category, f.culprit_ranks) for f in report.findings]


def _jitter(rank: int, step: int) -> float:
    return ((rank * 7 + step * 13) % 5) * 0.3  # a fixed spread of under 1.5 ms


def test_a_rank_early_at_most_collectives_of_a_group_is_no_straggler_where_it_is_on_time(tmp_path: Path) -> None:
    """Rank 1 reaches group tp's collective 140 ms late each step; ranks 0-2 wait for it there, then reach
    group dp's first collective together, 140 ms after rank 3 (which is not in tp). dp's second collective
    runs in lockstep. Rank 3's usual place at dp is 70 ms early: no clock runs that far off (the skew bound
    is 20 ms), so it is never late at the lockstep collective: rank 1 is the one straggler."""
    groups = {"dp": (0, 1, 2, 3), "tp": (0, 1, 2)}
    per_rank = _run(groups, ["tp", "dp", "dp"], 10, lambda r, s: 200 + (140 if r == 1 else 0) + _jitter(r, s))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (1,))]


def test_a_slow_nodes_ranks_late_at_every_nccl_step_are_named_each_step(tmp_path: Path) -> None:
    """NCCL, 8 ranks, one collective a step: ranks 0 and 1 (one node) start every step 150 ms late. The
    same late set at consecutive collectives is a new wait each time the others reached the next one after
    the late ranks had reached the previous (the others waited for them in between, at the step's sync).
    The two take turns at being last, so neither is last at most collectives by itself; all ranks met at
    the model's broadcast before the first step in step (so no clock of theirs is 150 ms off)."""
    groups = {"world": tuple(range(8))}
    per_rank = _run(groups, ["world"], 10, lambda r, s: 200 + (150 + (r + s) % 2 if r in (0, 1) else _jitter(r, s)),
                    backend="nccl", prologue=("world",))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (0, 1))]


def test_an_nccl_late_step_start_carried_to_the_steps_collectives_is_one_wait(tmp_path: Path) -> None:
    """NCCL enqueues a step's collectives without waiting: rank 2, late at the start of 2 steps of 12,
    is late at all three collectives of each (the others enqueued them before it reached the first one):
    two waits, not six, and two are no pattern."""
    groups = {"world": (0, 1, 2, 3)}
    per_rank = _run(groups, ["world"] * 3, 12, lambda r, s: 200 + (300 if r == 2 and s in (3, 8) else 0)
                    + _jitter(r, s), backend="nccl")
    assert _findings(tmp_path, groups, per_rank) == []


def test_a_slow_nodes_ranks_late_at_every_collective_are_named_together(tmp_path: Path) -> None:
    """NCCL with durations, 8 ranks: ranks 2 and 3 (one node) reach every collective ~150 ms late; rank 3
    comes last at most of them, by a ms or two over rank 2. Both are late, not rank 3 alone."""
    groups = {"world": tuple(range(8))}
    per_rank = _run(groups, ["world", "world"], 12, lambda r, s: 200 + (150 + (r == 3) * 1.5 if r in (2, 3) else
                                                                          _jitter(r, s)), backend="nccl", timing=True)
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (2, 3))]


def test_a_rank_that_waited_for_the_straggler_in_another_group_passes_its_lateness_on(tmp_path: Path) -> None:
    """Rank 2 reaches its pair group's collective 110 ms late each step; rank 3, its partner there, waits
    for it and so reaches the world group's next collective as late as rank 2: ranks 2 and 3 late together
    there, like a slow node. Rank 3's lateness is rank 2's, passed on (it came on from the pair group at
    once, also through a second pair collective in lockstep): rank 2 is the straggler, alone."""
    groups = {"world": tuple(range(6)), "pair01": (0, 1), "pair23": (2, 3), "pair45": (4, 5)}
    for lockstep in ([], ["pair01", "pair23", "pair45"]):
        per_rank = _run(groups, ["pair01", "pair23", "pair45", *lockstep, "world"], 11,
                        lambda r, s: 200 + (110 if r == 2 else 0) + _jitter(r, s), prologue=("world",))
        (tmp_path / str(len(lockstep))).mkdir()
        assert _findings(tmp_path / str(len(lockstep)), groups, per_rank) == [(Category.STRAGGLER, (2,))], lockstep


def test_two_ranks_one_late_by_the_same_wait_at_each_of_five_short_steps_is_a_straggler(tmp_path: Path) -> None:
    """Principle 5, 2-rank jobs: 5 steps of 50 ms, rank 1 starts each ~43 ms late. Five waits are a coin
    toss by count alone, but they are one length and all of the waiting: a straggler, as five steady late
    collectives are for the consistent check. Jitter alone over as many steps stays quiet."""
    groups = {"world": (0, 1)}
    per_rank = _run(groups, ["world", "world", "world"], 5, lambda r, s: 50 + (43 if r == 1 else 0) + _jitter(r, s),
                    prologue=("world",))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (1,))]
    for seed in range(20):
        jittery = _run(groups, ["world", "world", "world"], 5,
                       lambda r, s, seed=seed: 50 + ((r * 31 + s * 17 + seed * 7) % 11) * 4.0, prologue=("world",))
        (tmp_path / str(seed)).mkdir()
        assert _findings(tmp_path / str(seed), groups, jittery) == [], seed


def test_a_slow_nodes_ranks_each_late_in_a_group_of_its_own_are_one_node(tmp_path: Path) -> None:
    """Ranks 0 and 1 (one node) start every step 60 ms late; they share no collective after the first, each
    is late in its own pair group (0 with 3, 1 with 4). One slow node, named whole."""
    groups = {"world": tuple(range(6)), "pair03": (0, 3), "pair14": (1, 4), "pair25": (2, 5)}
    per_rank = _run(groups, ["pair14", "pair25", "pair03"], 8,
                    lambda r, s: 50 + (60 if r in (0, 1) else 0) + _jitter(r, s), prologue=("world",))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (0, 1))]


def test_a_clock_is_read_where_the_group_runs_in_lockstep_not_from_a_rank_late_at_half_its_collectives(
        tmp_path: Path) -> None:
    """Pair group 0-1 runs two collectives a step: rank 1 reaches the first 27 ms late (each 50 ms step),
    the second in lockstep. Read as a usual offset, half of that lateness would be rank 1's clock and half
    of it rank 0's, and no wait would be left; the lockstep collectives show both clocks agree."""
    groups = {"world": (0, 1, 2, 3), "pair01": (0, 1), "pair23": (2, 3)}
    per_rank = _run(groups, ["pair01", "pair23", "pair01", "pair23"], 9,
                    lambda r, s: 50 + (27 if r == 1 else 0) + _jitter(r, s), prologue=("world",))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (1,))]


def test_a_slow_nodes_ranks_a_few_ms_apart_where_they_meet_are_still_one_node(tmp_path: Path) -> None:
    """As above, and the node's ranks meet again in a world collective each step, rank 1 a couple of ms
    after rank 0: rank 0 'waiting' there for rank 1 is the node late together, not rank 1's lateness
    passed on to rank 0."""
    groups = {"world": tuple(range(6)), "pair03": (0, 3), "pair14": (1, 4), "pair25": (2, 5)}
    per_rank = _run(groups, ["pair14", "pair25", "pair03", "world"], 8,
                    lambda r, s: 50 + (60 + 2 * r if r in (0, 1) else 0) + _jitter(r, s), prologue=("world",))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (0, 1))]



def test_a_rank_released_late_at_the_end_of_a_step_passes_the_lateness_into_the_next(tmp_path: Path) -> None:
    """NCCL: rank 0 computes 300 ms more each step and sends to rank 2 at the step's end; rank 2 waits for
    that send at its step's sync, so it starts its next step, and reaches its collective with rank 3, as
    late, after the same compute as rank 3: released late (its recv completed late), not slow. Rank 0
    alone is named, though it shares no collective with rank 2."""
    groups = {"world": (0, 1, 2, 3), "g01": (0, 1), "g23": (2, 3)}
    per_rank = _run(groups, ["g01", "g23", "send 0 2"], 9, lambda r, s: 500 + (300 if r == 0 else 0) + _jitter(r, s),
                    backend="nccl", prologue=("world",))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (0,))]


def test_nccl_jitter_at_a_steps_start_is_one_wait_for_the_consistent_check_too(tmp_path: Path) -> None:
    """A healthy NCCL job read from a small ring: three 1.5 s steps of four collectives enqueued back to
    back, the step's latest starter (jitter of tens of ms) last at all four. Rank 3 happened to start two
    of the three steps last: two waits in three, not 8 of 12 collectives."""
    groups = {"world": tuple(range(8))}
    start = {(3, 0): 45.0, (3, 1): 40.0, (5, 2): 42.0}
    per_rank = _run(groups, ["world"] * 4, 3, lambda r, s: 1500 + start.get((r, s), ((r * 7 + s * 3) % 9) * 3.0),
                    backend="nccl", prologue=("world",))
    assert _findings(tmp_path, groups, per_rank) == []


def test_a_late_step_start_carried_over_gloo_async_ops_is_one_wait(tmp_path: Path) -> None:
    """A healthy 2-rank gloo job of 1.5 s steps (compute jitter of tens of ms) read from a small ring: each
    step an async all_reduce, then an all_gather; rank 1 happened to start all four steps last. The
    all_gather right after the async op is the same wait carried, not a second one: four waits in two
    ranks, steady in nothing, no straggler."""
    groups = {"world": (0, 1)}
    late = [22.0, 24.0, 56.0, 38.0]
    per_rank = _run(groups, ["~world", "world"], 4, lambda r, s: 1500 + (late[s] if r == 1 else 0.0),
                    prologue=("world", "world"))
    assert _findings(tmp_path, groups, per_rank) == []


def test_lateness_passed_on_is_judged_at_each_checks_own_margin(tmp_path: Path) -> None:
    """Principle 1 behind principle 5, gloo, 6 ranks: ranks 0 and 1 (one node) compute 47-51 ms more each
    step; rank 2, with them in group a, waits there for them (a little less than the world group's gap,
    its own compute being a ms longer than ranks 3-5's) and reaches the world collective with them. The step
    check looks for waits of 50 ms first, then of 20: at 50 ms rank 2's 49.5 ms wait in group a is "among the
    last itself", at 20 it is a wait for ranks 0 and 1. What one margin decided about rank 2's release is
    no answer for the other (one record of releases per analysis serves every check): ranks 0 and 1 are the
    slow node, rank 2 is not part of it."""
    groups = {"world": tuple(range(6)), "a": (0, 1, 2), "b": (3, 4, 5)}
    late = [50.5, 51.2, 48.2, 47.4, 49.0]
    per_rank = _run(groups, ["a", "b", "a", "b", "world"], 5,
                    lambda r, s: 50 + (late[s] if r in (0, 1) else 1.0 if r == 2 else 0.0),
                    prologue=("world", "world", "world"))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (0, 1))]


def test_ranks_that_leave_a_blocking_collective_together_are_none_of_them_last_at_the_next(tmp_path: Path) -> None:
    """Principle 5, a slow node on gloo, 8 ranks: ranks 6 and 7 start every step 60 ms late; the step's second
    collective follows the first in lockstep, every rank arriving at the same moment (gloo lets a
    collective's members go on together). A tie at the latest arrival makes no rank the last: credited to
    the higher rank, rank 7 was 'last' at every lockstep collective and named alone."""
    groups = {"world": tuple(range(8))}
    per_rank = _run(groups, ["world", "world"], 9, lambda r, s: 50 + (60 if r in (6, 7) else 0) + _jitter(r, s))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (6, 7))]


def test_a_slow_node_seen_whole_in_one_group_is_one_finding_not_one_per_rank_elsewhere(tmp_path: Path) -> None:
    """Principle 5, NCCL, 8 ranks: ranks 4 and 5 (one node) start every step 240 ms late. Each is the only late
    rank of its pipeline group (4 with 6; 5 with 0-3 and 7), and the world group shows them late together.
    One finding names the node; rank 5's own group is part of it, not a straggler of its own listed first."""
    groups = {"world": tuple(range(8)), "ppa": (4, 6), "ppb": (0, 1, 2, 3, 5, 7)}
    per_rank = _run(groups, ["ppa", "ppb", "world"], 9, lambda r, s: 200 + (240 if r in (4, 5) else 0) + _jitter(r, s),
                    backend="nccl", prologue=("world",))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (4, 5))]


def test_collectives_every_rank_reached_at_once_are_no_samples_of_who_comes_last(tmp_path: Path) -> None:
    """Principle 5, NCCL with durations, 3 ranks: rank 1 starts each of 9 steps 20-25 ms late (about the
    clock skew a host may have, so the step check takes the first step's 19.5 ms for its clock; the others'
    longer durations show they waited), each step's four collectives enqueued back to back (one wait,
    carried). Three collectives before the first step were reached by every rank at the same instant:
    nobody came last there, so they are no samples against rank 1's 9 of 9 (as samples, 9 of 12 was within
    chance for 3 ranks)."""
    groups = {"world": (0, 1, 2)}
    late = [19.5, 23.0, 22.0, 21.5, 24.5, 22.5, 23.5, 24.0, 22.0]
    per_rank = _run(groups, ["world"] * 4, 9, lambda r, s: 50 + (late[s] if r == 1 else 0) + _jitter(r, s) / 2,
                    backend="nccl", timing=True, prologue=("world",) * 3)
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (1,))]


def test_a_clock_is_read_only_where_the_durations_say_nobody_waited(tmp_path: Path) -> None:
    """A healthy 2-rank NCCL job with durations, 11 steps of 1.5 s, each rank's compute jittered by tens of
    ms: rank 0 started four steps within the 20 ms clock skew after rank 1, rank 1 six steps after rank 0.
    Read as a clock offset, those four small waits made rank 0's clock 8 ms ahead and lifted rank 1's waits
    over 50 ms at five steps of one length: a 'steady' straggler out of jitter. The durations show rank 1
    waited at those four collectives: no lockstep there, no clock to read, no finding."""
    groups = {"world": (0, 1)}
    late = {0: [13.9, 19.8, 0, 0, 0, 17.9, 62.2, 0, 0, 0, 0], 1: [0, 0, 55.4, 37.4, 26.3, 0, 0, 3.9, 52.3, 71.7, 50.0]}
    per_rank = _run(groups, ["world"], 11, lambda r, s: 1500 + late[r][s], backend="nccl", timing=True)
    assert _findings(tmp_path, groups, per_rank) == []


def test_a_slow_nodes_ranks_taking_turns_at_last_are_judged_as_the_set(tmp_path: Path) -> None:
    """Principle 5, gloo: ranks 2 and 3 (one node) start each of 5 steps ~390 ms late in a 6-rank group that
    runs one collective a step (so no collective of it is in lockstep to read clocks from). Rank 3 is last
    at 3 of the 5: as one rank of six that is within chance, but the pair late together at all five is not
    (1 in 15 per collective): the node is named, not nobody."""
    groups = {"world": tuple(range(8)), "aux": (0, 2, 3, 4, 6, 7)}
    late = {2: [415.0, 388.3, 385.0, 379.4, 367.6], 3: [412.6, 394.1, 380.3, 387.6, 405.3]}
    per_rank = _run(groups, ["aux"], 5, lambda r, s: 500 + (late[r][s] if r in late else 0) + _jitter(r, s),
                    prologue=("world",))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (2, 3))]


def test_a_wait_carried_to_queued_collectives_is_no_lockstep_to_read_clocks_from(tmp_path: Path) -> None:
    """A healthy 2-rank NCCL job with durations, 12 steps of 1.5 s, six collectives enqueued back to back
    each step, compute jittered by tens of ms. Where rank 1 started a step 14-16 ms late, the step's five
    queued collectives show it as late (its one wait, carried) with durations that agree (their kernels
    queue behind the first): no lockstep, so no clock to read there. Read as one, rank 1's clock was 7 ms
    ahead and rank 0's jitter became five waits over 50 ms."""
    groups = {"world": (0, 1)}
    late = {0: [0, 24.6, 64.8, 62.4, 38.7, 75.9, 0, 5.3, 0, 0, 32.2, 71.2],
            1: [16.4, 0, 0, 0, 0, 0, 14.1, 0, 55.0, 24.0, 0, 0]}
    per_rank = _run(groups, ["world"] * 6, 12, lambda r, s: 1500 + late[r][s], backend="nccl", timing=True,
                    prologue=("world",) * 3)
    assert _findings(tmp_path, groups, per_rank) == []


def test_a_rank_last_at_every_step_by_a_small_share_of_it_is_no_straggler(tmp_path: Path) -> None:
    """A healthy 2-rank gloo job of 1.5 s steps, compute jittered by tens of ms: rank 1 happened to finish its
    compute 8-41 ms after rank 0 at all 10 steps (a coin toss won ten times: 1 in 512 for either rank, and a
    job runs many groups). Its lateness, ~2% of each step, is what jitter costs; a straggler costs the job
    a share of its time. A rank that computes 600 ms more each step is one."""
    groups = {"world": (0, 1)}
    late = [22.0, 35.0, 8.0, 41.0, 27.0, 15.0, 30.0, 38.0, 24.0, 19.0]
    per_rank = _run(groups, ["world"], 10, lambda r, s: 1500 + (late[s] if r == 1 else 0.0), prologue=("world",))
    assert _findings(tmp_path, groups, per_rank) == []
    slow = _run(groups, ["world"], 10, lambda r, s: 1500 + (600 + late[s] if r == 1 else 0.0), prologue=("world",))
    (tmp_path / "slow").mkdir()
    assert _findings(tmp_path / "slow", groups, slow) == [(Category.STRAGGLER, (1,))]


def test_jitters_longest_waits_are_steady_only_for_being_the_longest(tmp_path: Path) -> None:
    """A healthy 2-rank gloo job of 1.5 s steps, two collectives a step, compute jittered by up to 75 ms:
    the five waits over 50 ms all fell on rank 1 (61-76 ms: the top of jitter's range is narrow, so they
    look steady). Its lateness is no share of the job's time worth a finding: ~2% of it; rank 0 waited too,
    at other steps."""
    groups = {"world": (0, 1)}
    late = {0: [0, 23.5, 0, 0, 19.0, 0, 0, 8.1, 0, 0, 0, 27.0],
            1: [61.4, 0, 7.8, 7.1, 0, 33.2, 71.4, 0, 75.3, 75.7, 50.9, 0]}
    per_rank = _run(groups, ["world", "world"], 12, lambda r, s: 1500 + late[r][s], prologue=("world",))
    assert _findings(tmp_path, groups, per_rank) == []


def test_a_late_sets_wait_carried_to_queued_collectives_is_one_sample(tmp_path: Path) -> None:
    """NCCL, 4 ranks, 5 steps of 200 ms, three collectives enqueued back to back a step: ranks 2 and 3 start
    three of the steps ~60 ms late, ranks 0 and 1 the other two. Three late starts of five are within chance
    for one of the six pairs; counted per collective (9 of 15) they would not be. The pair's one wait at a
    step's start, carried to the step's queued collectives, is one sample."""
    groups = {"world": (0, 1, 2, 3)}
    late = {(2, 0): 62.0, (3, 0): 58.0, (2, 2): 57.0, (3, 2): 61.0, (2, 4): 63.0, (3, 4): 59.0,
            (0, 1): 64.0, (1, 3): 66.0}
    per_rank = _run(groups, ["world"] * 3, 5, lambda r, s: 200 + late.get((r, s), 0.0) + _jitter(r, s),
                    backend="nccl")
    assert _findings(tmp_path, groups, per_rank) == []


@pytest.mark.parametrize("world", [4, 6])
def test_half_the_group_late_together_is_measured_from_the_other_half(tmp_path: Path, world: int) -> None:
    """gloo, two nodes of world/2 ranks: the second node's ranks reach every collective ~150 ms late, its last
    rank a ms or two after the others, so that rank is last at nearly all of them. Measured from the group's
    middle (one of the late node) it is late by nothing; the node is late by 150 ms from the other half, which
    waits for it at every step."""
    groups = {"world": tuple(range(world))}
    half = world // 2
    per_rank = _run(groups, ["world"], 12,
                    lambda r, s: 30 + (150 + (r == world - 1) * 2.0 if r >= half else _jitter(r, s)))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, tuple(range(half, world)))]
