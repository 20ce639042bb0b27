"""Waits the Flight Recorder cannot see: a live stack inside torch.distributed while the recorder shows
nothing in flight (issue 33, principle 6).

On gloo, point-to-point ops (`send`/`recv`, `torch.distributed.pipelining`'s batched p2p) and
`monitored_barrier` leave no entry: a rank blocked in one of them looks idle to its recorder. Its
live stack (`dump_traceback`) still shows where it waits: inside a function of `distributed_c10d`
(`recv`, `monitored_barrier`, `barrier`...), or in a library's wait on the works such a function
returned (`pipelining`'s `_wait_batch_p2p`). The sidecar asks these functions of every rank's stack
when its recorders have been idle longer than the job's usual step (frscope.sidecar.unrecorded), and
`stack_waits` reads a capture of that moment: the ranks in Python are the ones the others wait for.
"""

from __future__ import annotations

from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding, GroupRef
from frscope.analysis.stacks import P2P_FUNCTIONS, blocked_in, user_frame
from frscope.analysis.wording import fmt_duration, plural
from frscope.records import Frame

# A library function inside torch.distributed that waits on works returned by p2p calls (the
# innermost Python frame of the waiting thread: the wait itself is C++): torch.distributed.pipelining.
P2P_WAITS = frozenset({"_wait_batch_p2p", "_wait_p2p"})
_DISTRIBUTED = "/torch/distributed/"


def waiting_in(frames: tuple[Frame, ...]) -> str | None:
    """The torch.distributed call a live stack (most recent call first) waits in: a `distributed_c10d`
    function (`recv`, `monitored_barrier`, `all_reduce`...), or a p2p wait of torch.distributed's own
    libraries at the innermost frame (`_wait_batch_p2p`); None when the stack is elsewhere (in Python,
    in another library's C call)."""
    inside = blocked_in(frames)
    if inside is not None:
        return inside
    if frames and _DISTRIBUTED in frames[0].filename.replace("\\", "/") and frames[0].name in P2P_WAITS:
        return frames[0].name
    return None


def is_p2p_wait(name: str | None) -> bool:
    """A point-to-point call or a wait on point-to-point works."""
    return name is not None and (name in P2P_FUNCTIONS or name in P2P_WAITS)


def _idle(ctx: Context, rank: int) -> bool:
    """Nothing of the rank's recorder is in flight: every collective of every group it is in completed
    (gloo: retired), no p2p op open."""
    for by_rank in ctx.tracks.values():
        track = by_rank.get(rank)
        if track is not None and (track.next_seq <= track.last_seq or track.open_p2p()):
            return False
    return True


def stack_waits(ctx: Context, ref: GroupRef) -> Finding | None:
    """A hang the recorder cannot see: every recorder idle (all entries completed) for longer than
    `stall_after_s` by the capture time, ranks whose live stack waits in a torch.distributed call that
    leaves no entry (`monitored_barrier`, pipelining's batched p2p; plain `send`/`recv` are
    `p2p_stacks`' to read), and ranks in Python: those in Python wait on nobody, the others wait for
    them. None where any of that is missing (the age unknown included: a healthy job between steps
    shows the same stacks)."""
    ranks = sorted(ctx.dumpset.dumps)
    if not ranks or not all(_idle(ctx, rank) for rank in ranks):
        return None
    waiting: dict[int, str] = {}
    in_python: list[int] = []
    for rank in ranks:
        stack = ctx.live_stack(rank)
        if not stack:
            continue
        inside = waiting_in(stack)
        if inside is None:
            in_python.append(rank)
        elif inside in P2P_FUNCTIONS:
            return None  # send/recv: p2p_stacks reads the chain
        else:
            waiting[rank] = inside
    now, newest = ctx.now_for(ranks), ctx.clock.newest_entry_ns
    if not waiting or not in_python or now is None or newest is None:
        return None
    quiet_s = (now - newest) / 1e9
    if quiet_s < ctx.options.stall_after_s:
        return None
    ops = sorted(set(waiting.values()))
    kind = "point-to-point ops" if all(is_p2p_wait(op) for op in ops) else "this call"
    sites = {rank: user_frame(ctx.live_stack(rank)) for rank in waiting}
    where = "; ".join(f"rank {rank} in {op}" + (f" at {s.filename}:{s.line} ({s.name})" if (s := sites[rank]) else "")
                      for rank, op in list(waiting.items())[:6])
    doing = (str(ctx.activity(in_python[0])) if len(in_python) == 1
             else "; ".join(f"rank {r} {ctx.activity(r)}" for r in in_python[:3]))
    calls = f"point-to-point ({'/'.join(ops)})" if kind == "point-to-point ops" else "/".join(ops)
    summary = (f"{plural(in_python).capitalize()} {'is' if len(in_python) == 1 else 'are'} in Python ({doing}) "
               f"while {plural(sorted(waiting))} wait{'s' if len(waiting) == 1 else ''} in torch.distributed "
               f"{calls}, which the recorder does not record: every recorder has been idle for "
               f"{fmt_duration(quiet_s)}, so {'it holds' if len(in_python) == 1 else 'they hold'} up the others "
               f"({where}).")
    finding = Finding(category=Category.RANK_NOT_JOINED, culprit_ranks=tuple(in_python), process_group=ref,
                      summary=summary, op=ops[0], since_ns=newest, stalled_for_s=quiet_s,
                      age_source=ctx.age_source(ranks))
    for rank in in_python[: ctx.options.max_rank_views]:
        finding.ranks[rank] = ctx.rank_view(rank, ref.name, None)
        finding.culprit_stacks[rank] = ctx.live_stack(rank)
    for rank in sorted(waiting)[:3]:
        finding.ranks[rank] = ctx.rank_view(rank, ref.name, None)
    finding.evidence.append("waiting in torch.distributed: " + ", ".join(
        f"rank {r} in {op}" for r, op in sorted(waiting.items())[:16])
        + ("" if len(waiting) <= 16 else f" and {len(waiting) - 16} more"))
    finding.evidence.append("in Python (no torch.distributed call): " + ", ".join(
        f"rank {r}: {ctx.activity(r)}" for r in in_python[:8]))
    finding.evidence.append(
        f"every recorder idle: all entries completed, the newest enqueued {fmt_duration(quiet_s)} before the "
        f"capture; {kind} leave{'s' if kind == 'this call' else ''} no entry on this backend (gloo records "
        "neither point-to-point ops nor monitored_barrier), so only the stacks show the wait")
    return finding
