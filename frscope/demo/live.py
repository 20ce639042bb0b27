"""`frscope demo`'s live path: the demo job with a local `frscope sidecar` beside it.

The sidecar runs as its own process on loopback (`frscope sidecar --socket-dir <job dir> --port 0`),
polls every rank's worker-server socket, and this module only talks to its HTTP API, the way the
operator does in a cluster: it waits on `/v1/status` until every rank answers and the job has
stopped moving, then takes `/v1/snapshot?refresh=1` (every rank's recorder and stacks, while the
ranks are still blocked) and writes one `rank-<r>.json` per rank, the format `frscope analyze` reads.
"""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from frscope.demo.faults import FAULTS, culprit_ranks
from frscope.demo.launcher import (
    POLL_INTERVAL_S,
    CollectedJob,
    LaunchError,
    LocalJob,
    start_job,
    wait_until_stable,
)

SIDECAR_POLL_S = 0.25
SIDECAR_START_S = 30.0


class LocalSidecar:
    """`frscope sidecar` as a child process on loopback; ended with SIGTERM (then SIGKILL) by PID."""

    def __init__(self, socket_dir: Path, stall_after_s: float, python: str | None = None) -> None:
        self.port_file = socket_dir / "sidecar.port"
        self.log_path = socket_dir / "sidecar.log"
        self._log = open(self.log_path, "wb")  # closed in stop()
        cmd = [python or sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(socket_dir),
               "--evidence-dir", "none", "--host", "127.0.0.1", "--port", "0", "--port-file", str(self.port_file),
               "--poll-interval", str(SIDECAR_POLL_S), "--stall-after", str(stall_after_s), "--pod", "local-demo"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.port: int | None = None

    def wait_listening(self, deadline: float) -> None:
        while self.port is None:
            if self.proc.poll() is not None:
                raise LaunchError(f"the local sidecar exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.port = int(self.port_file.read_text())
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise LaunchError(f"the local sidecar did not start listening:\n{self.log_tail()}") from None
                time.sleep(POLL_INTERVAL_S)

    def get(self, path: str, timeout: float = 30.0) -> Any:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # loopback, a URL we built
            body = resp.read()
            if resp.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
        return json.loads(body)

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-limit:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
        return self.proc.returncode


def _signature(status: dict[str, Any]) -> dict[str, Any]:
    """What changes while the job makes progress: every rank's per-group enqueued/completed seqs."""
    return {
        rank: {pg: (g.get("last_enqueued_seq"), g.get("last_completed_seq")) for pg, g in r.get("groups", {}).items()}
        for rank, r in status.get("ranks", {}).items()
    }


def _wait_ranks_up(job: LocalJob, sidecar: LocalSidecar, deadline: float) -> dict[str, Any]:
    while True:
        for rank in job.ranks():
            if not job.alive(rank):
                raise LaunchError(
                    f"rank {rank} exited with code {job.exit_code(rank)} before the sidecar reached it:\n"
                    f"{job.log_tail(rank)}"
                )
        status: dict[str, Any] = sidecar.get("/v1/status")
        ranks = status.get("ranks", {})
        if all(ranks.get(str(r), {}).get("up") for r in job.ranks()):
            return status
        if time.monotonic() > deadline:
            raise LaunchError(f"ranks never all answered the sidecar: {sorted(ranks)}")
        time.sleep(POLL_INTERVAL_S)


def _wait_settled(job: LocalJob, sidecar: LocalSidecar, deadline: float, settle_s: float) -> bool:
    """Until every live rank is in its final phase and the sidecar saw no progress for `settle_s`."""

    def observe() -> tuple[bool, object]:
        status = sidecar.get("/v1/status")
        in_final_phase = all(job.phase(r) is not None for r in job.ranks() if job.alive(r))
        all_up = all(r.get("up") for r in status.get("ranks", {}).values())
        return in_final_phase and all_up, _signature(status)

    return wait_until_stable(observe, settle_s, deadline, SIDECAR_POLL_S)


def _write_piece(piece: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / f"rank-{piece['rank']}.json"
    tmp = out_dir / f".{path.name}.partial"
    tmp.write_text(json.dumps(piece, indent=1) + "\n")
    tmp.replace(path)
    return path


def run_with_sidecar(fault: str, world_size: int, out_dir: Path, timeout_s: float = 50.0, *,
                     settle_s: float = 1.5, stall_after_s: float = 1.0, python: str | None = None) -> CollectedJob:
    """Run the demo job beside a local sidecar; write the sidecar's per-rank snapshots into `out_dir`.

    Only for faults that end with every rank alive ("settle" faults). Raises LaunchError when the job
    or the sidecar cannot be brought up; a rank the sidecar could not read is listed in `skipped`.
    """
    if FAULTS[fault].collect != "settle":
        raise ValueError(f"fault {fault!r} kills ranks; the live demo path serves faults that leave them running")
    started = time.monotonic()
    deadline = started + timeout_s
    out_dir.mkdir(parents=True, exist_ok=True)
    result = CollectedJob(fault, world_size, out_dir, culprit_ranks(fault, world_size))
    with start_job(fault, world_size, lifetime_s=timeout_s + 10, python=python) as job:
        sidecar = LocalSidecar(job.work_dir, stall_after_s, python)
        try:
            sidecar.wait_listening(min(deadline, time.monotonic() + SIDECAR_START_S))
            _wait_ranks_up(job, sidecar, deadline)
            result.settled = _wait_settled(job, sidecar, deadline, settle_s)
            snapshot = sidecar.get("/v1/snapshot?refresh=1")
            for piece in snapshot.get("ranks", []):
                result.snapshots[int(piece["rank"])] = _write_piece(piece, out_dir)
            for error in snapshot.get("errors", []):
                if isinstance(error.get("rank"), int) and error["rank"] not in result.snapshots:
                    result.skipped[error["rank"]] = str(error.get("message"))
            for rank in job.ranks():
                if rank not in result.snapshots and rank not in result.skipped:
                    result.skipped[rank] = "the sidecar had no recorder for this rank"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise LaunchError(f"the local sidecar did not answer: {exc}\n{sidecar.log_tail()}") from exc
        finally:
            result.exit_codes = {r: job.exit_code(r) for r in job.ranks()}
            result.log_tails = {r: job.log_tail(r) for r in job.ranks()}
            result.log_tails[-1] = sidecar.log_tail()
            sidecar.stop()
    result.elapsed_s = time.monotonic() - started
    return result
