"""Run a batch of sweep jobs: draw them from the seed, run a few at a time through one zygote per torch
version, keep every capture under the output directory (one folder per job). Re-running the same command
skips the jobs already captured, so a batch can be resumed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from frscope.testing.sweep.capture import REPO, Zygote, run_job
from frscope.testing.sweep.classes import CLASSES
from frscope.testing.sweep.spec import JobSpec, draw_jobs

OWN_TORCH = "2.13"
OTHER_TORCH = {"2.14": "2.14.1", "2.15": "2.15.0"}


def python_for(version: str) -> str | None:
    """The Python that runs torch `version`: this venv's for 2.13, a cached scripts/torch-venv venv for the
    others; None when that venv is not built."""
    if version == OWN_TORCH:
        return sys.executable
    release = OTHER_TORCH.get(version)
    if release is None:
        return None
    done = subprocess.run([str(REPO / "scripts" / "torch-venv"), "--check", release], capture_output=True,
                          text=True, timeout=30)
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def available_versions(wanted: list[str]) -> list[str]:
    return [v for v in wanted if python_for(v) is not None]


def run_batch(seed: int, count: int, classes: list[str], versions: list[str], out: Path, parallel: int,
              command: str, log: Any = sys.stderr, first: int = 0, max_world: int = 8) -> list[dict[str, Any]]:
    unknown = [c for c in classes if c not in CLASSES]
    if unknown:
        raise ValueError(f"unknown classes {unknown}; choose from {', '.join(CLASSES)}")
    out.mkdir(parents=True, exist_ok=True)
    jobs = draw_jobs(seed, first + count, classes, versions, max_world)[first:]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    index_path = out / "batches.jsonl"
    with index_path.open("a") as handle:
        handle.write(json.dumps({"command": command, "seed": seed, "count": count, "first": first,
                                 "classes": classes, "torch": versions, "max_world": max_world, "commit": commit,
                                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
    todo = [j for j in jobs if not (out / j.job_id / "meta.json").exists()]
    zygotes: dict[str, Zygote] = {}
    for version in sorted({j.torch for j in todo}):
        python = python_for(version)
        if python is None:
            raise RuntimeError(f"no venv for torch {version} (make torch-venvs)")
        zygotes[version] = Zygote(python, Path("/tmp") / f"fsw-zygote-{version}")
    done_lock = threading.Lock()
    results: list[dict[str, Any]] = []
    started = time.monotonic()

    def one(spec: JobSpec) -> None:
        try:
            meta = run_job(spec, zygotes[spec.torch], out / spec.job_id)
        except Exception as exc:  # one job's failure never sinks the batch
            meta = {"job_id": spec.job_id, "error": f"{type(exc).__name__}: {exc}"}
            (out / spec.job_id).mkdir(parents=True, exist_ok=True)
            (out / spec.job_id / "error.json").write_text(json.dumps(meta) + "\n")
        with done_lock:
            results.append(meta)
            print(f"[{len(results)}/{len(todo)} {time.monotonic() - started:.0f}s] {spec.job_id}: "
                  f"{meta.get('elapsed_s', '-')} s{' UNSETTLED' if not meta.get('settled') else ''}"
                  f"{' ' + meta['error'] if 'error' in meta else ''}", file=log, flush=True)

    try:
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(one, todo))
    finally:
        for zygote in zygotes.values():
            zygote.close()
    return results
