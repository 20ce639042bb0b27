"""gloo point-to-point waits read from live stacks alone (issue 33, principle 6: hangs the recorder cannot see).
gloo records no send/recv, and a stack names no peer, only the op and the exchange (the user function) it was
called from. In the one wait-for model: two ranks that are the only ones waiting in an exchange, both
receiving first, wait on each other (a cycle: both are the candidates, whoever else waits behind them);
a send facing a receive of the same exchange from the next member of a group both belong to never matches
(one of the two named another peer); and a rank in Python is the end of the waits only where a wait
reaches it. Each case is a sidecar capture: idle gloo recorders (every entry retired) and the stacks."""

from __future__ import annotations

from frscope import wire
from frscope.analysis import AnalysisOptions, Category, Finding, analyze
from frscope.records import assemble, normalize_dump
from tests.unit import builders as b
from tests.unit.test_unrecorded_waits import SITE, _stack

S = 1_000_000_000
LAST = b.T0 + 100 * S
DONE = _stack(("wait_for_next_epoch", "/app/train.py", 310), ("main", "/app/train.py", 318))


def _op(name: str, func: str, line: int) -> str:
    line_in_c10d = 2466 if name == "send" else 2524
    return _stack((name, f"{SITE}/distributed_c10d.py", line_in_c10d), (func, "/app/train.py", line),
                  ("train_step", "/app/train.py", 250), ("main", "/app/train.py", 300))


def _capture(stacks: dict[int, str], groups: dict[str, list[int]] | None = None,
             open_in: dict[str, list[int]] | None = None) -> list[Finding]:
    """Idle gloo recorders of len(stacks) ranks captured with `stacks`; `groups`: further groups (name ->
    members), each member having recorded one retired collective in it (gloo's pg_config lists no subgroup);
    `open_in`: the members of a group that entered its second collective, still open."""
    world = len(stacks)
    per_rank = {r: [b.entry(s, backend="gloo", state="scheduled", retired=True, created_ns=LAST - (20 - s) * S // 5)
                    for s in range(1, 21)] for r in range(world)}
    for name, members in (groups or {}).items():
        for r in members:
            per_rank[r].append(b.entry(1, backend="gloo", pg=(name, "pp"), state="scheduled", retired=True,
                                       created_ns=LAST + 1))
    for name, members in (open_in or {}).items():
        for r in members:
            per_rank[r].append(b.entry(2, op="all_gather", backend="gloo", pg=(name, "pp"), state="scheduled",
                                       retired=False, created_ns=LAST + 2))
    for entries in per_rank.values():
        for i, e in enumerate(entries):
            e["record_id"] = i
    pieces = [wire.snapshot_piece(r, LAST + 60 * S, f"socket:/run/rank-{r}.sock", stacks[r],
                                  b.dump(per_rank[r], world=world)) for r in range(world)]
    report = analyze(assemble([normalize_dump(p, p["source"], p["rank"]) for p in pieces], []),
                     AnalysisOptions(stall_after_s=10.0))
    return report.findings


def test_two_ranks_receiving_first_in_one_exchange_are_the_pair_a_stage_waits_behind() -> None:
    """Rank 0 (a pipeline stage) waits in send for rank 1; ranks 1 and 2 are the only ranks in `exchange`,
    both receiving first: they wait on each other, and rank 0 waits behind them (not the odd one out)."""
    stacks = {0: _op("send", "pipeline_stage", 120), 1: _op("recv", "exchange", 210), 2: _op("recv", "exchange", 210)}
    root = _capture(stacks)[0]
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (1, 2), root.summary


def test_a_receiving_pair_and_a_stage_receiving_behind_it_name_the_pair() -> None:
    """Rank 1 sends toward rank 2 and rank 3 receives from rank 2 (pipeline stages); ranks 2 and 4 both
    receive first in `exchange`; rank 0 waits in a collective-free Python loop of its own (done)."""
    stacks = {0: DONE, 1: _op("send", "pipeline_stage", 120), 2: _op("recv", "exchange", 210),
              3: _op("recv", "pipeline_stage", 120), 4: _op("recv", "exchange", 210)}
    root = _capture(stacks)[0]
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (2, 4), root.summary


def test_a_rank_in_python_that_no_wait_reaches_is_no_culprit() -> None:
    """Ranks 0 and 1 both receive first in `exchange`; rank 2 sits in its own Python (a batch wait shows only
    the user's frame): the pair's waits end at each other, not at rank 2."""
    stacks = {0: _op("recv", "exchange", 210), 1: _op("recv", "exchange", 210),
              2: _stack(("exchange_halo", "/app/train.py", 120), ("main", "/app/train.py", 300))}
    root = _capture(stacks)[0]
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (0, 1), root.summary


def test_a_facing_pair_of_a_pipeline_is_named_beside_finished_ranks() -> None:
    """A pipeline over ranks 0-4: rank 2 waits in send for rank 3, which waits in recv in the same exchange
    (it named another peer), and rank 4 waits behind it; ranks 0 and 1 finished (in Python, waited on by
    nobody). The facing pair is the finding, not the finished ranks."""
    stacks = {0: DONE, 1: DONE, 2: _op("send", "pipeline_stage", 141), 3: _op("recv", "pipeline_stage", 141),
              4: _op("recv", "pipeline_stage", 141)}
    root = _capture(stacks)[0]
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (2, 3), root.summary
    assert root.ambiguous


def test_a_facing_pair_along_a_group_of_non_consecutive_ranks() -> None:
    """Pipeline stages are the members of group 1 (ranks 0, 2, 5) in order: rank 2's send to rank 5 and rank
    5's recv in the same exchange face each other; the ranks beside them in the default group (3, 4) are
    finished, waited on by nobody."""
    stacks = {r: DONE for r in range(6)}
    stacks[2], stacks[5] = _op("send", "pipeline_stage", 141), _op("recv", "pipeline_stage", 141)
    root = _capture(stacks, {"1": [0, 2, 5]})[0]
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (2, 5), root.summary


def test_senders_whose_next_stages_are_a_receiving_pair_wait_behind_it() -> None:
    """Two pipelines (groups [0, 3] and [2, 5]): ranks 0 and 2 wait in send in pipeline_stage, each toward its
    next stage, and those (3 and 5) are the only ranks in `exchange`, both receiving first: the receiving pair
    is the cycle, the senders its victims."""
    stacks = {r: DONE for r in range(6)}
    stacks[0], stacks[2] = _op("send", "pipeline_stage", 120), _op("send", "pipeline_stage", 120)
    stacks[3], stacks[5] = _op("recv", "exchange", 210), _op("recv", "exchange", 210)
    root = _capture(stacks, {"1": [0, 3], "2": [2, 5]})[0]
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (3, 5), root.summary


def test_a_pair_of_one_groups_stages_is_read_in_that_groups_order() -> None:
    """Ranks 2 and 4, the only ranks in `exchange`, both receive first. They are consecutive members of group
    1 (ranks 0, 2, 4), whose member before them (rank 0) waits in a collective, not in Python: no chain of that
    group's stages starts at a rank in Python, and finished ranks 1 and 3 (in Python) are no stage before them
    in any order where 2 and 4 follow each other. The pair waits on each other."""
    stacks = {r: DONE for r in range(6)}
    stacks[0] = _stack(("all_reduce", f"{SITE}/distributed_c10d.py", 3906), ("main", "/app/train.py", 52))
    stacks[2], stacks[4] = _op("recv", "exchange", 210), _op("recv", "exchange", 210)
    root = _capture(stacks, {"1": [0, 2, 4]})[0]
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (2, 4), root.summary


def test_stages_whose_stage_before_waits_on_the_pair_in_a_collective_wait_behind_the_pair() -> None:
    """Ranks 0 and 4, the only ranks in `exchange`, both receive first. Ranks 5-7 wait in all_gather #2 of
    group 1 (ranks 4-7) for rank 4; ranks 8-11 receive in pipeline_stage, the first of them from rank 7. Their
    waits go, through rank 7's collective, to the pair: they are no pairing of their own (a receiver at rank
    0 belongs to the pair, and says nothing of whether the others are a chain of stages)."""
    stacks = {r: DONE for r in range(12)}
    stacks[0], stacks[4] = _op("recv", "exchange", 210), _op("recv", "exchange", 210)
    for r in (5, 6, 7):
        stacks[r] = _stack(("all_gather", f"{SITE}/distributed_c10d.py", 4287), ("main", "/app/train.py", 90))
    for r in range(8, 12):
        stacks[r] = _op("recv", "pipeline_stage", 141)
    findings = _capture(stacks, {"1": [4, 5, 6, 7]}, open_in={"1": [5, 6, 7]})
    root = findings[0]
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (0, 4), root.summary


def _went_on_capture(ahead: int) -> list[Finding]:
    """4 gloo ranks, 20 steps of two collectives (an all_reduce on the pair's own group, a broadcast on the
    default group), 0.2 s apart. Ranks 2 and 3 stopped after step 12 and now both wait in recv in
    `exchange`; ranks 0 and 1 ran `ahead` steps further (the pair's group [0, 1] needs neither 2 nor 3) and are
    in Python now."""
    stacks = {0: DONE, 1: DONE, 2: _op("recv", "exchange", 210), 3: _op("recv", "exchange", 210)}
    pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
    pieces = []
    for r, text in stacks.items():
        steps = 12 + (ahead if r < 2 else 0)
        pair = ("1", "tp") if r < 2 else ("2", "tp")
        entries = []
        for step in range(1, steps + 1):
            t = b.T0 + step * S // 5
            entries.append(b.entry(step, backend="gloo", pg=pair, state="scheduled", retired=True, created_ns=t))
            if step <= 12:
                entries.append(b.entry(step, op="broadcast", backend="gloo", state="scheduled", retired=True,
                                       created_ns=t + 1000))
        for i, e in enumerate(entries):
            e["record_id"] = i
        pieces.append(wire.snapshot_piece(r, b.T0 + 60 * S, f"socket:/run/rank-{r}.sock", text,
                                          b.dump(entries, world=4, pg_config=pg_config)))
    report = analyze(assemble([normalize_dump(p, p["source"], p["rank"]) for p in pieces], []),
                     AnalysisOptions(stall_after_s=10.0))
    return report.findings


def test_a_rank_in_python_that_ran_on_after_the_waits_began_is_no_end_of_them() -> None:
    """Principle 1: rank 1 sits in Python, the stage before ranks 2 and 3, which both receive in `exchange`
    (the chain reading would end their waits at it). But rank 1 recorded its group's all_reduce twice after
    ranks 2 and 3 last recorded anything: it ran whole steps while they waited, so it was not stopped before a
    send of theirs. The two receivers wait on each other."""
    root = _went_on_capture(ahead=4)[0]
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (2, 3), root.summary


def test_a_rank_in_python_that_stopped_with_the_waiters_is_the_stage_they_wait_behind() -> None:
    """The same stacks where ranks 0 and 1 stopped with ranks 2 and 3: rank 1 (the stage before them, in
    Python) never sent, and rank 3 waits behind rank 2 (the chain reading stands)."""
    root = _went_on_capture(ahead=0)[0]
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (1,), root.summary


def test_principle1_a_rank_that_returned_from_the_step_is_no_end_of_the_waits_inside_it() -> None:
    """Rank 0 waits in send (gloo: no record, no peer in the stack) inside `train_step`; rank 3 sits in Python
    inside the same step (`wait_for_data` under `train_step`, under `main` at the loop's line); ranks 1 and 2
    are in Python too, but outside it (`main` at another line: they returned from their last step, having run
    it to the end). The wait ends at rank 3, not at rank 1, the stage after rank 0, nor at every rank in Python."""
    in_step = _stack(("wait_for_data", "/app/train.py", 177), ("train_step", "/app/train.py", 250),
                     ("main", "/app/train.py", 300))
    root = _capture({0: _op("send", "pipeline_stage", 162), 1: DONE, 2: DONE, 3: in_step})[0]
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (3,), root.summary
    assert any("outside the step" in e for e in root.evidence)


def test_ranks_all_outside_the_step_stay_candidates() -> None:
    """The same with no rank in Python inside the step: nothing sets the ranks that returned from it apart."""
    findings = _capture({0: _op("send", "pipeline_stage", 162), 1: DONE, 2: DONE, 3: DONE})
    assert findings and not any("outside the step" in e for f in findings for e in f.evidence)
