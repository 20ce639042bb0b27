"""Run one sweep job through a zygote and capture it in every form, the way frscope meets it.

Forms written into the job's capture directory:
- `snapshot/sidecar-snapshot.json`: a sidecar's snapshot envelope (frscope.wire): each rank's recorder
  (`fr_trace_json`) and live stacks (`dump_traceback`) read over its worker-server socket while the job is
  blocked; a rank that does not answer in time keeps the last recorder a poll got and an error. For jobs
  whose ranks die, what a sidecar polling every POLL_S kept, with a dump file a rank wrote later taking
  its place (as the sidecar prefers the newer one);
- `pickle/nccl_trace_rank_<r>`: torch's `_dump_fr_trace()`; `json/nccl_trace_rank_<r>.json`:
  `_dump_fr_trace_json()`; taken by each rank on request while blocked, or on its own error path;
- `exits.json`: how the ranks that ended ended (`frscope analyze --exits`);
- `truth.json`: what the generator injected. `meta.json`: timings, exit codes, whether it settled.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from frscope import wire
from frscope.demo.unix_http import WorkerServerError, call_handler
from frscope.testing.sweep.classes import CLASSES, NOT_JOINED, P2P, PIPELINE_WHY
from frscope.testing.sweep.spec import JobSpec

POLL_S = 0.3
SETTLE_S = 1.0
# A hung job is held until its blocked collectives are this old; scoring uses STUCK_AFTER_S (< this).
HOLD_S = 3.0
STUCK_AFTER_S = 2.0
ANSWER_TIMEOUT_S = 2.0
DUMP_WAIT_S = 8.0
JOB_DEADLINE_S = 60.0
REPO = Path(__file__).resolve().parents[3]
BOOTSTRAP = REPO / "frscope" / "sidecar" / "bootstrap"


class Zygote:
    """One `python -m frscope.testing.sweep.zygote` of one torch venv; thread-safe `start()`."""

    def __init__(self, python: str, base: Path) -> None:
        base.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP), str(REPO)]),
            "FRSCOPE_SOCKET_DIR": str(base),  # exists: the bootstrap arms itself; each rank names its own
            "TORCH_FR_BUFFER_SIZE": "2000",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.proc = subprocess.Popen([python, "-m", "frscope.testing.sweep.zygote"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(base))
        self._lock = threading.Lock()

    def start(self, request: dict[str, Any]) -> int:
        with self._lock:
            stdin: IO[str] | None = self.proc.stdin
            stdout: IO[str] | None = self.proc.stdout
            assert stdin is not None and stdout is not None
            stdin.write(json.dumps(request) + "\n")
            stdin.flush()
            line = stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote exited ({self.proc.poll()})")
        return int(json.loads(line)["pid"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass
class RunningJob:
    spec: JobSpec
    cap: Path
    work: Path
    parent_pid: int
    last_good: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # rank -> (captured ns, trace)
    events: list[str] = field(default_factory=list)

    def sock(self, rank: int) -> Path:
        return self.work / f"rank-{rank}.sock"

    def exit_code(self, rank: int) -> int | None:
        try:
            return int((self.work / f"rank-{rank}.exit").read_text())
        except (OSError, ValueError):
            return None

    def alive(self, rank: int) -> bool:
        return self.exit_code(rank) is None

    def phase(self, rank: int) -> str | None:
        try:
            return (self.work / f"rank-{rank}.phase").read_text()
        except OSError:
            return None

    def phase_age(self, rank: int) -> float:
        try:
            return time.time() - (self.work / f"rank-{rank}.phase").stat().st_mtime
        except OSError:
            return 0.0

    def ranks(self) -> range:
        return range(self.spec.world)

    def pid(self, rank: int) -> int | None:
        try:
            return int((self.work / f"rank-{rank}.pid").read_text())
        except (OSError, ValueError):
            return None


def _progress(job: RunningJob, rank: int) -> object:
    """The bootstrap's cheap progress answer (a Python handler: None from a rank that holds the GIL)."""
    try:
        body = call_handler(job.sock(rank), "frscope_progress", 0.5)
    except WorkerServerError:
        return None
    return body


def _poll_trace(job: RunningJob, rank: int, timeout: float) -> bytes | None:
    try:
        body = call_handler(job.sock(rank), "fr_trace_json", timeout)
    except WorkerServerError:
        return None
    job.last_good[rank] = (time.time_ns(), body)
    return body


def _wait_sockets(job: RunningJob, deadline: float) -> bool:
    """Until every rank's worker server answers `fr_trace_json` (a C++ handler: it answers while the rank
    holds the GIL); a rank that ended is done waiting for. The answers are kept as a polling sidecar keeps
    them, for ranks that may die soon."""
    pending = set(job.ranks())
    while pending and time.monotonic() < deadline:
        for rank in sorted(pending):
            if not job.alive(rank):
                pending.discard(rank)
            elif job.sock(rank).exists():
                answered = _poll_trace(job, rank, 1.0)
                if answered is not None:
                    pending.discard(rank)
        time.sleep(POLL_S)
    return not pending


def _settle(job: RunningJob, deadline: float) -> bool:
    """Every live rank has reached its final phase and no recorder moved for SETTLE_S; then held until the
    newest phase marker is HOLD_S old (the blocked collectives are older than STUCK_AFTER_S)."""
    previous: object = None
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        live = [r for r in job.ranks() if job.alive(r)]
        current = {r: _progress(job, r) for r in live}
        ready = all(job.phase(r) is not None for r in live)
        if job.spec.cls == "after-timeout":  # captured only once the others' collective timed out
            ready = ready and all(job.phase(r) == "error" for r in live if r not in job.spec.culprits)
        now = time.monotonic()
        if not ready or current != previous:
            stable_since = now
        elif now - stable_since >= SETTLE_S:
            youngest = min((job.phase_age(r) for r in live), default=HOLD_S)
            time.sleep(max(0.0, min(HOLD_S - youngest, deadline - time.monotonic())))
            return True
        previous = current
        time.sleep(POLL_S)
    return False


def _snapshot(job: RunningJob, only: list[int] | None = None) -> tuple[list[bytes], list[wire.SnapshotError], int]:
    pieces: list[bytes] = []
    errors: list[wire.SnapshotError] = []
    captured = time.time_ns()
    for rank in job.ranks() if only is None else only:
        if not job.alive(rank):
            kept = job.last_good.get(rank)
            if kept is not None:
                pieces.append(wire.snapshot_piece_bytes(rank, kept[0], f"socket:{job.sock(rank)}", None, kept[1]))
            errors.append({"rank": rank, "message": _gone(job, rank)})
            continue
        at = time.time_ns()
        trace = _poll_trace(job, rank, ANSWER_TIMEOUT_S)
        stacks: str | None = None
        try:
            stacks = call_handler(job.sock(rank), "dump_traceback", ANSWER_TIMEOUT_S).decode("utf-8", "replace")
        except WorkerServerError as exc:
            errors.append({"rank": rank, "message": f"rank {rank}: dump_traceback: {exc}"})
        if trace is None:
            kept = job.last_good.get(rank)
            errors.append({"rank": rank, "message": f"rank {rank}: fr_trace_json did not answer"})
            if kept is None:
                continue
            at, trace = kept
        pieces.append(wire.snapshot_piece_bytes(rank, at, f"socket:{job.sock(rank)}", stacks, trace))
    return pieces, errors, captured


def _gone(job: RunningJob, rank: int) -> str:
    """What a real sidecar says of a rank whose process has exited: its worker socket went with it (the
    exit code reaches the analysis the way the kubelet's does, not through this message)."""
    return f"{job.sock(rank)}: fr_trace_json: socket is gone"


def _poll_snapshot(job: RunningJob) -> tuple[list[bytes], list[wire.SnapshotError], int]:
    """What a polling sidecar holds once the ranks are gone: the last good poll, or a dump file written
    after it (the sidecar's dump-dir watcher), whichever is newer."""
    pieces: list[bytes] = []
    errors: list[wire.SnapshotError] = []
    live = [r for r in job.ranks() if job.alive(r)]
    if live:  # a rank that outlived the others (stuck in teardown): read live, with stacks, and dumped
        live_pieces, live_errors, _ = _snapshot(job, only=live)
        pieces += live_pieces
        errors += live_errors
        _request_dumps(job)
    for rank in job.ranks():
        if rank in live:
            continue
        kept = job.last_good.get(rank)
        dump = job.cap / "json" / f"nccl_trace_rank_{rank}.json"
        dump_ns = dump.stat().st_mtime_ns if dump.exists() else None
        if dump_ns is not None and (kept is None or dump_ns > kept[0]):
            pieces.append(wire.snapshot_piece_bytes(rank, dump_ns, f"file:{dump.name}", None, dump.read_bytes()))
        elif kept is not None:
            pieces.append(wire.snapshot_piece_bytes(rank, kept[0], f"socket:{job.sock(rank)}", None, kept[1]))
        if job.exit_code(rank) is not None:
            errors.append({"rank": rank, "message": _gone(job, rank)})
    return pieces, errors, time.time_ns()


def _request_dumps(job: RunningJob) -> None:
    (job.work / "dump-request").touch()
    wanted = [r for r in job.ranks() if job.alive(r)]
    end = time.monotonic() + DUMP_WAIT_S
    while time.monotonic() < end:
        if all((job.cap / "json" / f"nccl_trace_rank_{r}.json").exists() for r in wanted):
            return
        time.sleep(0.1)
    job.events.append("some ranks wrote no dump on request")


def _exit_message(log: Path) -> str:
    try:
        text = log.read_bytes()[-6000:].decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "WorkerServer" not in ln]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln or "what()" in ln or "Exception" in ln]
    return (errors or lines or [""])[-1][:400]


def _finished_ns(job: RunningJob, rank: int) -> int | None:
    try:
        return (job.work / f"rank-{rank}.exit").stat().st_mtime_ns
    except OSError:
        return None


def exits_source(spec: JobSpec) -> str:
    """Where the job's exit codes come from, from the job's own seed (no draw): 'pods' (one pod per rank:
    exit code, reason, message, finishedAt) or 'torchrun' (its failure summary also names the first
    failure, the rank whose failure it saw first)."""
    return "torchrun" if (spec.seed >> 1) & 1 else "pods"


def _exits(job: RunningJob, killed: set[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    finished = {r: _finished_ns(job, r) for r in job.ranks() if job.exit_code(r) is not None}
    failed = [r for r in finished if job.exit_code(r) != 0 and finished[r] is not None]
    first = min(failed, key=lambda r: finished[r] or 0) if failed else None
    source = exits_source(job.spec)
    for rank in job.ranks():
        code = job.exit_code(rank)
        if code is None:
            continue
        entry: dict[str, Any] = {"exit_code": code, "source": source}
        if finished.get(rank) is not None:
            entry["finished_at_ns"] = finished[rank]
        if source == "torchrun" and rank == first:
            entry["first_failure"] = True
        if rank not in killed:
            if code == 137 and job.spec.params.get("how") == "sigkill":
                entry["reason"] = "OOMKilled"
            elif code == 0:
                entry["reason"] = "Completed"
            else:
                entry["reason"] = "Error"
                entry["message"] = _exit_message(job.cap / "logs" / f"rank-{rank}.log")
        out[str(rank)] = entry
    return out


def _poll_until_done(job: RunningJob, deadline: float) -> set[int]:
    """Poll every live rank's recorder until every rank has exited (the timeout class: until every rank
    but the culprit exited, then kill the culprit as a launcher would). Returns the ranks killed."""
    killed: set[int] = set()
    culprits = set(job.spec.culprits)
    while time.monotonic() < deadline:
        live = [r for r in job.ranks() if job.alive(r)]
        if not live:
            break
        if job.spec.cls == "teardown" and set(live) <= culprits and all(job.phase(r) == "teardown" for r in live):
            time.sleep(max(0.0, HOLD_S - min(job.phase_age(r) for r in live)))
            break  # the culprit stays stuck in teardown: captured live below
        if job.spec.cls == "timeout" and set(live) <= culprits:
            time.sleep(0.5)
            for rank in live:
                pid = job.pid(rank)
                if pid is not None:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.add(rank)
                    except ProcessLookupError:
                        pass  # it ended on its own meanwhile
            time.sleep(0.3)
            continue
        for rank in live:
            if job.sock(rank).exists():
                _poll_trace(job, rank, 1.0)
        time.sleep(POLL_S)
    return killed


def collect_mode(spec: JobSpec) -> str:
    """The class's collection, unless the job's variant ends blocked instead (an all_to_all that hangs)."""
    return "settle" if spec.params.get("a2a") == "hang" else spec.fault.collect


def truth_of(spec: JobSpec) -> dict[str, Any]:
    cls = CLASSES[spec.cls]
    op, group = spec.params["ops"][spec.op_index] if spec.params.get("ops") else (None, None)
    group_size = {"world": spec.world, "tp": spec.tp, "shard": spec.tp, "dp": spec.world // max(spec.tp, 1),
                  "replicate": spec.world // max(spec.tp, 1), "strided": spec.world // 2}.get(group or "", 0)
    undecidable = dict(cls.undecidable)
    accepted = list(cls.accepted)
    if op == "pipeline_forward" and spec.cls != "healthy":  # stuck before a p2p stage: the chain waits
        accepted += [c for c in (P2P, NOT_JOINED) if c not in accepted]
        undecidable = {form: PIPELINE_WHY for form in ("pickle", "json")}
    accepted_undecidable: list[str] = []
    if cls.copied_undecidable and float(spec.copied_hours or 0) > 0 and not spec.exits:
        undecidable.update({form: cls.copied_undecidable for form in ("pickle", "json")})
        accepted_undecidable = [c for c in cls.copied_accepted if c not in accepted]
    if spec.cls in ("type", "size", "dtype") and group_size == 2:
        why = "two ranks disagree and no third says which one is wrong"
        undecidable = {form: why for form in ("snapshot", "pickle", "json")}
    return {
        "class": spec.cls,
        "summary": cls.summary,
        "culprit_ranks": spec.culprits,
        "accepted": accepted,
        # Also right in the forms without live stacks (pickle, JSON), with or without exit codes.
        "accepted_without_stacks": [c for c in cls.no_stacks_accepted if c not in accepted],
        "accepted_with_exits": list(cls.with_exits or accepted),
        "undecidable": undecidable,
        # Also right in the undecidable forms (with the culprits named as the rule below says).
        "accepted_undecidable": accepted_undecidable,
        "group": group,
        "group_size": group_size,
        "op": op,
        "step": spec.fault_step,
        "world_size": spec.world,
        "layout": spec.layout,
        "torch": spec.torch,
    }


def run_job(spec: JobSpec, zygote: Zygote, cap: Path) -> dict[str, Any]:
    """Run `spec` to its end state, capture every form into `cap`, end it. Returns meta.json's content."""
    if cap.exists():
        shutil.rmtree(cap)
    (cap / "logs").mkdir(parents=True)
    spec.write(cap / "spec.json")
    work = Path(tempfile.mkdtemp(prefix="fsw-", dir="/tmp"))
    started = time.monotonic()
    deadline = started + JOB_DEADLINE_S
    parent = zygote.start({"spec": spec.to_json(), "cap": str(cap), "work": str(work),
                           "lifetime_s": JOB_DEADLINE_S + 20})
    job = RunningJob(spec, cap, work, parent)
    meta: dict[str, Any] = {"job_id": spec.job_id, "settled": False}
    killed: set[int] = set()
    try:
        if not _wait_sockets(job, deadline):
            job.events.append("not every socket answered")
        meta["up_s"] = round(time.monotonic() - started, 2)
        if collect_mode(spec) == "poll":
            killed = _poll_until_done(job, deadline)
            meta["settled"] = all(not job.alive(r) for r in job.ranks() if r not in spec.culprits)
            pieces, errors, captured = _poll_snapshot(job)
        else:
            meta["settled"] = _settle(job, deadline)
            pieces, errors, captured = _snapshot(job)
            if spec.cls == "gil" or meta["settled"]:
                _request_dumps(job)
        meta["captured_s"] = round(time.monotonic() - started, 2)
        head = wire.snapshot_head(pod=f"{spec.job_id}", namespace="sweep", node="loopback",
                                  captured_at_ns=captured, reason="stall")
        (cap / "snapshot").mkdir(exist_ok=True)
        (cap / "snapshot" / "sidecar-snapshot.json").write_bytes(wire.snapshot_envelope_bytes(head, pieces, errors))
    finally:
        try:
            os.killpg(parent, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(0.1)
        meta["exit_codes"] = {str(r): job.exit_code(r) for r in job.ranks()}
        exits = _exits(job, killed)
        shutil.rmtree(work, ignore_errors=True)
    (cap / "exits.json").write_text(json.dumps(exits, indent=1) + "\n")
    (cap / "truth.json").write_text(json.dumps(truth_of(spec), indent=1) + "\n")
    meta.update({"elapsed_s": round(time.monotonic() - started, 2), "events": job.events,
                 "killed": sorted(killed)})
    (cap / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta
