"""The bootstrap's collective timer (`_frscope_timings`, beside the sitecustomize) on the paths no real
job here can take: a GPU collective (NCCL) through torch 2.14+'s process-group hooks, an abort hook,
and the older torch's wrappers around a collective that runs on a GPU. There is no GPU on this machine,
so the process group, its Work and tensors are stand-ins with torch's interface (the names and
arguments of `ProcessGroup.register_pre_hook` / `register_post_hook` / `register_abort_hook`,
`PreHookArgs`, `PostHookArgs`, `Work.get_future()`, `Future.add_done_callback`, as torch 2.15's
`_distributed_c10d.pyi` declares them). The same code runs on real gloo jobs of torch 2.13, 2.14 and
2.15 in tests/integration/test_live_durations.py. A GPU check of the NCCL path is still to be done
(docs/sidecar.md, "Collective durations").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from frscope.sidecar.bootstrap import _frscope_timings as ft
from frscope.wire import parse_timings


class FakeFuture:
    def __init__(self) -> None:
        self.callbacks: list[Callable[[Any], None]] = []

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self.callbacks.append(callback)

    def finish(self) -> None:
        for callback in self.callbacks:
            callback(self)


class FakeWork:
    def __init__(self) -> None:
        self.future = FakeFuture()

    def get_future(self) -> FakeFuture:
        return self.future


@dataclass(eq=False)
class FakeGroup:
    """A ProcessGroup as torch 2.14+ has it: hooks by id, and the collective sequence number."""

    group_name: str
    supports_abort_hooks: bool = False
    seq: int = 0
    pre: dict[int, Callable[[Any], None]] = field(default_factory=dict)
    post: dict[int, Callable[[Any], None]] = field(default_factory=dict)
    abort: dict[int, Callable[[], None]] = field(default_factory=dict)

    def register_pre_hook(self, hook_id: int, hook: Callable[[Any], None]) -> None:
        self.pre[hook_id] = hook

    def register_post_hook(self, hook_id: int, hook: Callable[[Any], None]) -> None:
        self.post[hook_id] = hook

    def register_abort_hook(self, hook_id: int, hook: Callable[[], None]) -> None:
        self.abort[hook_id] = hook

    def _get_sequence_number_for_group(self) -> int:
        return self.seq

    def collective(self, name: str, *, cuda: bool, op_id: int = 0) -> FakeWork:
        """What ProcessGroup does around a collective: pre-hooks, the issue, post-hooks with the Work."""
        tensor = SimpleNamespace(is_cuda=cuda)
        for hook in self.pre.values():
            hook(SimpleNamespace(name=SimpleNamespace(name=name), async_op=False, input_tensors=[tensor],
                                 output_tensors=[tensor], root=0, op_id=op_id))
        if name not in ("SEND", "RECV"):
            self.seq += 1
        work = FakeWork()
        for hook in self.post.values():
            hook(SimpleNamespace(name=SimpleNamespace(name=name), async_op=False, work=work, op_id=op_id))
        return work


def rows(timings: ft.Timings) -> list[Any]:
    parsed = parse_timings(json.loads(timings.document()))
    assert parsed.rejected == 0
    return parsed.rows


def test_a_host_collective_is_dated_from_its_start_to_its_works_future() -> None:
    timings = ft.Timings(16)
    pg = FakeGroup("0")
    assert timings.attach(pg)
    work = pg.collective("ALLREDUCE", cuda=False, op_id=4)
    [running] = rows(timings)
    assert (running.group, running.seq, running.op_id, running.op, running.end_ns) == ("0", 1, 4, "all_reduce", None)
    work.future.finish()
    [done] = rows(timings)
    assert done.end_ns is not None and done.end_ns >= done.start_ns == running.start_ns


def test_a_gpu_collective_nccl_gets_its_start_only() -> None:
    # Its future completes at launch, not when the kernel ends: no end from the host; the recorder's own
    # started / completed times (and duration_ms with timing) date an NCCL collective.
    timings = ft.Timings(16)
    pg = FakeGroup("3", supports_abort_hooks=True)
    timings.attach(pg)
    work = pg.collective("ALLGATHER_BASE", cuda=True)
    assert work.future.callbacks == []
    [row] = rows(timings)
    assert (row.group, row.seq, row.op, row.end_ns) == ("3", 1, "_all_gather_base", None)
    # the abort hook (NCCL has one; gloo does not) notes when the group aborted
    assert list(pg.abort) == [ft.HOOK_ID]
    pg.abort[ft.HOOK_ID]()
    assert parse_timings(json.loads(timings.document())).aborted_at_ns is not None


def test_p2p_is_not_dated_and_a_group_is_hooked_once_with_frscopes_id() -> None:
    timings = ft.Timings(16)
    pg = FakeGroup("0")
    timings.attach(pg)
    timings.attach(pg)
    assert list(pg.pre) == [ft.HOOK_ID] and list(pg.post) == [ft.HOOK_ID] and pg.abort == {}  # gloo: no abort hooks
    pg.collective("SEND", cuda=False)
    pg.collective("RECV", cuda=False)
    assert rows(timings) == []


def test_the_ring_is_bounded_and_keeps_the_newest() -> None:
    timings = ft.Timings(16)
    pg = FakeGroup("0")
    timings.attach(pg)
    for _ in range(40):
        pg.collective("BROADCAST", cuda=False).future.finish()
    assert [r.seq for r in rows(timings)] == list(range(25, 41))


def test_a_hook_that_meets_the_unexpected_never_raises_into_training() -> None:
    timings = ft.Timings(16)
    pg = FakeGroup("0")
    timings.attach(pg)
    pg.pre[ft.HOOK_ID](SimpleNamespace())  # no tensors at all
    pg.post[ft.HOOK_ID](SimpleNamespace(name=None))  # nothing it expects
    assert rows(timings) == []


def test_a_torch_without_group_hooks_is_not_attached() -> None:
    assert not ft.Timings(16).attach(SimpleNamespace(group_name="0"))


class FakeC10d:
    """torch.distributed.distributed_c10d as older torch has it, for the wrappers: a default group and
    Python collectives (one calling another, as the object collectives do)."""

    def __init__(self, backend: str) -> None:
        self.pg = FakeGroup("0")
        self.backend = backend

    def _get_default_group(self) -> FakeGroup:
        return self.pg

    def all_reduce(self, tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        (group or self.pg).seq += 1
        return FakeWork() if async_op else None

    def barrier(self, group: Any = None, async_op: bool = False, device_ids: Any = None) -> Any:
        (group or self.pg).seq += 1
        return FakeWork() if async_op else None

    def all_gather_object(self, objects: Any, obj: Any, group: Any = None) -> None:
        self.all_reduce(SimpleNamespace(is_cuda=False), group=group)
        self.all_reduce(SimpleNamespace(is_cuda=False), group=group)


def wrapped(c10d: FakeC10d, timings: ft.Timings) -> None:
    for name in ("all_reduce", "barrier", "all_gather_object"):
        setattr(c10d, name, timings.wrap(c10d, name))


def test_wrappers_date_sync_calls_at_return_and_async_ones_at_their_future() -> None:
    timings = ft.Timings(16)
    c10d = FakeC10d("gloo")
    wrapped(c10d, timings)
    c10d.all_reduce(SimpleNamespace(is_cuda=False))
    work = c10d.all_reduce(SimpleNamespace(is_cuda=False), async_op=True)
    sub = FakeGroup("1")
    c10d.all_reduce(SimpleNamespace(is_cuda=False), None, sub)  # group given by position
    first, second, third = rows(timings)
    assert (first.seq, first.end_ns is not None) == (1, True)
    assert (second.seq, second.end_ns) == (2, None)
    assert (third.group, third.seq) == ("1", 1)
    work.future.finish()
    assert rows(timings)[1].end_ns is not None


def test_wrappers_date_each_op_of_an_object_collective_once() -> None:
    timings = ft.Timings(16)
    c10d = FakeC10d("gloo")
    wrapped(c10d, timings)
    c10d.all_gather_object([None, None], {"a": 1})
    assert [r.seq for r in rows(timings)] == [1, 2]  # its two ops, not a third row for the whole call


@pytest.mark.parametrize("backend, dated", [("nccl", False), ("gloo", True), ("cpu:gloo,cuda:nccl", False)])
def test_wrappers_leave_a_gpu_collective_without_an_end(backend: str, dated: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    torch_distributed = pytest.importorskip("torch.distributed")
    monkeypatch.setattr(torch_distributed, "get_backend", lambda group=None: backend)
    timings = ft.Timings(16)
    c10d = FakeC10d(backend)
    wrapped(c10d, timings)
    c10d.all_reduce(SimpleNamespace(is_cuda=True))  # a CUDA tensor: never dated by the host
    c10d.barrier()  # no tensor: the group's backend decides
    cuda_row, barrier_row = rows(timings)
    assert cuda_row.end_ns is None
    assert (barrier_row.end_ns is not None) is dated


def test_on_hooks_a_synchronous_python_collective_ends_at_its_return_without_a_callback() -> None:
    timings = ft.Timings(16)
    pg = FakeGroup("0")
    timings.attach(pg)
    issued: list[FakeWork] = []

    class C10d:
        def all_reduce(self, tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
            issued.append(pg.collective("ALLREDUCE", cuda=False))  # the hooks fire inside the call
            return issued[-1] if async_op else None

    c10d = C10d()
    c10d.all_reduce = timings.returning(c10d, "all_reduce")  # type: ignore[method-assign]
    c10d.all_reduce(SimpleNamespace(is_cuda=False))
    [row] = rows(timings)
    assert row.end_ns is not None and issued[0].future.callbacks == []  # dated at the return
    work = c10d.all_reduce(SimpleNamespace(is_cuda=False), async_op=True)
    assert rows(timings)[1].end_ns is None and len(work.future.callbacks) == 1  # async: its future dates it
    work.future.finish()
    assert rows(timings)[1].end_ns is not None
    pg.collective("ALLREDUCE", cuda=False).future.finish()  # a C++ caller (DDP's reducer): the future too
    assert rows(timings)[2].end_ns is not None
