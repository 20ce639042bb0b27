"""Reading Python stacks: the live ones (`dump_traceback`, faulthandler's format) and the recorder's
frames at enqueue. Finds the thread that matters and the user's code inside it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from frscope.records import Frame

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.+?)\s*$')

# Library code that is never "where it was called from".
# Frames that are never the user's call site: libraries, and frscope's own bootstrap modules in the
# trainer (the collective timer wraps torch.distributed's collectives, wherever its image copied it).
_LIBRARY_MARKERS = ("/torch/", "/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ",
                    "/_frscope_timings.py", "/_frscope_debug_server.py")

P2P_FUNCTIONS = frozenset(
    {"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list"}
)
COLLECTIVE_FILE = "distributed_c10d.py"
# Creating a process group is collective too (the world's ranks, or only the members where
# use_local_synchronization is set, meet in the store); the recorder keeps nothing of it.
GROUP_CREATION = frozenset({"new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group"})


@dataclass(frozen=True, slots=True)
class ThreadStack:
    thread_id: int
    frames: tuple[Frame, ...]  # most recent call first


def parse_traceback(text: str) -> list[ThreadStack]:
    threads: list[ThreadStack] = []
    current: int | None = None
    frames: list[Frame] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            if current is not None:
                threads.append(ThreadStack(current, tuple(frames)))
            current, frames = int(head.group(1), 16), []
            continue
        frame = _FRAME.match(line)
        if frame and current is not None:
            frames.append(Frame(frame.group("name"), frame.group("file"), int(frame.group("line"))))
    if current is not None:
        threads.append(ThreadStack(current, tuple(frames)))
    return threads


def main_stack(text: str, thread_id: str | None = None) -> tuple[Frame, ...]:
    """The stack of the thread that issues collectives: the one the recorder names (its thread_id is
    the same pthread id faulthandler prints in hex), else the deepest Python stack."""
    threads = [t for t in parse_traceback(text) if t.frames]
    if not threads:
        return ()
    if thread_id is not None and thread_id.isdigit():
        wanted = int(thread_id)
        for thread in threads:
            if thread.thread_id == wanted:
                return thread.frames
    return max(threads, key=lambda t: len(t.frames)).frames


def is_library(frame: Frame) -> bool:
    return any(marker in frame.filename for marker in _LIBRARY_MARKERS)


def user_frame(frames: tuple[Frame, ...]) -> Frame | None:
    """The innermost frame in the user's code (frames are most recent first)."""
    for frame in frames:
        if not is_library(frame):
            return frame
    return frames[-1] if frames else None


# torch.distributed.pipelining waits on its batched p2p ops inside these (the wait itself is C++).
_PIPELINING_P2P = frozenset({"_wait_batch_p2p", "_batch_p2p", "_sorted_batch_p2p"})
_PIPELINING_DIR = "/torch/distributed/pipelining/"


def blocked_in(frames: tuple[Frame, ...]) -> str | None:
    """The torch.distributed function a stack is inside ('recv', 'all_reduce'), if any; a pipelining
    schedule waiting on its stage's sends and receives reads as 'batch_isend_irecv', a rank creating a
    group as the creating call ('new_group'), whatever store wait inside it holds the rank."""
    creating = [f.name for f in frames if f.name in GROUP_CREATION and f.filename.endswith(COLLECTIVE_FILE)]
    if creating:
        return creating[0]
    for frame in frames:
        if frame.filename.endswith(COLLECTIVE_FILE):
            return frame.name
        if frame.name in _PIPELINING_P2P and _PIPELINING_DIR in frame.filename:
            return "batch_isend_irecv"
    return None


def describe(frames: tuple[Frame, ...]) -> str | None:
    """'in load_batch (train.py:9)' or 'blocked in recv, called from train.py:31 (step)'."""
    if not frames:
        return None
    inside = blocked_in(frames)
    user = user_frame(frames)
    if inside and user:
        return f"blocked in torch.distributed {inside}, called from {user.filename}:{user.line} ({user.name})"
    if user:
        top = frames[0]
        if top is user:
            return f"in {user.name} ({user.filename}:{user.line})"
        return f"in {top.name} ({top.filename}:{top.line}), called from {user.name} ({user.filename}:{user.line})"
    return f"in {frames[0]}"


def _user_path(frames: tuple[Frame, ...]) -> list[tuple[str, str, int]]:
    """The user's frames, outermost first (library frames left out)."""
    return [(f.filename, f.name, f.line) for f in reversed(frames) if not is_library(f)]


def _shared(a: list[tuple[str, str, int]], b: list[tuple[str, str, int]]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def still_inside(waiters: list[tuple[Frame, ...]], candidates: dict[int, tuple[Frame, ...]]) -> list[int]:
    """Of ranks in Python, those still inside the call the waiting ranks wait in: their user frames hold every
    call the waiters share but the innermost (the step the waiters are in: `main` at the loop's line, then the
    step function), where the others' left it (a `main` at another line: they returned from that step, and a
    rank that ran its step to the end posted what its step posts). Every candidate where the waiters share no
    such call, or none (or all) of the candidates is inside it."""
    paths = [_user_path(w) for w in waiters if w]
    if not paths or len(candidates) < 2:
        return sorted(candidates)
    common = paths[0]
    for path in paths[1:]:
        common = common[:_shared(common, path)]
    base = len(common) - 1  # the calls around the user function the waiters called torch.distributed from
    if base < 2:
        return sorted(candidates)
    inside = [r for r, stack in sorted(candidates.items()) if _shared(_user_path(stack), common) >= base]
    return inside if 0 < len(inside) < len(candidates) else sorted(candidates)
