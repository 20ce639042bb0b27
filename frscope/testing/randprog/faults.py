"""Faults: edits of one or two ranks' op lists at a random point. The fault's name is kept for the
report's per-class table only; what is right comes from the executor's final state (truth.py)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from frscope.testing.randprog.program import Op, Program, Rec, recs_for

FAULTS = ("healthy", "stuck", "skip", "extra", "reorder", "wrong_op", "wrong_size", "wrong_dtype", "crash",
          "stale", "stale_read", "straggler", "p2p_deadlock", "p2p_wrong_peer")
# How often each is drawn (healthy programs are a large share: they must give no finding).
WEIGHTS = (4, 3, 2, 1, 1, 2, 2, 2, 2, 2, 1, 2, 1, 1)


SIGKILL_CODES = (-9, 137)  # as Popen and as a container runtime report a SIGKILL


@dataclass(slots=True)
class Fault:
    name: str
    ranks: tuple[int, ...] = ()
    step: int = 0
    detail: str = ""
    # crash/stale: the rank's dump (file forms): "none" | "at_exit" | "periodic"
    dump: str = "at_exit"
    stale_steps: int = 0  # stale: how many steps before the crash its periodic dump was taken
    late_s: float = 0.0  # straggler: extra compute per step
    exits_known: bool = False  # the runner passes exit codes (--exits)


# Calls whose op, shape or dtype a fault may change (one entry, a shape that recs_for rebuilds).
_CHANGEABLE = {"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
               "all_to_all_single", "gather", "scatter", "barrier"}


# Where a rank may stop: before an op its peers need (not before a wait, which NCCL's peers do not see).
_PEERED = ("coll", "p2p", "batch", "mbarrier")


def _colls(ops: list[Op], step: int, single: bool = False) -> list[int]:
    return [i for i, op in enumerate(ops) if op.kind == "coll" and op.step >= step
            and (not single or (len(op.recs) == 1 and op.recs[0].api in _CHANGEABLE))]


def _swap_op(rec: Rec) -> Rec:
    other = {"all_reduce": "broadcast", "broadcast": "all_reduce", "all_gather": "all_reduce", "reduce": "all_reduce",
             "barrier": "all_reduce", "all_to_all": "all_reduce", "gather": "all_gather", "scatter": "broadcast",
             "_allgather_base": "all_reduce", "_reduce_scatter_base": "all_reduce",
             "all_reduce_barrier": "broadcast", "coalesced": "broadcast"}.get(rec.op, "broadcast")
    return replace(rec, op=other, api=other if other != "broadcast" else "broadcast")


def apply_fault(rng: random.Random, prog: Program, name: str | None = None) -> Fault:
    name = name or rng.choices(FAULTS, WEIGHTS)[0]
    world = prog.layout.world
    rank = rng.randrange(world)
    ops = prog.ops[rank]
    step = rng.randint(1, prog.steps)
    fault = Fault(name, (rank,), step)
    if name == "healthy":
        return Fault("healthy")
    if name == "stuck":
        at = rng.choice([i for i, op in enumerate(ops) if op.step >= step and op.kind in _PEERED] or [len(ops)])
        ops.insert(at, Op("stuck", ops[min(at, len(ops) - 1)].step, func=rng.choice(
            ("load_next_batch", "compute_metrics", "save_checkpoint", "wait_for_data")), line=177))
        return fault
    if name in ("skip", "extra", "wrong_op", "wrong_size", "wrong_dtype"):
        cands = _colls(ops, step, single=name != "skip" and name != "extra")
        if not cands:
            return Fault("healthy", detail=f"{name}: no collective to change")
        at = rng.choice(cands)
        op = ops[at]
        if name == "skip":
            del ops[at]
        elif name == "extra":
            ops.insert(at, replace(op, is_async=False, func="log_metrics"))
        elif name == "wrong_op":
            ops[at] = replace(op, recs=(_swap_op(op.recs[0]),))
        elif name == "wrong_size":
            rec = op.recs[0]
            if not rec.shape:
                return Fault("healthy", detail="wrong_size: a barrier has no size")
            same = rng.random() < 0.5 and rec.shape[0] % 2 == 0 and rec.shape[0] >= 2
            shape = (rec.shape[0] // 2, 2, *rec.shape[1:]) if same else (rec.shape[0] * 2, *rec.shape[1:])
            g = prog.layout.groups[op.group]
            new = recs_for(_kind_of(rec), prog.backend, len(g.ranks), g.local(rank), _root(op, g.ranks, rank), shape,
                           rec.dtype)
            ops[at] = replace(op, recs=(replace(new[0], op=rec.op, api=rec.api),))
            fault.detail = "same bytes" if same else "different bytes"
        else:
            rec = op.recs[0]
            if not rec.shape:
                return Fault("healthy", detail="wrong_dtype: a barrier has no dtype")
            same = rng.random() < 0.5
            dt = ("Int" if rec.dtype != "Int" else "Float") if same else ("Double" if rec.dtype != "Double" else "Half")
            ops[at] = replace(op, recs=(replace(rec, dtype=dt, in_dtypes=tuple(dt for _ in rec.in_dtypes),
                                                out_dtypes=tuple(dt for _ in rec.out_dtypes)),))
            fault.detail = "same bytes" if rec.nbytes == replace(rec, dtype=dt).nbytes else "different bytes"
        fault.step = op.step
        return fault
    if name == "reorder":
        cands = [i for i in _colls(ops, step) if i + 1 < len(ops) and ops[i + 1].kind == "coll"
                 and ops[i + 1].group != ops[i].group and not ops[i].is_async and not ops[i + 1].is_async]
        if not cands:
            return Fault("healthy", detail="reorder: no two adjacent collectives on different groups")
        at = rng.choice(cands)
        ops[at], ops[at + 1] = ops[at + 1], ops[at]
        fault.step = ops[at].step
        return fault
    if name in ("crash", "stale"):
        at = rng.choice([i for i, op in enumerate(ops) if op.step >= max(step, 2) and op.kind in _PEERED]
                        or [len(ops)])
        code = rng.choice((1, 1, -9, 137, -6))
        dump = "periodic" if name == "stale" else rng.choice(("none", "at_exit"))
        if dump == "at_exit" and code in SIGKILL_CODES:
            dump = "none"  # nothing runs in a process SIGKILL ends: no handler writes a dump as it dies
        ops.insert(at, Op("crash", ops[min(at, len(ops) - 1)].step, code=code, dump=dump == "at_exit",
                          func="train_step", line=150))
        fault.dump, fault.exits_known = dump, rng.random() < 0.5
        fault.stale_steps = rng.randint(1, 3) if name == "stale" else 0
        fault.detail = f"exit {code}, dump {dump}"
        return fault
    if name == "stale_read":  # nothing wrong but one rank's recorder read steps before the others'
        k = rng.randint(1, max(1, prog.steps - 1))
        return Fault("stale_read", (rank,), prog.steps - k, f"read {k} step(s) early", stale_steps=k)
    if name == "straggler":
        two = world >= 6 and rng.random() < 0.3
        ranks = (rank, rank ^ 1) if two and (rank ^ 1) < world else (rank,)
        late = prog.step_s * rng.uniform(0.4, 1.5)
        for r in ranks:
            for op in prog.ops[r]:
                if op.kind == "compute":
                    op.seconds += late
        return Fault("straggler", tuple(sorted(ranks)), 1, f"+{late:.3f}s a step", late_s=late)
    if name == "p2p_deadlock":
        other = rng.choice([r for r in range(world) if r != rank])
        a_ops, b_ops = prog.ops[rank], prog.ops[other]
        ai = _step_start(a_ops, step)
        bi = _step_start(b_ops, step)
        shape = (1024,)
        a_ops[ai:ai] = [Op("p2p", step, 0, peer=other, send=False, shape=shape, func="exchange", line=210),
                        Op("p2p", step, 0, peer=other, send=True, shape=shape, func="exchange", line=211)]
        b_ops[bi:bi] = [Op("p2p", step, 0, peer=rank, send=False, shape=shape, func="exchange", line=210),
                        Op("p2p", step, 0, peer=rank, send=True, shape=shape, func="exchange", line=211)]
        return Fault("p2p_deadlock", tuple(sorted((rank, other))), step, "both recv first")
    if name == "p2p_wrong_peer":  # a rank receives from a peer that never sends to it
        cands = [i for i, op in enumerate(ops) if op.kind == "p2p" and not op.send and op.step >= step
                 and len(prog.layout.groups[op.group].ranks) >= 3]
        if not cands:
            return Fault("healthy", detail="p2p_wrong_peer: no recv in a group of 3+ ranks")
        at = rng.choice(cands)
        members = prog.layout.groups[ops[at].group].ranks
        wrong = rng.choice([r for r in members if r not in (rank, ops[at].peer)])
        ops[at] = replace(ops[at], peer=wrong)
        return Fault("p2p_wrong_peer", (rank,), ops[at].step, f"recv from {wrong}")
    raise ValueError(name)


def _step_start(ops: list[Op], step: int) -> int:
    for i, op in enumerate(ops):
        if op.step == step and op.kind == "compute":
            return i + 1
    return len(ops)


def _kind_of(rec: Rec) -> str:
    return rec.api


def _root(op: Op, ranks: tuple[int, ...], rank: int) -> int:
    rec = op.recs[0]
    if rec.op in ("gather",):
        return ranks.index(rank) if rec.out_sizes else -1
    if rec.op in ("scatter",):
        return ranks.index(rank) if rec.in_sizes else -1
    return 0
