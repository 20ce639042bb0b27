"""Start `rhythm_job.py` as a real multi-process gloo job on loopback, laid out in pods: each pod's
ranks serve their worker-server sockets in the pod's own socket dir through frscope's zero-code
bootstrap (PYTHONPATH + FRSCOPE_SOCKET_DIR, no frscope import in the job), the way the webhook sets
a pod up. Every rank process is killed by PID when the context exits. No torch in this module."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from frscope.demo.ports import rendezvous_port
from frscope.sidecar.bootstrap import BOOTSTRAP_DIR

JOB_SCRIPT = Path(__file__).with_name("rhythm_job.py")


@dataclass
class RhythmJob:
    work_dir: Path
    out: Path
    pods: dict[int, Path]  # pod index -> its socket dir
    pod_of: dict[int, int]  # rank -> pod index
    procs: dict[int, subprocess.Popen[bytes]]
    logs: dict[int, Path]

    def ranks(self) -> list[int]:
        return sorted(self.procs)

    def alive(self, rank: int) -> bool:
        return self.procs[rank].poll() is None

    def socket_path(self, rank: int) -> Path:
        return self.pods[self.pod_of[rank]] / f"rank-{rank}.sock"

    def hang_started_ns(self) -> int | None:
        """When the culprit stopped (it writes hang-<rank> first), None before."""
        for path in self.out.glob("hang-*"):
            text = path.read_text().strip()
            if text:
                return int(text)
        return None

    def slow_started_ns(self) -> int | None:
        """When the culprit's first slow step began (it writes slow-<rank>), None before."""
        for path in self.out.glob("slow-*"):
            text = path.read_text().strip()
            if text:
                return int(text)
        return None

    def phases(self) -> dict[int, tuple[str, float]]:
        """Per rank: what it does now (rhythm_job's phase marker) and for how many seconds."""
        out: dict[int, tuple[str, float]] = {}
        now = time.time_ns()
        for rank in self.ranks():
            try:
                phase, _, since = (self.out / f"phase-{rank}").read_text().rpartition(" ")
                out[rank] = (phase, (now - int(since)) / 1e9)
            except (OSError, ValueError):
                continue
        return out

    def finished(self) -> bool:
        return all(proc.poll() is not None for proc in self.procs.values())

    def log_tail(self, rank: int, limit: int = 3000) -> str:
        try:
            return self.logs[rank].read_bytes()[-limit:].decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_for_sockets(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(self.socket_path(r).exists() for r in self.ranks()):
            dead = [r for r in self.ranks() if not self.alive(r)]
            if dead:
                raise RuntimeError(f"rank {dead[0]} exited early: {self.log_tail(dead[0])}")
            if time.monotonic() > deadline:
                raise RuntimeError("the job's sockets never appeared")
            time.sleep(0.2)



@contextmanager
def start_rhythm_job(world: int, ranks_per_pod: int, job_args: list[str], *, lifetime_s: float = 900.0,
                     python: str | None = None, env_extra: dict[str, str] | None = None) -> Iterator[RhythmJob]:
    """`world` ranks, `ranks_per_pod` to a pod (socket dir), running rhythm_job.py with `job_args`
    (and `env_extra` in every rank's environment)."""
    base = tempfile.gettempdir() if len(tempfile.gettempdir()) < 60 else "/tmp"
    work_dir = Path(tempfile.mkdtemp(prefix="frscope-rhythm-", dir=base))
    out = work_dir / "out"
    out.mkdir()
    pod_of = {rank: rank // ranks_per_pod for rank in range(world)}
    pods = {pod: work_dir / f"pod{pod}" for pod in sorted(set(pod_of.values()))}
    for path in pods.values():
        path.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(BOOTSTRAP_DIR),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(rendezvous_port()),
        "TORCH_FR_BUFFER_SIZE": "2000",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **(env_extra or {}),
    }
    procs: dict[int, subprocess.Popen[bytes]] = {}
    files: list[IO[bytes]] = []
    logs = {rank: work_dir / f"rank-{rank}.log" for rank in range(world)}
    cmd = [python or sys.executable, str(JOB_SCRIPT), "--out", str(out), "--max-lifetime", str(lifetime_s),
           *job_args]
    try:
        for rank in range(world):
            log = open(logs[rank], "wb")  # closed in the finally below
            files.append(log)
            procs[rank] = subprocess.Popen(
                cmd, env={**env, "RANK": str(rank), "FRSCOPE_SOCKET_DIR": str(pods[pod_of[rank]])},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=work_dir,
                start_new_session=True,
            )
        yield RhythmJob(work_dir, out, pods, pod_of, procs, logs)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
        for proc in procs.values():
            proc.wait(timeout=30)
        for file in files:
            file.close()
        shutil.rmtree(work_dir, ignore_errors=True)
