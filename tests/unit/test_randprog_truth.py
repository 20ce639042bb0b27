"""The random-program executor and its truth, on hand-built programs: the truth follows what the executor
ended in (sinks, cycles, counts, mismatches), never the fault's name, and the written dumps load."""

from __future__ import annotations

import random
from pathlib import Path

from frscope.records import load_dumps
from frscope.records.safe_pickle import safe_loads
from frscope.testing.randprog import torchpickle
from frscope.testing.randprog.case import BATCH_LOOKALIKE_WHY, FORMS, RING_WHY, Case, make_case, write_form
from frscope.testing.randprog.executor import BLOCKED, DONE, EXITED, FAILED, execute
from frscope.testing.randprog.faults import Fault, apply_fault
from frscope.testing.randprog.layout import DEFAULT, NEW_GROUP, Group, Layout
from frscope.testing.randprog.program import Call, Op, build_program
from frscope.testing.randprog.recorder import dump
from frscope.testing.randprog.truth import truth_of


def _layout(world: int, *subgroups: tuple[int, ...]) -> Layout:
    groups = [Group(0, "0", "default_pg", tuple(range(world)), DEFAULT)]
    groups += [Group(i, str(i), "sub", ranks, NEW_GROUP) for i, ranks in enumerate(subgroups, 1)]
    return Layout(world, tuple(groups), tuple((g.index,) for g in groups))


def _program(layout: Layout, calls: list[Call], backend: str = "gloo", steps: int = 3):  # type: ignore[no-untyped-def]
    return build_program(layout, backend, [], calls, steps=steps, step_s=0.05)


def _first(ops: list[Op], group: int, step: int) -> int:
    return next(i for i, op in enumerate(ops) if op.kind == "coll" and op.group == group and op.step == step)


def test_a_rank_stuck_in_python_is_the_sink_its_peers_wait_for() -> None:
    prog = _program(_layout(4), [Call("all_reduce", 0, (8,), "Float")])
    prog.ops[2].insert(_first(prog.ops[2], 0, 2), Op("stuck", 2, func="load_next_batch"))
    ex = execute(prog, random.Random(0))
    truth = truth_of(ex)
    assert (truth.category, truth.culprits) == ("RankNotJoined", (2,))
    assert [ex.states[r].status for r in (0, 1, 3)] == [BLOCKED] * 3


def test_swapped_groups_form_a_cycle_broken_at_the_rank_out_of_order() -> None:
    layout = _layout(6, (3, 4, 5))
    prog = _program(layout, [Call("all_reduce", 1, (8,), "Float"), Call("all_reduce", 0, (8,), "Float")])
    ops = prog.ops[3]
    at = _first(ops, 1, 2)
    ops[at], ops[at + 1] = ops[at + 1], ops[at]
    truth = truth_of(execute(prog, random.Random(0)))
    assert (truth.category, truth.culprits, truth.undecidable) == ("RankNotJoined", (3,), {})


def test_the_same_swap_in_a_two_rank_group_cannot_be_decided() -> None:
    prog = _program(_layout(4, (0, 1)), [Call("all_reduce", 1, (8,), "Float"), Call("all_reduce", 0, (8,), "Float")])
    ops = prog.ops[0]
    at = _first(ops, 1, 2)
    ops[at], ops[at + 1] = ops[at + 1], ops[at]
    truth = truth_of(execute(prog, random.Random(0)))
    assert set(truth.culprits) == {0, 1} and truth.undecidable


def test_a_cycle_is_read_where_each_rank_still_waits_not_at_an_async_op_it_went_past() -> None:
    # Groups: 1 = (0, 1, 2), 2 = (1, 2, 3), 3 = (2, 3). Rank 3 calls group 3's all_gather twice at step 3: it
    # waits there for rank 2, which waits (with rank 1) in step 3's async all_reduce of group 2 for rank 3.
    # Their Work.wait() also lists group 1's async all_reduce, done; rank 0 went on to step 4's all_reduce
    # of the default group, waiting for everyone: downstream of the cycle, never its odd side.
    layout = _layout(4, (0, 1, 2), (1, 2, 3), (2, 3))
    prog = _program(layout, [Call("all_reduce", 0, (8,), "Float"), Call("all_reduce", 1, (8,), "Float", is_async=True),
                             Call("all_gather", 3, (8,), "Float"), Call("all_reduce", 2, (8,), "Float", is_async=True)],
                    steps=4)
    ops = prog.ops[3]
    ops.insert(_first(ops, 3, 3), ops[_first(ops, 3, 3)])
    ex = execute(prog, random.Random(0))
    assert ex.states[0].status == BLOCKED and ex.states[0].blocked[0].key == ("c", 0, 3)
    assert ex.states[2].blocked[0].done is not None
    truth = truth_of(ex)
    assert set(truth.culprits) == {2, 3} and truth.undecidable, truth  # one rank on each side of group 3


def test_an_extra_collective_blames_the_rank_with_the_odd_count_not_the_idle_ones() -> None:
    prog = _program(_layout(4), [Call("all_reduce", 0, (8,), "Float")])
    ops = prog.ops[1]
    ops.insert(_first(ops, 0, 3), ops[_first(ops, 0, 3)])
    ex = execute(prog, random.Random(0))
    assert ex.states[1].status == BLOCKED and all(ex.states[r].status == DONE for r in (0, 2, 3))
    truth = truth_of(ex)
    assert (truth.category, truth.culprits) == ("RankNotJoined", (1,))


def test_mismatches_by_the_minority_signature_and_gloo_byte_counts() -> None:
    calls = [Call("all_reduce", 0, (8,), "Float")]
    for dtype, outcome in (("Int", "silent"), ("Double", "abort")):
        prog = _program(_layout(3), calls)
        at = _first(prog.ops[2], 0, 2)
        op = prog.ops[2][at]
        rec = op.recs[0]
        prog.ops[2][at] = Op("coll", op.step, 0, recs=(type(rec)(rec.op, rec.in_sizes, (dtype,), rec.out_sizes,
                                                                 (dtype,), rec.shape, dtype, rec.api),))
        ex = execute(prog, random.Random(0))
        truth = truth_of(ex)
        assert (truth.category, truth.culprits) == ("DtypeMismatch", (2,))
        assert {r.outcome for r in ex.rdvs} >= {outcome}
        if outcome == "abort":  # the common side aborts without a dump: the evidence cannot decide
            assert truth.undecidable and not ex.states[0].dump_at_exit and ex.states[2].dump_at_exit


def test_gloo_peers_of_a_dead_rank_fail_and_their_dumps_retire_the_failed_op() -> None:
    prog = _program(_layout(3), [Call("all_reduce", 0, (8,), "Float")])
    prog.ops[1].insert(_first(prog.ops[1], 0, 2), Op("crash", 2, code=137))
    ex = execute(prog, random.Random(0))
    assert ex.states[0].status == ex.states[2].status == FAILED
    truth = truth_of(ex)
    assert (truth.category, truth.culprits) == ("RankStopped", (1,))
    last = dump(ex, 0, ex.end_t + 1, pickle=False)["entries"][-1]
    assert last["retired"] is True and last["state"] == "scheduled"


def test_nccl_python_goes_on_until_the_step_sync_and_records_p2p() -> None:
    prog = _program(_layout(2), [Call("all_reduce", 0, (8,), "Float"), Call("sendrecv", 0, (4,), "Float", src=0,
                                                                                 dst=1)], backend="nccl")
    prog.ops[1].insert(_first(prog.ops[1], 0, 2), Op("stuck", 2, func="load_next_batch"))
    ex = execute(prog, random.Random(0))
    entries = dump(ex, 0, ex.end_t + 30, pickle=False)["entries"]
    names = [e["profiling_name"] for e in entries]
    assert "nccl:send 0->1" in names and names[-1] == "nccl:send 0->1"  # enqueued past the hung all_reduce
    states = {e["profiling_name"]: e["state"] for e in entries[-2:]}
    assert states == {"nccl:all_reduce": "started", "nccl:send 0->1": "started"}
    assert ex.states[0].block_op is not None and ex.states[0].block_op.kind == "wait"


def test_every_form_loads_and_pickles_are_safe_to_read(tmp_path: Path) -> None:
    for seed in range(30):
        case = make_case(seed)
        for form in FORMS:
            folder = tmp_path / f"{seed}-{form}"
            paths = write_form(case, form, folder)
            if not paths:
                continue
            dumpset = load_dumps([folder], jobs=1)
            # the only error a form carries is a real sidecar's word that a dead rank's socket is gone
            errors = [p for p in dumpset.problems if p.kind != "warning"]
            dead = {r for r, st in case.ex.states.items() if st.status in (EXITED, FAILED)}
            assert all(p.rank in dead and "socket is gone" in p.message for p in errors), (seed, form, errors)
            assert form == "snapshot" or not errors, (seed, form)
            assert set(dumpset.dumps) == set(case.dump_t[form])
        want = dump(case.ex, 0, case.capture_t, pickle=True)
        assert safe_loads(torchpickle.dumps(want), "randprog") == want


def test_the_fault_name_does_not_make_the_truth() -> None:
    # a fault drawn where it changes nothing leaves a healthy truth (no collective to change: a barrier-only
    # template cannot take a wrong size)
    prog = _program(_layout(2), [Call("barrier", 0, (), "Float")])
    fault = apply_fault(random.Random(3), prog, "wrong_size")
    assert fault.name == "healthy"
    assert truth_of(execute(prog, random.Random(0))).category == "healthy"


def test_p2p_peer_errors_blame_the_rank_whose_peer_never_posts_the_counterpart() -> None:
    for backend in ("gloo", "nccl"):
        # a pipeline 0 -> 1 -> 2 where rank 2 receives from rank 0, which never sends to it
        prog = _program(_layout(3), [Call("sendrecv", 0, (4,), "Float", src=0, dst=1),
                                     Call("sendrecv", 0, (4,), "Float", src=1, dst=2)], backend=backend)
        ops = prog.ops[2]
        at = next(i for i, op in enumerate(ops) if op.kind == "p2p" and op.step == 2)
        ops[at] = Op("p2p", 2, 0, peer=0, send=False, shape=(4,))
        truth = truth_of(execute(prog, random.Random(0)))
        assert (truth.category, truth.culprits) == ("P2PMismatch", (2,)), backend
        # both ranks receiving first deadlock on either backend (NCCL: one stream per peer, in order)
        prog = _program(_layout(3), [Call("all_reduce", 0, (8,), "Float")], backend=backend)
        for me, peer in ((0, 1), (1, 0)):
            at = next(i for i, op in enumerate(prog.ops[me]) if op.kind == "coll" and op.step == 2)
            prog.ops[me][at:at] = [Op("p2p", 2, 0, peer=peer, send=False, shape=(4,)),
                                   Op("p2p", 2, 0, peer=peer, send=True, shape=(4,))]
        truth = truth_of(execute(prog, random.Random(0)))
        assert (truth.category, truth.culprits) == ("P2PMismatch", (0, 1)), backend


def _slow(prog, ranks: tuple[int, ...], late_s: float) -> None:  # type: ignore[no-untyped-def]
    for r in ranks:
        for op in prog.ops[r]:
            if op.kind == "compute":
                op.seconds += late_s


def test_a_straggler_only_seen_with_a_rank_that_waited_for_it_in_gloo_send_recv_is_undecidable() -> None:
    """Rank 2 computes late; rank 3 receives from it (gloo records no send/recv) and so reaches the next
    all_reduce exactly as late: every recorded collective shows 2 and 3 late together, like a slow node.
    With the send/recv gone the same lateness shows rank 2 alone: decidable."""
    for exchange, undecidable in ((True, True), (False, False)):
        calls = [Call("sendrecv", 0, (8,), "Float", src=2, dst=3)] if exchange else []
        prog = build_program(_layout(4), "gloo", [], [*calls, Call("all_reduce", 0, (8,), "Float")], steps=6,
                             step_s=0.2)
        _slow(prog, (2,), 0.1)
        truth = truth_of(execute(prog, random.Random(0)))
        assert (truth.category, truth.culprits) == ("Straggler", (2,))
        assert bool(truth.undecidable) is undecidable, exchange


def test_a_straggler_whose_late_steps_the_ring_buffer_dropped_is_undecidable() -> None:
    """The recorders keep the last 4 entries (a step and a half here): the lateness shows at one step, too
    few to tell from jitter; with the whole run kept the same program is decidable."""
    prog = build_program(_layout(4), "gloo", [], [Call("all_reduce", 0, (8,), "Float"),
                                                  Call("broadcast", 0, (8,), "Float"),
                                                  Call("all_gather", 0, (8,), "Float")], steps=8, step_s=0.2)
    _slow(prog, (1,), 0.1)
    ex = execute(prog, random.Random(0))
    truth = truth_of(ex)
    assert (truth.category, truth.culprits, truth.undecidable) == ("Straggler", (1,), {})
    read = {f: {r: ex.end_t + 1 for r in ex.states} for f in FORMS}
    for buffer, why in ((4, RING_WHY), (2000, "")):
        case = Case(0, prog, Fault("straggler", (1,)), ex, truth, ex.end_t + 1, "2.10", False, {}, read, buffer)
        assert [case.undecidable(f) for f in FORMS] == [why] * 3, buffer


def test_a_straggler_with_a_lookalike_it_held_in_gloo_send_recv_is_undecidable() -> None:
    """Rank 3 computes late and sends to rank 2 (gloo records no send/recv): rank 2 reaches its own pair
    group's all_reduce (with rank 0) as late as rank 3 reaches its (with rank 1). The records show two
    stragglers alike; without the send/recv rank 2 is on time: decidable."""
    layout = _layout(4, (0, 2), (1, 3))
    for exchange, undecidable in ((True, True), (False, False)):
        calls = [Call("sendrecv", 0, (8,), "Float", src=3, dst=2)] if exchange else []
        prog = build_program(layout, "gloo", [], [*calls, Call("all_reduce", 1, (8,), "Float"),
                                                  Call("all_reduce", 2, (8,), "Float")], steps=6, step_s=0.2)
        _slow(prog, (3,), 0.1)
        truth = truth_of(execute(prog, random.Random(0)))
        assert (truth.category, truth.culprits) == ("Straggler", (3,))
        assert bool(truth.undecidable) is undecidable, exchange

def test_a_rank_killed_by_sigkill_writes_no_dump_as_it_dies() -> None:
    # SIGKILL ends a process without running any handler: a crash with exit code -9 / 137 leaves at most the
    # sidecar's last poll (or a periodic dump), never a dump written at exit.
    killed = 0
    for seed in range(400):
        prog = _program(_layout(4), [Call("all_reduce", 0, (8,), "Float")])
        fault = apply_fault(random.Random(seed), prog, "crash")
        crash = next(op for op in prog.ops[fault.ranks[0]] if op.kind == "crash")
        if crash.code in (-9, 137):
            killed += 1
            assert not crash.dump and fault.dump == "none", (seed, crash.code, fault.dump)
    assert killed > 50


def test_a_gloo_crash_every_survivor_failed_of_is_undecidable_in_files_without_exit_codes() -> None:
    # The survivors of a gloo crash fail at once and gloo retires the op they failed in: every recorder
    # shows every op retired, the dead rank's ending early, as a healthy job whose rank was read early
    # does (the stale read's files). Without exit codes the file forms cannot decide (nor a snapshot in
    # which every process ended: no live stack); the exits can.
    from frscope.testing.randprog.case import DIED_GLOO_WHY

    found = 0
    for seed in range(600):
        case = make_case(seed, "crash")
        ended = not case.hung and case.program.backend == "gloo" and case.truth.culprits
        if not ended or any(r not in case.dump_t["json"] for r in case.truth.culprits):
            continue
        retired = all(e["retired"] for r, tv in case.dump_t["json"].items()
                      for e in dump(case.ex, r, tv, pickle=False, buffer=case.buffer)["entries"])
        expected = retired and not case.exits
        why = case.undecidable("json")
        assert bool(why) if expected else why != DIED_GLOO_WHY, seed  # (another reason may come first)
        # a snapshot decides where a live stack remains (a rank that finished its program, idle)
        all_ended = all(st.status in (EXITED, FAILED) for st in case.ex.states.values())
        snapshot = case.undecidable("snapshot")
        assert bool(snapshot) if expected and all_ended else snapshot != DIED_GLOO_WHY, seed
        found += why == DIED_GLOO_WHY
    assert found >= 3


def test_a_snapshot_in_which_every_process_ended_is_no_better_than_the_files_at_an_unrecorded_wait() -> None:
    # gloo records no send/recv: the files cannot show who started a wait there (UNRECORDED_WHY), and where
    # every process had ended by the capture the snapshot holds no live stack either, only the same reads
    # (seeds 5313, 7255: every rank failed on its peer's death in a send/recv; the exit codes, all 1, or
    # none, do not tell the first).
    from frscope.testing.randprog.case import UNRECORDED_GONE_WHY, UNRECORDED_WHY

    found = 0
    for seed in range(400):
        case = make_case(seed, "crash")
        all_ended = all(st.status in (EXITED, FAILED) for st in case.ex.states.values())
        if case.undecidable("json") != UNRECORDED_WHY or case.truth.undecidable:
            continue
        snapshot = case.undecidable("snapshot")
        assert bool(snapshot) if all_ended else snapshot != UNRECORDED_GONE_WHY, seed
        found += snapshot == UNRECORDED_GONE_WHY
    assert found >= 3


def test_a_snapshot_whose_live_ranks_finished_cannot_tell_which_ended_rank_went_first() -> None:
    # A rank died in a send/recv ring and its peers failed on its death one after the other; the ranks still
    # alive had finished their programs. Their stacks show no wait, the ended ranks have none, gloo recorded
    # none of the ring's ops, and the exit codes (all 1, or none) are alike: where the first to go also holds
    # every collective its peers hold, nothing in the snapshot names it (seeds 1209411, 427182). Where its
    # last read is older than its peers' collectives (seed 3), or its code differs (a SIGKILL), it decides.
    from frscope.testing.randprog.case import UNRECORDED_ENDED_WHY

    found = 0
    for seed in range(400):
        case = make_case(seed, "crash")
        if case.undecidable("snapshot") != UNRECORDED_ENDED_WHY:
            continue
        states = case.ex.states
        assert not any(st.status == BLOCKED for st in states.values()), seed
        ended = {r for r, st in states.items() if st.status in (EXITED, FAILED)}
        assert set(case.truth.culprits) < ended, seed
        assert len({case.exits.get(r) for r in ended}) == 1, seed
        found += 1
    assert found >= 2  # seeds 191, 312
    assert make_case(3, "crash").undecidable("snapshot") != UNRECORDED_ENDED_WHY  # its read is older: decides


def test_nccl_peers_never_finish_an_op_a_rank_died_in() -> None:
    # NCCL: rank 1 enqueues step 2's all_reduce and its process dies before the others arrive. The op
    # needs every member's device and proxy thread: it finishes on nobody (the peers hang in it, 'started'),
    # and the truth's wait-for graph leads to the dead rank.
    prog = _program(_layout(3), [Call("all_reduce", 0, (8,), "Float")], backend="nccl")
    ops = prog.ops[1]
    ops.insert(_first(ops, 0, 2) + 1, Op("crash", 2, code=1))
    ex = execute(prog, random.Random(0))
    assert ex.states[1].status == EXITED
    [dead] = [x for x in ex.rdvs if x.outcome == "dead"]
    assert dead.dead == {1} and dead.done is None and set(dead.arrivals) == {0, 1, 2}
    entry = next(e for e in dump(ex, 0, ex.end_t + 30, pickle=False)["entries"]
                 if e["collective_seq_id"] == dead.key[2] + 1)
    assert entry["state"] == "started" and not entry["retired"]
    truth = truth_of(ex)
    assert (truth.category, truth.culprits) == ("RankStopped", (1,))

def test_a_size_mismatch_whose_odd_rank_passed_another_dtype_too_accepts_either_finding() -> None:
    # A skipped all_to_all_single: rank 2's next one (another shape and dtype, the same bytes) meets the
    # others' first. The recorder cannot judge all_to_all sizes (they may differ by design), but the dtypes
    # name the same odd rank: a dtype finding is as right as a size one.
    calls = [Call("all_to_all_single", 0, (8,), "BFloat16"), Call("all_to_all_single", 0, (4,), "Float")]
    prog = _program(_layout(3), calls)
    del prog.ops[2][_first(prog.ops[2], 0, 2)]
    truth = truth_of(execute(prog, random.Random(0)))
    assert (truth.category, truth.culprits, truth.undecidable) == ("SizeMismatch", (2,), {})
    assert set(truth.accepted) == {"SizeMismatch", "DtypeMismatch"}


def test_an_extra_call_meeting_the_others_next_one_in_a_cycle_accepts_a_type_mismatch() -> None:
    # Rank 0 calls the default group's reduce once more: it meets ranks 3-5's all_gather there (they have no
    # subgroup call with rank 0 to wait in), while ranks 1-2 wait for rank 0 in their subgroup. The cycle's
    # odd rank is 0, and the recorders show its reduce against the others' all_gather: either finding is right.
    calls = [Call("reduce", 0, (8,), "Float"), Call("gather", 1, (8,), "Float"), Call("gather", 2, (8,), "Float"),
             Call("all_gather", 0, (8,), "Float")]
    prog = _program(_layout(6, (0, 1, 2), (3, 4, 5)), calls)
    at = _first(prog.ops[0], 0, 2)
    prog.ops[0].insert(at, prog.ops[0][at])
    truth = truth_of(execute(prog, random.Random(0)))
    assert (truth.category, truth.culprits, truth.undecidable) == ("RankNotJoined", (0,), {})
    assert set(truth.accepted) == {"RankNotJoined", "CollectiveTypeMismatch"}



def test_a_coalesced_call_meeting_a_single_tensor_all_reduce_does_not_complete() -> None:
    # gloo flattens a coalesced all_reduce's tensors into one buffer: [3, 128] + [192] is 576 elements, which a
    # peer's plain all_reduce of [3, 128] (384) cannot match. Rank 2 skipped the coalesced call of the last step.
    calls = [Call("coalesced", 0, (3, 128), "Float"), Call("all_reduce", 0, (3, 128), "Float")]
    prog = _program(_layout(3), calls)
    del prog.ops[2][_first(prog.ops[2], 0, 3)]
    ex = execute(prog, random.Random(0))
    assert any(r.outcome == "abort" for r in ex.rdvs)
    assert truth_of(ex).category == "SizeMismatch"


def test_nccl_p2p_to_one_peer_does_not_wait_for_a_recv_from_another() -> None:
    """ProcessGroupNCCL runs each peer pair's send/recv on that pair's own communicator and stream: rank 1's
    send to rank 2 starts when it is posted, not when its recv from the late rank 0 completes, and every
    recorded p2p op starts before it completes (a 'started' time after 'completed' was the recorder putting
    all of a group's p2p ops on one stream while the executor ran them per pair)."""
    prog = build_program(_layout(3), "nccl", [], [Call("sendrecv", 0, (4,), "Float", src=0, dst=1),
                                                  Call("sendrecv", 0, (4,), "Float", src=1, dst=2)],
                         steps=3, step_s=0.05)
    _slow(prog, (0,), 0.04)
    ex = execute(prog, random.Random(0))
    for rank in ex.states:
        for e in dump(ex, rank, ex.end_t + 1, pickle=False)["entries"]:
            assert e["time_discovered_started_ns"] <= e["time_discovered_completed_ns"], (rank, e)
    sends = [e for e in dump(ex, 1, ex.end_t + 1, pickle=False)["entries"] if e["profiling_name"] == "nccl:send 1->2"]
    assert sends and all(e["duration_ms"] < 1 for e in sends)


def test_a_straggler_seen_only_at_nccl_send_recv_is_undecidable() -> None:
    """NCCL records send/recv with their times, but rank 1 waiting for rank 0's send at every step is as much
    a pipeline's next stage waiting for its input by design (a stage's work differs from its peers') as a
    slow rank 0: only a collective, where every member does the same work before it, shows lateness that is
    the rank's own. With an all_reduce in each step the same straggler is decidable."""
    for collective, undecidable in ((False, True), (True, False)):
        calls = [Call("sendrecv", 0, (8,), "Float", src=0, dst=1), Call("sendrecv", 0, (8,), "Float", src=1, dst=2)]
        calls += [Call("all_reduce", 0, (8,), "Float")] if collective else []
        prog = build_program(_layout(3), "nccl", [], calls, steps=8, step_s=0.2)
        _slow(prog, (0,), 0.1)
        truth = truth_of(execute(prog, random.Random(0)))
        assert (truth.category, truth.culprits) == ("Straggler", (0,))
        assert bool(truth.undecidable) is undecidable, collective


def test_a_straggler_a_ring_shows_late_at_four_steps_is_undecidable_among_few_ranks() -> None:
    """The recorders keep the last 13 entries (four steps and a bit): the straggler shows late at four. Among
    eight ranks one rank last at four steps of four is beyond jitter (8 * 8**-4, 1 in 500); between two
    it happens once in eight runs (2 * 2**-4), among four once in 64: too few steps to tell, where five of
    one length would do. With the whole run kept (8 steps) all are decidable."""
    from frscope.testing.randprog.case import late_steps_needed
    assert [late_steps_needed(n) for n in (2, 3, 4, 6, 8, 16)] == [5, 5, 5, 4, 4, 3]
    for world, undecidable in ((2, True), (4, True), (8, False)):
        prog = build_program(_layout(world), "gloo", [], [Call("all_reduce", 0, (8,), "Float"),
                                                          Call("broadcast", 0, (8,), "Float"),
                                                          Call("all_gather", 0, (8,), "Float")], steps=8, step_s=0.2)
        _slow(prog, (1,), 0.1)
        ex = execute(prog, random.Random(0))
        truth = truth_of(ex)
        assert (truth.category, truth.culprits, truth.undecidable) == ("Straggler", (1,), {})
        read = {f: {r: ex.end_t + 1 for r in ex.states} for f in FORMS}
        for buffer, why in ((13, RING_WHY if undecidable else ""), (2000, "")):
            case = Case(0, prog, Fault("straggler", (1,)), ex, truth, ex.end_t + 1, "2.10", False, {}, read, buffer)
            assert [case.undecidable(f) for f in FORMS] == [why] * 3, (world, buffer)


def test_a_batch_waiter_others_wait_on_looks_like_a_rank_in_python_in_a_snapshot() -> None:
    """Ranks 0 and 2 both receive first (a p2p deadlock); rank 1 waits in a batch_isend_irecv with them
    (gloo records none of it, and work.wait() is C++: its stack is its own Python) and rank 3 waits in the
    barrier for all three. The capture is the one a run with rank 1 stuck in Python there leaves: the
    snapshot cannot decide. Without the batch rank 1 waits in the barrier too: decidable."""
    layout = _layout(4, (0, 1, 2))
    for batch, why in ((True, BATCH_LOOKALIKE_WHY), (False, "")):
        calls = [Call("batch", 1, (8,), "Float", func="exchange_halo")] if batch else []
        prog = build_program(layout, "gloo", [], [*calls, Call("barrier", 0, (), "Float")], steps=3, step_s=0.05)
        for me, peer in ((0, 2), (2, 0)):
            at = next(i for i, op in enumerate(prog.ops[me]) if op.kind == "compute" and op.step == 2) + 1
            prog.ops[me][at:at] = [Op("p2p", 2, 0, peer=peer, send=False, shape=(4,)),
                                   Op("p2p", 2, 0, peer=peer, send=True, shape=(4,))]
        ex = execute(prog, random.Random(0))
        truth = truth_of(ex)
        assert (truth.category, truth.culprits) == ("P2PMismatch", (0, 2)), batch
        read = {f: {r: ex.end_t + 60 for r in ex.states} for f in FORMS}
        case = Case(0, prog, Fault("p2p_deadlock", (0, 2)), ex, truth, ex.end_t + 60, "2.10", False, {}, read, 2000)
        assert case.undecidable("snapshot") == why, batch


def test_a_batch_waiter_nobody_waits_on_looks_like_the_culprit_where_no_recorded_wait_names_it() -> None:
    """Ranks 0 and 1 exchange in a batch_isend_irecv, then rank 1 sends to 2 and 2 to 3 (gloo records none of
    it). Rank 1 is stuck in Python before its batch: rank 0 waits in the batch (work.wait() is C++: its stack
    is its own Python), 2 and 3 in recv, whose stacks name no peer. Nobody waits on rank 0, but nothing the
    recorders keep names rank 1 either: the capture is the one a run with rank 0 stuck and rank 1 waiting in a
    C++ call leaves, so the snapshot cannot decide. Where rank 0 waits in a collective instead, its recorded
    wait names rank 1 among those that never joined: decidable."""
    layout = _layout(4, (0, 1))
    for batch, why in ((True, BATCH_LOOKALIKE_WHY), (False, "")):
        first = Call("batch", 1, (8,), "Float", func="exchange_halo") if batch else Call("all_reduce", 0, (8,), "Float")
        calls = [first, *(Call("sendrecv", 0, (8,), "Float", src=s, dst=s + 1) for s in (1, 2))]
        prog = _program(layout, calls)
        at = next(i for i, op in enumerate(prog.ops[1]) if op.kind == "compute" and op.step == 2) + 1
        prog.ops[1].insert(at, Op("stuck", 2, func="save_checkpoint"))
        ex = execute(prog, random.Random(0))
        truth = truth_of(ex)
        assert (truth.category, truth.culprits) == ("RankNotJoined", (1,)), batch
        assert truth.named is not batch
        read = {f: {r: ex.end_t + 60 for r in ex.states} for f in FORMS}
        case = Case(0, prog, Fault("stuck", (1,)), ex, truth, ex.end_t + 60, "2.10", False, {}, read, 2000)
        assert case.undecidable("snapshot") == why, batch


def test_a_stuck_rank_that_never_recorded_in_the_subgroup_it_is_awaited_in_is_one_of_its_lookalikes() -> None:
    """gloo names no subgroup's members. Rank 2 is stuck before its first collective of the pair {0, 2}; rank 0
    waits there, and its entries show no other member. Ranks 1 and 3 finished (idle, like rank 2 in every
    form) and recorded nothing of the pair either: any of the three may be the member that never came. Where
    ranks 1 and 3 recorded in a group created after the pair, their group numbers (pg_status, without a gap)
    leave no room for it: rank 2 alone is the candidate, decidable."""
    from frscope.testing.randprog.case import UNSEEN_MEMBER_WHY
    for later, why in ((False, UNSEEN_MEMBER_WHY), (True, "")):
        layout = _layout(4, (0, 2), (1, 3)) if later else _layout(4, (0, 2))
        calls = [Call("all_reduce", 0, (8,), "Float"), *([Call("all_reduce", 2, (8,), "Float")] if later else []),
                 Call("all_reduce", 1, (8,), "Float")]
        prog = _program(layout, calls, steps=1)
        prog.ops[2].insert(_first(prog.ops[2], 1, 1), Op("stuck", 1, func="save_checkpoint"))
        ex = execute(prog, random.Random(0))
        truth = truth_of(ex)
        assert (truth.category, truth.culprits) == ("RankNotJoined", (2,)), later
        read = {f: {r: ex.end_t + 60 for r in ex.states} for f in FORMS}
        case = Case(0, prog, Fault("stuck", (2,)), ex, truth, ex.end_t + 60, "2.10", False, {}, read, 2000)
        assert [case.undecidable(f) for f in FORMS] == [why] * 3, later
