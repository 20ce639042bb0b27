"""Run one file's decoding in a child process, so that what kills the process kills only that file.

The C unpickler can be crashed by bytes no allow-list sees: a tuple nested 10**6 deep used as a dict
key overflows the C stack when hashed (a segfault), and the kernel's OOM killer ends whatever holds
the most memory. Neither can be caught in the process it happens in. Nor can a decode that takes
minutes inside one opcode (a dict of keys that all hash alike): the child runs under a CPU-time cap
(`limits.cpu_time_cap`) and the parent stops waiting after a wall-clock deadline.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from frscope.records.errors import DumpError, DumpTooSlow
from frscope.records.limits import cpu_time_cap, file_cpu_budget_s

T = TypeVar("T")

# The parent waits at most this many times the child's CPU budget in wall-clock time (the machine may
# be busy; a child that sleeps or blocks uses no CPU and would never meet its cap).
WALL_PER_CPU = 30.0


def can_isolate() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def _child(send: Any, cpu_s: float | None, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    # A crash here is expected of crafted input and reported by the parent: no fault dump of the
    # parent's inherited stack on stderr.
    faulthandler.disable()
    try:
        if cpu_s is None:
            result: tuple[bool, Any] = (True, fn(*args))
        else:
            with cpu_time_cap(cpu_s):
                result = (True, fn(*args))
    except DumpError as exc:
        result = (False, exc)
    send.send(result)
    send.close()


def capped(path: Path, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` under the CPU cap of decoding `path` (`limits.file_cpu_budget_s`), in a process that
    exists to decode (a loader worker): past the cap the kernel ends the process."""
    with cpu_time_cap(file_cpu_budget_s(path)):
        return fn(*args)


def died_because(exitcode: int | None, source: str, cpu_s: float | None) -> DumpError:
    """The problem of a decoder process that ended without an answer, by how it ended."""
    if exitcode == -signal.SIGXCPU and cpu_s is not None:
        return DumpTooSlow(source, f"decoding took more than {cpu_s:.0f} s of CPU time (the cap for a file of this "
                           "size): crafted or pathological input; not read")
    return DumpError(source, f"the decoder process died reading this file (exit code {exitcode}): "
                     "crafted or corrupt input")


def call_isolated(source: str, fn: Callable[..., T], *args: Any, cpu_s: float | None = None) -> T:
    """`fn(*args)` in a forked child; its result (or DumpError) comes back pickled. A child that dies
    is a DumpError naming `source`; one past `cpu_s` seconds of CPU (or `WALL_PER_CPU` times that in
    wall-clock time) is a DumpTooSlow. `fn` must raise nothing but DumpError for bad input."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, cpu_s, fn, args), daemon=True)
    proc.start()
    send.close()
    try:
        if cpu_s is not None and not receive.poll(WALL_PER_CPU * cpu_s):
            proc.kill()
            proc.join()
            raise DumpTooSlow(source, f"decoding took more than {WALL_PER_CPU * cpu_s:.0f} s (wall clock): "
                              "crafted or pathological input; not read")
        ok, value = receive.recv()
    except (EOFError, OSError):
        proc.join()
        raise died_because(proc.exitcode, source, cpu_s) from None
    finally:
        receive.close()
    proc.join()
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]
