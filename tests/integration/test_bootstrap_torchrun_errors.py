"""Under torchrun, a rank's uncaught exception reaches the end of the container's log: the bootstrap
writes it to the error file torchrun's agent names (as torch's `@record` would), so the agent's failure
summary, which is all Kubernetes keeps of the log as the termination message (its last 2 KiB), names
the exception. Without the bootstrap the summary says only "To enable traceback see ...".

Real torchrun, two workers on loopback, gloo; the last rank raises after three all_reduces.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from frscope.records.torchrun_exits import WorkerFailure, torchrun_failures
from frscope.sidecar.bootstrap import BOOTSTRAP_DIR
from tests.integration.test_sidecar_support import free_port

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(300)]

MESSAGE = "frscope-test: this rank lost its data shard"
SCRIPT = f"""\
import datetime
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(8)
for _ in range(3):
    dist.all_reduce(t)
if rank == world - 1:
    raise RuntimeError("{MESSAGE}")
dist.all_reduce(t)
"""
# The raising rank's own exit: 1, or SIGABRT when gloo's teardown aborts the exiting process (also
# without the bootstrap): torchrun reports a signal as its negative, a shell as 134.
RAISED_EXIT_CODES = (1, -6, 134)
KUBELET_TAIL = 2048  # FallbackToLogsOnError: the log's last 2048 bytes (or 80 lines)


def run_torchrun(tmp_path: Path, bootstrap: bool) -> str:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "FRSCOPE_")) and k not in ("RANK", "WORLD_SIZE")}
    env.update(PYTHONPATH=str(BOOTSTRAP_DIR), FRSCOPE_SOCKET_DIR=str(sockets), PYTHONUNBUFFERED="1",
               FRSCOPE_BOOTSTRAP="1" if bootstrap else "0")
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--nproc-per-node=2", f"--master-port={free_port()}", str(script)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, timeout=240,
                          check=False)
    assert proc.returncode == 1, proc.stdout.decode(errors="replace")[-4000:]
    return proc.stdout[-KUBELET_TAIL:].decode(errors="replace")


def raiser(tail: str) -> WorkerFailure:
    """Rank 1's failure in torchrun's summary, root cause or not: torchrun picks the root cause by the
    failures' times in whole seconds, and rank 0, failing on gloo's "Connection closed by peer" in the
    same second, is sometimes listed first (a loaded machine)."""
    failures = {f.rank: f for f in torchrun_failures(tail)}
    assert 1 in failures, tail
    return failures[1]


def test_the_raising_ranks_failure_names_the_exception_in_the_kept_tail(tmp_path: Path) -> None:
    tail = run_torchrun(tmp_path, bootstrap=True)
    mine = raiser(tail)
    assert mine.exit_code in RAISED_EXIT_CODES, tail
    assert mine.line == f"RuntimeError: {MESSAGE}", tail


def test_without_the_bootstrap_the_tail_holds_no_exception(tmp_path: Path) -> None:
    tail = run_torchrun(tmp_path, bootstrap=False)
    mine = raiser(tail)
    assert mine.exit_code in RAISED_EXIT_CODES, tail
    # torchrun's own words where no error file exists: its hint for an exit code, or the signal that
    # ended the process (gloo's teardown can abort the raising rank).
    assert "To enable traceback see" in tail or re.search(r"Signal \d+ \(SIG\w+\) received by PID", tail), tail
    assert mine.line in ("", f"RuntimeError: {MESSAGE}") or mine.line.startswith("Signal "), tail
