"""Run one file's decoding in a child process, so that what kills the process kills only that file.

The C unpickler can be crashed by bytes no allow-list sees: a tuple nested 10**6 deep used as a dict
key overflows the C stack when hashed (a segfault), and the kernel's OOM killer ends whatever holds
the most memory. Neither can be caught in the process it happens in.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
from collections.abc import Callable
from typing import Any, TypeVar

from frscope.records.errors import DumpError

T = TypeVar("T")


def can_isolate() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def _child(send: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    # A crash here is expected of crafted input and reported by the parent: no fault dump of the
    # parent's inherited stack on stderr.
    faulthandler.disable()
    try:
        result: tuple[bool, Any] = (True, fn(*args))
    except DumpError as exc:
        result = (False, exc)
    send.send(result)
    send.close()


def call_isolated(source: str, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a forked child; its result (or DumpError) comes back pickled. A child that dies
    is a DumpError naming `source`. `fn` must raise nothing but DumpError for bad input."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args), daemon=True)
    proc.start()
    send.close()
    try:
        ok, value = receive.recv()
    except (EOFError, OSError):
        proc.join()
        raise DumpError(
            source, f"the decoder process died reading this file (exit code {proc.exitcode}): crafted or corrupt input"
        ) from None
    finally:
        receive.close()
    proc.join()
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]
