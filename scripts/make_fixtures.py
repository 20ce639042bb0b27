#!/usr/bin/env python3
"""Regenerate the real recorder fixtures in tests/data/real/ from live gloo jobs.

    .venv/bin/python scripts/make_fixtures.py            # every fault
    .venv/bin/python scripts/make_fixtures.py hang type  # only these

Each fault runs the demo job (frscope/demo/job.py) on loopback, collects every rank's frscope
snapshot over its worker-server socket while the job is hung or idle, and for the faults in
PICKLE_FAULTS also the raw bytes of torch's `_dump_fr_trace()` from the same run. It then rewrites
tests/data/real/README.md with what was run and what each rank's recorder and stack show.
Needs torch (the `demo` extra); takes about two minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from frscope.demo.faults import FAULT_STEP, FAULTS, subgroup_ranks  # noqa: E402
from frscope.demo.launcher import CollectedJob, run_fault_job  # noqa: E402

OUT = REPO / "tests" / "data" / "real"
# fixture name -> (fault, world size). Several world sizes and group layouts (the subgroup is the
# first half of the ranks: {0, 1} of 4, {0, 1, 2} of 6).
FIXTURES: dict[str, tuple[str, int]] = {
    name: (name, 3 if name in ("size-bytes", "steps") else 4) for name in FAULTS
} | {"crossgroup-6": ("crossgroup", 6), "steps-6": ("steps", 6), "pipeline-6": ("pipeline", 6)}
# Raw torch pickles next to the JSON snapshots of the same run (torch's own dump format).
PICKLE_FAULTS = ("none", "hang", "skip", "type", "size", "dtype", "p2p", "straggler", "steps", "jitter",
                 "crossgroup", "crossgroup-6", "steps-6", "crash", "pipeline", "pipeline-6")
PICKLE_PREFIX = "nccl_trace_rank_"
TIMEOUT_S = 180.0  # generous: the fixtures are made on shared, busy machines too
# Keep the job hung this long before collecting: the blocked collectives are then older than
# `frscope analyze`'s default --stall-after (10 s), as they would be when a sidecar reports a stall.
HOLD_S = 12.0

# What each fixture shows, for people; the per-rank facts below it are read from the data.
EXPLAIN = {
    "none": "Healthy. Every rank ran the `param_sync` broadcast and 6 all_reduces on default_pg, "
    "then idles in `wait_for_shutdown`. No finding expected.",
    "hang": "Rank 1 is stuck in `load_batch` (time.sleep) before step 3: it never enqueues default_pg "
    "all_reduce seq 4. Ranks 0, 2, 3 are blocked in that all_reduce (seq 4, not retired). "
    "Expected: RankNotJoined, culprit 1, default_pg, all_reduce seq 4.",
    "skip": "Rank 1 skipped step 3's all_reduce. Its later all_reduces paired with the others' earlier "
    "ones (same op and shape, so the skip itself is invisible at seq 4-5); it finished after 5 "
    "all_reduces and idles in `save_checkpoint`. Ranks 0, 2, 3 are blocked in all_reduce seq 6. "
    "Expected: RankNotJoined, culprit 1, default_pg, all_reduce seq 6.",
    "type": "At step 3 rank 1 calls broadcast where the others call all_reduce: default_pg seq 4 is "
    "gloo:broadcast on rank 1 and gloo:all_reduce on 0, 2, 3; every rank hangs (nothing retired). "
    "Expected: CollectiveTypeMismatch, culprit 1, default_pg seq 4.",
    "size": "At step 3 rank 1 passes a [4, 8] tensor where the others pass [8, 4] (same bytes): gloo "
    "completed it silently with wrong data; every rank then idles. Expected: SizeMismatch, culprit 1, "
    "default_pg all_reduce seq 4.",
    "dtype": "At step 3 rank 1 passes int32 where the others pass float32 (same bytes): gloo completed "
    "it silently; every rank then idles. Expected: DtypeMismatch, culprit 1, default_pg all_reduce "
    "seq 4.",
    "p2p": "At step 3 ranks 0 and 1 both `recv` from each other first (`exchange_halo`): a p2p "
    "deadlock that gloo does not record at all; only their stacks show `recv`. Ranks 2 and 3 are "
    "blocked in default_pg all_reduce seq 4, which 0 and 1 never enqueued. Expected: P2PMismatch "
    "(from the stacks) / RankNotJoined, culprits 0 and 1, default_pg seq 4.",
    "straggler": "Rank 2 sleeps 150 ms before each of 20 all_reduces; every rank then idles. The "
    "others' time_created_ns for each seq is ~150 ms earlier than rank 2's. Expected: Straggler, "
    "culprit 2, ~150 ms late.",
    "steps": "World size 3. Rank 2's data loader takes 0.4 s longer before each of 8 steps of 4 all_reduces "
    "on default_pg: it is late at every step's first all_reduce (seq 1, 5, 9, ...), and the step's other "
    "three run in lockstep. Expected: Straggler, culprit 2, ~400 ms late at the first collective of each step.",
    "steps-6": "World size 6. As `steps`: rank 2 is late at every step's first all_reduce. "
    "Expected: Straggler, culprit 2.",
    "jitter": "Healthy but uneven: every rank's data loader takes a random 0-0.25 s before each of 8 steps of "
    "4 all_reduces (seeded per rank and step; no rank is slow on purpose). No finding expected.",
    "crossgroup": "Every step all_reduces on the param_sync subgroup {0, 1}, then on default_pg. At step 3 rank 1 "
    "skips the subgroup's all_reduce: rank 0 waits in param_sync all_reduce seq 5, rank 1 in default_pg "
    "all_reduce seq 4 with ranks 2 and 3: a wait cycle between two groups. Expected: RankNotJoined, culprit 1, "
    "param_sync seq 5 (rank 1 broke its own order of groups).",
    "crossgroup-6": "World size 6, subgroup {0, 1, 2}; as `crossgroup`, rank 1 skips param_sync all_reduce seq 5 "
    "at step 3 while ranks 0 and 2 wait in it. Expected: RankNotJoined, culprit 1, param_sync seq 5.",
    "pipeline": "At step 3 every rank passes a tensor down a pipeline: `recv` from the previous rank, `send` to "
    "the next (`pipeline_forward`; gloo records neither). Rank 1 is stuck in `load_batch` before its recv, so "
    "rank 0 waits in `send` (gloo's send waits for the matching recv) and ranks 2 and 3 wait in `recv`, each on "
    "the rank before it. Expected: P2PMismatch, culprit 1 (not the ranks waiting on it).",
    "pipeline-6": "World size 6; as `pipeline`: rank 1 stuck in `load_batch`, rank 0 waits in `send`, ranks 2-5 "
    "in `recv` one behind the other. Expected: P2PMismatch, culprit 1.",
    "crash": "Every step takes 0.3 s. Rank 2 writes a recorder dump after step 0 (a periodic dump), then is "
    "killed with SIGKILL at step 3 (as the OOM killer would). The survivors' default_pg all_reduce seq 4 fails "
    "('Connection closed/reset by peer'); each survivor writes its recorder in its error handler (the failed "
    "all_reduce is not retired yet there) and exits 1. `crash/` holds each rank's last snapshot polled every 100 ms; "
    "`crash-pickle/` the survivors' on-failure dumps only (rank 2 left none); `stale-pickle/` the same plus "
    "rank 2's early dump; `crash-exits.json` the exit codes. Expected: RankStopped, culprit 2.",
    "size-bytes": "World size 3. At step 3 rank 2 passes [16, 4] where the others pass [8, 4] "
    "(different byte counts). This does not hang: the rank that receives rank 2's larger message "
    "aborts at once (gloo::EnforceNotMet, SIGABRT) and the others fail with 'Connection reset/closed "
    "by peer'. Every rank pauses 1 s in `load_batch` before that step, so the poller (every "
    "100 ms, keeping each rank's last good snapshot) has seen all of them at seq 3; a rank's last "
    "snapshot is from before the failure, or for a survivor just after it (then seq 4 may show). "
    "No rank was blocked when it was taken. See the exit codes and errors below for this run.",
}


def main_thread_frames(stacks: str) -> list[str]:
    """Function names of the main thread, innermost first (faulthandler text)."""
    for block in stacks.split("\n\n"):
        if "in <module>" in block:
            return re.findall(r"line \d+ in (\S+)", block)
    return []


def entry_line(entry: dict[str, Any]) -> str:
    pg = entry.get("process_group") or ["?", "?"]
    return (f"pg {pg[0]} ({pg[1]}) seq {entry.get('collective_seq_id')} "
            f"{entry.get('profiling_name')} in={entry.get('input_sizes')} {entry.get('input_dtypes')} "
            f"retired={entry.get('retired')}")


def describe_rank(path: Path) -> list[str]:
    snap = json.loads(path.read_text())
    entries = snap["trace"].get("entries") or []
    last_per_pg: dict[str, dict[str, Any]] = {}
    for entry in entries:
        last_per_pg[str(entry["pg_id"])] = entry
    frames = main_thread_frames(snap["stacks"])
    age = (snap["captured_at_ns"] - entries[-1]["time_created_ns"]) / 1e9 if entries else 0.0
    lines = [f"  - rank {snap['rank']}: {len(entries)} entries, captured {age:.1f} s after the last was "
             f"created; main thread in `{' < '.join(frames[:3]) or '(no main-thread stack: exiting)'}`"]
    lines += [f"    - last: {entry_line(e)}" for _, e in sorted(last_per_pg.items())]
    return lines


def error_line(log_tail: str) -> str:
    hits = [ln.strip() for ln in log_tail.splitlines()
            if re.search(r"RuntimeError|enforce fail|EnforceNotMet", ln)]
    return hits[-1][:220] if hits else "(no error in the log)"


def split_crash(job: CollectedJob, all_dumps: Path) -> None:
    """`stale-pickle/`: every dump the crash run left (the dead rank's is from step 0);
    `crash-pickle/`: the survivors' only; `crash-exits.json`: each rank's exit code."""
    stale = OUT / "stale-pickle"
    crash = OUT / "crash-pickle"
    for d in (stale, crash):
        shutil.rmtree(d, ignore_errors=True)
    all_dumps.rename(stale)
    crash.mkdir()
    for path in sorted(stale.glob(f"{PICKLE_PREFIX}*")):
        rank = int(path.name[len(PICKLE_PREFIX):])
        job.pickle_dumps[rank] = path
        if rank not in job.culprit_ranks:
            shutil.copy2(path, crash / path.name)
    (OUT / "crash-exits.json").write_text(json.dumps({str(r): c for r, c in sorted(job.exit_codes.items())}) + "\n")


def run_fault(name: str) -> tuple[CollectedJob, list[str]]:
    fault, world = FIXTURES[name]
    out_dir = OUT / name
    pickle_dir = OUT / f"{name}-pickle" if name in PICKLE_FAULTS else None
    if fault == "crash":
        pickle_dir = OUT / ".crash-all"  # split into crash-pickle/ and stale-pickle/ afterwards
    for d in (out_dir, pickle_dir):
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)
    job = run_fault_job(fault, world, out_dir, timeout_s=TIMEOUT_S, hold_s=HOLD_S,
                        pickle_dir=pickle_dir, pickle_prefix=PICKLE_PREFIX)
    if fault == "crash" and pickle_dir is not None:
        split_crash(job, pickle_dir)
    problems = []
    if FAULTS[fault].collect == "settle":
        if not job.settled:
            problems.append("the recorders never settled")
        if sorted(job.snapshots) != list(range(job.world_size)):
            problems.append(f"ranks without a snapshot: {job.skipped}")
        if pickle_dir is not None and sorted(job.pickle_dumps) != list(range(job.world_size)):
            missing = sorted(set(range(job.world_size)) - set(job.pickle_dumps))
            problems.append(f"ranks without a pickle dump: {missing}")
    return job, problems


def readme(jobs: dict[str, CollectedJob], command: str) -> str:
    import importlib.metadata

    torch_version = importlib.metadata.version("torch")
    sub = subgroup_ranks(4)
    out = [
        "# Real Flight Recorder fixtures (gloo, CPU)",
        "",
        "Generated by real multi-process gloo jobs on loopback; nothing here is hand-edited. Regenerate with:",
        "",
        "```",
        command,
        "```",
        "",
        f"torch {torch_version}, Python {platform.python_version()}, {platform.system()} "
        f"{platform.machine()}, generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')}. "
        f"The job is `frscope/demo/job.py` (faults in `frscope/demo/faults.py`), started by "
        "`frscope/demo/launcher.py` with `TORCH_FR_BUFFER_SIZE=2000`.",
        "",
        "## The job",
        "",
        f"Every rank: `init_process_group('gloo')` (default_pg, pg id 0), then `new_group(ranks={sub}, "
        "group_desc='param_sync')` (pg id 1) whose members broadcast once (its seq 1), then the "
        f"training steps: one all_reduce of a float32 [8, 4] tensor on default_pg per step (step k is "
        f"seq k+1 there). Faults strike at step {FAULT_STEP}, i.e. default_pg seq {FAULT_STEP + 1}.",
        "",
        "## Layout",
        "",
        "- `<fault>/rank-<r>.json`: frscope snapshots, one per rank, taken over each rank's worker-server",
        f"  socket while the job was blocked or idle, {HOLD_S:.0f} s after its recorders stopped changing:",
        '  `{"frscope_snapshot": 1, "rank": r, "captured_at_ns": ..., "source": "socket:<path>",',
        '  "stacks": "<POST /handler/dump_traceback>", "trace": <POST /handler/fr_trace_json, as parsed>}`.',
        f"- `<fault>-pickle/{PICKLE_PREFIX}<r>`: the raw bytes of `torch._C._distributed_c10d._dump_fr_trace()`",
        "  (torch's on-timeout dump format, with Python frames per entry), written by a thread inside each",
        "  rank of the *same* run, a few seconds after the JSON snapshot, while the main thread was still",
        "  blocked. Gloo itself never writes these on timeout; this is what an NCCL-style dump would hold.",
        "",
        "## The faults",
        "",
    ]
    out += [line for fault, job in jobs.items() for line in fixture_section(fault, job)]
    out += FACTS
    return "\n".join(out)


def fixture_section(fault: str, job: CollectedJob) -> list[str]:
    out: list[str] = []
    out.append(f"### `{fault}` (fault `{job.fault}`, world size {job.world_size}, culprit ranks "
               f"{list(job.culprit_ranks) or 'none'})")
    out.append("")
    out.append(EXPLAIN[fault])
    out.append("")
    out.append(f"Observed in this run (collected in {job.elapsed_s:.1f} s"
               f"{'' if job.settled else ', recorders NOT settled'}):")
    out.append("")
    for rank in range(job.world_size):
        if rank in job.snapshots:
            out += describe_rank(job.snapshots[rank])
        else:
            out.append(f"  - rank {rank}: no snapshot ({job.skipped.get(rank)})")
    if FAULTS[job.fault].collect == "poll":
        out.append("")
        out.append("  Exit codes and errors (negative: killed by that signal; 6 is SIGABRT):")
        for rank in range(job.world_size):
            out.append(f"  - rank {rank}: exit {job.exit_codes.get(rank)}: `{error_line(job.log_tails[rank])}`")
    if job.pickle_dumps:
        out.append("")
        where = "crash-pickle/`, `stale-pickle" if job.fault == "crash" else f"{fault}-pickle"
        out.append(f"  Pickle dumps: `{where}/` ({len(job.pickle_dumps)} ranks).")
    out.append("")
    return out


def update_sections(readme_text: str, jobs: dict[str, CollectedJob]) -> str:
    """Replace (or add, before the facts) the sections of the fixtures just regenerated."""
    head = readme_text.partition(FACTS[0])[0]
    parts = re.split(r"^(?=### `)", head, flags=re.MULTILINE)
    sections = {p[len("### `"):].split("`", 1)[0]: p.rstrip("\n") + "\n\n" for p in parts[1:]}
    for fault, job in jobs.items():
        sections[fault] = "\n".join(fixture_section(fault, job)).rstrip("\n") + "\n\n"
    return parts[0] + "".join(sections.values()) + "\n".join(FACTS)


FACTS = [
        "## Facts these runs show (torch 2.13 gloo)",
        "",
        "- JSON (`fr_trace_json`) and pickle (`_dump_fr_trace`) differ: JSON has no `frames`, gives",
        "  `pg_status` values as strings and unset times as `0`, has `nccl_comm_state: {}` and lists for",
        "  `process_group`; the pickle has `frames`, int `pg_status` values, `None` times, tuples.",
        "- The pickles use only plain opcodes (dicts, lists, tuples, str, int, bool, None): no globals.",
        "- `pg_config` is `{'': {...}}` with `ranks` as a *string*: `'[]'` on ranks that are members of the",
        "  subgroup (built last), `'[0, 1, 2, 3]'` on ranks that are not.",
        "- The subgroup's entries say `process_group: ['1', 'param_sync']` (without `group_desc` torch",
        "  writes `'undefined'`).",
        "- p2p ops are in no entry; `pg_status` does not show them either in these runs (no entry, no",
        "  counter moved for the recv that never completed).",
        "- A gloo `send` of a 16-byte tensor waits for the matching `recv` (`pipeline`: rank 0 sits in `send`",
        "  while the next stage is stuck in Python).",
        "- A recorder dumped in the error handler right after a peer died (`crash`) still shows the failed",
        "  all_reduce as not retired: gloo retires it only later.",
        "",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("faults", nargs="*", metavar="FIXTURE",
                        help=f"fixtures to regenerate: {', '.join(FIXTURES)} (default: all, and README.md)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.faults) - set(FIXTURES))
    if unknown:
        parser.error(f"unknown fixtures: {', '.join(unknown)}")
    faults = args.faults or list(FIXTURES)
    jobs: dict[str, CollectedJob] = {}
    failed = False
    for fault in faults:
        job, problems = run_fault(fault)
        jobs[fault] = job
        status = "ok" if not problems else "PROBLEM: " + "; ".join(problems)
        print(f"{fault}: {len(job.snapshots)} snapshots, {len(job.pickle_dumps)} pickles, "
              f"{job.elapsed_s:.1f} s: {status}", file=sys.stderr)
        failed |= bool(problems)
    command = ".venv/bin/python scripts/make_fixtures.py" + (" " + " ".join(args.faults) if args.faults else "")
    if not args.faults:
        (OUT / "README.md").write_text(readme(jobs, command))
    else:
        (OUT / "README.md").write_text(update_sections((OUT / "README.md").read_text(), jobs))
    git = subprocess.run(["git", "-C", str(REPO), "status", "--short", str(OUT)], capture_output=True, text=True)
    print(git.stdout, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
