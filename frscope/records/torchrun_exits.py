"""Per-rank exits out of torchrun's failure summary, as it reaches a container's termination message.

Under torchrun the container's exit code is the agent's (1 whenever a worker failed) and the log's
tail, which `FallbackToLogsOnError` makes the termination message, ends with the agent's
`ChildFailedError` summary: one block per failed worker (global rank, local rank, exit code, a
traceback line) and the first failure as "Root Cause". Read as one exit for the whole pod, every rank
of the pod would seem to have crashed with code 1 and the message would be the summary's rule lines
(seen on a real node). This reads the blocks, so each rank gets its own exit code (a worker the agent
stopped: SIGTERM) and its own last error line: the `[rank<N>]: ...` line torch prefixes to a rank's
uncaught exception, when the tail still holds it, else the block's traceback line.

Pure text parsing, bounded: the message is at most the kubelet's 4 KiB, and anything else is ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# torch/distributed/elastic/multiprocessing/errors/__init__.py (ChildFailedError.format_msg): the block
# of one failure. `exitcode` is Popen's: -N for signal N.
_BLOCK = re.compile(
    r"^\[\d+\]:\s*\n"
    r"(?:[ \t]+time\s*:[^\n]*\n)?"
    r"(?:[ \t]+host\s*:[^\n]*\n)?"
    r"[ \t]+rank\s*:\s*(?P<rank>\d{1,7})\s*\(local_rank:\s*(?P<local>\d{1,7})\)[^\n]*\n"
    r"[ \t]+exitcode\s*:\s*(?P<code>-?\d{1,4})[^\n]*\n"
    r"(?:[ \t]+error_file\s*:[^\n]*\n)?"
    r"(?:[ \t]+traceback\s*:[ \t]*(?P<traceback>[^\n]*))?",
    re.MULTILINE,
)
_ROOT_CAUSE = "Root Cause (first observed failure):"
_NO_TRACEBACK = "To enable traceback see"
MAX_MESSAGE = 16384  # far above the kubelet's 4096 bytes: a longer text is not a termination message


@dataclass(frozen=True, slots=True)
class WorkerFailure:
    """One failed worker as torchrun's agent summarized it."""

    rank: int
    local_rank: int
    exit_code: int  # as a container runtime would say it: 128 + N for signal N
    root_cause: bool  # torchrun's first observed failure
    line: str  # the worker's own last error line, or the summary's traceback line ('' if neither says)


def _container_code(popen_code: int) -> int:
    return 128 - popen_code if popen_code < 0 else popen_code


def _rank_line(message: str, rank: int) -> str:
    """The last line torch's excepthook prefixed with `[rank<N>]:` (the exception), if the tail has it."""
    prefix = f"[rank{rank}]:"
    lines = [line[len(prefix):].strip() for line in message.splitlines() if line.startswith(prefix)]
    lines = [line for line in lines if line]
    return lines[-1] if lines else ""


def torchrun_failures(message: str) -> list[WorkerFailure]:
    """The failed workers torchrun's summary lists in `message` (empty when there is no summary)."""
    if not message or len(message) > MAX_MESSAGE or "FAILED" not in message:
        return []
    root_at = message.find(_ROOT_CAUSE)
    found: dict[int, WorkerFailure] = {}
    for match in _BLOCK.finditer(message):
        rank = int(match["rank"])
        traceback = (match["traceback"] or "").strip()
        if traceback.startswith(_NO_TRACEBACK):
            traceback = ""
        line = _rank_line(message, rank) or traceback
        root = root_at >= 0 and match.start() > root_at
        failure = WorkerFailure(rank, int(match["local"]), _container_code(int(match["code"])), root, line)
        if rank not in found or root:
            found[rank] = failure
    return sorted(found.values(), key=lambda f: f.rank)
