"""Python stacks: the frames torch stores with each entry (pickle dumps), and the text the sidecar reads
from torch's worker server (`/handler/dump_traceback`: faulthandler's form, every thread, most recent call
first). Line numbers of torch.distributed are torch 2.13's (read from real dumps)."""

from __future__ import annotations

from typing import Any

from frscope.testing.randprog.executor import BLOCKED, DONE, STUCK, RankState
from frscope.testing.randprog.program import Op, Rec

C10D = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"
TYPING = "/opt/venv/lib/python3.11/site-packages/typing_extensions.py"
CONTEXTLIB = "/usr/lib/python3.11/contextlib.py"
USER = "/workspace/train.py"
# distributed_c10d.py's line that enqueues each op (torch 2.13)
LINES = {"all_reduce": 3245, "broadcast": 3145, "all_gather": 4280, "all_gather_single": 4387,
         "all_gather_into_tensor": 4413, "reduce_scatter_single": 4936, "reduce_scatter_tensor": 4962,
         "all_to_all_single": 5131, "barrier": 5349, "gather": 4660, "scatter": 4778, "reduce": 3392,
         "_coalescing_manager": 2900, "send": 2459, "recv": 2517, "monitored_barrier": 5421,
         "batch_isend_irecv": 2806, "_sync_bucket_indices": 3145}

Frame = tuple[str, str, int]


def _user(op: Op) -> list[Frame]:
    out = [(op.func, USER, op.line)]
    if op.func != "train_step":
        out.append(("train_step", USER, 250))
    return [*out, ("main", USER, 300), ("<module>", USER, 325)]


def _torch(rec: Rec | None, op: Op, second: bool) -> list[Frame]:
    api = rec.api if rec is not None else {"p2p": "send" if op.send else "recv", "mbarrier": "monitored_barrier",
                                          "batch": "batch_isend_irecv"}.get(op.kind, op.kind)
    wrap = ("wrapper", LOGGER, 83)
    if api in ("all_gather_object", "broadcast_object_list"):
        inner = "all_gather" if api == "all_gather_object" else "broadcast"
        lines = {"all_gather_object": (3513, 3525), "broadcast_object_list": (4026, 4045)}[api]
        return [(inner, C10D, LINES[inner]), wrap, (api, C10D, lines[1] if second else lines[0]), wrap]
    if api == "all_gather_into_tensor":
        return [("all_gather_single", C10D, 4387), wrap, (api, C10D, 4413), ("wrapper", TYPING, 3140)]
    if api == "reduce_scatter_tensor":
        return [("reduce_scatter_single", C10D, 4936), wrap, (api, C10D, 4962), ("wrapper", TYPING, 3140)]
    if api == "_coalescing_manager":
        return [(api, C10D, 2900), ("__exit__", CONTEXTLIB, 144)]
    if api == "_sync_bucket_indices":
        return [("broadcast", C10D, 3145), wrap, (api, "/opt/venv/lib/python3.11/site-packages/torch/nn/parallel/"
                                                   "distributed.py", 1322)]
    return [(api, C10D, LINES.get(api, 3000)), wrap]


def entry_frames(op: Op, rec: Rec, backend: str) -> list[dict[str, Any]]:
    second = bool(op.recs) and len(op.recs) > 1 and rec is op.recs[-1]
    frames = (_torch(rec, op, second) if rec.op != "p2p" else _torch(None, op, False)) + _user(op)
    return [{"name": n, "filename": f, "line": ln} for n, f, ln in frames]


def _thread(ident: int, frames: list[Frame], current: bool = False) -> str:
    head = f"{'Current thread' if current else 'Thread'} 0x{ident:016x} (most recent call first):"
    body = [f'  File "{f}", line {ln} in {n}' for n, f, ln in frames] or ["  <no Python frame>"]
    return "\n".join([head, *body])


def stack_text(st: RankState) -> str | None:
    """What `dump_traceback` answers for this rank now (None: the process is gone)."""
    if st.status == BLOCKED and st.block_op is not None:
        op = st.block_op
        if op.kind == "wait" or op.kind == "batch":
            frames = _user(op)  # Work.wait() is C++: the caller is the top Python frame
        else:
            frames = _torch(st.block_rec, op, bool(op.recs) and st.sub > 0) + _user(op)
            frames[0] = (frames[0][0], frames[0][1], frames[0][2] + 7)
    elif st.status == STUCK and st.block_op is not None:
        frames = [(st.block_op.func, USER, st.block_op.line), ("train_step", USER, 250), ("main", USER, 300),
                  ("<module>", USER, 325)]
    elif st.status == DONE:
        frames = [("wait_for_next_epoch", USER, 310), ("main", USER, 318), ("<module>", USER, 325)]
    else:
        return None
    base = 0x7F40_0000_0000 + st.rank * 0x1000_0000
    return "\n\n".join([_thread(base + 0x6C0, [], current=True),
                        _thread(base + 0x26B80, frames)]) + "\n"
