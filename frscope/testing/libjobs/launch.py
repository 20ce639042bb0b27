"""Run library-driven real jobs (`worker.py`) and judge frscope's diagnosis of each.

A job is (program, fault, world size, torch version). The launcher starts every rank as its own process
under that torch's Python, waits for the fault to strike (the faulty rank marks it, a crashed rank's
process ends) and `SETTLE_S` more, asks every live rank to write its recorder and stacks (`trigger`), then
ends the job. A healthy job writes its recorders as it ends. The truth is the injected fault's rank and the
categories that name it; jobs whose hang sits in an op the recorder never sees (gloo's send/recv) are
decidable from live stacks only, and judged apart in the forms without them.

Judging is `score.py`'s rule (the project's judge): the first finding's category is one the fault accepts
and its culprits are exactly the truth's, or a finding marked ambiguous lists them among at most twice as
many candidates; a healthy job has no finding. Three forms per job: `pkl` and `json` as copies (their
mtimes an hour late, so the capture time is lost) and `snap`, the sidecar's snapshot with the live stacks
and the capture time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frscope.analysis import AnalysisOptions, analyze
from frscope.demo.ports import rendezvous_port
from frscope.records import load_dumps
from frscope.wire import SnapshotError, snapshot_envelope_bytes, snapshot_head, snapshot_piece

WORKER = Path(__file__).with_name("worker.py")
# worker.PROGRAMS, named here so that launching imports no torch (the jobs run under other torch venvs).
PROGRAMS = ("ddp", "fsdp2", "tensor_parallel", "mesh3d", "dcp_save", "objects", "scatter_gather",
            "monitored_barrier", "pipeline", "dataloader")
SETTLE_S = 3.0
JOB_TIMEOUT_S = 150.0

HANG = ("RankNotJoined",)
CRASH = ("RankNotJoined", "MissingDumps", "RankStopped")
P2P_HANG = ("RankNotJoined", "P2PMismatch")
# Programs whose step begins with ops gloo does not record (send/recv): a stuck stage shows only in stacks.
UNRECORDED_FIRST = {"pipeline"}
# Programs whose op after the step's first collective is unrecorded on gloo: monitored_barrier (p2p).
UNRECORDED_MID = {"monitored_barrier"}


@dataclass(frozen=True)
class Job:
    program: str
    fault: str  # none | stuck | crash | loader
    world: int = 4
    rank: int = 1
    step: int = 3
    torch: str = "2.13"

    @property
    def name(self) -> str:
        at = f"-r{self.rank}s{self.step}" if self.fault != "none" else ""
        return f"{self.program}-{self.fault}{at}-ws{self.world}-t{self.torch}"

    def accepted(self) -> tuple[str, ...]:
        if self.fault == "none":
            return ()
        if self.fault == "crash":
            return CRASH
        return P2P_HANG if self.stacks_only else HANG

    @property
    def stacks_only(self) -> bool:
        """The hang sits in ops gloo does not record: only live stacks show it."""
        return ((self.fault == "stuck" and self.program in UNRECORDED_FIRST)
                or (self.fault == "stuckmid" and self.program in UNRECORDED_MID))



def run_job(job: Job, python: str, out: Path) -> dict[str, Any]:
    """Run the job, leave its capture in `out`, return its truth (also written to truth.json)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    port = rendezvous_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR", PYTHONWARNINGS="ignore")
    fault = f"{job.fault}:{job.rank}:{job.step}"
    logs = {r: (out / f"log-{r}.txt").open("w") for r in range(job.world)}
    procs = {r: subprocess.Popen([python, str(WORKER), "--program", job.program, "--fault", fault, "--out", str(out),
                                  "--rank", str(r), "--world", str(job.world), "--port", str(port)],
                                 env=env, stdout=subprocess.DEVNULL, stderr=logs[r], start_new_session=True)
             for r in range(job.world)}
    started = time.monotonic()
    struck: float | None = None
    outcome = "timeout"
    try:
        while time.monotonic() - started < JOB_TIMEOUT_S:
            if all((out / f"finished-{r}").exists() for r in range(job.world)):
                outcome = "finished"
                break
            exited = {r for r, p in procs.items() if p.poll() is not None}
            if struck is None and (exited or list(out.glob("fault-*"))):
                struck = time.monotonic()
            if struck is not None and time.monotonic() - struck >= SETTLE_S:
                outcome = "fault"
                break
            time.sleep(0.05)
        if outcome != "finished":
            (out / "trigger").write_text("")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                live = [r for r, p in procs.items() if p.poll() is None]
                if all((out / f"captured-{r}").exists() for r in live):
                    break
                time.sleep(0.05)
    finally:
        (out / "release").write_text("")
        deadline = time.monotonic() + 5
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            # What the rank started (a DataLoader worker hung in the dataset) is in its process group: ended too.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for log in logs.values():
            log.close()
    exits = {r: p.returncode for r, p in procs.items()}
    if outcome == "fault" and not list(out.glob("fault-*")) and job.fault != "crash":
        outcome = "broken"  # a rank failed on its own before any fault: the program cannot run here (log-*.txt)
    captured: dict[str, int] = {}
    for r in range(job.world):  # the capture, else the periodic dump a rank that died left behind
        for marker in (out / f"captured-{r}", out / f"periodic-{r}"):
            if marker.exists():
                captured[str(r)] = json.loads(marker.read_text())["captured_at_ns"]
                break
    truth = {"job": job.name, "program": job.program, "fault": job.fault, "world": job.world, "torch": job.torch,
             "outcome": outcome, "exits": exits, "captured_at_ns": captured,
             "culprit_ranks": [] if job.fault == "none" else [job.rank], "accepted": list(job.accepted()),
             "stacks_only": job.stacks_only}
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    return truth


def _stage(job_dir: Path, form: str, dst: Path, truth: dict[str, Any]) -> list[Path]:
    dst.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    late = time.time() + 3600  # a copy's mtime: when the recorders were read is lost
    for src in sorted(job_dir.glob(f"rank_*.{'json' if form == 'snap' else form}")):
        rank = src.stem.split("_")[1]
        if form == "snap":
            stack = job_dir / f"rank_{rank}.stack.txt"
            path = dst / f"rank-{rank}.json"
            piece = {"frscope_snapshot": 1, "rank": int(rank), "source": "libjobs",
                     "captured_at_ns": truth["captured_at_ns"].get(rank),
                     "stacks": stack.read_text() if stack.exists() else None, "trace": json.loads(src.read_text())}
            if (job_dir / f"captured-{rank}").exists():
                path.write_text(json.dumps(piece))
            else:
                # The rank died before the capture: its sidecar keeps its last read (here the periodic dump it
                # left) and says its socket is gone, as frscope's sidecar does; no live stack of it.
                read = snapshot_piece(int(rank), piece["captured_at_ns"], "libjobs", None, piece["trace"])
                head = snapshot_head(pod=f"{job_dir.name}-{rank}", namespace="libjobs", node="local",
                                     captured_at_ns=max(truth["captured_at_ns"].values()), reason="exit")
                gone: SnapshotError = {"rank": int(rank), "message": f"rank {rank}: fr_trace_json: socket is gone"}
                path.write_bytes(snapshot_envelope_bytes(head, [json.dumps(read).encode()], [gone]))
        else:
            path = dst / (f"comm_lib_trace_rank_{rank}" if form == "pkl" else f"trace_rank_{rank}.json")
            shutil.copy(src, path)
            os.utime(path, (late, late))
        paths.append(path)
    return paths


def judge(truth: dict[str, Any], findings: list[Any]) -> tuple[bool, str]:
    if not truth["culprit_ranks"]:
        return not findings, f"{len(findings)} finding(s) on a healthy job" + (
            f": {findings[0].category.value} {list(findings[0].culprit_ranks)}" if findings else "")
    if not findings:
        return False, "no finding"
    top = findings[0]
    got, want = set(top.culprit_ranks), set(truth["culprit_ranks"])
    ranks_ok = got == want or (top.ambiguous and want <= got and len(got) <= 2 * len(want))
    amb = " (ambiguous)" if top.ambiguous else ""
    return top.category.value in truth["accepted"] and ranks_ok, f"got {top.category.value} {sorted(got)}{amb}"


def score_job(job_dir: Path, scratch: Path) -> list[dict[str, Any]]:
    """Each form's verdict: {form, right, why, apart}."""
    truth = json.loads((job_dir / "truth.json").read_text())
    if truth["outcome"] == "broken":
        return [{"form": form, "right": False, "why": "the job broke before its fault (see log-*.txt)",
                 "apart": False, "broken": True} for form in ("pkl", "json", "snap")]
    results: list[dict[str, Any]] = []
    for form in ("pkl", "json", "snap"):
        paths = _stage(job_dir, form, scratch / f"{job_dir.name}-{form}", truth)
        if not paths:
            results.append({"form": form, "right": False, "why": "no dump captured", "apart": False})
            continue
        options = AnalysisOptions(stall_after_s=1.0) if form == "snap" else AnalysisOptions()
        report = analyze(load_dumps(paths), options)
        right, why = judge(truth, report.findings)
        apart = truth["stacks_only"] and form != "snap"
        results.append({"form": form, "right": right, "why": why, "apart": apart})
    return results


def python_for(torch: str) -> str | None:
    """This venv's Python runs torch 2.13; `make torch-venvs` builds the others under ~/.cache."""
    if torch == "2.13":
        return sys.executable
    release = {"2.14": "2.14.1", "2.15": "2.15.0"}.get(torch)
    path = Path.home() / ".cache" / "frscope-torch" / (release or "none") / "bin" / "python"
    return str(path) if release and path.exists() else None
