#!/usr/bin/env python3
"""frscope beside torchfrtrace on the same synthetic NCCL-shaped dumps, plus a bare-deserialization baseline.

One run measures, for every dump set (ranks x entries, scenario `not_joined`, pickle, as torch writes):

- baseline: a fresh interpreter that only `pickle.loads` every file (and drops it): the floor for any
  Python tool that reads these files;
- frscope: `frscope analyze DIR --format json` (wall time, CPU time, peak memory with its worker
  processes, and whether its first finding names the planted culprit, group and category);
- torchfrtrace (the smaller sets only): `torchfrtrace DIR --prefix nccl_trace_rank_`, under a time
  limit; timeouts and crashes are recorded as such, and its first reported problem is parsed.

Every command runs in its own process; wall time is measured around it, CPU time comes from wait4()'s
rusage (the process and the workers it reaped), peak memory from sampling the PSS of its process tree.
The dumps are generated once into --workdir (outside the repo) and reused while their ground truth
file says they match; the page cache is warmed before timing.

    .venv/bin/python bench/run_bench.py                       # the full run, writes bench/RESULTS.md
    .venv/bin/python bench/run_bench.py --sizes 64 --frscope-only '' --repeat 1 --results /tmp/r.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PREFIX = "nccl_trace_rank_"

BARE_LOAD = """
import os, pickle, sys
d = sys.argv[1]
n = 0
for name in sorted(os.listdir(d)):
    with open(os.path.join(d, name), 'rb') as f:
        obj = pickle.loads(f.read())  # noqa: S301 (our own generated files)
    n += len(obj['entries'])
    del obj
print(n)
"""


@dataclass
class Run:
    """One process, measured."""

    argv: list[str]
    wall_s: float
    user_s: float
    sys_s: float
    max_rss_mib: float  # largest single process (wait4 rusage: the child or one of its reaped children)
    tree_peak_mib: float  # the process and its children together (PSS, sampled every 0.2 s)
    returncode: int | None
    timed_out: bool
    load_before: float
    load_after: float
    output_path: str

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s


@dataclass
class SetResult:
    ranks: int
    entries: int
    files_mib: float
    gen_s: float | None
    truth: dict[str, Any]
    baseline: list[Run] = field(default_factory=list)
    frscope: list[Run] = field(default_factory=list)
    torchfrtrace: Run | None = None
    frscope_verdict: dict[str, Any] = field(default_factory=dict)
    torchfrtrace_verdict: dict[str, Any] = field(default_factory=dict)


_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def tree_memory_kib(root: int) -> int:
    """PSS (shared pages split between sharers, so forked workers are not counted twice) of a process
    and all its descendants; RSS where smaps_rollup cannot be read."""
    total = 0
    stack, seen = [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            kib = None
            try:
                with open(f"/proc/{pid}/smaps_rollup") as handle:
                    for line in handle:
                        if line.startswith("Pss:"):
                            kib = int(line.split()[1])
                            break
            except OSError:
                pass
            if kib is None:
                with open(f"/proc/{pid}/statm") as handle:
                    kib = int(handle.read().split()[1]) * _PAGE_KIB
            total += kib
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as handle:
                    stack.extend(int(x) for x in handle.read().split())
        except (OSError, ValueError):
            continue
    return total


class TreeSampler(threading.Thread):
    """Peak memory of a process tree, sampled."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.peak_kib = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak_kib = max(self.peak_kib, tree_memory_kib(self.pid))
            self.done.wait(self.interval_s)


def _address_space_limit(limit_bytes: int | None) -> Any:
    """A preexec_fn that caps the child's address space (an allocation past it fails: MemoryError)."""
    if not limit_bytes:
        return None

    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return apply


def measure(argv: list[str], out_path: Path, timeout_s: float, env: dict[str, str] | None = None,
            memory_limit: int | None = None) -> Run:
    """Run argv with stdout+stderr to out_path; wall time, rusage of exactly that process."""
    load_before = os.getloadavg()[0]
    with out_path.open("wb") as out:
        began = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                start_new_session=True, preexec_fn=_address_space_limit(memory_limit))
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        sampler = TreeSampler(proc.pid)
        sampler.start()
        try:
            _pid, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            sampler.done.set()
        wall = time.perf_counter() - began
        sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(
        argv=argv,
        wall_s=wall,
        user_s=usage.ru_utime,
        sys_s=usage.ru_stime,
        max_rss_mib=usage.ru_maxrss / 1024,
        tree_peak_mib=max(sampler.peak_kib, usage.ru_maxrss) / 1024,
        returncode=None if timed_out.is_set() else proc.returncode,
        timed_out=timed_out.is_set(),
        load_before=load_before,
        load_after=os.getloadavg()[0],
        output_path=str(out_path),
    )


def warm_cache(directory: Path) -> None:
    for entry in os.scandir(directory):
        with open(entry.path, "rb") as handle:
            while handle.read(1 << 22):
                pass


def ensure_set(workdir: Path, ranks: int, entries: int, scenario: str, seed: int, jobs: int,
               regenerate: bool, layout: list[str] | None = None) -> tuple[Path, dict[str, Any], float | None]:
    layout = layout or []
    name = f"nccl-{scenario}-{ranks}x{entries}-seed{seed}" + "".join(
        f"-{layout[i].lstrip('-')}{layout[i + 1]}" for i in range(0, len(layout), 2))
    directory = workdir / name
    truth_path = workdir / f"{name}.truth.json"
    if not regenerate and truth_path.exists() and directory.is_dir():
        truth = json.loads(truth_path.read_text())
        expected = ranks - len(truth.get("missing_ranks", []))
        if sum(1 for _ in os.scandir(directory)) == expected:
            return directory, truth, None
    shutil.rmtree(directory, ignore_errors=True)
    argv = [sys.executable, "-m", "frscope.testing.synthetic", str(directory), "--ranks", str(ranks),
            "--entries", str(entries), "--shape", "nccl", "--scenario", scenario, "--format", "pickle",
            "--seed", str(seed), "--jobs", str(jobs), "--truth", str(truth_path), *layout]
    print(f"  generating {name} ...", flush=True)
    began = time.perf_counter()
    subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    gen_s = time.perf_counter() - began
    return directory, json.loads(truth_path.read_text()), gen_s


def frscope_verdict(output: Path, truth: dict[str, Any], run: Run) -> dict[str, Any]:
    if run.timed_out:
        return {"status": "timeout", "right": False, "said": "timed out"}
    try:
        report = json.loads(output.read_text())
    except (OSError, ValueError) as exc:
        tail = output.read_text(errors="replace")[-400:] if output.exists() else ""
        return {"status": "crash", "right": False, "said": f"no JSON ({exc}): {tail}"}
    findings = report.get("findings") or []
    if not findings:
        return {"status": "ok", "right": truth.get("category") is None, "said": "no findings"}
    first = findings[0]
    group = (first.get("process_group") or {}).get("name")
    seq = first.get("collective_seq_id") if first.get("collective_seq_id") is not None else first.get("p2p_seq_id")
    right = (
        first.get("category") == truth["category"]
        and sorted(first.get("culprit_ranks") or []) == sorted(truth["culprit_ranks"])
        and (truth.get("group_name") is None or group == truth["group_name"])
    )
    said = f"{first.get('category')} ranks {first.get('culprit_ranks')} group {group} seq {seq}"
    return {"status": "ok", "right": right, "said": said, "findings": len(findings)}


_TFT_HEADS = (
    ("not_joined", re.compile(r"^Not all ranks joining collective, sequence number: (\d+)")),
    ("errors", re.compile(r"^Collective sequence number: (\d+) has errors")),
    ("io_mismatch", re.compile(r"^Input/output mismatch in the collective sequence number: (\d+)")),
)


def parse_torchfrtrace(text: str) -> list[dict[str, Any]]:
    """torchfrtrace's report blocks, in the order it printed them."""
    blocks: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        for kind, pattern in _TFT_HEADS:
            match = pattern.match(line)
            if match:
                current = {"kind": kind, "seq": int(match.group(1)), "group": None, "ranks": set()}
                blocks.append(current)
                break
        else:
            if current is None:
                continue
            if line.startswith("group info: "):
                current["group"] = line[len("group info: "):].split(":", 1)[0]
            elif line.startswith("missing ranks: "):
                current["ranks"] |= {int(x) for x in re.findall(r"\d+", line[len("missing ranks: "):])}
            elif line.startswith("error msg: "):
                current["ranks"] |= {int(x) for x in re.findall(r"Culprit rank (\d+)", line)}
                current["error"] = line[len("error msg: "):][:160]
    if "No errors found for this collective entry" in text and not blocks:
        blocks.append({"kind": "no_errors", "seq": None, "group": None, "ranks": set()})
    return blocks


def compact_ranks(ranks: set[int] | list[int], limit: int = 6) -> str:
    """[8-15, 24-31, ...] (128 ranks): torchfrtrace lists whole groups."""
    spans: list[str] = []
    ordered = sorted(ranks)
    start = prev = None
    for rank in [*ordered, None]:
        if rank is not None and prev is not None and rank == prev + 1:
            prev = rank
            continue
        if start is not None:
            spans.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = rank
    text = ", ".join(spans[:limit]) + (", ..." if len(spans) > limit else "")
    return f"[{text}]" + (f" ({len(ordered)} ranks)" if len(ordered) > 1 else "")


def torchfrtrace_verdict(output: Path, truth: dict[str, Any], run: Run, timeout_s: float) -> dict[str, Any]:
    if run.timed_out:
        return {"status": "timeout", "right": False, "said": f"killed after {timeout_s:.0f} s"}
    text = output.read_text(errors="replace")
    if "Traceback (most recent call last)" in text:
        last = [ln for ln in text.strip().splitlines() if ln.strip()][-1]
        return {"status": "crash", "right": False, "said": f"crashed: {last[:200]}"}
    blocks = parse_torchfrtrace(text)
    if not blocks:
        return {"status": "ok", "right": truth.get("category") is None, "said": "reported nothing"}
    first = blocks[0]
    culprits = set(truth["culprit_ranks"])
    right = first["ranks"] == culprits and first["group"] == truth.get("group_name")
    anywhere = any(b["ranks"] == culprits and b["group"] == truth.get("group_name") for b in blocks)
    said = f"{first['kind']} ranks {compact_ranks(first['ranks'])} group {first['group']} seq {first['seq']}"
    if first["ranks"] != culprits and culprits <= first["ranks"]:
        said += " (the culprit among them)"
    if first.get("error"):
        said += f" ({first['error'][:80]})"
    return {"status": "ok", "right": right, "right_anywhere": anywhere, "said": said, "blocks": len(blocks)}


def machine_info() -> dict[str, str]:
    info: dict[str, str] = {}
    info["nproc"] = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kib = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                       if ln.startswith("MemTotal"))
        info["ram"] = f"{mem_kib / 2**20:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        info.setdefault("ram", "?")
    info["cpu"] = model or platform.processor() or "?"
    info["kernel"] = platform.release()
    info["python"] = platform.python_version()
    try:
        from importlib.metadata import version

        info["torch"] = version("torch")
    except Exception:  # torch is optional here
        info["torch"] = "not installed"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "frscope"], capture_output=True, text=True,
                           cwd=REPO)
    info["frscope"] = commit.stdout.strip() + (" (+ uncommitted changes under frscope/)" if dirty.stdout.strip()
                                               else "")
    return info


def fmt_run(runs: list[Run]) -> str:
    walls = [r.wall_s for r in runs if not r.timed_out]
    if not walls:
        return "timeout"
    if len(walls) == 1:
        return f"{walls[0]:.2f}"
    return f"{statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f})"


def median_wall(runs: list[Run]) -> float | None:
    walls = [r.wall_s for r in runs if not r.timed_out]
    return statistics.median(walls) if walls else None


def median_cpu(runs: list[Run]) -> float | None:
    cpus = [r.cpu_s for r in runs if not r.timed_out]
    return statistics.median(cpus) if cpus else None


def write_results(path: Path, results: list[SetResult], info: dict[str, str], command: str,
                  tft_timeout: float, started: str, load_start: tuple[float, float, float],
                  load_end: tuple[float, float, float], startup: Run | None, tft_memory_gib: float = 12.0) -> None:
    lines: list[str] = []
    add = lines.append
    add("# frscope vs torchfrtrace: speed on synthetic NCCL dumps")
    add("")
    add("Written by `bench/run_bench.py`; every number below comes from one run of it.")
    add("")
    add("## Machine and command")
    add("")
    add(f"- CPU: {info['cpu']}, `nproc` = {info['nproc']}; RAM {info['ram']}; Linux {info['kernel']}")
    add(f"- Python {info['python']}, torch {info['torch']}, frscope at commit {info['frscope']}")
    add(f"- Run started {started}; load average (1/5/15 min) at start "
        f"{' / '.join(f'{x:.1f}' for x in load_start)}, at end {' / '.join(f'{x:.1f}' for x in load_end)}. "
        "The machine is shared with other engineers' builds and test runs, so wall times carry their load; "
        "CPU time (user+sys of the measured process) is less sensitive to it and is shown beside.")
    add(f"- Command: `{command}`")
    add("- Dumps: `python -m frscope.testing.synthetic DIR --ranks N --entries 2000 --shape nccl --scenario not_joined "
        "--format pickle --seed 0` (plus `--tp`/`--pp` where the command gives them): one plain pickle "
        "(protocol 2, like torch) per rank, 2,000-entry ring "
        "buffers that wrapped, 3-D parallel job (by default tp 8 x pp 2 x dp N/16: every rank in 4 groups), ~12 "
        "stack frames per entry. Generated into a temp dir outside the repo; page cache warmed before timing.")
    add("- baseline: a fresh `python` that only `pickle.loads` every file and drops it (plain C unpickler, "
        "nothing kept): the floor for any Python reader of these files.")
    add("- frscope: `frscope analyze DIR --format json --no-progress -o OUT` (exit 1 = findings).")
    add(f"- torchfrtrace: `torchfrtrace DIR --prefix {PREFIX}` from torch {info['torch']}, killed after "
        f"{tft_timeout:.0f} s; its address space is capped at {tft_memory_gib:.0f} GiB (it keeps every dump in "
        "memory; past the cap it fails with MemoryError instead of taking the shared machine down).")
    if startup is not None:
        add(f"  Its start-up alone (`import torch.distributed.flight_recorder.fr_trace`) took "
            f"{startup.wall_s:.1f} s wall, {startup.cpu_s:.1f} s CPU here.")
    add("- Wall times are seconds, median (min-max) over the repeats. CPU = user+sys seconds of the process and "
        "of the worker processes it waited for (wait4 rusage). Memory = peak of the process and its workers "
        "together: PSS summed over the process tree, sampled every 0.2 s (never less than the largest single "
        "process's peak RSS).")
    add("")
    add("## Results")
    add("")
    add("| ranks | dump MiB | baseline wall s | baseline CPU s | frscope wall s | frscope CPU s "
        "| frscope peak memory MiB | frscope / baseline | torchfrtrace wall s | torchfrtrace peak memory MiB "
        "| torchfrtrace / frscope | load avg (1 min) around the runs |")
    add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        base_w, fr_w = median_wall(r.baseline), median_wall(r.frscope)
        base_c, fr_c = median_cpu(r.baseline), median_cpu(r.frscope)
        fr_rss = max((x.tree_peak_mib for x in r.frscope), default=0.0)
        ratio = f"{fr_w / base_w:.2f}x wall, {fr_c / base_c:.2f}x CPU" if fr_w and base_w and fr_c and base_c else "-"
        if r.torchfrtrace is None:
            tft_w, tft_rss, speed = "not run", "-", "-"
        elif r.torchfrtrace.timed_out:
            tft_w, tft_rss = f"> {tft_timeout:.0f} (killed)", f"{r.torchfrtrace.tree_peak_mib:.0f}"
            speed = f"> {tft_timeout / fr_w:.0f}x" if fr_w else "-"
        elif r.torchfrtrace_verdict.get("status") == "crash":
            tft_w = f"crashed after {r.torchfrtrace.wall_s:.0f} s"
            tft_rss, speed = f"{r.torchfrtrace.tree_peak_mib:.0f}", "-"
        else:
            tft_w, tft_rss = f"{r.torchfrtrace.wall_s:.1f}", f"{r.torchfrtrace.tree_peak_mib:.0f}"
            speed = f"{r.torchfrtrace.wall_s / fr_w:.1f}x" if fr_w else "-"
        runs = [*r.baseline, *r.frscope, *([r.torchfrtrace] if r.torchfrtrace else [])]
        loads = [x for run in runs for x in (run.load_before, run.load_after)]
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"
        add(f"| {r.ranks:,} | {r.files_mib:,.0f} | {fmt_run(r.baseline)} | "
            f"{base_c:.1f} | {fmt_run(r.frscope)} | {fr_c:.1f} | {fr_rss:,.0f} | {ratio} | {tft_w} | {tft_rss} | "
            f"{speed} | {load} |".replace("| None |", "| - |"))
    add("")
    add("## Did each tool name the planted culprit?")
    add("")
    add("The planted fault (`not_joined`): one rank never enqueues the data-parallel reduce-scatter of the last "
        "step; the others in its DP group block in it, and the hang spreads to the other groups from there. "
        "Right = the first thing the tool reports names the culprit rank(s) and the DP group.")
    add("")
    add("| ranks | planted | frscope said (first finding) | right | torchfrtrace said (first report) | right |")
    add("|---:|---|---|:-:|---|:-:|")
    for r in results:
        t = r.truth
        planted = (f"{t['category']} rank {t['culprit_ranks']} group {t['group_name']} ({t['group_desc']}) "
                   f"seq {t['collective_seq_id']}")
        fv, tv = r.frscope_verdict, r.torchfrtrace_verdict
        t_said = tv.get("said", "not run") if tv else "not run"
        t_right = ("yes" if tv.get("right") else ("later" if tv.get("right_anywhere") else "no")) if tv else "-"
        add(f"| {r.ranks:,} | {planted} | {fv.get('said', '-')} | {'yes' if fv.get('right') else 'no'} | "
            f"{t_said} | {t_right} |")
    add("")
    add("## Targets")
    add("")
    by_ranks = {r.ranks: r for r in results}

    def target(label: str, ok: bool | None, detail: str) -> None:
        mark = "n/a" if ok is None else ("met" if ok else "**missed**")
        add(f"- {label}: {mark} ({detail})")

    # Issue 36, item 2.
    r1k = by_ranks.get(1024)
    if r1k:
        w, b = median_wall(r1k.frscope), median_wall(r1k.baseline)
        if w and b:
            target("1,024 ranks: <= 0.3x the bare pickle.loads wall time (same run)", w / b <= 0.3,
                   f"{w:.2f} s vs {b:.2f} s = {w / b:.2f}x")
        if w:
            target("1,024 ranks in <= 1 s wall", w <= 1.0, f"{w:.2f} s wall, {median_cpu(r1k.frscope):.2f} s CPU")
        tft = r1k.torchfrtrace
        if w and tft is not None:
            if tft.timed_out:
                target("1,024 ranks: >= 100x faster than torchfrtrace", tft_timeout / w >= 100,
                       f"torchfrtrace killed after {tft_timeout:.0f} s vs {w:.2f} s")
            elif r1k.torchfrtrace_verdict.get("status") == "ok":
                target("1,024 ranks: >= 100x faster than torchfrtrace", tft.wall_s / w >= 100,
                       f"{tft.wall_s:.1f} s vs {w:.2f} s = {tft.wall_s / w:.1f}x")
    r8k = by_ranks.get(8192)
    if r8k:
        w = median_wall(r8k.frscope)
        peak = max((x.tree_peak_mib for x in r8k.frscope), default=0.0)
        target("8,192 ranks: <= 3 GiB peak memory", peak <= 3072, f"{peak:,.0f} MiB (frscope and its workers)")
        target("8,192 ranks: <= 100 s wall", None if w is None else w <= 100,
               f"{w:.1f} s wall, {median_cpu(r8k.frscope):.1f} s CPU" if w else "timeout")
    for r in results:
        if r.ranks > 8192:
            w, b = median_wall(r.frscope), median_wall(r.baseline)
            peak = max((x.tree_peak_mib for x in r.frscope), default=0.0)
            target(f"{r.ranks:,} ranks: <= 30 s wall", w is not None and w <= 30,
                   f"{(w or 0):.1f} s wall, {median_cpu(r.frscope) or 0:.1f} s CPU"
                   + (f"; the bare pickle.loads {b:.1f} s" if b else ""))
            target(f"{r.ranks:,} ranks: <= 4 GiB peak", bool(peak) and peak <= 4096,
                   f"{peak:,.0f} MiB (frscope and its workers)")
            target(f"{r.ranks:,} ranks: planted culprit first", bool(r.frscope_verdict.get("right")),
                   f"first finding {r.frscope_verdict.get('said')}")
    per_rank = [(r.ranks, max((x.tree_peak_mib for x in r.frscope), default=0.0) * 1024 / r.ranks)
                for r in results if r.frscope and r.ranks >= 1024]
    if len(per_rank) > 1:
        target("memory linear in ranks (peak KiB per rank, by size)", None,
               ", ".join(f"{n:,}: {kib:.0f}" for n, kib in per_rank))
    add("")
    add("## What torchfrtrace did on each set")
    add("")
    for r in results:
        if r.torchfrtrace is None:
            continue
        tv = r.torchfrtrace_verdict
        run = r.torchfrtrace
        if run.timed_out:
            what = f"still running after {tft_timeout:.0f} s; killed (peak memory {run.tree_peak_mib:,.0f} MiB)."
        elif tv.get("status") == "crash":
            what = f"crashed after {run.wall_s:.1f} s: `{tv['said']}`."
        else:
            what = (f"finished in {run.wall_s:.1f} s (exit {run.returncode}, {tv.get('blocks', 0)} report blocks); "
                    f"first report: {tv.get('said')}; right culprit first: "
                    f"{'yes' if tv.get('right') else 'no'}, anywhere: {'yes' if tv.get('right_anywhere') else 'no'}.")
        add(f"- {r.ranks:,} ranks: {what}")
    add("")
    gens = [r for r in results if r.gen_s is not None]
    if gens:
        add("## Generating the dumps (this run)")
        add("")
        for r in gens:
            add(f"- {r.ranks:,} ranks: {r.gen_s:.0f} s for {r.files_mib:,.0f} MiB "
                "(`python -m frscope.testing.synthetic ... --jobs 2`)")
        add("")
    text = "\n".join(lines) + "\n"
    marker = "<!-- notes below are kept across runs -->"
    notes = "\n"
    if path.exists():
        previous = path.read_text()
        if marker in previous:
            notes = previous.split(marker, 1)[1]
    text += marker + notes
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,256,1024", help="rank counts for all three tools")
    parser.add_argument("--frscope-only", default="4096,8192", help="rank counts for frscope and baseline only")
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--scenario", default="not_joined")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="/tmp/frscope-bench")
    parser.add_argument("--repeat", type=int, default=3, help="runs of baseline and frscope per set (<=1,024 ranks)")
    parser.add_argument("--repeat-large", type=int, default=1, help="runs per set above 1,024 ranks")
    parser.add_argument("--tft-timeout", type=float, default=300.0)
    parser.add_argument("--tft-memory-gib", type=float, default=12.0,
                        help="address-space cap for torchfrtrace (it keeps every dump in memory: at 8,192 ranks "
                             "it would take the machine down, and other people's work with it)")
    parser.add_argument("--tp", type=int, default=None, help="tensor-parallel size of the generated job")
    parser.add_argument("--pp", type=int, default=None, help="pipeline-parallel size of the generated job")
    parser.add_argument("--timeout", type=float, default=1200.0, help="limit for frscope and baseline runs")
    parser.add_argument("--jobs", type=int, default=2, help="processes for generating dumps")
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--skip-torchfrtrace", action="store_true")
    parser.add_argument("--delete-large", action="store_true", help="delete sets above 1,024 ranks afterwards")
    parser.add_argument("--results", default=str(REPO / "bench" / "RESULTS.md"))
    args = parser.parse_args(argv)

    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    only = [int(x) for x in args.frscope_only.split(",") if x.strip()]
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    outdir = workdir / "outputs"
    outdir.mkdir(exist_ok=True)
    bindir = Path(sys.executable).parent
    frscope_bin = shutil.which("frscope", path=str(bindir)) or "frscope"
    tft_bin = shutil.which("torchfrtrace", path=str(bindir)) or "torchfrtrace"
    info = machine_info()
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_start = os.getloadavg()
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/run_bench.py", *(argv or sys.argv[1:])])
    print(f"machine: {info}", flush=True)

    startup = None
    if sizes and not args.skip_torchfrtrace:
        startup = measure([sys.executable, "-c", "import torch.distributed.flight_recorder.fr_trace"],
                          outdir / "torch-import.txt", 300)

    results: list[SetResult] = []
    for ranks in sizes + only:
        print(f"[{ranks} ranks]", flush=True)
        layout = [*(["--tp", str(args.tp)] if args.tp else []), *(["--pp", str(args.pp)] if args.pp else [])]
        directory, truth, gen_s = ensure_set(workdir, ranks, args.entries, args.scenario, args.seed, args.jobs,
                                             args.regenerate, layout)
        files_mib = sum(e.stat().st_size for e in os.scandir(directory)) / 2**20
        result = SetResult(ranks, args.entries, files_mib, gen_s, truth)
        warm_cache(directory)
        repeat = args.repeat if ranks <= 1024 else args.repeat_large
        for i in range(repeat):
            base = measure([sys.executable, "-c", BARE_LOAD, str(directory)], outdir / f"baseline-{ranks}.txt",
                           args.timeout)
            result.baseline.append(base)
            out_json = outdir / f"frscope-{ranks}.json"
            out_json.unlink(missing_ok=True)
            run = measure([frscope_bin, "analyze", str(directory), "--format", "json", "--no-progress", "-o",
                           str(out_json)], outdir / f"frscope-{ranks}.log", args.timeout)
            result.frscope.append(run)
            if i == 0:
                result.frscope_verdict = frscope_verdict(out_json, truth, run)
            print(f"  baseline {base.wall_s:.2f} s ({base.cpu_s:.2f} CPU, {base.tree_peak_mib:.0f} MiB) | "
                  f"frscope {run.wall_s:.2f} s ({run.cpu_s:.2f} CPU, {run.tree_peak_mib:.0f} MiB, "
                  f"exit {run.returncode}) load {run.load_after:.1f}", flush=True)
        print(f"  frscope: {result.frscope_verdict}", flush=True)
        if ranks in sizes and not args.skip_torchfrtrace:
            log = outdir / f"torchfrtrace-{ranks}.txt"
            tft = measure([tft_bin, str(directory), "--prefix", PREFIX], log, args.tft_timeout,
                          memory_limit=int(args.tft_memory_gib * 2**30))
            result.torchfrtrace = tft
            result.torchfrtrace_verdict = torchfrtrace_verdict(log, truth, tft, args.tft_timeout)
            print(f"  torchfrtrace {tft.wall_s:.1f} s ({tft.cpu_s:.1f} CPU, {tft.tree_peak_mib:.0f} MiB) "
                  f"{result.torchfrtrace_verdict}", flush=True)
        results.append(result)
        if args.delete_large and ranks > 1024:
            shutil.rmtree(directory, ignore_errors=True)
        (workdir / "results.json").write_text(json.dumps(
            [{**asdict(r), "baseline": [asdict(x) for x in r.baseline], "frscope": [asdict(x) for x in r.frscope]}
             for r in results], indent=1, default=str))
        write_results(Path(args.results), results, info, command, args.tft_timeout, started, load_start,
                      os.getloadavg(), startup, args.tft_memory_gib)
    print(f"wrote {args.results}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
