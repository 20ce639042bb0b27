"""Hangs the recorder cannot see, as the sidecar captures them (frscope.sidecar.unrecorded): which stacks
wait in torch.distributed (frscope.analysis.stacks.blocked_in, what the sidecar asks of each stack), and
what the analysis makes of a capture where every recorder is idle, some ranks wait in monitored_barrier
or pipelining's p2p wait and one is in Python. The stacks are faulthandler's text as
the worker server returned it from real gloo jobs (tests/integration/test_sidecar_unrecorded.py runs
them live); the recorders are gloo-shaped (every entry `scheduled`, retired)."""

from __future__ import annotations

from frscope import wire
from frscope.analysis import AnalysisOptions, Category, Report, analyze
from frscope.analysis.stacks import blocked_in, main_stack, user_frame
from frscope.records import assemble, normalize_dump
from tests.unit import builders as b

S = 1_000_000_000
SITE = "/venv/lib/python3.11/site-packages/torch/distributed"
SERVER = "Current thread 0x00007f0a8d7fa6c0 (most recent call first):\n  <no Python frame>\n\n"


def _stack(*frames: tuple[str, str, int]) -> str:
    lines = [f'  File "{file}", line {line} in {name}' for name, file, line in frames]
    return SERVER + "Thread 0x00007f3e247c9b80 (most recent call first):\n" + "\n".join(lines) + "\n"


BARRIER = _stack(("monitored_barrier", f"{SITE}/distributed_c10d.py", 5435), ("main", "/app/train.py", 166),
                 ("<module>", "/app/train.py", 177))
PIPELINE = _stack(("_wait_batch_p2p", f"{SITE}/pipelining/schedules.py", 683),
                  ("_step_microbatches", f"{SITE}/pipelining/schedules.py", 910),
                  ("step", f"{SITE}/pipelining/schedules.py", 785), ("main", "/app/train.py", 155))
RECV = _stack(("recv", f"{SITE}/distributed_c10d.py", 2600), ("main", "/app/train.py", 40))
IN_PYTHON = _stack(("stuck_in_python", "/app/train.py", 77), ("main", "/app/train.py", 163),
                   ("<module>", "/app/train.py", 177))
# A rank inside torch.distributed's Python but not waiting (pipelining running a stage's forward).
FORWARD = _stack(("forward", "/app/model.py", 12), ("forward_one_chunk", f"{SITE}/pipelining/stage.py", 892))


def _gloo_steps(steps: int, last_ns: int) -> list[dict[str, object]]:
    """A gloo recorder of `steps` all_reduces 0.2 s apart, the last enqueued at `last_ns`, all retired."""
    return [b.entry(seq, backend="gloo", state="scheduled", retired=True,
                    created_ns=last_ns - (steps - seq) * S // 5) for seq in range(1, steps + 1)]


def _capture(stacks: dict[int, str], quiet_s: float) -> Report:
    last = b.T0 + 100 * S
    world = len(stacks)
    pieces = [wire.snapshot_piece(rank, last + int(quiet_s * S), f"socket:/run/rank-{rank}.sock", text,
                                  b.dump(_gloo_steps(20, last), world=world))
              for rank, text in stacks.items()]
    dumps = [normalize_dump(piece, piece["source"], piece["rank"]) for piece in pieces]
    return analyze(assemble(dumps, []), AnalysisOptions(stall_after_s=10.0))


def test_blocked_in_reads_c10d_calls_and_pipelinings_p2p_wait() -> None:
    assert blocked_in(main_stack(BARRIER)) == "monitored_barrier"
    assert blocked_in(main_stack(PIPELINE)) == "batch_isend_irecv"
    assert blocked_in(main_stack(RECV)) == "recv"
    assert blocked_in(main_stack(IN_PYTHON)) is None
    assert blocked_in(main_stack(FORWARD)) is None  # inside torch.distributed's Python, not waiting


def test_a_monitored_barrier_waiting_for_a_rank_in_python_names_that_rank() -> None:
    report = _capture({0: BARRIER, 1: IN_PYTHON, 2: BARRIER}, quiet_s=30)
    [root] = report.findings
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (1,)
    assert root.op == "monitored_barrier"
    assert [f.name for f in root.culprit_stacks[1]][:1] == ["stuck_in_python"]


def test_a_pipeline_stage_in_python_is_named_by_the_stages_waiting_in_p2p() -> None:
    report = _capture({0: IN_PYTHON, 1: PIPELINE, 2: PIPELINE}, quiet_s=30)
    assert [(f.category, f.culprit_ranks) for f in report.findings] == [(Category.RANK_NOT_JOINED, (0,))]


def test_a_pause_in_python_is_no_finding() -> None:
    assert _capture({0: IN_PYTHON, 1: IN_PYTHON, 2: FORWARD}, quiet_s=30).findings == []


ALL_REDUCE = _stack(("all_reduce", f"{SITE}/distributed_c10d.py", 3906), ("main", "/app/train.py", 52))


def _stalled_pipeline(stacks: dict[int, str] | None) -> Report:
    """4 pipeline stages on gloo: ranks 0-1 wait in the step's loss all_reduce (#21, open), rank 2 is stuck
    in Python before its send, rank 3 waits in recv for it; the recorders show no p2p (gloo records none).
    `stacks`: the live stacks of a sidecar capture, or None for copied files (no stacks, no capture time)."""
    last = b.T0 + 100 * S
    per_rank = {r: _gloo_steps(20, last) for r in range(4)}
    for r in (0, 1):
        per_rank[r].append(b.entry(21, backend="gloo", state="scheduled", created_ns=last + S // 5))
    if stacks is None:
        return analyze(assemble([normalize_dump(b.dump(per_rank[r], world=4), f"rank{r}", r)
                                 for r in range(4)], []), AnalysisOptions(now_ns=last + 30 * S))
    pieces = [wire.snapshot_piece(r, last + 30 * S, f"socket:/run/rank-{r}.sock", stacks[r],
                                  b.dump(per_rank[r], world=4)) for r in range(4)]
    dumps = [normalize_dump(piece, piece["source"], piece["rank"]) for piece in pieces]
    return analyze(assemble(dumps, []), AnalysisOptions(stall_after_s=10.0))


def test_a_wait_chain_through_an_unrecorded_recv_ends_at_the_stage_in_python() -> None:
    """Principle 1: rank 3 never joined the all_reduce either, but its stack waits in recv: a waiter, not
    a sink. The chain ends at rank 2, in Python: it never joined (not a p2p mismatch: no two posted ops
    failed to match)."""
    report = _stalled_pipeline({0: ALL_REDUCE, 1: ALL_REDUCE, 2: IN_PYTHON, 3: RECV})
    root = report.findings[0]
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (2,), root.summary
    assert not root.ambiguous
    nested = [f for f in report.findings[0].consequences if f.collective_seq_id == 21]
    assert all(f.culprit_ranks == (2,) for f in nested), [f.summary for f in nested]


def test_idle_ranks_without_stacks_on_gloo_are_candidates() -> None:
    """Principle 4: the same files without stacks: ranks 2 and 3 both show nothing open, and gloo records
    no send/recv, so which of them waits on the other is unknown: both are named, as candidates."""
    [root] = _stalled_pipeline(None).findings
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (2, 3)
    assert root.ambiguous and any("records no point-to-point" in e for e in root.evidence)


ALL_REDUCE = _stack(("all_reduce", f"{SITE}/distributed_c10d.py", 2800), ("main", "/app/train.py", 150))


def test_a_rank_waiting_in_an_unrecorded_recv_does_not_hide_the_rank_that_called_one_more() -> None:
    # Rank 3 ran one step more: it waits alone in all_reduce #21, which ranks 0-2 (finished, in Python) never
    # call; rank 4 waits in a recv from a peer no evidence names (rank 3's send would come after #21). Rank
    # 4 is neither an idle peer nor evidence against the odd count: the one in the collective is the odd side.
    last = b.T0 + 100 * S
    stacks = {0: IN_PYTHON, 1: IN_PYTHON, 2: IN_PYTHON, 3: ALL_REDUCE, 4: RECV}
    pieces = []
    for rank, text in stacks.items():
        entries = _gloo_steps(20, last)
        if rank == 3:
            entries.append(b.entry(21, backend="gloo", state="scheduled", retired=False, created_ns=last + S // 5))
        pieces.append(wire.snapshot_piece(rank, last + 600 * S, f"socket:/run/rank-{rank}.sock", text,
                                          b.dump(entries, world=5)))
    dumps = [normalize_dump(piece, piece["source"], piece["rank"]) for piece in pieces]
    report = analyze(assemble(dumps, []), AnalysisOptions(stall_after_s=10.0))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (3,), first.summary
    assert "one collective more" in first.summary
    assert any("rank 4 never called it either" in e for e in first.evidence), first.evidence


def test_the_call_site_is_the_users_frame_not_frscopes_collective_timer() -> None:
    # frscope's bootstrap wraps torch.distributed's collectives to time them: its frame sits between the
    # collective and the user's code, wherever the trainer's image copied it.
    timed = _stack(("all_reduce", f"{SITE}/distributed_c10d.py", 2800),
                   ("sync", "/opt/frscope-bootstrap/_frscope_timings.py", 176),
                   ("train_step", "/app/train.py", 41))
    site = user_frame(main_stack(timed))
    assert site is not None and (site.filename, site.name) == ("/app/train.py", "train_step")
