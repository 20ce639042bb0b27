"""Random programs the analysis missed (issue 33), each replayed in every capture form and judged against the
executor's own truth (`python -m frscope.testing.randprog replay SEED`): a generated case that failed before
the change named beside it, so it stays fixed."""

from __future__ import annotations

import pytest

from frscope.testing.randprog.score import score_case

FIXED = {
    424282: "NCCL ring of batch_isend_irecv, a rank stuck before its batch: no finding before (batch_waits)",
    1196: "the same, a 6-rank ring (batch_waits)",
    5690: "a stale periodic dump of a rank its neighbours' batches wait for (batch_waits)",
    425402: "an extra collective; a rank that never called it waits in a batch on the caller (named_waits)",
    7289: "an extra collective; a rank that never called it waits in a send to the caller (named_waits)",
    931941: "gloo, a crash amid async collectives, 2 ranks: no finding before (stuck._failed_after)",
    934039: "gloo, the same with 6 ranks (stuck._failed_after)",
    424389: "gloo, the same; the snapshot said nothing (stuck._failed_after)",
    931333: "format 2.2, batches before a group's first collective read as a type mismatch (rowwise)",
    355: "format 2.2, the same (rowwise)",
    931615: "gloo, a periodic dump read before the others' newest entries, 50 ms steps: no finding (clock: an mtime "
            "bounded by the rank's own entries)",
    930106: "gloo, a rank SIGKILLed with a stale periodic dump; a peer that failed with it read as the stopped one "
            "(precedence._stops_under_first_failure)",
    7527: "gloo, the same with a SIGABRT (precedence._stops_under_first_failure)",
    930627: "a cycle of two groups, one rank in one, two in the other (rootcause._odd_side)",
    932908: "a cycle of two groups on gloo with a small ring (rootcause._odd_side)",
    1216011: "healthy, format 2.2, a ring of 20: the broadcast opening a group's oldest seq evicted, the batch "
             "recorded under it kept: read as a type mismatch (history._p2p_under_collective_seqs)",
    2436900: "healthy, format 2.2, a ring of 35: a batch recorded as one `coalesced` entry under the collective "
             "seq outlived its all_gather; seen by its p2p seq advancing inside a seq "
             "(history._p2p_under_collective_seqs)",
    4447207: "healthy gloo, 32 ranks, a 2-rank group whose async collectives each rank enqueues at once: one step's "
             "jitter counted once per async collective read as a straggler (stragglers_steps: a wait carried to the "
             "next collectives counted once, on every backend)",
    1207145: "gloo, an extra all_reduce meeting a peer's all_gather while the others wait for it in another group: "
             "read as a type mismatch (history._disagreement: the wait-for graph reads a call ahead of its order)",
    1213891: "the same, read as a size mismatch (history._disagreement)",
    1207184: "gloo snapshot, ranks in monitored_barrier: a finished rank outside the barrier's group named with the "
             "stuck one (waitfor.barrier_group: the group its sequence gaps show)",
    312: "gloo snapshot, a monitored_barrier read as a send to the next rank, a finished one (waitfor.barrier_group)",
    500876: "gloo snapshot, two ranks both receiving first: the stage before them, finished steps later, named "
            "instead (waitfor.went_on)",
    501235: "the same on a 2-D mesh (waitfor.went_on)",
    424813: "the same, the finished stage's group went on 8 steps (waitfor.went_on)",
    2415745: "gloo reorder, 32 ranks: a dp group's unseen member read as any of 17 ranks that recorded nothing of "
             "it; the rank whose own order differs (crossgroup.skipped_kind)",
    2417019: "the same, the cycle rooted at the older finding, which named the ranks that kept the order "
             "(rootcause._breaker: skipped_kind)",
    2412378: "NCCL format 2.2, a skipped last collective: a batch under the seq before it read as "
             "'scatter+coalesced', a type mismatch (rowwise: an entry that advanced the p2p count)",
    2417479: "NCCL format 2.2, a stuck rank (rowwise: the same)",
    2413917: "gloo snapshot, a send inside the step, ranks in Python inside it and past it: the stage after it, "
             "past the step, named (stacks.still_inside)",
    2411672: "gloo snapshot, a pipeline's stuck stage named with a rank that finished (stacks.still_inside)",
    2414401: "the same (stacks.still_inside)",
    2414737: "the same (stacks.still_inside)",
    2413798: "gloo snapshot, monitored_barrier: a finished rank named, not the stuck one (stacks.still_inside)",
    2415627: "the same (stacks.still_inside)",
    2417740: "gloo snapshot, a recv: a finished stage named, not the stuck one (stacks.still_inside)",
    2416757: "gloo snapshot, a p2p deadlock; a strided pair's unseen member read as six ranks, four of which ran "
             "their own strided collective (crossgroup.behind_on_kind)",
    2417449: "gloo snapshot, a p2p deadlock; a lone pp_stage group's unseen member read as a rank in no such group "
             "that 'skipped' it (crossgroup.family_kind: kinds only from a family of groups)",
}


@pytest.mark.parametrize("seed", sorted(FIXED))
def test_fixed_random_program(seed: int) -> None:
    verdicts = [v for v in score_case(seed) if not v.undecidable]
    assert verdicts, "every form undecidable: the case no longer tests anything"
    wrong = [f"{v.form}: got {v.got}" for v in verdicts if not v.right]
    assert not wrong, f"seed {seed} ({FIXED[seed]}), truth {verdicts[0].truth}: " + "; ".join(wrong)
