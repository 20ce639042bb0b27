"""Run the demo job locally and collect every rank's recorder while it is hung.

`run_fault_job()` starts one process per rank (``python -m frscope.demo.job``) on loopback, waits
until every rank's worker-server socket answers and the job has reached its final state (blocked
or idle, recorders no longer changing), then takes a snapshot of each rank over its socket and
writes `<out>/rank-<r>.json` (see `snapshot.py`). Gloo writes no dump on timeout and a recorder
read after a collective failed looks like a success, so this is the only moment that tells the
truth.

No torch in this module: it runs in the CLI. The rank processes are always killed, by PID, when
the job context exits, and each one also has its own hard deadline (`--max-lifetime`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import frscope
from frscope.demo.faults import FAULTS, culprit_ranks
from frscope.demo.ports import rendezvous_port
from frscope.demo.socket_snapshot import (
    Snapshot,
    fetch_trace,
    progress_signature,
    take_snapshot,
    write_snapshot,
)
from frscope.demo.unix_http import WorkerServerError, call_handler

REQUEST_TIMEOUT_S = 5.0
POLL_INTERVAL_S = 0.2
DUMP_REQUEST = "dump-request"
# Unix socket paths are limited to 107 bytes; the socket directory must be short.
_MAX_SOCKET_DIR = 80


class LaunchError(RuntimeError):
    """The job could not be brought up (a rank died early, a socket never answered)."""


@dataclass
class CollectedJob:
    """What one run of the demo job produced, for the CLI and the tests."""

    fault: str
    world_size: int
    out_dir: Path
    culprit_ranks: tuple[int, ...]
    # rank -> snapshot file written; ranks without one are in `skipped`, with the reason.
    snapshots: dict[int, Path] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)
    pickle_dumps: dict[int, Path] = field(default_factory=dict)
    # rank -> exit code, None where the rank was still running when collected (then killed).
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    # False when the deadline came first (recorders still changing, or, for "poll" faults, ranks
    # still running): collected anyway.
    settled: bool = True
    log_tails: dict[int, str] = field(default_factory=dict)
    elapsed_s: float = 0.0



def _short_tempdir() -> Path:
    base = tempfile.gettempdir()
    if len(base) > _MAX_SOCKET_DIR - 20:
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix="frscope-", dir=base))


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def wait_until_stable(
    observe: Callable[[], tuple[bool, object]], settle_s: float, deadline: float, interval_s: float
) -> bool:
    """Poll `observe` (ready?, signature) until it is ready and its signature has not changed for
    `settle_s`; False when `deadline` (monotonic) comes first."""
    previous: object = None
    stable_since = time.monotonic()
    while True:
        now = time.monotonic()
        ready, current = observe()
        if not ready or current != previous:
            stable_since = now
        elif now - stable_since >= settle_s:
            return True
        if now > deadline:
            return False
        previous = current
        time.sleep(interval_s)


class LocalJob:
    """The rank processes of one demo job, and their sockets. Use `start_job()`."""

    def __init__(self, fault: str, world_size: int, work_dir: Path, procs: dict[int, subprocess.Popen[bytes]],
                 logs: dict[int, Path], pickle_dir: Path | None, pickle_prefix: str) -> None:
        self.fault = fault
        self.world_size = world_size
        self.work_dir = work_dir
        self.procs = procs
        self.logs = logs
        self.pickle_dir = pickle_dir
        self.pickle_prefix = pickle_prefix

    def socket_path(self, rank: int) -> Path:
        return self.work_dir / f"rank-{rank}.sock"

    def alive(self, rank: int) -> bool:
        return self.procs[rank].poll() is None

    def exit_code(self, rank: int) -> int | None:
        return self.procs[rank].poll()

    def phase(self, rank: int) -> str | None:
        try:
            return (self.work_dir / f"rank-{rank}.phase").read_text()
        except OSError:
            return None

    def log_tail(self, rank: int) -> str:
        return _tail(self.logs[rank])

    def ranks(self) -> range:
        return range(self.world_size)

    def wait_for_sockets(self, deadline: float) -> None:
        """Until every rank's worker server answers `ping`; LaunchError if a rank dies first."""
        pending = set(self.ranks())
        while pending:
            for rank in sorted(pending):
                if not self.alive(rank):
                    raise LaunchError(
                        f"rank {rank} exited with code {self.exit_code(rank)} before its socket answered:\n"
                        f"{self.log_tail(rank)}"
                    )
                if self.socket_path(rank).exists():
                    try:
                        call_handler(self.socket_path(rank), "ping", REQUEST_TIMEOUT_S)
                    except WorkerServerError:
                        continue
                    pending.discard(rank)
            if pending and time.monotonic() > deadline:
                raise LaunchError(f"ranks {sorted(pending)} did not open their sockets in time")
            if pending:
                time.sleep(POLL_INTERVAL_S)

    def wait_settled(self, deadline: float, settle_s: float) -> bool:
        """Until every live rank has reached its final phase and no recorder changed for `settle_s`.

        Returns False when the deadline came first. A rank that dies meanwhile is left out.
        """

        def observe() -> tuple[bool, object]:
            live = [r for r in self.ranks() if self.alive(r)]
            current: dict[int, tuple[int, int, int] | None] = {}
            for rank in live:
                try:
                    current[rank] = progress_signature(fetch_trace(self.socket_path(rank), REQUEST_TIMEOUT_S))
                except WorkerServerError:
                    current[rank] = None
            ready = all(self.phase(r) is not None for r in live) and None not in current.values()
            return ready, current

        return wait_until_stable(observe, settle_s, deadline, POLL_INTERVAL_S)

    def collect(self, out_dir: Path, result: CollectedJob) -> None:
        """One snapshot per live rank into `out_dir`; a rank that does not answer is skipped."""
        for rank in self.ranks():
            if not self.alive(rank):
                result.skipped[rank] = f"process exited with code {self.exit_code(rank)} before collection"
                continue
            try:
                snapshot = take_snapshot(rank, self.socket_path(rank), REQUEST_TIMEOUT_S)
            except WorkerServerError as exc:
                result.skipped[rank] = str(exc)
                continue
            result.snapshots[rank] = write_snapshot(snapshot, out_dir)

    def poll_until_gone(self, out_dir: Path, result: CollectedJob, deadline: float, interval: float) -> None:
        """Snapshot every live rank every `interval` s until all ranks exit; keep each one's last good.

        For faults where ranks die: whatever they knew is gone with them, so the last snapshot
        taken while they lived is all there is, and it may be older than the failure.
        """
        last_good: dict[int, Snapshot] = {}
        errors: dict[int, str] = {}
        while any(self.alive(r) for r in self.ranks()) and time.monotonic() < deadline:
            for rank in self.ranks():
                if not self.alive(rank) or not self.socket_path(rank).exists():
                    continue
                try:
                    last_good[rank] = take_snapshot(rank, self.socket_path(rank), interval * 5)
                except WorkerServerError as exc:
                    errors[rank] = str(exc)
            time.sleep(interval)
        for rank in self.ranks():
            if rank in last_good:
                result.snapshots[rank] = write_snapshot(last_good[rank], out_dir)
            else:
                result.skipped[rank] = errors.get(rank, "no snapshot answered before the rank exited")

    def dump_pickles(self, deadline: float, result: CollectedJob) -> None:
        """Ask every live rank for `_dump_fr_trace()` bytes and wait for the files (see job.py)."""
        if self.pickle_dir is None:
            raise ValueError("the job was started without a pickle dump directory")
        wanted = {r: self.pickle_dir / f"{self.pickle_prefix}{r}" for r in self.ranks() if self.alive(r)}
        request = self.pickle_dir / DUMP_REQUEST
        request.touch()
        try:
            while wanted and time.monotonic() < deadline:
                for rank, path in list(wanted.items()):
                    if path.exists():
                        result.pickle_dumps[rank] = path
                        del wanted[rank]
                time.sleep(POLL_INTERVAL_S)
        finally:
            # Only the dumps stay in the directory.
            request.unlink(missing_ok=True)
        for rank in wanted:
            reasons = [result.skipped.get(rank), "no pickle dump in time"]
            result.skipped[rank] = "; ".join(r for r in reasons if r)


@contextmanager
def start_job(fault: str, world_size: int, *, lifetime_s: float, python: str | None = None,
              pickle_dir: Path | None = None, pickle_prefix: str = "nccl_trace_rank_") -> Iterator[LocalJob]:
    """Start the job's rank processes; on exit kill every one of them by PID and wait for it."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}")
    if world_size < FAULTS[fault].min_world_size:
        raise ValueError(f"fault {fault!r} needs at least {FAULTS[fault].min_world_size} ranks")
    work_dir = _short_tempdir()
    procs: dict[int, subprocess.Popen[bytes]] = {}
    log_files: dict[int, IO[bytes]] = {}
    logs = {rank: work_dir / f"rank-{rank}.log" for rank in range(world_size)}
    env = _job_env(world_size)
    cmd = [python or sys.executable, "-m", "frscope.demo.job", "--fault", fault,
           "--socket-dir", str(work_dir), "--max-lifetime", str(int(lifetime_s) + 1)]
    if pickle_dir is not None:
        pickle_dir.mkdir(parents=True, exist_ok=True)
        cmd += ["--pickle-dump-dir", str(pickle_dir), "--pickle-prefix", pickle_prefix]
    try:
        for rank in range(world_size):
            log_files[rank] = open(logs[rank], "wb")  # closed in the finally below
            procs[rank] = subprocess.Popen(
                cmd,
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdin=subprocess.DEVNULL,
                stdout=log_files[rank],
                stderr=subprocess.STDOUT,
                cwd=work_dir,
                # Its own session: a Ctrl-C at the terminal reaches the launcher, which ends the ranks.
                start_new_session=True,
            )
        yield LocalJob(fault, world_size, work_dir, procs, logs, pickle_dir, pickle_prefix)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait on Python
                pass
        for f in log_files.values():
            f.close()
        shutil.rmtree(work_dir, ignore_errors=True)


def _job_env(world_size: int) -> dict[str, str]:
    # The ranks import frscope.demo.job from wherever this frscope is, installed or a checkout.
    package_root = str(Path(frscope.__file__).resolve().parent.parent)
    pythonpath = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "PYTHONPATH": pythonpath,
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(rendezvous_port()),
        "TORCH_FR_BUFFER_SIZE": os.environ.get("TORCH_FR_BUFFER_SIZE", "2000"),
        # Tiny tensors: one thread per rank keeps four ranks from fighting over two cores.
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


def run_fault_job(fault: str, world_size: int, out_dir: Path, timeout_s: float = 50.0, *,
                  settle_s: float = 1.5, hold_s: float = 0.0, pickle_dir: Path | None = None,
                  pickle_prefix: str = "nccl_trace_rank_", python: str | None = None) -> CollectedJob:
    """Run the demo job with `fault`, write one snapshot per rank into `out_dir`, end the job.

    `hold_s` keeps the job in its final state that much longer before collecting, so that the
    blocked collectives are older than an analyzer's stall threshold (the fixtures use it).
    Never raises for one rank that does not answer: it is listed in `skipped`. Raises LaunchError
    only when the job cannot be brought up at all (after one retry, for a port taken meanwhile).
    """
    args = (fault, world_size, out_dir, timeout_s, settle_s, hold_s, pickle_dir, pickle_prefix, python)
    try:
        return _run_once(*args)
    except LaunchError as exc:
        if "address already in use" not in str(exc).lower():
            raise
        return _run_once(*args)


def _run_once(fault: str, world_size: int, out_dir: Path, timeout_s: float, settle_s: float, hold_s: float,
              pickle_dir: Path | None, pickle_prefix: str, python: str | None) -> CollectedJob:
    started = time.monotonic()
    deadline = started + timeout_s
    out_dir.mkdir(parents=True, exist_ok=True)
    result = CollectedJob(fault, world_size, out_dir, culprit_ranks(fault, world_size))
    with start_job(fault, world_size, lifetime_s=timeout_s + 10, python=python,
                   pickle_dir=pickle_dir, pickle_prefix=pickle_prefix) as job:
        try:
            if FAULTS[fault].collect == "poll":
                job.poll_until_gone(out_dir, result, deadline, interval=0.1)
                # Here the final state is every rank gone; ranks still running hit the deadline.
                result.settled = not any(job.alive(r) for r in job.ranks())
            else:
                job.wait_for_sockets(deadline)
                result.settled = job.wait_settled(deadline, settle_s)
                time.sleep(max(0.0, min(hold_s, deadline - time.monotonic() - 5.0)))
                job.collect(out_dir, result)
                if pickle_dir is not None:
                    job.dump_pickles(deadline, result)
        finally:
            result.exit_codes = {r: job.exit_code(r) for r in job.ranks()}
            result.log_tails = {r: job.log_tail(r) for r in job.ranks()}
    result.elapsed_s = time.monotonic() - started
    return result
