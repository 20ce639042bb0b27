"""The wait-for principles on small exact situations (issue 33): who a blocked rank waits for, which
side of a split is odd, and what evidence can and cannot say. Each test builds torch-shaped dumps."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path

from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.records import exits_from_json, load_dumps
from tests.unit import builders as b

SECOND = 10**9


def _steps(n: int, *, backend: str = "nccl", op: str = "all_reduce") -> list[dict[str, object]]:
    return [b.entry(s, op=op, backend=backend, created_ns=b.T0 + s * SECOND) for s in range(1, n + 1)]


def _gloo_steps(step_ns: int, late_ns: Callable[[int, int], int]) -> dict[int, list[dict[str, object]]]:
    """4 gloo ranks, 12 steps of 3 collectives each 1 ms apart; `late_ns(rank, k)`: how late the rank
    reaches the step's k-th collective."""
    per_rank: dict[int, list[dict[str, object]]] = {r: [] for r in range(4)}
    for step in range(12):
        for k in range(3):
            for r in range(4):
                start = b.T0 + step * step_ns + late_ns(r, k) + k * 1_000_000 + r * 1000
                per_rank[r].append(b.entry(step * 3 + k + 1, backend="gloo", created_ns=start))
    return per_rank


def _write_format_22(directory: Path, rank: int, entries: list[dict[str, object]], world: int) -> None:
    """A rank's pickle as format 2.2 writes it: records numbered in order, without the fields 2.2 lacks."""
    for i, e in enumerate(entries):
        e["record_id"] = i
        del e["is_p2p"], e["thread_id"], e["thread_name"], e["timeout_ms"]
    b.write_pickle(directory, rank, b.dump(entries, world=world, version="2.2"))


def test_two_ranks_receiving_from_each_other_first_are_a_p2p_deadlock(tmp_path: Path) -> None:
    # Each rank posted recv then send with the other: the recv heads its stream, so the send the other
    # waits for never runs. Both sends are there (a naive match pairs them with the recvs): a deadlock.
    per_rank = {r: _steps(3) for r in range(4)}
    t = b.T0 + 10 * SECOND
    for me, other in ((1, 2), (2, 1)):
        per_rank[me] += [
            b.entry(4, op="recv", peer=f" {me}<-{other}", p2p_seq=1, state="started", record_id=3, created_ns=t),
            b.entry(5, op="send", peer=f" {me}->{other}", p2p_seq=2, state="scheduled", record_id=4, created_ns=t),
        ]
    for r in (0, 3):
        per_rank[r].append(b.entry(4, state="started", created_ns=t))
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(now_ns=t + 700 * SECOND))
    first = report.findings[0]
    assert first.category is Category.P2P_MISMATCH and first.culprit_ranks == (1, 2), first.summary
    assert "deadlock" in first.summary


def test_a_send_and_a_recv_facing_each_other_are_no_deadlock(tmp_path: Path) -> None:
    per_rank = {r: _steps(3) for r in range(2)}
    t = b.T0 + 10 * SECOND
    per_rank[0].append(b.entry(4, op="send", peer=" 0->1", p2p_seq=1, state="started", record_id=3, created_ns=t))
    per_rank[1].append(b.entry(4, op="recv", peer=" 1<-0", p2p_seq=1, state="started", record_id=3, created_ns=t))
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 2)]), AnalysisOptions(now_ns=t + 700 * SECOND))
    assert not any("deadlock" in f.summary for f in report.findings)


def test_a_scatter_chunk_of_another_size_is_a_size_mismatch(tmp_path: Path) -> None:
    # Non-roots record no input; each rank's chunk (its output) must match the others'.
    per_rank = {}
    t = b.T0 + 10 * SECOND
    for r in range(4):
        inputs = [[4, 3, 128]] if r == 1 else []
        out = [[6, 128]] if r == 0 else [[3, 128]]
        per_rank[r] = [*_steps(3), b.entry(4, op="scatter", sizes=inputs, out_sizes=out, state="started",
                                           created_ns=t)]
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(now_ns=t + 700 * SECOND))
    first = report.findings[0]
    assert first.category is Category.SIZE_MISMATCH and first.culprit_ranks == (0,), first.summary
    assert "output [[6, 128]]" in first.summary and "[[4, 3, 128]]" not in first.summary


def test_a_healthy_scatter_has_no_finding(tmp_path: Path) -> None:
    per_rank = {r: [*_steps(3), b.entry(4, op="scatter", sizes=[[4, 3]] if r == 0 else [], out_sizes=[[3]])]
                for r in range(4)}
    assert analyze(load_dumps([b.job(tmp_path, per_rank, 4)])).findings == []


def test_the_odd_side_of_a_split_is_the_rank_that_called_one_more(tmp_path: Path) -> None:
    # Rank 3 ran one step more (uneven data): it waits alone in #6 while the three others finished all
    # they enqueued. The culprit is the one in the collective, not the majority that agrees.
    t = b.T0 + 10 * SECOND
    per_rank = {r: _steps(5, backend="gloo") for r in range(4)}
    per_rank[3].append(b.entry(6, backend="gloo", state="scheduled", retired=False, created_ns=t))
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(now_ns=t + 700 * SECOND))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (3,), first.summary
    assert "one collective more" in first.summary


def test_a_few_ranks_that_stopped_short_are_the_culprits(tmp_path: Path) -> None:
    # The mirror image: one rank idle after #5 while three wait in #6: the idle one never joined.
    t = b.T0 + 10 * SECOND
    per_rank = {r: _steps(5, backend="gloo") for r in range(4)}
    for r in (0, 1, 2):
        per_rank[r].append(b.entry(6, backend="gloo", state="scheduled", retired=False, created_ns=t))
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(now_ns=t + 700 * SECOND))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (3,), first.summary
    assert "never joined" in first.summary


def test_a_collective_the_others_finished_is_not_where_they_wait(tmp_path: Path) -> None:
    # NCCL: rank 2's all_gather #6 still shows 'started' (its process stopped there, or its read raced the
    # completion), while every other rank finished #6 and now waits in #7: rank 2 never joined #7.
    t = b.T0 + 10 * SECOND
    per_rank = {r: _steps(5) for r in range(4)}
    for r in range(4):
        per_rank[r].append(b.entry(6, op="all_gather", state="started" if r == 2 else "completed", created_ns=t))
        if r != 2:
            per_rank[r].append(b.entry(7, state="started", created_ns=t + SECOND))
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(now_ns=t + 700 * SECOND))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (2,), first.summary
    assert first.collective_seq_id == 7


def test_a_rank_late_by_a_large_share_of_short_steps_is_a_straggler(tmp_path: Path) -> None:
    # 50 ms steps of three collectives; rank 2 reaches each step's first collective 30 ms after the others
    # (below the 50 ms an absolute wait needs, but 40% of the job's time).
    per_rank = _gloo_steps(80_000_000, lambda rank, k: 30_000_000 if rank == 2 else 0)
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]))
    assert [(f.category, f.culprit_ranks) for f in report.findings] == [(Category.STRAGGLER, (2,))]


def test_a_few_ms_of_lateness_in_long_steps_is_no_straggler(tmp_path: Path) -> None:
    per_rank = _gloo_steps(1_500_000_000, lambda rank, k: 15_000_000 if rank == 2 and k == 0 else 0)
    assert analyze(load_dumps([b.job(tmp_path, per_rank, 4)])).findings == []


def test_a_gloo_rank_that_wrote_its_last_dump_as_the_others_failed_stopped(tmp_path: Path) -> None:
    # Rank 2 died in step 6: its dump (written as it went) holds #1-#5; the others had begun #6 before,
    # and gloo retired their #6 as finished when its connection closed, a few ms later. A collective
    # cannot finish without a member: rank 2 stopped before it, however close the dumps' times are.
    t = b.T0 + 10 * SECOND
    per_rank = {r: _steps(5, backend="gloo") for r in range(3)}
    for r in (0, 1):
        per_rank[r].append(b.entry(6, backend="gloo", created_ns=t))
    b.job(tmp_path, per_rank, 3)
    for rank, written in ((2, t + 2_000_000), (0, t + 7_000_000), (1, t + 7_000_000)):
        os.utime(tmp_path / f"nccl_trace_rank_{rank}", ns=(written, written))
    first = analyze(load_dumps([tmp_path])).findings[0]
    assert first.category is Category.RANK_STOPPED and first.culprit_ranks == (2,), first.summary


def test_a_rank_that_receives_from_the_wrong_peer_is_the_culprit(tmp_path: Path) -> None:
    # Rank 2 sends to rank 3, which posted its recv from rank 3's wrong peer, rank 5 (idle). Rank 5 never
    # owed rank 3 anything, and rank 2 waits for rank 3: rank 3 named the wrong peer.
    t = b.T0 + 10 * SECOND
    per_rank = {r: _steps(3) for r in range(6)}
    per_rank[2].append(b.entry(4, op="send", peer=" 2->3", p2p_seq=1, state="started", record_id=3, created_ns=t))
    per_rank[3].append(b.entry(4, op="recv", peer=" 3<-5", p2p_seq=1, state="started", record_id=3, created_ns=t))
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 6)]), AnalysisOptions(now_ns=t + 700 * SECOND))
    first = report.findings[0]
    assert first.category is Category.P2P_MISMATCH and first.culprit_ranks == (3,), first.summary
    assert "wrong peer" in first.summary


def test_ranks_blocked_in_a_p2p_batch_are_not_the_sink_beside_an_idle_rank(tmp_path: Path) -> None:
    # Ranks 1 and 3 never joined #4 either, but they are blocked in a batch of sends and receives (the
    # recorder names no peer for it); rank 0 finished everything it enqueued: the chain ends at rank 0.
    t = b.T0 + 10 * SECOND
    per_rank = {r: _steps(3) for r in range(4)}
    for r in (1, 3):
        batch = b.entry(4, op="coalesced", state="started", p2p_seq=1, record_id=3, created_ns=t)
        batch.update(is_p2p=True, collective_seq_id=0)
        per_rank[r].append(batch)
    per_rank[2].append(b.entry(4, state="started", created_ns=t))
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(now_ns=t + 700 * SECOND))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (0,), first.summary


def test_a_rank_in_python_that_never_posted_a_recv_nor_joined_is_one_sink(tmp_path: Path) -> None:
    # NCCL: rank 0's send to rank 1 is queued, and rank 0 went on to #4, where it is blocked; rank 1 is
    # idle (stuck in its data loader). One cause: rank 1 never reached its next step. The collective it
    # never joined is the root; the recv it never posted nests under it.
    t = b.T0 + 10 * SECOND
    per_rank = {r: _steps(3) for r in range(2)}
    per_rank[0] += [b.entry(4, op="send", peer=" 0->1", p2p_seq=1, state="scheduled", record_id=3, created_ns=t),
                    b.entry(4, state="scheduled", record_id=4, created_ns=t + 1000)]
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 2)]), AnalysisOptions(now_ns=t + 700 * SECOND))
    assert [(f.category, f.culprit_ranks) for f in report.findings] == [(Category.RANK_NOT_JOINED, (1,))]
    assert [f.category for f in report.findings[0].consequences] == [Category.P2P_MISMATCH]


def _one_op_steps(world: int, steps: int, late_ms: dict[int, float], jitter_ms: float,
                  seed: int) -> dict[int, list[dict[str, object]]]:
    """One all_reduce per step (gloo: no durations); `late_ms[rank]`: how late the rank arrives at every
    step, on top of a uniform jitter on every rank."""
    rng = random.Random(seed)
    per_rank: dict[int, list[dict[str, object]]] = {r: [] for r in range(world)}
    t = b.T0
    for seq in range(1, steps + 1):
        arrive = {r: t + int((late_ms.get(r, 0.0) + rng.uniform(0, jitter_ms)) * 1e6) for r in range(world)}
        for r in range(world):
            per_rank[r].append(b.entry(seq, created_ns=arrive[r], backend="gloo", state="scheduled", retired=True))
        t = max(arrive.values()) + 100_000_000
    return per_rank


def test_principle5_a_slow_nodes_ranks_late_together_are_named_together(tmp_path: Path) -> None:
    """Two ranks of 8 (one host's) late by 250 ms at every step: each is last only about half the time, so
    neither alone is a straggler by count; together they are the late set at every collective."""
    per_rank = _one_op_steps(8, 40, {6: 250.0, 7: 250.0}, jitter_ms=4.0, seed=3)
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 8)]), AnalysisOptions(now_ns=b.T0 + 3600 * 10**9))
    [finding] = report.findings
    assert finding.category is Category.STRAGGLER and finding.culprit_ranks == (6, 7), finding.summary
    assert "slow node" in finding.summary


def test_principle5_jitter_makes_no_late_set(tmp_path: Path) -> None:
    """The same job with jitter only (up to 250 ms on every rank): the latest pair changes every step."""
    for seed in range(5):
        (tmp_path / str(seed)).mkdir()
        per_rank = _one_op_steps(8, 40, {}, jitter_ms=250.0, seed=seed)
        report = analyze(load_dumps([b.job(tmp_path / str(seed), per_rank, 8)]),
                         AnalysisOptions(now_ns=b.T0 + 3600 * 10**9))
        assert report.findings == [], seed


def test_a_stale_read_does_not_cut_the_window_the_others_arrivals_are_judged_on(tmp_path: Path) -> None:
    """Evidence must agree. 8 gloo ranks, 30 steps of one all_reduce; ranks 2 and 3 happen to come last at
    the first 6 steps (a few ms: jitter), and rank 7's recorder was read after step 6 (an older read: the
    others completed 24 more, which needed it). Judged on the 6 collectives rank 7 holds, 2 and 3 look like
    a slow node; on the others' 30 they are late at 6: no straggler."""
    rng = random.Random(7)
    per_rank: dict[int, list[dict[str, object]]] = {r: [] for r in range(8)}
    t = b.T0
    for seq in range(1, 31):
        arrive = {r: t + int((rng.uniform(0, 4.0) + (30.0 if seq <= 6 and r in (2, 3) else 0.0)) * 1e6)
                  for r in range(8)}
        for r in range(8):
            if r != 7 or seq <= 6:
                per_rank[r].append(b.entry(seq, created_ns=arrive[r], backend="gloo", state="scheduled", retired=True))
        t = max(arrive.values()) + 100_000_000
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 8)]), AnalysisOptions(now_ns=b.T0 + 3600 * 10**9))
    assert not any(f.category is Category.STRAGGLER for f in report.findings), [f.summary for f in report.findings]


def test_principle1_a_rank_blocked_in_an_earlier_collective_waits_on_the_rank_that_never_entered_it(
        tmp_path: Path) -> None:
    """broadcast_object_list is two broadcasts; gloo relays a broadcast through ranks (a tree). Rank 3 is
    stuck in Python before the first (#17); rank 1 waits in #17 for it; ranks 0 and 2 finished #17 and
    wait in #18. Ranks 1 and 3 both never joined #18, but rank 1 waits on rank 3: rank 3 is the sink."""
    def gloo(seq: int, done: bool = True) -> dict[str, object]:
        return b.entry(seq, op="broadcast", backend="gloo", state="scheduled", retired=done)

    per_rank = {r: [gloo(s) for s in range(1, 17)] for r in range(4)}
    for r in (0, 2):
        per_rank[r] += [gloo(17), gloo(18, done=False)]
    per_rank[1].append(gloo(17, done=False))
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(now_ns=b.T0 + 3600 * 10**9))
    root = report.findings[0]
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (3,), root.summary
    assert any("earlier collective" in e for e in root.evidence), root.evidence

def _nccl_job_with_pair(tmp_path: Path, pair_states: dict[int, str]) -> Path:
    """4 NCCL ranks, #1-#5 of the default group done; group 1 = ranks [2, 3] ran a gather whose state on
    each is `pair_states`; ranks 0-2 then wait in #6 of the default group, which rank 3 never entered."""
    t = b.T0 + 10 * SECOND
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
              "1": {"name": "1", "desc": "tp", "ranks": "[2, 3]"}}
    for rank in range(4):
        entries = _steps(5)
        if rank in pair_states:
            entries.append(b.entry(1, op="gather", pg=("1", "tp"), state=pair_states[rank], created_ns=t))
        if rank != 3:
            entries.append(b.entry(6, state="started", created_ns=t + SECOND))
        for i, e in enumerate(entries):
            e["record_id"] = i
        b.write_pickle(tmp_path, rank, b.dump(entries, world=4, pg_config=config))
    return tmp_path


def test_an_entry_every_peer_completed_is_no_hang_of_its_group(tmp_path: Path) -> None:
    # Evidence must agree: rank 3's gather of group 1 still shows 'started' while rank 2, its only peer,
    # recorded it completed (NCCL: it succeeded, which needs rank 3): rank 3's read is older than rank 2's.
    # Group 1 holds nobody; the others wait in #6 of the default group, which rank 3 never entered.
    job = _nccl_job_with_pair(tmp_path, {2: "completed", 3: "started"})
    report = analyze(load_dumps([job]), AnalysisOptions(now_ns=b.T0 + 700 * SECOND))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (3,), first.summary
    assert not any(f.category is Category.NOT_COMPLETED for f in report.findings)


def test_a_dead_rank_whose_pending_entry_its_peers_completed_stopped_there(tmp_path: Path) -> None:
    # The same recorders, and the runner says rank 3 was killed: its dump is older than its peers' (it
    # stopped after the gather ran), not a wait in group 1: a dead rank is the sink the others wait for.
    job = _nccl_job_with_pair(tmp_path, {2: "completed", 3: "started"})
    exits = {e.rank: e for e in exits_from_json({"3": 137}, "exits")}
    report = analyze(load_dumps([job]), AnalysisOptions(now_ns=b.T0 + 700 * SECOND), exits=exits)
    first = report.findings[0]
    assert first.category is Category.RANK_STOPPED and first.culprit_ranks == (3,), first.summary
    assert "pending" in first.summary or "ends at #5" in first.summary


def test_a_collective_started_on_every_member_and_finished_on_none_is_still_a_hang(tmp_path: Path) -> None:
    # The converse: nobody completed the gather, so nothing says rank 3's read is older: it is where the
    # pair waits (the device-side hang stays a NotCompleted finding of group 1).
    job = _nccl_job_with_pair(tmp_path, {2: "started", 3: "started"})
    report = analyze(load_dumps([job]), AnalysisOptions(now_ns=b.T0 + 700 * SECOND))
    assert any(f.category is Category.NOT_COMPLETED and f.process_group.name == "1"
               for f in [*report.findings, *(c for f in report.findings for c in f.consequences)]), report.findings


def test_a_recv_whose_send_the_peer_completed_is_no_longer_pending(tmp_path: Path) -> None:
    # Evidence must agree, point to point: rank 1 recorded its send to rank 0 completed, so rank 0's recv
    # of it finished too; rank 0's read (still 'started') is older than rank 1's. Rank 1 owes nothing:
    # it waits in #4, which rank 0 never entered.
    t = b.T0 + 10 * SECOND
    per_rank = {r: _steps(3) for r in range(2)}
    per_rank[0].append(b.entry(4, op="recv", peer=" 0<-1", p2p_seq=1, state="started", record_id=3, created_ns=t))
    per_rank[1] += [b.entry(4, op="send", peer=" 1->0", p2p_seq=1, state="completed", record_id=3, created_ns=t),
                    b.entry(4, state="started", record_id=4, created_ns=t + SECOND)]
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 2)]), AnalysisOptions(now_ns=t + 700 * SECOND))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (0,), first.summary
    assert not any(f.category is Category.P2P_MISMATCH and 1 in f.culprit_ranks for f in report.findings)


def test_a_dead_gloo_rank_whose_pending_entry_its_only_peer_retired_stopped_there(tmp_path: Path) -> None:
    # gloo retires a failed op as if it had finished: rank 1's 'retired' #6 of the pair [0, 1] is a success
    # (rank 0's read is older) or a failure for want of rank 0. Both entered it and rank 0's process ended:
    # it stopped there either way (a dead rank is the sink).
    t = b.T0 + 10 * SECOND
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
    for rank in range(2):
        entries = [*_steps(5, backend="gloo"),
                   b.entry(6, backend="gloo", pg=("1", "pair"), state="scheduled", retired=rank == 1, created_ns=t)]
        for i, e in enumerate(entries):
            e["record_id"] = i
        b.write_pickle(tmp_path, rank, b.dump(entries, world=2, pg_config=config))
    exits = {e.rank: e for e in exits_from_json({"0": -9, "1": 1}, "exits")}
    first = analyze(load_dumps([tmp_path]), exits=exits).findings[0]
    assert first.category is Category.RANK_STOPPED and first.culprit_ranks == (0,), first.summary
    assert "pending" in first.summary


def test_a_rank_named_only_by_its_exit_is_a_missing_rank_of_the_job(tmp_path: Path) -> None:
    # gloo: no group lists its members (the default group is known from its entries), and rank 3 was
    # killed before any dump. The runner's word that rank 3's process ended says the job has a rank 3:
    # it is missing, and the others stopped at the collective it never finished (world from evidence).
    t = b.T0 + 10 * SECOND
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
    for rank in range(3):
        entries = [*_steps(5, backend="gloo"), b.entry(6, backend="gloo", created_ns=t)]
        for i, e in enumerate(entries):
            e["record_id"] = i
        b.write_pickle(tmp_path, rank, b.dump(entries, world=3, pg_config=config))
    exits = {e.rank: e for e in exits_from_json({"0": 1, "1": 1, "2": 1, "3": 137}, "exits")}
    report = analyze(load_dumps([tmp_path]), exits=exits)
    assert report.world_size == 4 and report.missing_ranks == (3,)
    first = report.findings[0]
    assert first.category in (Category.RANK_STOPPED, Category.MISSING_DUMPS) and first.culprit_ranks == (3,), \
        first.summary


def test_a_dead_rank_in_a_collective_every_member_entered_and_none_finished_is_the_sink(tmp_path: Path) -> None:
    # Nobody finished the gather of the pair [2, 3]; the runner says rank 3's process failed, rank 2 lives.
    # An op finishes only while every member's process lives: rank 2 waits in it for rank 3, which is
    # gone; the device or the network are not suspects (NotCompleted would blame them).
    job = _nccl_job_with_pair(tmp_path, {2: "started", 3: "started"})
    exits = {e.rank: e for e in exits_from_json({"3": 1}, "exits")}
    report = analyze(load_dumps([job]), AnalysisOptions(now_ns=b.T0 + 700 * SECOND), exits=exits)
    first = report.findings[0]
    assert first.category is Category.RANK_STOPPED and first.culprit_ranks == (3,), first.summary
    assert "none finished" in first.summary
    # every member's process ended (a watchdog tears them all down after a device hang): no sink among them
    exits = {e.rank: e for e in exits_from_json({"2": -6, "3": -6}, "exits")}
    report = analyze(load_dumps([job]), AnalysisOptions(now_ns=b.T0 + 700 * SECOND), exits=exits)
    assert not any(f.category is Category.RANK_STOPPED and f.culprit_ranks == (3,) and "none finished" in f.summary
                   for f in report.findings)


def test_the_odd_count_is_unknown_while_a_member_left_no_dump(tmp_path: Path) -> None:
    # gloo: rank 3 waits alone in #6 of the default group while ranks 0-2 recorded nothing open, as in the
    # split above; but rank 4 left no dump and its process failed, and ranks 0-2's last collective, in a
    # group known only from its entries, was retired (gloo retires what failed for want of a member). Rank
    # 4's count is unknown: the odd side cannot be told, and the wait chain ends at the dead rank.
    t = b.T0 + 10 * SECOND
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3, 4]"}}
    for rank in range(4):
        entries = _steps(5, backend="gloo")
        if rank == 3:
            entries.append(b.entry(6, backend="gloo", state="scheduled", retired=False, created_ns=t))
        else:
            entries.append(b.entry(1, backend="gloo", pg=("1", "sub"), created_ns=t))
        for i, e in enumerate(entries):
            e["record_id"] = i
        b.write_pickle(tmp_path, rank, b.dump(entries, world=5, pg_config=config))
    exits = {e.rank: e for e in exits_from_json({"4": 1}, "exits")}
    report = analyze(load_dumps([tmp_path]), AnalysisOptions(now_ns=t + 700 * SECOND), exits=exits)
    first = report.findings[0]
    assert first.culprit_ranks == (4,), first.summary
    assert not any("one collective more" in f.summary for f in report.findings)


def test_a_read_between_the_parts_of_one_collective_is_no_mismatch(tmp_path: Path) -> None:
    # Format 2.2 has no is_p2p: a batch's 'coalesced' entry recorded right after all_gather #5 shares its
    # sequence number. Rank 2's recorder was read between the two (its newest entry is the all_gather):
    # its bucket is a prefix of the others', an older read, not another call. Ranks 0-1 went on to #6.
    t = b.T0 + 10 * SECOND
    for rank in range(3):
        entries = [*_steps(4), b.entry(5, op="all_gather", created_ns=t)]
        if rank != 2:
            entries += [b.entry(5, op="coalesced", created_ns=t + 1000),
                        b.entry(6, state="started", created_ns=t + SECOND)]
        _write_format_22(tmp_path, rank, entries, world=3)
    report = analyze(load_dumps([tmp_path]), AnalysisOptions(now_ns=t + 700 * SECOND))
    first = report.findings[0]
    assert first.category is not Category.COLLECTIVE_TYPE_MISMATCH and first.culprit_ranks == (2,), first.summary


def test_a_stale_read_that_ends_before_the_peers_batch_under_the_same_seq_is_no_mismatch(tmp_path: Path) -> None:
    # Evidence must agree. Format 2.2, no is_p2p: each step is broadcast #k of group 1, an all_reduce of the
    # default group, then a batch ('coalesced') on group 1 that shares #k. Rank 2's periodic dump was read
    # after the all_reduce of step 5 and before its batch: its bucket #5 lacks the batch, not another call.
    # Ranks 0-1 went on (step 6's broadcast never completes: rank 2 is gone).
    g1 = ("1", "dp")
    t = b.T0 + 10 * SECOND
    for rank in range(3):
        entries = []
        for step in range(1, 7 if rank != 2 else 6):
            at = t + step * SECOND
            entries.append(b.entry(step, op="broadcast", pg=g1, created_ns=at,
                                   state="started" if step == 6 else "completed"))
            entries.append(b.entry(step, created_ns=at + 1000, state="started" if step == 6 else "completed"))
            if rank != 2 or step < 5:
                entries.append(b.entry(step, op="coalesced", pg=g1, p2p_seq=step, created_ns=at + 2000))
        _write_format_22(tmp_path, rank, entries, world=3)
    report = analyze(load_dumps([tmp_path]), AnalysisOptions(now_ns=t + 700 * SECOND))
    first = report.findings[0]
    assert first.category is not Category.COLLECTIVE_TYPE_MISMATCH and first.culprit_ranks == (2,), first.summary


def test_a_stale_read_that_ends_after_the_other_side_of_a_p2p_op_is_no_mismatch(tmp_path: Path) -> None:
    # The same with a send/recv between the batches (format 2.2: both share the collective seq): rank 1's
    # recorder ends with its recv of step 3, where rank 0 recorded the send: one point of the program.
    t = b.T0 + 10 * SECOND
    for rank in range(2):
        entries = [b.entry(1, op="all_gather", created_ns=t)]
        for step in range(1, 6 if rank == 0 else 4):
            at = t + step * SECOND
            state = "started" if step == 5 else "completed"
            entries.append(b.entry(1, op="coalesced", p2p_seq=2 * step - 1, created_ns=at, state=state))
            p2p = b.entry(1, op="send" if rank == 0 else "recv", peer=" 0->1" if rank == 0 else " 1<-0",
                          p2p_seq=2 * step, created_ns=at + 1000, state="scheduled" if step == 5 else state)
            p2p["collective_seq_id"] = 1
            entries.append(p2p)
        _write_format_22(tmp_path, rank, entries, world=2)
    report = analyze(load_dumps([tmp_path]), AnalysisOptions(now_ns=t + 700 * SECOND))
    first = report.findings[0]
    assert first.category is not Category.COLLECTIVE_TYPE_MISMATCH and first.culprit_ranks == (1,), first.summary


def test_a_gone_gloo_rank_behind_collectives_the_others_went_past_stopped(tmp_path: Path) -> None:
    # gloo retires a failed op too, but a failed op raises: ranks 0 and 1 went on past #2 to #3, so #2
    # succeeded, and it needs rank 2, whose last read (10 ms before the others began #2) ends at #1. Its
    # sidecar says its process is gone: it took part and went away, however close its read (no timeout
    # recorded here to date the others' finish by).
    import json

    from frscope.wire import snapshot_envelope_bytes, snapshot_head, snapshot_piece

    ms = 1_000_000
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}}
    steps = [b.entry(s, backend="gloo", created_ns=b.T0 + at * ms) for s, at in ((1, 300), (2, 600), (3, 610))]
    pieces = []
    for rank, entries in {0: [dict(e) for e in steps], 1: [dict(e) for e in steps], 2: [dict(steps[0])]}.items():
        for i, e in enumerate(entries):
            e["record_id"] = i
            del e["timeout_ms"]
        read = b.T0 + (590 if rank == 2 else 1300) * ms
        pieces.append(json.dumps(snapshot_piece(rank, read, "worker-server", None,
                                                b.dump(entries, world=3, pg_config=config))).encode())
    head = snapshot_head(pod="job-0", namespace="ns", node="n", captured_at_ns=b.T0 + 1400 * ms, reason="stall")
    errors = [{"rank": 2, "message": "rank-2.sock: socket is gone"}]
    (tmp_path / "job-0.json").write_bytes(snapshot_envelope_bytes(head, pieces, errors))
    first = analyze(load_dumps([tmp_path]), AnalysisOptions(stall_after_s=2.0)).findings[0]
    assert first.category is Category.RANK_STOPPED and first.culprit_ranks == (2,), first.summary


def test_a_rank_whose_process_is_gone_while_the_others_live_stopped_though_nobody_waits(tmp_path: Path) -> None:
    # Rank 2 took part in #1 and its process went away (its sidecar: socket gone); ranks 0, 1 live (their
    # stacks answered) and went on with a group that does not need it. Nobody waits, yet rank 2 stopped.
    import json

    from frscope.wire import snapshot_envelope_bytes, snapshot_head, snapshot_piece

    ms = 1_000_000
    sub = ("1", "pair")
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}, "1": {"name": "1", "desc": "pair",
                                                                     "ranks": "[0, 1]"}}
    stack = ('Thread 0x1 (most recent call first):\n  File "/app/train.py", line 310 in wait_for_next_epoch\n'
             '  File "/app/train.py", line 400 in main\n')
    pieces = []
    for rank in range(3):
        entries = [b.entry(1, backend="gloo", created_ns=b.T0 + 300 * ms)]
        if rank != 2:
            entries += [b.entry(s, backend="gloo", pg=sub, created_ns=b.T0 + (300 + 100 * s) * ms) for s in (1, 2, 3)]
        for i, e in enumerate(entries):
            e["record_id"] = i
        read = b.T0 + (350 if rank == 2 else 5000) * ms
        pieces.append(json.dumps(snapshot_piece(rank, read, "worker-server", None if rank == 2 else stack,
                                                b.dump(entries, world=3, pg_config=config))).encode())
    head = snapshot_head(pod="job-0", namespace="ns", node="n", captured_at_ns=b.T0 + 5000 * ms, reason="stall")
    errors = [{"rank": 2, "message": "rank-2.sock: socket is gone"}]
    (tmp_path / "job-0.json").write_bytes(snapshot_envelope_bytes(head, pieces, errors))
    first = analyze(load_dumps([tmp_path]), AnalysisOptions(stall_after_s=2.0)).findings[0]
    assert first.category is Category.RANK_STOPPED and first.culprit_ranks == (2,), first.summary


def test_principle1_a_two_rank_tie_is_settled_by_the_groups_own_repeating_order(tmp_path: Path) -> None:
    # Two ranks, a step of all_gather then all_reduce (FSDP's reduce_scatter as torch records it). Rank 0
    # skipped #12's all_reduce and called the next step's all_gather: it, not rank 1, left the group's order.
    # (The last agreed collective, #11's all_gather, would name rank 1.)
    t = b.T0 + 20 * SECOND

    def ops(rank: int) -> list[dict[str, object]]:
        def op(seq: int, gather: bool, **kw: object) -> dict[str, object]:
            return b.entry(seq, op="all_gather" if gather else "all_reduce", out_sizes=[[8, 8]] if gather else None,
                           **kw)  # type: ignore[arg-type]
        out = [op(s, s % 2 == 1, created_ns=b.T0 + s * SECOND) for s in range(1, 12)]
        out.append(op(12, rank == 0, state="started", created_ns=t))
        return out

    for columnar in (True, False):
        report = analyze(load_dumps([b.job(tmp_path, {0: ops(0), 1: ops(1)}, 2)], columnar=columnar),
                         AnalysisOptions(now_ns=t + 700 * SECOND))
        first = report.findings[0]
        assert first.category is Category.COLLECTIVE_TYPE_MISMATCH, first.summary
        assert first.culprit_ranks == (0,) and not first.ambiguous, first.summary


def test_principle2_a_coalesced_call_cut_by_a_wrapped_ring_is_no_mismatch(tmp_path: Path) -> None:
    # Both ranks ran the same program: #2 is a coalesced call of an all_gather and an all_reduce, then #3-#5.
    # Rank 1's ring wrapped inside #2: its oldest entry is #2's all_reduce, the all_gather evicted. The
    # entries that are there agree; a cut call is no disagreement.
    def calls(first_record: int) -> list[dict[str, object]]:
        out = [b.entry(1), b.entry(2, op="all_gather", out_sizes=[[8, 8]]), b.entry(2)]
        out += [b.entry(s) for s in range(3, 6)]
        for i, e in enumerate(out):
            e["record_id"] = i
        return [e for e in out if int(str(e["record_id"])) >= first_record]

    per_rank = {0: calls(0), 1: calls(2)}
    for columnar in (True, False):
        report = analyze(load_dumps([b.job(tmp_path, per_rank, 2)], columnar=columnar))
        assert report.findings == [], [f.summary for f in report.findings]


def test_principle2_a_seq_recorded_apart_and_cut_by_a_wrapped_ring_is_no_mismatch(tmp_path: Path) -> None:
    # Format 2.2, NCCL, both ranks ran the same program: group 0's broadcast #1, then each step an all_reduce
    # of group 1 and a batch_isend_irecv on group 0, which 2.2 records as `coalesced` under group 0's current
    # collective seq (#1 still): #1 grows a step at a time, its entries apart. Rank 1's ring wrapped after
    # the first step: its #1 lost the broadcast and the first batch, though its oldest entry is group 1's.
    # What is there agrees; a seq whose head was evicted is no disagreement.
    config = {g: {"name": g, "desc": g, "ranks": "[0, 1]"} for g in ("0", "1")}

    def program(first_record: int) -> list[dict[str, object]]:
        out = [b.entry(1, op="broadcast", pg=("0", "0"))]
        for step in range(1, 5):
            out += [b.entry(step, pg=("1", "1")), b.entry(1, op="coalesced", pg=("0", "0"))]
        for i, e in enumerate(out):
            e["record_id"] = i
            del e["is_p2p"], e["thread_id"], e["thread_name"], e["timeout_ms"]
        return out[first_record:]

    for rank, entries in {0: program(0), 1: program(3)}.items():
        b.write_pickle(tmp_path, rank, b.dump(entries, world=2, version="2.2", pg_config=config))
    for columnar in (True, False):
        report = analyze(load_dumps([tmp_path], columnar=columnar))
        assert report.findings == [], [f.summary for f in report.findings]


def _grid_2x3(tmp_path: Path, went_on: set[int], in_tp: set[int]) -> Path:
    """A 2x3 gloo grid (tp [0, 1, 2] and [3, 4, 5], dp [0, 3], [1, 4], [2, 5]); each step runs tp, dp and world
    all_reduces, step 0 done by all. At step 1 the ranks in `went_on` finished their tp all_reduce and wait in
    dp; those in `in_tp` wait in their tp all_reduce; the rest recorded nothing more."""
    tp = [[0, 1, 2], [3, 4, 5]]
    dp = [[0, 3], [1, 4], [2, 5]]
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(6)))}}
    config.update({str(1 + i): {"name": str(1 + i), "desc": "tp", "ranks": str(g)} for i, g in enumerate(tp)})
    config.update({str(3 + i): {"name": str(3 + i), "desc": "dp", "ranks": str(g)} for i, g in enumerate(dp)})

    def pg(kind: list[list[int]], base: int, rank: int) -> tuple[str, str]:
        i = next(i for i, g in enumerate(kind) if rank in g)
        return str(base + i), "tp" if base == 1 else "dp"

    per_rank: dict[int, list[dict[str, object]]] = {}
    for r in range(6):
        mine = [b.gloo_entry(1, 0, pg=pg(tp, 1, r)), b.gloo_entry(1, 1, pg=pg(dp, 3, r)), b.gloo_entry(1, 2)]
        if r in went_on:
            mine += [b.gloo_entry(2, 1000, pg=pg(tp, 1, r)), b.gloo_entry(2, 1001, pg=pg(dp, 3, r), done=False)]
        elif r in in_tp:
            mine.append(b.gloo_entry(2, 1000, pg=pg(tp, 1, r), done=False))
        per_rank[r] = mine
    return b.write_gloo_ranks(tmp_path, per_rank, config)


def test_principle1_idle_ranks_behind_whom_the_job_went_on_never_joined(tmp_path: Path) -> None:
    """Ranks 4 and 5 stopped before step 1; rank 3 waits for them in its tp all_reduce, and ranks 0-2 went on
    to step 1's dp all_reduce, waiting on 3, 4 and 5. Within tp [3, 4, 5] the idle ranks outnumber rank 3, but
    over the job four ranks went further than the two idle ones: those are the odd side, not rank 3 with
    an extra call."""
    directory = _grid_2x3(tmp_path, went_on={0, 1, 2}, in_tp={3})
    report = analyze(load_dumps(sorted(directory.iterdir())), AnalysisOptions(now_ns=b.T0 + 700 * SECOND))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (4, 5), first.summary
    assert "one collective more" not in first.summary


def test_a_rank_alone_in_a_collective_of_a_grid_called_one_more(tmp_path: Path) -> None:
    """The same grid where only rank 3 began step 1 (uneven data: one more batch) and the five others are
    idle: rank 3 is the odd side."""
    directory = _grid_2x3(tmp_path, went_on=set(), in_tp={3})
    report = analyze(load_dumps(sorted(directory.iterdir())), AnalysisOptions(now_ns=b.T0 + 700 * SECOND))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (3,), first.summary
    assert "one collective more" in first.summary


def test_principle2_idle_ranks_right_after_a_collective_an_older_read_lacks_end_at_that_rank(tmp_path: Path) -> None:
    """A 2x3 gloo grid (steps of tp, dp and world all_reduces, 1.5 s apart). Rank 2 died at step 4; its only dump
    is a periodic one of step 1. Its tp peers 0 and 1 recorded step 4's tp all_reduce finished (gloo retires a
    collective that failed) and nothing after it; ranks 3 and 4 wait for them in step 4's dp all_reduce; rank 5's
    dp all_reduce with rank 2 is retired too. The copies' mtimes are an hour late: when each was read is lost.
    Every rank the blocked ones wait on is idle right after a collective rank 2 lacks: the waits go on to rank 2,
    whose read is older (it stopped), not to two ranks that each stopped recording at once."""
    tp, dp = [[0, 1, 2], [3, 4, 5]], [[0, 3], [1, 4], [2, 5]]
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(6)))}}
    config.update({str(1 + i): {"name": str(1 + i), "desc": "tp", "ranks": str(g)} for i, g in enumerate(tp)})
    config.update({str(3 + i): {"name": str(3 + i), "desc": "dp", "ranks": str(g)} for i, g in enumerate(dp)})

    def pg(kind: list[list[int]], base: int, rank: int) -> tuple[str, str]:
        return str(base + next(i for i, g in enumerate(kind) if rank in g)), "tp" if base == 1 else "dp"

    def step(rank: int, s: int, ops: int = 3, done_upto: int = 3) -> list[dict[str, object]]:
        made = [b.gloo_entry(s + 1, 1500 * s, pg=pg(tp, 1, rank)),
                b.gloo_entry(s + 1, 1500 * s + 5, pg=pg(dp, 3, rank)), b.gloo_entry(s + 1, 1500 * s + 10)][:ops]
        for k, e in enumerate(made):
            e["retired"] = k < done_upto
        return made

    per_rank: dict[int, list[dict[str, object]]] = {}
    for r in range(6):
        entries = [e for s in range(2 if r == 2 else 4) for e in step(r, s)]
        if r in (0, 1):
            entries += step(r, 4, ops=1)  # tp failed for want of rank 2, retired
        elif r in (3, 4):
            entries += step(r, 4, ops=2, done_upto=1)  # tp done; dp waits for rank 0 / rank 1
        elif r == 5:
            entries += step(r, 4, ops=2)  # tp done; dp with rank 2 failed, retired
        per_rank[r] = entries
    b.write_gloo_ranks(tmp_path, per_rank, config)
    later = time.time() + 3600
    for path in tmp_path.iterdir():
        os.utime(path, (later, later))  # copies: the read times are lost
    report = analyze(load_dumps(sorted(tmp_path.iterdir())))
    first = report.findings[0]
    assert first.category is Category.RANK_STOPPED and first.culprit_ranks == (2,), first.summary
    assert any("either it failed for want of rank 2" in e for e in first.evidence), first.evidence
