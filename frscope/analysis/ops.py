"""Knowledge about collective ops: which arguments must agree across ranks, and bounded op labels."""

from __future__ import annotations

import math

# Ops whose per-rank sizes legitimately differ (split sizes, root-only buffers): compared by totals.
VARIABLE_SIZE_OPS = frozenset(
    {
        "all_to_all",
        "all_to_all_single",
        "all_to_all_v_single",
        "alltoall",
        "alltoall_base",
        "gather",
        "scatter",
        "all_gather_v",
        "reduce_scatter_v",
        "_reduce_oop",
        "_broadcast_oop",
    }
)
# Rooted ops with a root-only side: the other side must still agree on every rank (each rank's scatter
# chunk, each rank's gather contribution are the same size; torch checks that on the root).
SAME_SIZE_SIDE = {"scatter": "output", "gather": "input"}


def agreeing_sizes(op: str, input_sizes: list[list[int]], output_sizes: list[list[int]]) -> object:
    """What of an entry's sizes must be equal across the group's ranks: all of them, or for ops whose
    sizes legitimately differ only the side that must agree (None when nothing must)."""
    side = SAME_SIZE_SIDE.get(op)
    if side is not None:
        return output_sizes if side == "output" else input_sizes
    if op in VARIABLE_SIZE_OPS:
        return None
    return (input_sizes, output_sizes)


# Root-only buffers: one side of the dtypes may legitimately be empty.
ROOTED_OPS = frozenset({"gather", "scatter", "broadcast", "reduce"})

ALL_GATHER_OPS = frozenset(
    {"all_gather", "_allgather_base", "_all_gather_base", "all_gather_into_tensor_coalesced", "all_gather_single"}
)
REDUCE_SCATTER_OPS = frozenset(
    {"reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "reduce_scatter_single"}
)

# Bounded label set for metrics and filters (torch's profiling names are open-ended).
_LABELS = {
    "all_reduce": "ALLREDUCE",
    "allreduce": "ALLREDUCE",
    "allreduce_coalesced": "ALLREDUCE",
    "all_reduce_barrier": "BARRIER",
    "broadcast": "BROADCAST",
    "_broadcast_oop": "BROADCAST",
    "reduce": "REDUCE",
    "_reduce_oop": "REDUCE",
    "barrier": "BARRIER",
    "gather": "GATHER",
    "scatter": "SCATTER",
    "send": "SEND",
    "isend": "SEND",
    "recv": "RECV",
    "irecv": "RECV",
    "coalesced": "COALESCED",
}


def op_label(op: str) -> str:
    """'all_reduce' -> 'ALLREDUCE'; anything unknown -> 'OTHER'. Safe as a Prometheus label."""
    label = _LABELS.get(op)
    if label:
        return label
    if op in ALL_GATHER_OPS or op.startswith("all_gather") or op.startswith("_allgather") or op.startswith("ALLGATHER"):
        return "ALLGATHER"
    if op in REDUCE_SCATTER_OPS or op.lower().startswith("reduce_scatter") or op.startswith("_reduce_scatter"):
        return "REDUCE_SCATTER"
    if op.startswith("all_to_all") or op.startswith("alltoall"):
        return "ALLTOALL"
    return "OTHER"


OP_LABELS = (
    "ALLREDUCE",
    "BROADCAST",
    "REDUCE",
    "ALLGATHER",
    "REDUCE_SCATTER",
    "ALLTOALL",
    "GATHER",
    "SCATTER",
    "BARRIER",
    "SEND",
    "RECV",
    "COALESCED",
    "OTHER",
)


def numel(sizes: list[list[int]]) -> int:
    total = 0
    for shape in sizes:
        if isinstance(shape, (list, tuple)):
            total += math.prod(int(d) for d in shape)
    return total


def self_consistency_error(
    op: str, input_sizes: list[list[int]], output_sizes: list[list[int]], group_size: int
) -> str | None:
    """An all_gather / reduce_scatter whose own input and output disagree with the group size."""
    if not input_sizes or not output_sizes or group_size <= 0:
        return None
    if op in ALL_GATHER_OPS:
        got, want = numel(output_sizes), numel(input_sizes) * group_size
        if got != want:
            return f"output numel {got} != input numel {numel(input_sizes)} x group size {group_size}"
    elif op in REDUCE_SCATTER_OPS:
        got, want = numel(input_sizes), numel(output_sizes) * group_size
        if got != want:
            return f"input numel {got} != output numel {numel(output_sizes)} x group size {group_size}"
    return None
