"""Per-rank exits out of torchrun's failure summary, as it reaches a container's termination message.

Under torchrun the container's exit code is the agent's (1 whenever a worker failed) and the log's
tail, which `FallbackToLogsOnError` makes the termination message, ends with the agent's
`ChildFailedError` summary: one block per failed worker (global rank, local rank, exit code, a
traceback line) and the first failure as "Root Cause". Read as one exit for the whole pod, every rank
of the pod would seem to have crashed with code 1 and the message would be the summary's rule lines.
This reads the blocks, so each rank gets its own exit code (a worker the agent
stopped: SIGTERM) and its own last error line: the `[rank<N>]: ...` line torch prefixes to a rank's
uncaught exception, when the tail still holds it, else the block's traceback line.

Pure text parsing, bounded: the message is at most the kubelet's 4 KiB, and anything else is ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# torch/distributed/elastic/multiprocessing/errors/__init__.py (ChildFailedError.format_msg): one block
# per failure, "[<i>]:" then "  <key> : <value>" lines; the traceback (a worker's error file's
# py_callstack, indented) runs on to the next rule line. `exitcode` is Popen's: -N for signal N.
_BLOCK_START = re.compile(r"^\[\d{1,6}\]:\s*$")
_FIELD = re.compile(r"^\s+(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_RULE = re.compile(r"^(?:-{20,}|={20,})\s*$")
_RANK = re.compile(r"^(\d{1,7})\s*\(local_rank:\s*(\d{1,7})\)")
_CODE = re.compile(r"^(-?\d{1,4})\b")
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


def _blocks(message: str) -> list[tuple[int, list[str]]]:
    """(line index, lines) of each "[<i>]:" block, up to the next block or rule line."""
    lines = message.splitlines()
    out: list[tuple[int, list[str]]] = []
    current: list[str] | None = None
    for index, line in enumerate(lines):
        if _BLOCK_START.match(line):
            current = []
            out.append((index, current))
        elif _RULE.match(line):
            current = None
        elif current is not None:
            current.append(line)
    return out


def _failure(lines: list[str], root: bool, message: str) -> WorkerFailure | None:
    fields: dict[str, str] = {}
    traceback: list[str] = []
    for line in lines:
        match = _FIELD.match(line)
        if match and match[1] not in fields and not traceback:
            fields[match[1]] = match[2].strip()
            if match[1] == "traceback":
                traceback.append(match[2].strip())
        elif traceback:
            traceback.append(line.strip())
    rank = _RANK.match(fields.get("rank", ""))
    code = _CODE.match(fields.get("exitcode", ""))
    if rank is None or code is None:
        return None
    told = [t for t in traceback if t]
    last = told[-1] if told else ""
    if last.startswith(_NO_TRACEBACK):
        last = ""
    line = last if len(told) > 1 else (_rank_line(message, int(rank[1])) or last)
    return WorkerFailure(int(rank[1]), int(rank[2]), _container_code(int(code[1])), root, line)


def torchrun_failures(message: str) -> list[WorkerFailure]:
    """The failed workers torchrun's summary lists in `message` (empty when there is no summary). A
    block whose traceback is a worker's error file (several lines) gives that traceback's last line,
    the exception; else the `[rank<N>]:` line of the log, else the one-line traceback."""
    if not message or len(message) > MAX_MESSAGE or "FAILED" not in message:
        return []
    lines = message.splitlines()
    root_at = next((i for i, line in enumerate(lines) if line.strip() == _ROOT_CAUSE), None)
    found: dict[int, WorkerFailure] = {}
    for index, block in _blocks(message):
        failure = _failure(block, root_at is not None and index > root_at, message)
        if failure is not None and (failure.rank not in found or failure.root_cause):
            found[failure.rank] = failure
    return sorted(found.values(), key=lambda f: f.rank)
