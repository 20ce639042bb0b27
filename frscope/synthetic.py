"""Synthetic Flight Recorder dumps with a known answer, for benchmarks and scale tests.

Writes one file per rank in the shapes torch 2.13 writes (verified against real dumps and
torch/csrc/distributed/c10d/FlightRecorderDetail.hpp):

- NCCL: version '2.10'; `pg_config` keyed by group name for every group the rank belongs to, `ranks`
  a string like '[0, 1, 2]'; `pg_status` keyed by the rank-local pg uid (the entries' `pg_id`) with int
  values; states scheduled/started/completed with discovery times, `duration_ms` on completed entries,
  p2p entries ('nccl:send 0->1', 'nccl:recv 1<-0', group-local ranks, `is_p2p`, `p2p_seq_id`).
- gloo: `pg_config` is `{'': {'name': '', 'desc': '', 'ranks': '[]'}}` (the gloo bug: the entries still
  say ('0', 'default_pg')), state 'scheduled' only, no discovery times, no durations, `retired` True once
  an op finished, no p2p entries (gloo records none).

The job is a 3-D parallel training loop (data x pipeline x tensor parallel, DeviceMesh-style group
descs 'mesh_tp' / 'mesh_pp' / 'mesh_dp'): every rank runs the same step of ~30 collectives, the ring
buffer keeps the last `entries` records, so a long run wraps and sequence ids do not start at 1. The
last (hung) step is simulated rank by rank: NCCL enqueues asynchronously until a CPU sync point
(`.item()` after the grad-norm all_reduce and after the loss all_reduce) and runs each rank's ops in
order on one stream; gloo blocks in every op. A fault (scenario) is injected into that step and the
ground truth (category, culprit ranks, group, sequence id) is returned.

Pickle files are plain `pickle.dumps(dump, protocol=2)` named `<prefix><rank>`; JSON files are the
`fr_trace_json` shape (tuples as lists, None times as 0, pg_status values as strings, keys sorted, no
frames) named `<prefix><rank>.json`.

    python -m frscope.synthetic OUT_DIR --ranks 1024 --entries 2000 --shape nccl \
        --scenario not_joined --format pickle [--seed N] [--jobs 2]

prints the ground truth as JSON on stdout. Stdlib only; never imports torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SHAPES = ("nccl", "gloo")
FORMATS = ("pickle", "json")
SCENARIOS = (
    "healthy",
    "not_joined",
    "type_mismatch",
    "size_mismatch",
    "dtype_mismatch",
    "not_completed",
    "straggler",
    "p2p_mismatch",
    "missing",
    "cross_group",
)
# The finding category (frscope.analysis names) each scenario must produce; None: no finding.
CATEGORY: dict[str, str | None] = {
    "healthy": None,
    "not_joined": "RankNotJoined",
    "type_mismatch": "CollectiveTypeMismatch",
    "size_mismatch": "SizeMismatch",
    "dtype_mismatch": "DtypeMismatch",
    "not_completed": "NotCompleted",
    "straggler": "Straggler",
    "p2p_mismatch": "P2PMismatch",
    "missing": "MissingDumps",
    "cross_group": "NotCompleted",
}
# Where in the step each fault is injected (a position key of the step template).
DEFAULT_POSITION: dict[str, str] = {
    "not_joined": "dp_rs",
    "missing": "dp_rs",
    "type_mismatch": "fwd_ar_{mid}",
    "size_mismatch": "fwd_ar_{mid}",
    "dtype_mismatch": "fwd_ag_{mid}",
    "not_completed": "dp_rs",
    "cross_group": "tp_gnorm",
    "p2p_mismatch": "pp_fwd",
}
DEFAULT_PREFIX = "nccl_trace_rank_"
VERSION = "2.10"
NCCL_VERSION = "2.27.7"

# Roles of process groups. Every rank belongs to exactly one group of each role.
WORLD, TP, PP, DP = 0, 1, 2, 3
ROLE_NAMES = ("world", "tp", "pp", "dp")
ROLE_DESC = ("default_pg", "mesh_tp", "mesh_pp", "mesh_dp")
_ROLE_BY_NAME = {name: index for index, name in enumerate(ROLE_NAMES)}

# Entry state codes used by the simulation.
_SCHEDULED, _STARTED, _COMPLETED = 0, 1, 2
_STATE_NAMES = ("scheduled", "started", "completed")

_MS = 1_000_000  # ns per ms
_S = 1_000_000_000  # ns per s


# ---------------------------------------------------------------------------------------------
# topology


@dataclass(frozen=True, slots=True)
class Topology:
    """world = dp x pp x tp; rank = d * (pp * tp) + p * tp + t (tensor parallel innermost)."""

    world: int
    tp: int
    pp: int
    dp: int

    @classmethod
    def make(cls, world: int, tp: int | None = None, pp: int | None = None, shape: str = "nccl") -> Topology:
        if world < 2:
            raise ValueError("need at least 2 ranks")
        if tp is None:
            tp = 1
            for candidate in (8, 4, 2):
                if world % candidate == 0 and world // candidate >= 2:
                    tp = candidate
                    break
        if world % tp:
            raise ValueError(f"tensor-parallel size {tp} does not divide {world} ranks")
        if pp is None:
            rest = world // tp
            pp = 2 if shape == "nccl" and rest >= 4 and rest % 2 == 0 else 1
        if pp not in (1, 2):
            raise ValueError("pipeline-parallel size must be 1 or 2")
        if shape == "gloo" and pp != 1:
            raise ValueError("gloo records no point-to-point ops: use pp=1 with the gloo shape")
        if world % (tp * pp):
            raise ValueError(f"tp x pp = {tp * pp} does not divide {world} ranks")
        return cls(world, tp, pp, world // (tp * pp))

    @property
    def roles(self) -> tuple[int, ...]:
        return (WORLD, TP, PP, DP) if self.pp > 1 else (WORLD, TP, DP)

    def n_groups(self, role: int) -> int:
        if role == WORLD:
            return 1
        if role == TP:
            return self.world // self.tp
        if role == PP:
            return self.world // self.pp if self.pp > 1 else 0
        return self.world // self.dp

    def group_index(self, role: int, rank: int) -> int:
        if role == WORLD:
            return 0
        if role == TP:
            return rank // self.tp
        d, rest = divmod(rank, self.pp * self.tp)
        p, t = divmod(rest, self.tp)
        if role == PP:
            return d * self.tp + t
        return p * self.tp + t

    def local_rank(self, role: int, rank: int) -> int:
        if role == WORLD:
            return rank
        d, rest = divmod(rank, self.pp * self.tp)
        p, t = divmod(rest, self.tp)
        return t if role == TP else p if role == PP else d

    def members(self, role: int, index: int) -> tuple[int, ...]:
        """Global ranks of a group, in group-local rank order."""
        block = self.pp * self.tp
        if role == WORLD:
            return tuple(range(self.world))
        if role == TP:
            return tuple(range(index * self.tp, (index + 1) * self.tp))
        if role == PP:
            d, t = divmod(index, self.tp)
            return tuple(d * block + p * self.tp + t for p in range(self.pp))
        p, t = divmod(index, self.tp)
        return tuple(d * block + p * self.tp + t for d in range(self.dp))

    def group_name(self, role: int, index: int) -> str:
        """Names as `new_group` hands them out: a global counter, in creation order tp, pp, dp."""
        if role == WORLD:
            return "0"
        if role == TP:
            return str(1 + index)
        n_tp = self.world // self.tp
        if role == PP:
            return str(1 + n_tp + index)
        return str(1 + n_tp + self.n_groups(PP) + index)

    def local_uid(self, role: int) -> int:
        """The rank-local ProcessGroupNCCL uid (`pg_id`, `pg_status` key): creation order."""
        return self.roles.index(role)


# ---------------------------------------------------------------------------------------------
# the training step


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One position of the step as one pipeline stage sees it."""

    key: str
    role: int
    op: str  # 'all_reduce', 'send', ... (profiling name without backend and peers)
    in_sizes: tuple[tuple[int, ...], ...]
    in_dtypes: tuple[str, ...]
    out_sizes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[str, ...]
    site: str  # key into the frame table
    autograd: bool  # enqueued from the autograd engine's thread (backward hooks)
    sync_after: bool  # the CPU waits for this op's result (.item())
    dur_ms: float
    peer: int | None = None  # p2p: group-local peer
    local: int | None = None  # p2p: own group-local rank

    @property
    def is_p2p(self) -> bool:
        return self.peer is not None

    def profiling_name(self, backend: str) -> str:
        if self.peer is None:
            return f"{backend}:{self.op}"
        arrow = "->" if self.op == "send" else "<-"
        return f"{backend}:{self.op} {self.local}{arrow}{self.peer}"


_TORCH = "/usr/local/lib/python3.11/site-packages/torch"
_APP = "/workspace/llm"

# Innermost frame first, as torch's CapturedTraceback symbolizes them.
_C10D_FRAME = {
    "all_reduce": ("all_reduce", 3245),
    "broadcast": ("broadcast", 2846),
    "_all_gather_base": ("all_gather_into_tensor", 4181),
    "all_gather": ("all_gather_into_tensor", 4181),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor", 4633),
    "send": ("send", 2541),
    "recv": ("recv", 2603),
}
_USER_FRAMES: dict[str, tuple[tuple[str, str, int], ...]] = {
    "get_batch": (
        ("broadcast_data", f"{_APP}/core/tensor_parallel/data.py", 87),
        ("get_batch", f"{_APP}/training/data.py", 141),
    ),
    "fwd_ag": (
        ("forward", f"{_APP}/core/tensor_parallel/mappings.py", 217),
        ("forward", f"{_APP}/core/tensor_parallel/layers.py", 608),
        ("_call_impl", f"{_TORCH}/nn/modules/module.py", 1784),
        ("_wrapped_call_impl", f"{_TORCH}/nn/modules/module.py", 1773),
        ("forward", f"{_APP}/model/transformer.py", 311),
    ),
    "fwd_ar": (
        ("forward", f"{_APP}/core/tensor_parallel/mappings.py", 176),
        ("forward", f"{_APP}/core/tensor_parallel/layers.py", 905),
        ("_call_impl", f"{_TORCH}/nn/modules/module.py", 1784),
        ("_wrapped_call_impl", f"{_TORCH}/nn/modules/module.py", 1773),
        ("forward", f"{_APP}/model/transformer.py", 338),
    ),
    "fwd_ar_odd": (
        ("forward", f"{_APP}/core/tensor_parallel/mappings.py", 176),
        ("forward", f"{_APP}/core/tensor_parallel/layers.py", 912),
        ("_call_impl", f"{_TORCH}/nn/modules/module.py", 1784),
        ("_wrapped_call_impl", f"{_TORCH}/nn/modules/module.py", 1773),
        ("forward", f"{_APP}/model/transformer.py", 338),
    ),
    "pp_fwd": (
        ("_communicate", f"{_APP}/core/pipeline_parallel/p2p_communication.py", 301),
        ("send_forward_recv_backward", f"{_APP}/core/pipeline_parallel/p2p_communication.py", 455),
    ),
    "pp_bwd": (
        ("_communicate", f"{_APP}/core/pipeline_parallel/p2p_communication.py", 301),
        ("send_backward_recv_forward", f"{_APP}/core/pipeline_parallel/p2p_communication.py", 498),
    ),
    "bwd_ar": (
        ("backward", f"{_APP}/core/tensor_parallel/mappings.py", 181),
        ("apply", f"{_TORCH}/autograd/function.py", 311),
    ),
    "dp_rs": (
        ("reduce_scatter_grads", f"{_APP}/core/distributed/param_and_grad_buffer.py", 402),
        ("_post_backward_hook", f"{_APP}/core/distributed/distributed_data_parallel.py", 377),
    ),
    "tp_gnorm": (
        ("get_grad_norm_fp32", f"{_APP}/core/optimizer/clip_grads.py", 118),
        ("clip_grad_norm", f"{_APP}/core/optimizer/optimizer.py", 292),
        ("step", f"{_APP}/core/optimizer/optimizer.py", 441),
    ),
    "dp_ag": (
        ("start_param_sync", f"{_APP}/core/distributed/param_and_grad_buffer.py", 318),
        ("step", f"{_APP}/core/optimizer/distrib_optimizer.py", 1702),
    ),
    "world_loss": (
        ("average_losses_across_data_parallel_group", f"{_APP}/training/utils.py", 173),
        ("loss_func", f"{_APP}/pretrain_gpt.py", 164),
    ),
}
_LOOP_FRAMES = (
    ("forward_step", f"{_APP}/pretrain_gpt.py", 190),
    ("train_step", f"{_APP}/training/training.py", 612),
    ("train", f"{_APP}/training/training.py", 1187),
    ("<module>", f"{_APP}/pretrain_gpt.py", 291),
)


def _frames_for(site: str, op: str, autograd: bool) -> tuple[dict[str, Any], ...]:
    name, line = _C10D_FRAME.get(op, (op, 1000))
    frames = [
        (name, f"{_TORCH}/distributed/distributed_c10d.py", line),
        ("wrapper", f"{_TORCH}/distributed/c10d_logger.py", 83),
        *_USER_FRAMES[site],
    ]
    if not autograd:  # hooks run on the autograd engine's thread: no training loop above them
        frames.extend(_LOOP_FRAMES)
    return tuple({"name": n, "filename": f, "line": ln} for n, f, ln in frames)


def step_template(topo: Topology, shape: str, layers: int, stage: int) -> list[OpSpec]:
    """The collectives of one training step, in program order, as pipeline stage `stage` runs them."""
    gloo = shape == "gloo"
    bf16, f32, i64 = ("Float" if gloo else "BFloat16"), "Float", "Long"
    seq, hidden = (256, 1024) if gloo else (4096, 8192)
    micro = 1
    act = (seq, micro, hidden)
    shard = (seq // max(topo.tp, 1), micro, hidden)
    grad_a, grad_b = (1 << 18, 1 << 16) if gloo else (1 << 22, 1 << 20)
    ops: list[OpSpec] = []

    def add(key: str, role: int, op: str, ins: Any, outs: Any, dtype: str, site: str, dur: float,
            autograd: bool = False, sync: bool = False, peer: int | None = None,
            local: int | None = None) -> None:
        ins_t = tuple(tuple(s) for s in ins)
        outs_t = tuple(tuple(s) for s in outs)
        ops.append(OpSpec(key, role, op, ins_t, (dtype,) * len(ins_t), outs_t, (dtype,) * len(outs_t),
                          site, autograd, sync, dur, peer, local))

    gather = "all_gather" if gloo else "_all_gather_base"
    add("tp_bcast", TP, "broadcast", [(8, seq)], [(8, seq)], i64, "get_batch", 0.05)
    for layer in range(layers):
        gathered = (topo.tp, *shard) if gloo else (seq, micro, hidden)
        add(f"fwd_ag_{layer}", TP, gather, [shard], [gathered], bf16, "fwd_ag", 1.1)
        add(f"fwd_ar_{layer}", TP, "all_reduce", [act], [act], bf16, "fwd_ar", 2.4)
    if topo.pp > 1:
        if stage == 0:
            add("pp_fwd", PP, "send", [act], [act], bf16, "pp_fwd", 0.9, peer=1, local=0)
        else:
            add("pp_fwd", PP, "recv", [act], [act], bf16, "pp_fwd", 0.9, peer=0, local=1)
        if stage == 0:
            add("pp_bwd", PP, "recv", [act], [act], bf16, "pp_bwd", 0.9, peer=1, local=0)
        else:
            add("pp_bwd", PP, "send", [act], [act], bf16, "pp_bwd", 0.9, peer=0, local=1)
    for layer in reversed(range(layers)):
        add(f"bwd_ar_{layer}", TP, "all_reduce", [act], [act], bf16, "bwd_ar", 2.4, autograd=True)
    if gloo:
        add("dp_rs", DP, "all_reduce", [(grad_a,), (grad_b,)], [(grad_a,), (grad_b,)], f32, "dp_rs", 9.0)
    else:
        dp = topo.dp
        add("dp_rs", DP, "reduce_scatter_tensor_coalesced", [(grad_a * dp,), (grad_b * dp,)],
            [(grad_a,), (grad_b,)], f32, "dp_rs", 8.5, autograd=True)
    add("tp_gnorm", TP, "all_reduce", [(1,)], [(1,)], f32, "tp_gnorm", 0.04, sync=True)
    param_out = (topo.dp, grad_a) if gloo else (grad_a * topo.dp,)
    add("dp_ag", DP, gather, [(grad_a,)], [param_out], bf16, "dp_ag", 4.2)
    add("world_loss", WORLD, "all_reduce", [(1,)], [(1,)], f32, "world_loss", 0.06, sync=True)
    return ops


# ---------------------------------------------------------------------------------------------
# the answer


@dataclass(frozen=True)
class GroundTruth:
    """What a correct analyzer must say about the generated dumps."""

    scenario: str
    shape: str
    world_size: int
    tp: int
    pp: int
    dp: int
    category: str | None  # None: healthy, no finding
    culprit_ranks: tuple[int, ...]
    group_name: str | None = None
    group_desc: str | None = None
    group_ranks: tuple[int, ...] = ()
    collective_seq_id: int | None = None
    p2p_seq_id: int | None = None
    op: str | None = None
    missing_ranks: tuple[int, ...] = ()
    straggle_ms: float | None = None
    # Groups where the root cause shows up again (ranks absent or blocked there): not separate causes.
    consequence_groups: tuple[str, ...] = ()
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# the plan: everything a writer needs, small enough to hand to worker processes


@dataclass
class Plan:
    topo: Topology
    shape: str
    entries: int
    truth: GroundTruth
    templates: list[list[OpSpec]]  # per pipeline stage
    full_steps: int  # steps before the last (partial or hung) one
    last_step: dict[int, tuple[tuple[int, int], ...]]  # rank -> ((position, state code), ...)
    overrides: dict[int, dict[int, OpSpec]]  # rank -> position -> what that rank ran instead
    step_ns: int
    offsets_ns: list[int]
    first_step_ns: int  # creation time of step 0
    straggle_ns: dict[int, int]
    skew_ns: dict[int, int]  # per host (8 ranks a host)
    unretired: frozenset[int]  # gloo: ranks whose last entry is not yet retired (young)
    missing: frozenset[int]
    timeout_ms: int
    seed: int
    _group_straggle: dict[tuple[int, int], int] = field(default_factory=dict)

    # -- one rank ---------------------------------------------------------------------------

    def dump(self, rank: int, json_shape: bool = False, newest: int | None = None) -> dict[str, Any]:
        """The rank's recorder as torch returns it (`_dump_fr_trace` pickle shape, or the
        `_dump_fr_trace_json` shape when json_shape). `newest`: only the newest that many entries, as a
        sidecar's `/v1/snapshot?entries=N` serves them (the same as cutting the whole dump's entries,
        everything else unchanged; the older entries are counted, never built)."""
        topo = self.topo
        gloo = self.shape == "gloo"
        backend = self.shape
        stage = topo.local_rank(PP, rank) if topo.pp > 1 else 0
        template = self.templates[stage]
        n_pos = len(template)
        last = self.last_step.get(rank, ())
        full = self.full_steps * n_pos
        total = full + len(last)
        start = max(0, total - self.entries)

        main_tid = str(139_700_000_000_000 + (rank * 7_919 % 9_973) * 4_096)
        grad_tid = main_tid if gloo else str(int(main_tid) + 18_446_744)
        tname_main, tname_grad = "python", ("python" if gloo else "pt_autograd_0")
        rank_off = self.skew_ns.get(rank // 8, 0) + self.straggle_ns.get(rank, 0)
        skew = self.skew_ns.get(rank // 8, 0)
        roles = topo.roles
        pg_tuple = {
            role: (topo.group_name(role, topo.group_index(role, rank)), ROLE_DESC[role]) for role in roles
        }
        frames_cache: dict[tuple[str, str, bool], tuple[dict[str, Any], ...]] = {}

        def row(spec: OpSpec) -> tuple[Any, ...]:
            fkey = (spec.site, spec.op, spec.autograd)
            frames = frames_cache.get(fkey)
            if frames is None:
                frames = frames_cache[fkey] = _frames_for(*fkey)
            role = spec.role
            return (
                topo.local_uid(role),
                pg_tuple[role],
                tname_grad if spec.autograd else tname_main,
                grad_tid if spec.autograd else main_tid,
                spec.profiling_name(backend),
                [list(s) for s in spec.in_sizes],
                list(spec.in_dtypes),
                [list(s) for s in spec.out_sizes],
                list(spec.out_dtypes),
                frames,
                spec.is_p2p,
                role,
                int(spec.dur_ms * _MS),
                self._grp_straggle(role, rank),
            )

        rows = [row(spec) for spec in template]
        last_rows = list(rows)
        for pos, spec in self.overrides.get(rank, {}).items():
            last_rows[pos] = row(spec)

        # Counters as they stood just before the buffer's first record.
        coll = [0, 0, 0, 0]
        p2p = [0, 0, 0, 0]
        opid = [0, 0, 0, 0]
        before_full = min(start, full)
        steps_done, rem = divmod(before_full, n_pos)
        for pos, spec in enumerate(template):
            times = steps_done + (1 if pos < rem else 0)
            if spec.is_p2p:
                p2p[spec.role] += times
            else:
                coll[spec.role] += times
            opid[spec.role] += times
        for pos, _code in last[: max(0, start - full)]:
            spec = template[pos]
            if spec.is_p2p:
                p2p[spec.role] += 1
            else:
                coll[spec.role] += 1
            opid[spec.role] += 1
        last_started = [(p2p[r] if r == PP else coll[r]) or -1 for r in range(4)]
        last_completed = list(last_started)

        step_ns = self.step_ns
        t0 = self.first_step_ns
        offsets = self.offsets_ns
        last_step = self.full_steps
        rank_h = (rank * 2_654_435_761) & 0xFFFFFFFF
        timeout_ms = self.timeout_ms
        unretired_idx = total - 1 if rank in self.unretired else -1
        st_names = _STATE_NAMES
        out: list[dict[str, Any]] = []
        append = out.append
        keep_from = max(start, total - newest) if newest is not None and newest > 0 else start
        for idx in range(start, total):
            if idx < full:
                step, pos = divmod(idx, n_pos)
                code = _COMPLETED
                r = rows[pos]
            else:
                pos, code = last[idx - full]
                step = last_step
                r = last_rows[pos]
            (pgid, pgt, tname, tid, pname, insz, indt, outsz, outdt, frames, is_p2p, role, dur_ns, gstrag) = r
            if is_p2p:
                p2p[role] += 1
                seq = p2p[role]
            else:
                coll[role] += 1
                seq = coll[role]
            opid[role] += 1
            h = (rank_h ^ (idx * 40_503)) & 0xFFFFF
            nominal = t0 + step * step_ns + offsets[pos]
            created = nominal + rank_off + h % 150_000
            if gloo:
                state = st_names[_SCHEDULED]
                started_ns = completed_ns = None
                duration = None
                retired = code == _COMPLETED and idx != unretired_idx
                if retired:
                    last_completed[role] = seq
            else:
                state = st_names[code]
                retired = code == _COMPLETED
                duration = None
                started_ns = completed_ns = None
                if code >= _STARTED:
                    started_ns = created + 20_000 + h % 50_000
                    last_started[role] = seq
                    if code == _COMPLETED:
                        completed_ns = nominal + skew + gstrag + 250_000 + dur_ns + h % 30_000
                        duration = (completed_ns - started_ns) / _MS
                        last_completed[role] = seq
            if idx < keep_from:
                continue  # older than the window: counted above, not built
            if json_shape:
                e: dict[str, Any] = {
                    "record_id": idx,
                    "pg_id": pgid,
                    "process_group": list(pgt),
                    "thread_name": tname,
                    "thread_id": tid,
                    "collective_seq_id": coll[role],
                    "p2p_seq_id": p2p[role],
                    "op_id": opid[role],
                    "profiling_name": pname,
                    "time_created_ns": created,
                    "input_sizes": [list(s) for s in insz],
                    "input_dtypes": list(indt),
                    "output_sizes": [list(s) for s in outsz],
                    "output_dtypes": list(outdt),
                    "state": state,
                    "time_discovered_started_ns": started_ns or 0,
                    "time_discovered_completed_ns": completed_ns or 0,
                    "retired": retired,
                    "timeout_ms": timeout_ms,
                    "is_p2p": is_p2p,
                }
            else:
                e = {
                    "frames": list(frames),
                    "record_id": idx,
                    "pg_id": pgid,
                    "process_group": pgt,
                    "thread_name": tname,
                    "thread_id": tid,
                    "collective_seq_id": coll[role],
                    "p2p_seq_id": p2p[role],
                    "op_id": opid[role],
                    "profiling_name": pname,
                    "time_created_ns": created,
                    "input_sizes": [list(s) for s in insz],
                    "input_dtypes": list(indt),
                    "output_sizes": [list(s) for s in outsz],
                    "output_dtypes": list(outdt),
                    "state": state,
                    "time_discovered_started_ns": started_ns,
                    "time_discovered_completed_ns": completed_ns,
                    "retired": retired,
                    "timeout_ms": timeout_ms,
                    "is_p2p": is_p2p,
                }
            if duration is not None:
                e["duration_ms"] = duration
            append(e)

        pg_status: dict[str, dict[str, Any]] = {}
        for role in roles:
            enq = (p2p[role] if role == PP else coll[role]) or -1
            values: dict[str, Any] = {
                "last_enqueued_collective": enq,
                "last_started_collective": -1 if gloo else last_started[role],
                "last_completed_collective": last_completed[role],
            }
            if json_shape:
                values = {k: str(v) for k, v in values.items()}
            pg_status[str(topo.local_uid(role))] = values

        if gloo:
            pg_config: dict[str, dict[str, str]] = {"": {"name": "", "desc": "", "ranks": "[]"}}
        else:
            pg_config = {}
            for role in roles:
                index = topo.group_index(role, rank)
                name = topo.group_name(role, index)
                pg_config[name] = {
                    "name": name,
                    "desc": ROLE_DESC[role],
                    "ranks": str(list(topo.members(role, index))),
                }
        dump: dict[str, Any] = {
            "version": VERSION,
            "pg_config": pg_config,
            "comm_lib_version": "" if gloo else NCCL_VERSION,
            "pg_status": pg_status,
        }
        if json_shape:
            dump["nccl_comm_state"] = {}
            if out:
                dump["entries"] = out
        else:
            dump["entries"] = out
        return dump

    def dump_length(self, rank: int) -> int:
        """How many entries `dump(rank)` holds (the ring buffer's fill), without building them."""
        stage = self.topo.local_rank(PP, rank) if self.topo.pp > 1 else 0
        total = self.full_steps * len(self.templates[stage]) + len(self.last_step.get(rank, ()))
        return min(total, self.entries)

    def _grp_straggle(self, role: int, rank: int) -> int:
        """The latest straggle among the members of `rank`'s group of `role` (everyone waits for it)."""
        if not self.straggle_ns:
            return 0
        key = (role, self.topo.group_index(role, rank))
        got = self._group_straggle.get(key)
        if got is None:
            got = max(
                self.straggle_ns.get(m, 0) + self.skew_ns.get(m // 8, 0) - self.skew_ns.get(rank // 8, 0)
                for m in self.topo.members(role, key[1])
            )
            got = max(got, self.straggle_ns.get(rank, 0))
            self._group_straggle[key] = got
        return got

    def ranks_to_write(self) -> list[int]:
        return [r for r in range(self.topo.world) if r not in self.missing]


# ---------------------------------------------------------------------------------------------
# simulation of the last step


@dataclass
class _Faults:
    stop: dict[int, int] = field(default_factory=dict)  # rank -> first position its CPU never enqueues
    skip: set[tuple[int, int]] = field(default_factory=set)  # (rank, position) the CPU skips
    hang: set[tuple[int, int]] = field(default_factory=set)  # (group index, position): never completes
    cut: int | None = None  # healthy: positions >= cut not reached yet
    in_flight: int = 0  # healthy NCCL: the last N reached positions are still running (young)


def _simulate(topo: Topology, templates: list[list[OpSpec]], shape: str,
              faults: _Faults) -> dict[int, tuple[tuple[int, int], ...]]:
    """Which positions of the last step each rank enqueued, and how far each got."""
    world = topo.world
    n_pos = len(templates[0])
    end = n_pos if faults.cut is None else faults.cut
    gloo = shape == "gloo"
    cpu_ok = [True] * world
    gpu_ok = [True] * world
    records: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    stop = faults.stop
    for pos in range(end):
        spec0 = templates[0][pos]
        role = spec0.role
        sync = gloo or spec0.sync_after
        enq = [cpu_ok[r] and pos < stop.get(r, n_pos) and (r, pos) not in faults.skip for r in range(world)]
        started = [enq[r] and gpu_ok[r] for r in range(world)]
        completed = [False] * world
        for index in range(topo.n_groups(role)):
            members = topo.members(role, index)
            if (index, pos) in faults.hang:
                continue
            if all(started[m] for m in members):
                for m in members:
                    completed[m] = True
        if faults.cut is not None and pos >= end - faults.in_flight:
            in_flight_first = pos == end - faults.in_flight
            for r in range(world):
                completed[r] = False
                if not in_flight_first:
                    started[r] = False
        for r in range(world):
            if not enq[r]:
                continue
            code = _COMPLETED if completed[r] else _STARTED if started[r] else _SCHEDULED
            records[r].append((pos, code))
            if not completed[r]:
                gpu_ok[r] = False
                if sync:
                    cpu_ok[r] = False
    interned: dict[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]] = {}
    out: dict[int, tuple[tuple[int, int], ...]] = {}
    for r in range(world):
        key = tuple(records[r])
        out[r] = interned.setdefault(key, key)
    return out


# ---------------------------------------------------------------------------------------------
# building a plan


def make_plan(
    ranks: int,
    *,
    entries: int = 2000,
    shape: str = "nccl",
    scenario: str = "healthy",
    seed: int = 0,
    culprit: int | None = None,
    position: str | None = None,
    tp: int | None = None,
    pp: int | None = None,
    layers: int = 8,
    straggle_ms: float = 250.0,
    clock_skew_ms: float = 0.0,
    wrap: bool = True,
    now_ns: int | None = None,
    hang_age_s: float | None = None,
) -> Plan:
    """Decide the job, the fault and the timeline; `Plan.dump(rank)` then builds any rank's recorder."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}")
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {SCENARIOS}")
    if entries < 1:
        raise ValueError("entries must be >= 1")
    topo = Topology.make(ranks, tp, pp, shape)
    gloo = shape == "gloo"
    if scenario == "p2p_mismatch" and (gloo or topo.pp < 2):
        raise ValueError("p2p_mismatch needs the NCCL shape and pipeline parallelism (pp=2)")
    if scenario == "cross_group" and topo.tp < 2:
        raise ValueError("cross_group needs tensor parallelism (tp >= 2)")
    rng = random.Random(seed)
    templates = [step_template(topo, shape, layers, stage) for stage in range(topo.pp)]
    n_pos = len(templates[0])
    keys = [spec.key for spec in templates[0]]
    now = time.time_ns() if now_ns is None else now_ns
    timeout_ms = 1_800_000 if gloo else 600_000
    step_ns = (400 if gloo else 1200) * _MS
    offsets = [int(pos * 0.85 * step_ns / n_pos) for pos in range(n_pos)]
    if hang_age_s is None:
        hang_age_s = 120.0 if gloo else timeout_ms / 1000 + 5
    hang_age = int(hang_age_s * _S)

    k = culprit if culprit is not None else rng.randrange(1, ranks)
    if not 0 <= k < ranks:
        raise ValueError(f"culprit rank {k} is not in 0..{ranks - 1}")
    pos_key = position or DEFAULT_POSITION.get(scenario, "")
    pos_key = pos_key.replace("{mid}", str(layers // 2))
    faults = _Faults()
    overrides: dict[int, dict[int, OpSpec]] = {}
    straggle: dict[int, int] = {}
    unretired: set[int] = set()
    missing: set[int] = set()
    truth_kw: dict[str, Any] = {}

    p = -1
    if scenario not in ("healthy", "straggler"):
        if pos_key not in keys:
            raise ValueError(f"position {pos_key!r} is not in the step: {keys}")
        p = keys.index(pos_key)
    spec_p = templates[0][p] if p >= 0 else None

    def group_of(role: int, rank: int) -> tuple[int, tuple[int, ...], str]:
        index = topo.group_index(role, rank)
        return index, topo.members(role, index), topo.group_name(role, index)

    def seq_at(pos: int) -> int:
        """collective (or p2p) sequence id of the last step's op at `pos` on an undisturbed rank."""
        spec = templates[0][pos]
        per_step = sum(1 for s in templates[0] if s.role == spec.role and s.is_p2p == spec.is_p2p)
        before = sum(1 for s in templates[0][:pos] if s.role == spec.role and s.is_p2p == spec.is_p2p)
        return full_steps * per_step + before + 1

    # Steps before the last one: enough that the ring buffer wrapped (sequence ids do not start at 1).
    extra = 40 if wrap else 0
    full_steps = math.ceil(entries / n_pos) + extra if wrap else max(0, entries // n_pos - 1)

    if scenario in ("healthy", "straggler"):
        cut = max(1, n_pos - 7)  # somewhere in the backward pass, before the grad-norm sync
        faults.cut = cut
        faults.in_flight = 0 if gloo else 2
        last_pos = cut - 1
        if gloo:
            unretired.add(0)
        if scenario == "straggler":
            straggle[k] = int(straggle_ms * _MS)
            truth_kw.update(culprit_ranks=(k,), straggle_ms=straggle_ms,
                            description=f"rank {k} enqueues every collective ~{straggle_ms:g} ms after the others")
        else:
            truth_kw.update(culprit_ranks=(), description="a healthy job: nothing is stuck")
        first_step = now - (full_steps * step_ns) - offsets[last_pos] - 5 * _MS - straggle.get(k, 0)
    else:
        assert spec_p is not None
        role = spec_p.role
        index, members, name = group_of(role, k)
        first_step = now - hang_age - offsets[p] - full_steps * step_ns
        truth_kw.update(group_name=name, group_desc=ROLE_DESC[role], group_ranks=members,
                        op=spec_p.op)
        if spec_p.is_p2p:
            truth_kw["p2p_seq_id"] = seq_at(p)
        else:
            truth_kw["collective_seq_id"] = seq_at(p)
        if scenario in ("not_joined", "missing"):
            faults.stop[k] = p
            truth_kw.update(culprit_ranks=(k,))
            if scenario == "missing":
                missing.add(k)
                truth_kw.update(missing_ranks=(k,),
                                description=f"rank {k} died before {spec_p.op} in group {name}; it left no dump")
            else:
                truth_kw.update(description=f"rank {k} never enqueued {spec_p.op} in group {name}")
        elif scenario in ("type_mismatch", "size_mismatch", "dtype_mismatch"):
            faults.hang.add((index, p))
            spec_k = templates[topo.local_rank(PP, k) if topo.pp > 1 else 0][p]
            if scenario == "type_mismatch":
                other = "broadcast" if spec_k.op != "broadcast" else "all_reduce"
                odd = OpSpec(spec_k.key, spec_k.role, other, spec_k.in_sizes, spec_k.in_dtypes,
                             spec_k.in_sizes, spec_k.in_dtypes, spec_k.site + "_odd"
                             if spec_k.site + "_odd" in _USER_FRAMES else spec_k.site,
                             spec_k.autograd, spec_k.sync_after, spec_k.dur_ms)
                what = f"rank {k} called {other} where the others called {spec_k.op}"
            elif scenario == "size_mismatch":
                in_sizes = tuple(s[:-1] + (max(1, s[-1] // 2),) for s in spec_k.in_sizes)
                out_sizes = tuple(s[:-1] + (max(1, s[-1] // 2),) for s in spec_k.out_sizes)
                odd = OpSpec(spec_k.key, spec_k.role, spec_k.op, in_sizes, spec_k.in_dtypes, out_sizes,
                             spec_k.out_dtypes, spec_k.site, spec_k.autograd, spec_k.sync_after, spec_k.dur_ms)
                what = f"rank {k} passed {[list(s) for s in in_sizes]} where the others passed " \
                       f"{[list(s) for s in spec_k.in_sizes]}"
            else:
                new = "Float" if spec_k.in_dtypes[0] != "Float" else "BFloat16"
                odd = OpSpec(spec_k.key, spec_k.role, spec_k.op, spec_k.in_sizes, (new,) * len(spec_k.in_dtypes),
                             spec_k.out_sizes, (new,) * len(spec_k.out_dtypes), spec_k.site, spec_k.autograd,
                             spec_k.sync_after, spec_k.dur_ms)
                what = f"rank {k} passed {new} where the others passed {spec_k.in_dtypes[0]}"
            overrides[k] = {p: odd}
            truth_kw.update(culprit_ranks=(k,), description=f"{what} (group {name}); every rank hangs in it")
        elif scenario in ("not_completed", "cross_group"):
            faults.hang.add((index, p))
            truth_kw.update(culprit_ranks=members)
            if scenario == "cross_group":
                consequences = sorted({topo.group_name(DP, topo.group_index(DP, m)) for m in members},
                                      key=int) + ["0"]
                truth_kw.update(
                    consequence_groups=tuple(consequences),
                    description=f"{spec_p.op} in tensor-parallel group {name} (ranks {list(members)}, "
                                f"rank {k} among them) never completed; those ranks never reach the "
                                "data-parallel collective after it, so their DP groups and the world group "
                                "hang too. The root is the TP group.",
                )
            else:
                truth_kw.update(description=f"every rank of group {name} started {spec_p.op}, none completed")
        elif scenario == "p2p_mismatch":
            a, b = members[0], members[1]
            faults.skip.add((b, p))
            # b is the one whose program diverged (it skipped the recv and went on to its own send);
            # a, blocked in its send, is the victim.
            truth_kw.update(culprit_ranks=(b,),
                            description=f"rank {a} sends to rank {b} (group {name}), rank {b} never posts "
                                        "the matching recv")
    truth = GroundTruth(
        scenario=scenario,
        shape=shape,
        world_size=ranks,
        tp=topo.tp,
        pp=topo.pp,
        dp=topo.dp,
        category=CATEGORY[scenario],
        **truth_kw,
    )
    last_step = _simulate(topo, templates, shape, faults)
    skew: dict[int, int] = {}
    if clock_skew_ms:
        for host in range((ranks + 7) // 8):
            skew[host] = int(rng.uniform(-clock_skew_ms, clock_skew_ms) * _MS)
    return Plan(
        topo=topo,
        shape=shape,
        entries=entries,
        truth=truth,
        templates=templates,
        full_steps=full_steps,
        last_step=last_step,
        overrides=overrides,
        step_ns=step_ns,
        offsets_ns=offsets,
        first_step_ns=first_step,
        straggle_ns=straggle,
        skew_ns=skew,
        unretired=frozenset(unretired),
        missing=frozenset(missing),
        timeout_ms=timeout_ms,
        seed=seed,
    )


# ---------------------------------------------------------------------------------------------
# writing


def file_name(prefix: str, rank: int, fmt: str) -> str:
    return f"{prefix}{rank}.json" if fmt == "json" else f"{prefix}{rank}"


def encode(plan: Plan, rank: int, fmt: str) -> bytes:
    if fmt == "json":
        return json.dumps(plan.dump(rank, json_shape=True), sort_keys=True, separators=(",", ":")).encode()
    return pickle.dumps(plan.dump(rank), protocol=2)


_WORKER: tuple[Plan, str, str, str] | None = None


def _init_worker(plan: Plan, out_dir: str, prefix: str, fmt: str) -> None:
    global _WORKER
    _WORKER = (plan, out_dir, prefix, fmt)


def _write_ranks(ranks: Sequence[int]) -> int:
    assert _WORKER is not None
    plan, out_dir, prefix, fmt = _WORKER
    written = 0
    for rank in ranks:
        data = encode(plan, rank, fmt)
        with open(os.path.join(out_dir, file_name(prefix, rank, fmt)), "wb") as handle:
            handle.write(data)
        written += len(data)
    return written


def write_plan(plan: Plan, out_dir: str | Path, *, fmt: str = "pickle", prefix: str = DEFAULT_PREFIX,
               jobs: int = 1) -> int:
    """Write every rank's file (one rank in memory at a time per process); returns bytes written."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ranks = plan.ranks_to_write()
    chunk = 16
    chunks = [ranks[i : i + chunk] for i in range(0, len(ranks), chunk)]
    if jobs <= 1 or len(chunks) <= 1:
        _init_worker(plan, str(out), prefix, fmt)
        try:
            return sum(_write_ranks(c) for c in chunks)
        finally:
            _init_worker_clear()
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ctx.Pool(jobs, initializer=_init_worker, initargs=(plan, str(out), prefix, fmt)) as pool:
        return sum(pool.imap_unordered(_write_ranks, chunks))


def _init_worker_clear() -> None:
    global _WORKER
    _WORKER = None


def generate(out_dir: str | Path, ranks: int, *, fmt: str = "pickle", prefix: str = DEFAULT_PREFIX,
             jobs: int = 1, **plan_kw: Any) -> GroundTruth:
    """Write a synthetic dump set to `out_dir` and return what a correct analyzer must say."""
    plan = make_plan(ranks, **plan_kw)
    write_plan(plan, out_dir, fmt=fmt, prefix=prefix, jobs=jobs)
    return plan.truth


def iter_dumps(plan: Plan, json_shape: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """Every written rank's dump, in memory (small sets only)."""
    for rank in plan.ranks_to_write():
        yield rank, plan.dump(rank, json_shape=json_shape)


# ---------------------------------------------------------------------------------------------
# command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m frscope.synthetic",
        description="Write synthetic per-rank Flight Recorder dumps with a known answer (printed as JSON).",
    )
    parser.add_argument("out_dir")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--entries", type=int, default=2000, help="ring buffer size per rank (default 2000)")
    parser.add_argument("--shape", choices=SHAPES, default="nccl")
    parser.add_argument("--scenario", choices=SCENARIOS, default="healthy")
    parser.add_argument("--format", dest="fmt", choices=FORMATS, default="pickle")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix", default=DEFAULT_PREFIX)
    parser.add_argument("--culprit", type=int, default=None, help="rank to break (default: random, not 0)")
    parser.add_argument("--position", default=None, help="step position key of the fault (e.g. dp_rs)")
    parser.add_argument("--tp", type=int, default=None)
    parser.add_argument("--pp", type=int, default=None)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--straggle-ms", type=float, default=250.0)
    parser.add_argument("--clock-skew-ms", type=float, default=0.0)
    parser.add_argument("--no-wrap", action="store_true", help="keep the whole run in the ring buffer")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--truth", default=None, help="also write the ground truth JSON to this file")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    try:
        plan = make_plan(
            args.ranks, entries=args.entries, shape=args.shape, scenario=args.scenario, seed=args.seed,
            culprit=args.culprit, position=args.position, tp=args.tp, pp=args.pp, layers=args.layers,
            straggle_ms=args.straggle_ms, clock_skew_ms=args.clock_skew_ms, wrap=not args.no_wrap,
        )
    except ValueError as exc:
        parser.error(str(exc))
    size = write_plan(plan, args.out_dir, fmt=args.fmt, prefix=args.prefix, jobs=args.jobs)
    text = json.dumps(plan.truth.to_dict(), indent=2)
    if args.truth:
        Path(args.truth).write_text(text + "\n")
    print(text)
    print(
        f"wrote {len(plan.ranks_to_write())} files ({size / 2**20:.1f} MiB) to {args.out_dir} "
        f"in {time.perf_counter() - began:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
