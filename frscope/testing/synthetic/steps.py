"""One training step as a list of collectives per pipeline stage (`step_template`), with the Python stacks
torch records at enqueue."""


from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frscope.testing.synthetic.topology import DP, PP, TP, WORLD, Topology


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
USER_FRAMES: dict[str, tuple[tuple[str, str, int], ...]] = {
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


def frames_for(site: str, op: str, autograd: bool) -> tuple[dict[str, Any], ...]:
    name, line = _C10D_FRAME.get(op, (op, 1000))
    frames = [
        (name, f"{_TORCH}/distributed/distributed_c10d.py", line),
        ("wrapper", f"{_TORCH}/distributed/c10d_logger.py", 83),
        *USER_FRAMES[site],
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
