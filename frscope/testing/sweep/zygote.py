"""Imports torch once, then forks every rank of every job from that warm process.

    python -m frscope.testing.sweep.zygote          # reads one JSON request a line on stdin

A request `{"spec": {...}, "cap": DIR, "work": DIR, "lifetime_s": N}` forks a job parent (its own session,
so the controller ends a whole job with one killpg) that forks the job's ranks and records, per rank,
`work/rank-<r>.pid` and, once it ends, `work/rank-<r>.exit` (the exit code as a container runtime
reports it: 128 + N for signal N). The zygote answers `{"pid": <job parent>}` on stdout.

Forking after `import torch` is safe for CPU/gloo as long as no process group or OpenMP pool exists in the
zygote. Standard library and torch only (it runs in other torch versions' venvs too).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")

import torch
import torch.distributed  # noqa: F401

from frscope.testing.sweep import rank as rank_program


def _warm_symbolizer() -> None:
    """The first stack symbolization in a process costs 1-3 s of CPU (every rank's first `_dump_fr_trace()`
    paid it); done once here, every forked rank inherits the warm state."""
    try:
        from torch._C._profiler import gather_traceback, symbolize_tracebacks

        symbolize_tracebacks([gather_traceback(True, True, False)])
    except Exception as exc:  # another torch version: the ranks pay it themselves
        print(f"zygote: no symbolizer warm-up ({type(exc).__name__}: {exc})", file=sys.stderr)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code  # -9 -> 137, as a container runtime reports it


def _rank_child(spec: dict[str, Any], rank: int, cap: Path, work: Path, lifetime_s: float) -> None:
    code = 1
    try:
        os.environ.update({
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(spec["world"]),
            "LOCAL_WORLD_SIZE": str(spec["world"]), "FRSCOPE_SOCKET_DIR": str(work),
        })
        log = os.open(cap / "logs" / f"rank-{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        code = rank_program.main(spec, rank, cap, work, lifetime_s)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _job_parent(request: dict[str, Any]) -> None:
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    spec, cap, work = request["spec"], Path(request["cap"]), Path(request["work"])
    lifetime_s = float(request.get("lifetime_s", 120))
    (cap / "logs").mkdir(parents=True, exist_ok=True)
    pids: dict[int, int] = {}
    for rank in range(int(spec["world"])):
        pid = os.fork()
        if pid == 0:
            _rank_child(spec, rank, cap, work, lifetime_s)
        pids[pid] = rank
        (work / f"rank-{rank}.pid").write_text(str(pid))
    while pids:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid in pids:
            rank = pids.pop(pid)
            tmp = work / f".rank-{rank}.exit"
            tmp.write_text(str(_exit_code(status)))
            tmp.replace(work / f"rank-{rank}.exit")
    os._exit(0)


def main() -> int:
    _warm_symbolizer()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # job parents are reaped by the kernel
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                _job_parent(request)
            finally:
                os._exit(1)
        sys.stdout.write(json.dumps({"pid": pid}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
