"""frscope bootstrap, part two: each rank's own start and end of every collective, on every backend.

The recorder dates collectives only where the backend does (NCCL: started / completed, and
`duration_ms` with timing); gloo records when a collective was enqueued and nothing else. This
module keeps, in each rank, a bounded ring of its own collectives' times, served by the worker
server as `POST /handler/frscope_timings` (JSON, `frscope.wire.timings` reads it):

    {"frscope_timings": 1, "mechanism": "pg_hooks" | "wrappers", "capacity": N, "aborted_at_ns": 0,
     "rows": [[group name, collective_seq_id, op_id, op, start_ns, end_ns], ...]}

`end_ns` is 0 while the collective runs, and stays 0 where the end cannot be seen from the host
(a collective on a GPU: its work future completes at launch, not when the kernel ends; the
recorder's own times date it there).

How the times are taken, by what torch offers:
- torch 2.14+ (`ProcessGroup.register_pre_hook` / `register_post_hook`, on every backend): a pre-hook
  notes the start (and whether the tensors are on the host), the post-hook gets the issued Work and
  the group's sequence number (= the recorder's collective_seq_id), and the Work's future dates the
  end; a synchronous call of torch.distributed's Python collectives (marked by `returning`) is dated
  at its return instead, with no callback. Covers every caller, DDP's C++ reducer included. Hooks go
  on each group as it is made (`_new_process_group_helper`, `split_group`) and on any group made
  before. An abort hook (where the backend has one: NCCL) notes when the group aborted.
- older torch (2.13): the Python collectives of `torch.distributed` are wrapped: the call's start,
  its return (a synchronous call) or its Work's future (`async_op=True`) as the end. Collectives
  issued from C++ (DDP's gradient buckets) are not seen there.
Costs, per collective (bench/timing_overhead.py --micro): 3.6 us of CPU with the wrappers; with the
hooks 8 us for a synchronous Python collective, 21 us where the future's callback dates the end (it
runs on the backend's thread and takes the GIL). Nothing here ever raises into training.

Standard library only (plus torch, which is imported by the time anything here runs).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
import weakref
from typing import Any

FORMAT = 1
HOOK_ID = 0x66727363  # "frsc": this bootstrap's hooks on a group
_DEFAULT_CAPACITY = 2000  # the recorder's default ring size
# The collectives of torch.distributed that the wrappers date (older torch). Object collectives and
# the like call these, so each of their ops is dated on its own.
WRAPPED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
           "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "reduce", "gather",
           "scatter", "all_reduce_coalesced", "all_gather_coalesced")
_P2P = ("SEND", "RECV")  # the recorder keys p2p by op_id, not collective_seq_id: not dated here
# torch's hook op names (HookOpName) in the recorder's spelling (its profiling_name after "gloo:");
# any other name is kept lower-cased.
_OP_NAMES = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "ALLTOALL": "all_to_all",
             "ALLGATHER_BASE": "_all_gather_base", "REDUCE_SCATTER_BASE": "_reduce_scatter_base",
             "ALLTOALL_BASE": "all_to_all_single",
             "ALLGATHER_INTO_TENSOR_COALESCED": "all_gather_into_tensor_coalesced"}


def _capacity() -> int:
    raw = os.environ.get("FRSCOPE_TIMINGS_SIZE", "")
    return max(16, min(int(raw), 100_000)) if raw.isdigit() else _DEFAULT_CAPACITY


class Timings:
    """The ring and its writers. A row is a list that the end callback fills in place (one item
    assignment: atomic under the GIL, no lock on the hot path)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rows: collections.deque[list[Any]] = collections.deque(maxlen=capacity)
        self.mechanism = ""
        self.aborted_at_ns = 0
        self.attached: weakref.WeakSet[Any] = weakref.WeakSet()  # the groups with this timer's hooks
        self._local = threading.local()  # the pre-hook's start, for the post-hook on the same thread

    # -- the document the handler serves -----------------------------------------------------------

    def document(self) -> str:
        rows = [list(row) for row in list(self.rows)]  # a copy: callbacks may fill ends meanwhile
        return json.dumps({"frscope_timings": FORMAT, "mechanism": self.mechanism, "capacity": self.capacity,
                           "aborted_at_ns": self.aborted_at_ns, "rows": rows}, separators=(",", ":"))

    # -- recording ----------------------------------------------------------------------------------

    def add(self, group: str, seq: int, op_id: int, op: str, start_ns: int, work: Any, on_host: bool) -> None:
        """One issued collective. Its end: the Work's future where the host sees completion, now where
        there is no Work (the call returned done), never for a device collective."""
        row: list[Any] = [group, seq, op_id, op, start_ns, 0]
        self.rows.append(row)
        if not on_host:
            return
        if work is None:
            row[5] = time.time_ns()
            return
        waiting = getattr(self._local, "waiting", None)
        if waiting is not None:
            # Issued inside a synchronous Python collective (`returning`): its return dates the end,
            # with no callback on the backend's thread (which costs the GIL there).
            waiting.append(row)
            return
        future = work.get_future()

        def done(_future: Any, row: list[Any] = row) -> None:
            row[5] = time.time_ns()

        future.add_done_callback(done)

    # -- torch 2.14+: the group's own hooks ----------------------------------------------------------

    def attach(self, pg: Any) -> bool:
        """Pre/post (and abort, where the backend has one) hooks on `pg`; False if torch has none."""
        if not hasattr(pg, "register_pre_hook") or not hasattr(pg, "register_post_hook"):
            return False
        if pg in self.attached:
            return True
        group = str(pg.group_name)
        local = self._local
        seq_of = pg._get_sequence_number_for_group
        # A group on host devices only (gloo) needs no look at each collective's tensors (a microsecond).
        devices = getattr(pg, "_device_types", None) or ()
        host_only = bool(devices) and all(getattr(d, "type", "") == "cpu" for d in devices)

        def pre(args: Any) -> None:
            try:
                local.start = (time.time_ns(), True if host_only else _on_host(args))
            except Exception:
                local.start = None

        def post(args: Any) -> None:
            try:
                start = getattr(local, "start", None)
                local.start = None
                name = str(getattr(args.name, "name", args.name)).rpartition(".")[2]
                if start is None or name in _P2P:
                    return
                op = _OP_NAMES.get(name, name.lower())
                self.add(group, int(seq_of()), int(args.op_id), op, start[0], args.work, start[1])
            except Exception:
                pass

        def aborted() -> None:
            self.aborted_at_ns = time.time_ns()

        pg.register_pre_hook(HOOK_ID, pre)
        pg.register_post_hook(HOOK_ID, post)
        if getattr(pg, "supports_abort_hooks", False):
            try:
                pg.register_abort_hook(HOOK_ID, aborted)
            except Exception:
                pass
        self.attached.add(pg)
        return True

    def returning(self, c10d: Any, name: str) -> Any:
        """torch 2.14+: `c10d.<name>` marked so that a synchronous call's collectives (dated by the
        hooks) end when the call returns (it waited for them), instead of at a future's callback."""
        import inspect

        original = getattr(c10d, name)
        try:
            params = list(inspect.signature(original).parameters)
        except (TypeError, ValueError):
            return original
        async_at = params.index("async_op") if "async_op" in params else -1
        local = self._local

        def sync(*args: Any, **kwargs: Any) -> Any:
            async_op = args[async_at] if 0 <= async_at < len(args) else kwargs.get("async_op", False)
            if async_op or getattr(local, "waiting", None) is not None:
                return original(*args, **kwargs)
            waiting: list[list[Any]] = []
            local.waiting = waiting
            try:
                result = original(*args, **kwargs)
            finally:
                local.waiting = None
            end = time.time_ns()
            for row in waiting:
                row[5] = end
            return result

        sync.__wrapped__ = original  # type: ignore[attr-defined]
        sync.__name__ = getattr(original, "__name__", name)
        sync.__doc__ = getattr(original, "__doc__", None)
        return sync

    # -- older torch: the Python collectives, wrapped ------------------------------------------------

    def wrap(self, c10d: Any, name: str) -> Any:
        """`c10d.<name>` wrapped to date each call (the original where it cannot be)."""
        import inspect

        original = getattr(c10d, name)
        try:
            params = list(inspect.signature(original).parameters)
        except (TypeError, ValueError):
            return original
        group_at = params.index("group") if "group" in params else -1
        async_at = params.index("async_op") if "async_op" in params else -1
        local = self._local
        default_group = c10d._get_default_group
        op = name

        def timed(*args: Any, **kwargs: Any) -> Any:
            outer_count = getattr(local, "count", 0)
            start = time.time_ns()
            result = original(*args, **kwargs)
            if getattr(local, "count", 0) != outer_count:
                return result  # the collectives inside (an object collective's ops) were dated themselves
            try:
                group = args[group_at] if 0 <= group_at < len(args) else kwargs.get("group")
                pg = group if group is not None else default_group()
                async_op = args[async_at] if 0 <= async_at < len(args) else kwargs.get("async_op", False)
                work = result if async_op and result is not None and hasattr(result, "get_future") else None
                self.add(str(pg.group_name), int(pg._get_sequence_number_for_group()), -1, op, start, work,
                         _tensors_on_host(args, pg))
                local.count = getattr(local, "count", 0) + 1
            except Exception:
                pass
            return result

        timed.__wrapped__ = original  # type: ignore[attr-defined]
        timed.__name__ = getattr(original, "__name__", name)
        timed.__doc__ = getattr(original, "__doc__", None)
        return timed


def _on_host(args: Any) -> bool:
    """Whether a pre-hook's collective runs on host tensors (its future then completes at its end)."""
    for tensors in (args.input_tensors, args.output_tensors):
        for tensor in tensors:
            return not bool(tensor.is_cuda)
    return True


def _tensors_on_host(args: tuple[Any, ...], pg: Any) -> bool:
    """The wrapped call's first tensor argument decides; with none (barrier), the group's backend."""
    for arg in args:
        first = arg[0] if isinstance(arg, (list, tuple)) and arg else arg
        if hasattr(first, "is_cuda"):
            return not bool(first.is_cuda)
    try:
        from torch.distributed import get_backend

        return "nccl" not in str(get_backend(pg)).lower()
    except Exception:
        return True


TIMINGS = Timings(_capacity())
_INSTALLED = False


def install(say: Any) -> None:
    """Start dating collectives in this process (torch.distributed has finished importing)."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    try:
        c10d = sys.modules["torch.distributed.distributed_c10d"]
        from torch._C._distributed_c10d import ProcessGroup

        if hasattr(ProcessGroup, "register_pre_hook") and hasattr(ProcessGroup, "register_post_hook"):
            TIMINGS.mechanism = "pg_hooks"
            _hook_new_groups(c10d, say)
            wrapper = TIMINGS.returning
        else:
            TIMINGS.mechanism = "wrappers"
            wrapper = TIMINGS.wrap
        dist = sys.modules.get("torch.distributed")
        for name in WRAPPED:
            if not hasattr(c10d, name):
                continue
            original = getattr(c10d, name)
            timed = wrapper(c10d, name)
            setattr(c10d, name, timed)
            if dist is not None and getattr(dist, name, None) is original:
                setattr(dist, name, timed)
    except Exception as exc:
        TIMINGS.mechanism = ""
        say(f"no collective durations: {type(exc).__name__}: {exc}")


def _hook_new_groups(c10d: Any, say: Any) -> None:
    """Hooks on every group: those made from now on, and any already there."""

    def attach(pg: Any) -> None:
        try:
            TIMINGS.attach(pg)
        except Exception as exc:
            say(f"no durations for group {getattr(pg, 'group_name', '?')}: {type(exc).__name__}: {exc}")

    def after(maker: Any) -> Any:
        def made(*args: Any, **kwargs: Any) -> Any:
            result = maker(*args, **kwargs)
            pg = result[0] if isinstance(result, tuple) and result else result
            if pg is not None and hasattr(pg, "register_pre_hook"):
                attach(pg)
            return result

        made.__wrapped__ = maker  # type: ignore[attr-defined]
        return made

    dist = sys.modules.get("torch.distributed")
    for maker in ("_new_process_group_helper", "split_group"):
        if hasattr(c10d, maker):
            original = getattr(c10d, maker)
            setattr(c10d, maker, after(original))
            if dist is not None and getattr(dist, maker, None) is original:
                setattr(dist, maker, getattr(c10d, maker))
    world = getattr(c10d, "_world", None)
    for pg in list(getattr(world, "pg_map", {}) or {}):
        attach(pg)


def handler(request: Any, response: Any) -> None:
    """`POST /handler/frscope_timings`: the ring as JSON."""
    try:
        response.set_content(TIMINGS.document(), "application/json")
        response.set_status(200)
    except Exception as exc:
        response.set_content(f"frscope_timings: {type(exc).__name__}: {exc}", "text/plain")
        response.set_status(500)
