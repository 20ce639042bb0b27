"""Random SPMD programs: a training loop's calls over a layout's groups, expanded per rank, plus one fault.

A program is a prologue (the model broadcast), then `steps` repetitions of a step template (compute, then
collectives on the families' groups, point-to-point exchanges, async ops waited at the end of the step),
with library patterns: object collectives as their two real ops (a [1]/[n] Long size, then the bytes),
DDP's bucket-order rebroadcast at step 1, `scatter`/`gather` with [] on non-roots, FSDP2's
all_gather_into_tensor / reduce_scatter_tensor (recorded as all_gather / all_reduce on gloo),
`_coalescing_manager` (one entry with several shapes), `batch_isend_irecv` rings, pipeline send/recv
chains and gloo's `monitored_barrier`. Every rank of a group runs that group's calls in the same order
(SPMD); a fault (faults.py) then edits one or two ranks' op lists.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from frscope.testing.randprog.layout import Layout

ITEMSIZE = {"Float": 4, "Int": 4, "Double": 8, "Long": 8, "Byte": 1, "BFloat16": 2, "Half": 2}


@dataclass(frozen=True, slots=True)
class Rec:
    """One recorder entry as a rank issues it. `shape`/`dtype` are what must agree across the group."""

    op: str  # torch's op name after the backend prefix
    in_sizes: tuple[tuple[int, ...], ...]
    in_dtypes: tuple[str, ...]
    out_sizes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    api: str  # the torch.distributed function on the stack (all_reduce, all_gather_object, ...)

    @property
    def payload(self) -> tuple[int, ...]:
        """What the peers' calls must match: the shape, or for a coalesced call (one entry of several
        tensors) the one flat buffer the backend makes of them (gloo's allreduce_coalesced flattens)."""
        if self.api != "_coalescing_manager":
            return self.shape
        total = sum(_numel(s) for s in self.in_sizes)
        return (total,)

    @property
    def payload_bytes(self) -> int:
        return _numel(self.payload) * ITEMSIZE.get(self.dtype, 4)

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * ITEMSIZE.get(self.dtype, 4)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(slots=True)
class Op:
    """One step of one rank's program."""

    kind: str  # coll | wait | p2p | batch | mbarrier | compute | stuck | crash
    step: int
    group: int = 0
    recs: tuple[Rec, ...] = ()
    is_async: bool = False
    peer: int = -1  # p2p: the other global rank
    send: bool = False
    shape: tuple[int, ...] = ()
    dtype: str = "Float"
    posts: tuple[tuple[bool, int], ...] = ()  # batch: (is_send, peer)
    seconds: float = 0.0
    code: int = 0
    dump: bool = False
    func: str = "train_step"  # the user function on the stack
    line: int = 100
    root: int = 0  # broadcast/gather/scatter/reduce: the group-local root


@dataclass(slots=True)
class Program:
    layout: Layout
    backend: str  # gloo | nccl
    steps: int
    step_s: float
    ops: dict[int, list[Op]]
    notes: list[str] = field(default_factory=list)  # what was generated, for replay output


_FUNCS = ("sync_gradients", "all_reduce_loss", "gather_metrics", "shard_params", "exchange_tokens",
          "broadcast_state", "reduce_stats", "pipeline_stage", "checkpoint_sync")


def recs_for(kind: str, backend: str, size: int, local: int, root: int, shape: tuple[int, ...], dtype: str,
             obj_bytes: int = 37) -> tuple[Rec, ...]:
    """The entries one call records on a rank (group-local rank `local`, group size `size`)."""
    n = 1
    for dim in shape:
        n *= dim
    s, d = (shape,), (dtype,)
    stacked = ((size, *shape),)

    def rec(op: str, i: tuple[tuple[int, ...], ...], idt: tuple[str, ...], o: tuple[tuple[int, ...], ...],
            odt: tuple[str, ...], api: str | None = None, shp: tuple[int, ...] = shape, dt: str = dtype) -> Rec:
        return Rec(op, i, idt, o, odt, shp, dt, api or kind)

    nccl = backend == "nccl"
    if kind in ("all_reduce", "broadcast", "reduce"):
        return (rec(kind, s, d, s, d),)
    if kind == "all_gather":
        return (rec("all_gather", s, d, stacked, d),)
    if kind == "all_gather_into_tensor":
        return (rec("_allgather_base" if nccl else "all_gather", s, d, ((size * n,),) if nccl else stacked, d),)
    if kind == "reduce_scatter_tensor":
        big = ((size * n,),)
        return (rec("_reduce_scatter_base" if nccl else "all_reduce", big, d, s if nccl else big, d),)
    if kind == "all_to_all_single":
        big = ((size * n,),)
        return (rec("all_to_all", big, d, big, d),)
    if kind == "barrier":
        if nccl:
            return (rec("all_reduce_barrier", ((1,),), ("Float",), ((1,),), ("Float",), shp=(1,), dt="Float"),)
        return (rec("barrier", (), (), (), (), shp=(), dt="Float"),)
    if kind == "gather":
        return (rec("gather", s, d, stacked if local == root else (), d if local == root else ()),)
    if kind == "scatter":
        return (rec("scatter", stacked if local == root else (), d if local == root else (), s, d),)
    if kind == "all_gather_object":
        return (rec("all_gather", ((1,),), ("Long",), ((size, 1),), ("Long",), shp=(1,), dt="Long"),
                rec("all_gather", ((obj_bytes,),), ("Byte",), ((size, obj_bytes),), ("Byte",), shp=(obj_bytes,),
                    dt="Byte"))
    if kind == "broadcast_object_list":
        return (rec("broadcast", ((1,),), ("Long",), ((1,),), ("Long",), shp=(1,), dt="Long"),
                rec("broadcast", ((obj_bytes,),), ("Byte",), ((obj_bytes,),), ("Byte",), shp=(obj_bytes,), dt="Byte"))
    if kind == "ddp_rebroadcast":  # DDP's bucket order from rank 0 after the first backward
        return (rec("broadcast", ((1,),), ("Int",), ((1,),), ("Int",), "_sync_bucket_indices", (1,), "Int"),
                rec("broadcast", ((n,),), ("Int",), ((n,),), ("Int",), "_sync_bucket_indices", (n,), "Int"))
    if kind == "coalesced":
        shapes = (shape, (max(1, n // 2),))
        return (rec("coalesced" if nccl else "all_reduce", shapes, (dtype, dtype), shapes, (dtype, dtype),
                    "_coalescing_manager"),)
    raise ValueError(kind)


COLLECTIVES = ("all_reduce", "all_reduce", "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_to_all_single", "barrier", "gather", "scatter", "reduce",
               "all_gather_object", "broadcast_object_list", "coalesced")


def _shape(rng: random.Random) -> tuple[int, ...]:
    return rng.choice(((1,), (8,), (256,), (1024,), (4096,), (64, 16), (8192,), (3, 128)))


@dataclass(slots=True)
class Call:
    """A template entry: what every member of `group` does (or a p2p exchange between two ranks)."""

    kind: str
    group: int
    shape: tuple[int, ...]
    dtype: str
    root: int = 0
    is_async: bool = False
    func: str = "train_step"
    line: int = 100
    src: int = -1
    dst: int = -1


def _template(rng: random.Random, layout: Layout, backend: str) -> list[Call]:
    calls: list[Call] = []
    for i in range(rng.randint(2, 7)):
        family = rng.choice(layout.families)
        group = layout.groups[family[0]]
        roll = rng.random()
        func, line = rng.choice(_FUNCS), 120 + 7 * i
        if roll < 0.12 and group.ranks and len(group.ranks) >= 2:
            # a pipeline chain along each group of the family: stage i sends to stage i+1
            for gi in family:
                ranks = layout.groups[gi].ranks
                for a, b in zip(ranks, ranks[1:], strict=False):
                    calls.append(Call("sendrecv", gi, _shape(rng), "Float", func="pipeline_stage", line=line,
                                      src=a, dst=b))
            continue
        if roll < 0.17:
            for gi in family:
                calls.append(Call("batch", gi, _shape(rng), "Float", func="exchange_halo", line=line))
            continue
        if roll < 0.2 and backend == "gloo":
            for gi in family:
                calls.append(Call("monitored_barrier", gi, (), "Float", func="wait_for_peers", line=line))
            continue
        kind = rng.choice(COLLECTIVES)
        dtype = rng.choice(("Float", "Float", "Float", "BFloat16", "Int"))
        is_async = kind in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor") and rng.random() < 0.3
        root = rng.randrange(len(group.ranks)) if kind in ("broadcast", "gather", "scatter", "reduce") else 0
        for gi in family:
            calls.append(Call(kind, gi, _shape(rng), dtype, root, is_async, func, line))
    return calls


def _expand(call: Call, rank: int, layout: Layout, backend: str, step: int) -> Op | None:
    g = layout.groups[call.group]
    if call.kind == "sendrecv":
        if rank not in (call.src, call.dst):
            return None
        peer = call.dst if rank == call.src else call.src
        return Op("p2p", step, call.group, peer=peer, send=rank == call.src, shape=call.shape, dtype=call.dtype,
                  func=call.func, line=call.line)
    if rank not in g.ranks:
        return None
    if call.kind == "batch":
        ranks, li = g.ranks, g.local(rank)
        nxt, prv = ranks[(li + 1) % len(ranks)], ranks[(li - 1) % len(ranks)]
        posts = ((True, nxt), (False, prv)) if nxt != prv else ((True, nxt), (False, nxt))
        return Op("batch", step, call.group, posts=posts, shape=call.shape, dtype=call.dtype, func=call.func,
                  line=call.line)
    if call.kind == "monitored_barrier":
        return Op("mbarrier", step, call.group, func=call.func, line=call.line)
    recs = recs_for(call.kind, backend, len(g.ranks), g.local(rank), call.root, call.shape, call.dtype)
    return Op("coll", step, call.group, recs=recs, is_async=call.is_async, func=call.func, line=call.line,
              root=call.root)


def random_program(rng: random.Random, layout: Layout) -> Program:
    backend = "nccl" if rng.random() < 0.35 else "gloo"
    steps = rng.randint(3, 12)
    step_s = rng.choice((0.05, 0.2, 0.5, 1.5))
    template = _template(rng, layout, backend)
    ddp = rng.random() < 0.3
    prologue = [Call("broadcast", 0, (4096,), "Float", func="init_model", line=60)]
    if rng.random() < 0.3:
        prologue.append(Call("all_gather_object", 0, (1,), "Long", func="exchange_config", line=64))
    return build_program(layout, backend, prologue, template, steps, step_s, ddp)


def build_program(layout: Layout, backend: str, prologue: list[Call], template: list[Call], steps: int,
                  step_s: float, ddp: bool = False) -> Program:
    """Every rank's ops: the prologue, then `steps` times compute + the template (+ DDP's rebroadcast at
    step 1) + a wait for the step's async ops (on NCCL always: the step's sync point)."""
    ops: dict[int, list[Op]] = {r: [] for r in range(layout.world)}
    for rank in range(layout.world):
        mine = ops[rank]
        for call in prologue:
            op = _expand(call, rank, layout, backend, 0)
            if op is not None:
                mine.append(op)
        for step in range(1, steps + 1):
            mine.append(Op("compute", step, seconds=step_s, func="forward_backward", line=90))
            pending = False
            for call in template:
                op = _expand(call, rank, layout, backend, step)
                if op is None:
                    continue
                pending = pending or op.is_async
                mine.append(op)
            if ddp and step == 1:
                recs = recs_for("ddp_rebroadcast", backend, layout.world, rank, 0, (12,), "Int")
                mine.append(Op("coll", step, 0, recs=recs, func="_rebuild_buckets", line=40))
            if pending or backend == "nccl":
                # waits for every async op still outstanding on this rank (Work.wait() in issue order)
                mine.append(Op("wait", step, func="finish_step", line=200))
    notes = [f"backend {backend}, {steps} steps of {step_s}s, template " +
             ", ".join(f"{c.kind}@{layout.groups[c.group].name}" + ("(async)" if c.is_async else "") for c in template)]
    if ddp:
        notes.append("DDP bucket rebroadcast at step 1")
    return Program(layout, backend, steps, step_s, ops, notes)


def clone_op(op: Op, **changes: object) -> Op:
    return replace(op, **changes)  # type: ignore[arg-type]
