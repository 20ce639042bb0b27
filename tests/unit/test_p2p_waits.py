"""Point-to-point waits in the wait-for model (issue 33, principle 1: wait chains end at a rank that waits on
nobody): a send or receive waits on its peer, and where that peer is held in a recorded collective the wait goes
on, through it, to whoever holds that collective. Each test builds torch-shaped records (and, for gloo, which
records no point-to-point op, the live stacks a sidecar capture carries)."""

from __future__ import annotations

from pathlib import Path

from frscope import wire
from frscope.analysis import AnalysisOptions, Category, Finding, analyze
from frscope.records import assemble, load_dumps, normalize_dump
from tests.unit import builders as b
from tests.unit.test_unrecorded_waits import ALL_REDUCE, BARRIER, IN_PYTHON, SITE, _stack

S = 1_000_000_000


def test_a_peer_held_in_a_mismatched_collective_is_no_p2p_culprit(tmp_path: Path) -> None:
    """NCCL: rank 0's send to rank 1 waits; rank 1 never posted the recv, held in #4, where it called
    broadcast while ranks 0 and 2 called all_reduce. Rank 1 is the culprit of the type mismatch that holds
    it, not of a p2p op it never reached: the send is a consequence, not a mismatch of its own."""
    t = b.T0 + 10 * S
    per_rank = {r: [b.entry(s, created_ns=b.T0 + s * S) for s in range(1, 4)] for r in range(3)}
    per_rank[0].append(b.entry(1, op="send", peer=" 0->1", p2p_seq=1, state="started", created_ns=t))
    for r in range(3):
        per_rank[r].append(b.entry(4, op="broadcast" if r == 1 else "all_reduce", state="started",
                                   created_ns=t + S))
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 3)]), AnalysisOptions(now_ns=t + 700 * S))
    first = report.findings[0]
    assert first.category is Category.COLLECTIVE_TYPE_MISMATCH and first.culprit_ranks == (1,), first.summary


def test_a_peer_in_python_with_an_open_collective_is_still_the_p2p_culprit(tmp_path: Path) -> None:
    """The counterpart: NCCL rank 1's live stack is in Python (its data loader), not in the collective it
    enqueued: its thread waits on nobody, so it is the one that never posted the recv."""
    t = b.T0 + 10 * S
    per_rank = {r: [b.entry(s, created_ns=b.T0 + s * S) for s in range(1, 4)] for r in range(2)}
    per_rank[0].append(b.entry(1, op="send", peer=" 0->1", p2p_seq=1, state="started", created_ns=t))
    per_rank[1].append(b.entry(4, state="scheduled", created_ns=t))
    for entries in per_rank.values():
        for i, e in enumerate(entries):
            e["record_id"] = i
    pieces = [wire.snapshot_piece(r, t + 700 * S, f"socket:/run/rank-{r}.sock", IN_PYTHON if r == 1 else ALL_REDUCE,
                                  b.dump(per_rank[r], world=2)) for r in range(2)]
    report = analyze(assemble([normalize_dump(p, p["source"], p["rank"]) for p in pieces], []), AnalysisOptions())
    p2p = [f for f in report.findings if f.category is Category.P2P_MISMATCH]
    assert p2p and p2p[0].culprit_ranks == (1,), [f.summary for f in report.findings]


SEND = _stack(("send", f"{SITE}/distributed_c10d.py", 2466), ("pipeline_stage", "/app/train.py", 120),
              ("main", "/app/train.py", 300))
ALL_GATHER = _stack(("all_gather", f"{SITE}/distributed_c10d.py", 4287), ("gather_stats", "/app/train.py", 90),
                    ("main", "/app/train.py", 300))


def test_a_send_to_a_stage_held_in_a_collective_waits_on_that_collective() -> None:
    """gloo, a sidecar capture: rank 0 (the first stage) waits in send for rank 1, which is blocked in
    all_gather #2 of group 1 (ranks 1-3) that rank 3 skipped: rank 3 went on to a monitored_barrier, which
    waits for the ranks held in #2. Rank 0 waits, through rank 1, on rank 3: no send/recv pairing of its own
    (the stacks name no peer, but a lone sender whose partner is held in a collective pairs with nobody)."""
    last = b.T0 + 100 * S
    pp = ("1", "pp")

    def gloo(seq: int, pg: tuple[str, str] = ("0", "default_pg"), done: bool = True) -> dict[str, object]:
        return b.entry(seq, backend="gloo", pg=pg, state="scheduled", retired=done, created_ns=last + seq)

    per_rank = {r: [gloo(s) for s in range(1, 6)] for r in range(4)}
    for r in (1, 2, 3):
        per_rank[r].append(gloo(1, pp))
    for r in (1, 2):
        per_rank[r].append(gloo(2, pp, done=False))
    for entries in per_rank.values():
        for i, e in enumerate(entries):
            e["record_id"] = i
    stacks = {0: SEND, 1: ALL_GATHER, 2: ALL_GATHER, 3: BARRIER}
    pieces = [wire.snapshot_piece(r, last + 60 * S, f"socket:/run/rank-{r}.sock", stacks[r],
                                  b.dump(per_rank[r], world=4)) for r in range(4)]
    report = analyze(assemble([normalize_dump(p, p["source"], p["rank"]) for p in pieces], []),
                     AnalysisOptions(stall_after_s=10.0))
    root = report.findings[0]
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (3,), root.summary
    assert not any(f.category is Category.P2P_MISMATCH for f in report.findings), \
        [f.summary for f in report.findings]


def _gloo_capture(stacks: dict[int, str]) -> list[Finding]:
    """Idle gloo recorders (every entry retired) captured with `stacks`; the findings' categories."""
    last = b.T0 + 100 * S
    entries = [b.entry(s, backend="gloo", state="scheduled", retired=True, created_ns=last - (20 - s) * S // 5)
               for s in range(1, 21)]
    pieces = [wire.snapshot_piece(r, last + 60 * S, f"socket:/run/rank-{r}.sock", text,
                                  b.dump([dict(e) for e in entries], world=len(stacks)))
              for r, text in stacks.items()]
    report = analyze(assemble([normalize_dump(p, p["source"], p["rank"]) for p in pieces], []),
                     AnalysisOptions(stall_after_s=10.0))
    return report.findings


def test_a_send_and_a_recv_of_different_exchanges_do_not_face_each_other() -> None:
    """gloo, a sidecar capture: a pipeline (rank r sends to r + 1 in pipeline_stage) where ranks 1 and 5
    both receive first in another exchange (exchange, called elsewhere). Rank 0's send and rank 1's
    receive are neighbours but not one exchange's two ends: rank 1 is busy in its own. The ranks of the
    pipeline's exchange wait toward it; the odd exchange, whose two ranks both receive, is the pairing."""
    def op(name: str, func: str, line: int) -> str:
        line_in_c10d = 2466 if name == "send" else 2524
        return _stack((name, f"{SITE}/distributed_c10d.py", line_in_c10d), (func, "/app/train.py", line),
                      ("main", "/app/train.py", 300))

    pipeline = {r: op("recv", "pipeline_stage", 121) for r in (2, 3, 4)}
    stacks = {0: op("send", "pipeline_stage", 120), 1: op("recv", "exchange", 210), **pipeline,
              5: op("recv", "exchange", 210)}
    [root] = _gloo_capture(stacks)
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (1, 5), root.summary


def test_two_ranks_of_one_exchange_both_receiving_still_pair_beside_partners_held_elsewhere() -> None:
    """gloo, a sidecar capture: ranks 2 and 4 both wait in recv in the same exchange; their stage partners
    (1 and 3) are held in all_reduce #2 of group 1 (ranks 0, 1, 3), which rank 0 never entered: rank 0 waits
    in group 2 (ranks 0, 2, 4) for ranks 2 and 4. The two receivers may wait on each other (both received
    first): they stay the candidates, not victims of group 1."""
    last = b.T0 + 100 * S

    def gloo(seq: int, pg: tuple[str, str] = ("0", "default_pg"), done: bool = True) -> dict[str, object]:
        return b.entry(seq, backend="gloo", pg=pg, state="scheduled", retired=done, created_ns=last + seq)

    per_rank = {r: [gloo(s) for s in range(1, 6)] for r in range(5)}
    for r in (0, 1, 3):
        per_rank[r] += [gloo(1, ("1", "sub"))] + ([gloo(2, ("1", "sub"), done=False)] if r else [])
    for r in (0, 2, 4):
        per_rank[r] += [gloo(1, ("2", "sub"))] + ([gloo(2, ("2", "sub"), done=False)] if r == 0 else [])
    for entries in per_rank.values():
        for i, e in enumerate(entries):
            e["record_id"] = i
    recv = _stack(("recv", f"{SITE}/distributed_c10d.py", 2524), ("exchange", "/app/train.py", 210),
                  ("main", "/app/train.py", 300))
    stacks = {0: ALL_REDUCE, 1: ALL_REDUCE, 2: recv, 3: ALL_REDUCE, 4: recv}
    pieces = [wire.snapshot_piece(r, last + 60 * S, f"socket:/run/rank-{r}.sock", stacks[r],
                                  b.dump(per_rank[r], world=5)) for r in range(5)]
    report = analyze(assemble([normalize_dump(p, p["source"], p["rank"]) for p in pieces], []),
                     AnalysisOptions(stall_after_s=10.0))
    root = report.findings[0]
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (2, 4), root.summary
    assert root.ambiguous


def _batch(step: int, coll_seq: int, *, state: str, created_ns: int) -> dict[str, object]:
    """NCCL's one entry for a `batch_isend_irecv`: `coalesced`, point-to-point, peers unnamed."""
    e = b.entry(step, op="coalesced", state=state, created_ns=created_ns, sizes=[[256], [256]])
    e.update(is_p2p=True, collective_seq_id=coll_seq, p2p_seq_id=step)
    return e


def _ring_of_batches(stuck: int, world: int = 4) -> dict[int, list[dict[str, object]]]:
    """Each step an all_reduce, then a batch sending to the next rank and receiving from the previous one.
    At step 2 rank `stuck` never posts its batch: its neighbours' batches wait (the one sending to it, the
    one receiving from it); the others' finished."""
    per_rank: dict[int, list[dict[str, object]]] = {r: [] for r in range(world)}
    for step in (1, 2):
        t = b.T0 + step * S
        for r in range(world):
            per_rank[r].append(b.entry(step, created_ns=t))
            if step == 2 and r == stuck:
                continue
            waits = step == 2 and r in ((stuck - 1) % world, (stuck + 1) % world)
            per_rank[r].append(_batch(step, step, state="started" if waits else "completed", created_ns=t + 1000))
    return per_rank


def test_a_rank_that_never_posted_its_batch_is_the_culprit_of_the_batches_waiting_for_it(tmp_path: Path) -> None:
    """NCCL records a batch_isend_irecv as one `coalesced` entry without peers. Ranks 1 and 3 wait in batch
    #2; rank 2 never posted its batch #2 and waits on nobody (stuck in Python, idle in its recorder): the
    batches wait for it (a ring's ranks meet in their batches of the same number). Before, no finding."""
    per_rank = _ring_of_batches(stuck=2)
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(now_ns=b.T0 + 700 * S))
    first = report.findings[0]
    assert first.category is Category.P2P_MISMATCH and first.culprit_ranks == (2,), first.summary
    assert "never posted" in first.summary and "#2" in first.summary


def test_a_batch_waits_on_nobody_the_counts_name_when_a_ring_hid_a_member_count(tmp_path: Path) -> None:
    """The counts must be whole: where the member behind's recorder wrapped past its point-to-point ops
    (its first record is gone and it holds none), how many it posted is unknown: no culprit is made up."""
    per_rank = _ring_of_batches(stuck=2)
    per_rank[2] = [b.entry(2, created_ns=b.T0 + 2 * S, record_id=7)]
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(now_ns=b.T0 + 700 * S))
    assert not any(f.category is Category.P2P_MISMATCH and f.culprit_ranks == (2,) for f in report.findings)


def test_a_rank_blocked_in_a_send_to_the_extra_caller_counts_for_neither_side(tmp_path: Path) -> None:
    """Rank 0 ran one all_reduce more than the others (uneven data). Rank 1's send to rank 0 waits (rank 0
    never posted the recv: it is in the extra collective); ranks 2 and 3 finished everything. Rank 1 waits
    on the rank in the collective, so it is no idle peer and no evidence either way: the odd side is rank 0,
    not the three that never called it."""
    t = b.T0 + 10 * S
    per_rank = {r: [b.entry(s, created_ns=b.T0 + s * S) for s in range(1, 4)] for r in range(4)}
    per_rank[1].append(b.entry(4, op="send", peer=" 1->0", p2p_seq=1, state="started", record_id=3, created_ns=t))
    per_rank[0].append(b.entry(4, state="started", created_ns=t + S))
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(now_ns=t + 700 * S))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (0,), first.summary
    assert "one collective more" in first.summary


def test_a_recv_nobody_answers_whose_peer_waits_on_the_rank_names_the_rank(tmp_path: Path) -> None:
    """NCCL: rank 1 receives from rank 2 and then sends to rank 2; rank 2 receives from rank 1. The two wait on
    each other, and rank 2's wait has its counterpart (rank 1's send, held behind rank 1's recv) while rank 1's
    recv has none: rank 1 named a peer that is not sending to it. Rank 1 is the culprit, not rank 2."""
    t = b.T0 + 10 * S
    per_rank = {r: [b.entry(s, created_ns=b.T0 + s * S) for s in range(1, 4)] for r in range(3)}
    per_rank[1] += [b.entry(1, op="recv", peer=" 1<-2", p2p_seq=1, state="started", created_ns=t),
                    b.entry(2, op="send", peer=" 1->2", p2p_seq=2, state="scheduled", created_ns=t + 1)]
    per_rank[2].append(b.entry(1, op="recv", peer=" 2<-1", p2p_seq=1, state="started", created_ns=t))
    for entries in per_rank.values():
        for i, e in enumerate(entries):
            e["record_id"] = i
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 3)]), AnalysisOptions(now_ns=t + 700 * S))
    first = report.findings[0]
    assert first.category is Category.P2P_MISMATCH and first.culprit_ranks == (1,), first.summary


def test_a_recv_from_the_wrong_peer_beside_a_send_it_never_received_names_the_receiver(tmp_path: Path) -> None:
    """NCCL, a pipeline 0 -> 1 -> 2: rank 1's send to rank 2 completed (NCCL completes a small send before its
    recv is posted), and rank 2 never posted a recv from rank 1; its pending recv names rank 0, which sends only
    to rank 1. The message rank 2 should receive is there: rank 2 named the wrong peer, not rank 0 a send."""
    t = b.T0 + 10 * S
    per_rank = {r: [b.entry(s, created_ns=b.T0 + s * S) for s in range(1, 4)] for r in range(3)}
    per_rank[0].append(b.entry(1, op="send", peer=" 0->1", p2p_seq=1, created_ns=t))
    per_rank[1] += [b.entry(1, op="recv", peer=" 1<-0", p2p_seq=1, created_ns=t),
                    b.entry(2, op="send", peer=" 1->2", p2p_seq=2, created_ns=t + 1)]
    per_rank[2].append(b.entry(1, op="recv", peer=" 2<-0", p2p_seq=1, state="started", created_ns=t))
    for entries in per_rank.values():
        for i, e in enumerate(entries):
            e["record_id"] = i
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 3)]), AnalysisOptions(now_ns=t + 700 * S))
    first = report.findings[0]
    assert first.category is Category.P2P_MISMATCH and first.culprit_ranks == (2,), first.summary
