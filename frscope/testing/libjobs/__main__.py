"""`python -m frscope.testing.libjobs sweep --out DIR [--torch 2.13,2.14,2.15] [--programs a,b] [--faults ...]`:
run every (program, fault, torch) job, judge each form, print one line per job and the totals per form.
With `--seed S --jobs N` it runs N jobs drawn from the seed instead (a holdout: program, fault, world size
2-8, culprit rank and step drawn, torch versions in turn), so a seed chosen after a change judges it.
A torch version whose venv is not built (`make torch-venvs`) is skipped and said so. Exit 1 on any miss.
`python -m frscope.testing.libjobs score --out DIR`: judge the jobs captured there again (the analysis
changed, the captures did not)."""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from frscope.testing.libjobs.launch import PROGRAMS, Job, python_for, run_job, score_job

FAULTS = ("none", "stuck", "stuckmid", "crash", "loader")
MID_PROGRAMS = {"objects", "scatter_gather", "monitored_barrier", "pipeline"}


def jobs_for(programs: list[str], faults: list[str], torches: list[str], worlds: list[int]) -> list[Job]:
    out: list[Job] = []
    for torch in torches:
        for world in worlds:
            for program in programs:
                for fault in faults:
                    if (fault == "loader") != (program == "dataloader") and fault != "none":
                        continue  # the loader fault is the dataloader program's only one
                    if fault == "stuckmid" and program not in MID_PROGRAMS:
                        continue
                    # The fault strikes a middle rank mid-run, and rank 0 (a root, the first stage) too.
                    ranks = [0] if fault == "none" else sorted({1 % world, 0, world - 1})
                    out.extend(Job(program, fault, world, rank, 3, torch) for rank in ranks)
    return out


# World sizes a program can run at: the 3-D mesh splits its ranks (1 or 2, 2, world / 2 or / 4).
WORLDS = range(2, 9)
EVEN_ONLY = {"mesh3d"}
HEALTHY_SHARE = 1 / 6  # of drawn jobs; the others get one of their program's faults
FIRST_FAULT_STEP, LAST_STEP = 2, 5  # every rank writes its periodic dump at step 1; programs run steps 0-5


def faults_for(program: str) -> tuple[str, ...]:
    """The faults a program can be given, "none" first (the loader fault is the dataloader program's only one)."""
    if program == "dataloader":
        return ("none", "loader")
    return ("none", "stuck", "crash") + (("stuckmid",) if program in MID_PROGRAMS else ())


def draw_jobs(seed: int, count: int, programs: list[str], torches: list[str]) -> list[Job]:
    """`count` jobs drawn from `seed`: program, fault, world size, culprit rank and step; torch in turn."""
    rng = random.Random(seed)
    out: list[Job] = []
    for _ in range(count * 20):  # a job drawn twice is drawn again (each job has a folder of its own)
        if len(out) == count:
            break
        program = rng.choice(programs)
        fault = "none" if rng.random() < HEALTHY_SHARE else rng.choice(faults_for(program)[1:])
        world = rng.choice([w for w in WORLDS if program not in EVEN_ONLY or w % 2 == 0])
        rank = rng.randrange(world) if fault != "none" else 0
        step = rng.randint(FIRST_FAULT_STEP, LAST_STEP) if fault != "none" else 3
        job = Job(program, fault, world, rank, step, torches[len(out) % len(torches)])
        if job not in out:
            out.append(job)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m frscope.testing.libjobs", description=__doc__)
    parser.add_argument("command", choices=["sweep", "score"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--torch", default="2.13,2.14,2.15")
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--worlds", default="4")
    parser.add_argument("--seed", type=int, help="draw --jobs jobs from this seed instead of running every one")
    parser.add_argument("--jobs", type=int, default=60)
    args = parser.parse_args(argv)
    if args.command == "score":
        return _rescore(args.out)
    torches = []
    for version in args.torch.split(","):
        if python_for(version) is None:
            print(f"torch {version}: no venv (make torch-venvs): skipped", flush=True)
        else:
            torches.append(version)
    if args.seed is not None:
        jobs = draw_jobs(args.seed, args.jobs, args.programs.split(","), torches)
    else:
        jobs = jobs_for(args.programs.split(","), args.faults.split(","), torches,
                        [int(w) for w in args.worlds.split(",")])
    totals: dict[str, list[int]] = {"pkl": [0, 0], "json": [0, 0], "snap": [0, 0]}
    misses: list[str] = []
    with tempfile.TemporaryDirectory(prefix="frscope-libjobs-") as scratch:
        for job in jobs:
            started = time.monotonic()
            python = python_for(job.torch)
            assert python is not None
            run_job(job, python, args.out / job.name)
            results = score_job(args.out / job.name, Path(scratch))
            for r in results:
                if r["apart"]:
                    continue
                totals[r["form"]][0] += r["right"]
                totals[r["form"]][1] += 1
                if not r["right"]:
                    misses.append(f"{job.name} {r['form']}: {r['why']}")
            (args.out / job.name / "verdicts.json").write_text(json.dumps(results, indent=1))
            marks = " ".join(f"{r['form']}={'ok' if r['right'] else 'apart' if r['apart'] else 'MISS'}"
                             for r in results)
            print(f"{job.name}: {marks} ({time.monotonic() - started:.0f} s)", flush=True)
    for miss in misses:
        print("miss", miss)
    print("; ".join(f"{form} {ok}/{n}" for form, (ok, n) in totals.items()))
    return 1 if misses else 0


def _rescore(out: Path) -> int:
    totals: dict[tuple[str, str, str], list[int]] = {}
    misses: list[str] = []
    with tempfile.TemporaryDirectory(prefix="frscope-libjobs-") as scratch:
        for job_dir in sorted(p for p in out.iterdir() if (p / "truth.json").exists()):
            truth = json.loads((job_dir / "truth.json").read_text())
            for r in score_job(job_dir, Path(scratch)):
                if r["apart"]:
                    continue
                cell = totals.setdefault((truth["torch"], truth["fault"], r["form"]), [0, 0])
                cell[0] += r["right"]
                cell[1] += 1
                if not r["right"]:
                    misses.append(f"{job_dir.name} {r['form']}: {r['why']}")
    for (torch, fault, form), (ok, n) in sorted(totals.items()):
        print(f"torch {torch} {fault} {form}: {ok}/{n}")
    for miss in misses:
        print("miss", miss)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
