"""Runs PyTorch's own analyzer, torchfrtrace, on many dump directories from one warm process.

    python -m frscope.testing.sweep.tft_worker        # one directory a line on stdin

For each directory it forks a child (torch is imported once, here) that runs
`torch.distributed.flight_recorder.fr_trace.main([dir, "--prefix", "nccl_trace_rank_"])` with its output
going to `<dir>/../torchfrtrace.txt`, and writes the exit status to `<dir>/../torchfrtrace.rc`. torchfrtrace
unpickles the dumps with `pickle.load`: run it only on dumps this sweep wrote. Standard library and torch
only. A child that runs past TIMEOUT_S is killed (rc 124).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch  # noqa: F401
from torch.distributed.flight_recorder import fr_trace

TIMEOUT_S = 60.0


def _variant(directory: Path) -> str:
    """'pickle' -> '' (torchfrtrace.txt), 'pickle-pgfixed' -> '-pgfixed' (torchfrtrace-pgfixed.txt)."""
    return directory.name[len("pickle"):] if directory.name.startswith("pickle") else f"-{directory.name}"


def run(directory: Path) -> int:
    out = directory.parent / f"torchfrtrace{_variant(directory)}.txt"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            fr_trace.main([str(directory), "--prefix", "nccl_trace_rank_"])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    end = time.monotonic() + TIMEOUT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 124
        time.sleep(0.02)


def main() -> int:
    for line in sys.stdin:
        directory = Path(line.strip())
        if not line.strip():
            continue
        rc = run(directory)
        (directory.parent / f"torchfrtrace{_variant(directory)}.rc").write_text(f"{rc}\n")
        sys.stdout.write(f"{rc}\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
