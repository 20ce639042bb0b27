"""Score saved sweep captures: frscope's analysis (what `frscope analyze DIR --format json` runs) on every
form of every job, and torchfrtrace on the pickle form. Never re-runs a job.

A verdict is right when the first finding's category is an accepted one (truth.json) and its culprit ranks
are exactly the injected ones. In a form where truth.json says the evidence cannot decide, an answer that
frscope marks ambiguous is right when its candidates include the culprits and number at most twice as
many. A healthy job is right with no finding at all.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from frscope.analysis import AnalysisOptions, Report, analyze
from frscope.records import DumpSet, exits_from_json, load_dumps
from frscope.testing.sweep.capture import STUCK_AFTER_S, truth_of
from frscope.testing.sweep.classes import FORMS
from frscope.testing.sweep.runner import python_for
from frscope.testing.sweep.spec import JobSpec, groups_of

OPTIONS = AnalysisOptions(stall_after_s=STUCK_AFTER_S)
FORM_DIRS = {"snapshot": "snapshot", "pickle": "pickle", "json": "json"}


def _copied(src: Path, hours: float, into: Path) -> Path:
    """`src` copied, each file's mtime `hours` later than the original's (as a later `cp` leaves it)."""
    dst = into / src.name
    shutil.copytree(src, dst)
    for path in dst.iterdir():
        stat = (src / path.name).stat()
        later = stat.st_mtime + hours * 3600
        os.utime(path, (later, later))
    return dst


def judge(report: Report | None, truth: dict[str, Any], form: str, with_exits: bool) -> dict[str, Any]:
    culprits = sorted(truth["culprit_ranks"])
    accepted = truth["accepted_with_exits"] if with_exits else truth["accepted"]
    if form != "snapshot":
        accepted = accepted + [c for c in truth.get("accepted_without_stacks", []) if c not in accepted]
    undecidable = form in truth.get("undecidable", {})
    if undecidable:
        accepted = accepted + [c for c in truth.get("accepted_undecidable", []) if c not in accepted]
    flag = {"undecidable": True} if undecidable else {}
    if report is None:
        return {"right": False, "got": "no dump loaded", "category": None, "ranks": [], "ambiguous": False, **flag}
    findings = report.findings
    if not findings:
        return {"right": not culprits, "got": "no finding", "category": None, "ranks": [], "ambiguous": False,
                **flag}
    top = findings[0]
    ranks = sorted(top.culprit_ranks)
    got = f"{top.category.value} {ranks}" + (" (ambiguous)" if top.ambiguous else "")
    base = {"got": got, "category": top.category.value, "ranks": ranks, "ambiguous": top.ambiguous,
            "all": [f"{f.category.value} {sorted(f.culprit_ranks)}" for f in findings][:6],
            "summary": top.summary[:300], **flag}
    if not culprits:
        return {**base, "right": False}
    if top.category.value not in accepted:
        return {**base, "right": False}
    if ranks == culprits and not top.ambiguous:
        return {**base, "right": True}
    # As ../shared/accuracy-dev/score.py (the project's judge) rules, in every form: an answer marked
    # ambiguous is right when its candidates hold the culprits and are at most twice as many.
    if top.ambiguous and set(culprits) <= set(ranks) and len(ranks) <= 2 * len(culprits):
        return {**base, "right": True, "ambiguous_right": True}
    if ranks == culprits and undecidable:
        return {**base, "right": True, "ambiguous_right": True}
    return {**base, "right": False}


def current_truth(job_dir: Path) -> dict[str, Any]:
    """truth.json, re-derived from spec.json with today's class table (what was injected does not change;
    which categories count as right may have been refined since): rewritten when it differs."""
    truth = truth_of(JobSpec.from_json(json.loads((job_dir / "spec.json").read_text())))
    path = job_dir / "truth.json"
    if not path.exists() or json.loads(path.read_text()) != truth:
        path.write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def _unnamed_undecidable(truth: dict[str, Any], form: str, dumpset: DumpSet, with_exits: bool) -> dict[str, Any]:
    """The truth for this form, undecidable where a culprit left no dump and nothing in the form names it:
    no exit codes, and no dump's group listing reaches it (gloo's pg_config lists whichever group was built
    last: in a grid, not the world). The files cannot show the job had that rank."""
    if form == "snapshot" or with_exits or form in truth.get("undecidable", {}):
        return truth
    unnamed = [r for r in truth["culprit_ranks"] if r not in dumpset.dumps and r >= dumpset.world_size]
    if not unnamed:
        return truth
    why = (f"rank(s) {unnamed} left no dump and no file names them (no exit codes; the dumps' group listings stop "
           f"at rank {dumpset.world_size - 1}): the files cannot show the job had them")
    return {**truth, "undecidable": {**truth.get("undecidable", {}), form: why}}


def score_job(job_dir: Path) -> list[dict[str, Any]]:
    spec = json.loads((job_dir / "spec.json").read_text())
    truth = current_truth(job_dir)
    meta = json.loads((job_dir / "meta.json").read_text())
    exits_obj = json.loads((job_dir / "exits.json").read_text()) if (job_dir / "exits.json").exists() else {}
    use_exits = bool(spec.get("exits")) and bool(exits_obj)
    exits = {e.rank: e for e in exits_from_json(exits_obj, "exits.json")} if use_exits else {}
    rows = []
    for form in FORMS:
        folder = job_dir / FORM_DIRS[form]
        copied = form != "snapshot" and float(spec.get("copied_hours") or 0) > 0
        row: dict[str, Any] = {
            "job": job_dir.name, "class": truth["class"], "form": form, "world": truth["world_size"],
            "layout": truth["layout"], "torch": truth["torch"], "culprits": truth["culprit_ranks"],
            "copied": copied, "exits": use_exits, "settled": meta.get("settled", False),
        }
        if not folder.is_dir() or not any(folder.iterdir()):
            row.update(judge(None, truth, form, use_exits))
            rows.append(row)
            continue
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            path = _copied(folder, float(spec["copied_hours"]), Path(tmp)) if copied else folder
            dumpset = load_dumps([path], jobs=1)
            report = analyze(dumpset, OPTIONS, exits=exits) if dumpset.dumps else None
        row.update(judge(report, _unnamed_undecidable(truth, form, dumpset, use_exits), form, use_exits))
        if report is not None and report.findings and report.findings[0].stalled_for_s is not None:
            row["stalled_for_s"] = round(report.findings[0].stalled_for_s, 1)
        row["analyze_s"] = round(time.perf_counter() - started, 3)
        rows.append(row)
    return rows


# -- torchfrtrace ---------------------------------------------------------------------------------------

# torchfrtrace's words for what it found, as frscope's categories.
_TFT_CATEGORIES = {
    "COLLECTIVE_TYPE_MISMATCH": "CollectiveTypeMismatch",
    "SIZE_OR_SYNTAX_MISMATCH": "SizeMismatch",
    "COLLECTIVE_DTYPE_MISMATCH": "DtypeMismatch",
    "COLLECTIVE_STATE_MISMATCH": "NotCompleted",
}
_CULPRIT = re.compile(r"Culprit rank (\d+); Error type: (\w+)")
_MISSING = re.compile(r"missing ranks: \{([\d, ]*)\}")


def parse_torchfrtrace(text: str) -> tuple[str | None, list[int]]:
    """torchfrtrace's first verdict: a mismatch ('Culprit rank N; Error type: X') or a collective that not
    all ranks joined ('missing ranks: {..}'), whichever it printed first; (None, []) when neither."""
    for line in text.splitlines():
        culprit = _CULPRIT.search(line)
        if culprit:
            return _TFT_CATEGORIES.get(culprit.group(2), culprit.group(2)), [int(culprit.group(1))]
        missing = _MISSING.search(line)
        if missing:
            return "RankNotJoined", sorted(int(r) for r in missing.group(1).replace(",", " ").split())
    return None, []


def torchfrtrace_verdict(job_dir: Path, truth: dict[str, Any], variant: str = "") -> dict[str, Any]:
    """torchfrtrace judged by frscope's rule: its first verdict's category accepted (mapped to frscope's
    words) and its ranks exactly the culprits; a healthy job right with no verdict."""
    out_path = job_dir / f"torchfrtrace{variant}.txt"
    rc_path = job_dir / f"torchfrtrace{variant}.rc"
    if not out_path.exists():
        return {"right": False, "got": "not run"}
    text = out_path.read_text(errors="replace")
    rc = int(rc_path.read_text().strip() or 1) if rc_path.exists() else 1
    if rc != 0:
        last = [ln for ln in text.splitlines() if ln.strip()][-1:] or [""]
        return {"right": False, "got": f"crashed (rc {rc}): {last[0][:120]}", "ranks": []}
    category, ranks = parse_torchfrtrace(text)
    truth_ranks = sorted(truth["culprit_ranks"])
    if category is None:
        return {"right": not truth_ranks, "got": "no finding", "ranks": []}
    got = f"{category} {ranks}"
    accepted = set(truth["accepted"]) | set(truth.get("accepted_without_stacks", []))
    return {"right": bool(truth_ranks) and ranks == truth_ranks and category in accepted, "got": got,
            "category": category, "ranks": ranks}


def repair_pg_config(job_dir: Path) -> Path | None:
    """A copy of the job's pickle dumps whose `pg_config` names every group the rank belongs to with its
    real ranks, as ProcessGroupNCCL writes it (gloo keys one entry '' with the wrong ranks, and torchfrtrace
    fails on that with a KeyError before it analyses anything). The dumps are read with frscope's
    allow-list unpickler and written back with pickle.dumps. Returns the copy's directory."""
    import pickle

    from frscope.records.safe_pickle import safe_loads

    src = job_dir / "pickle"
    if not src.is_dir():
        return None
    dst = job_dir / "pickle-pgfixed"
    if dst.is_dir():
        return dst
    spec = JobSpec.from_json(json.loads((job_dir / "spec.json").read_text()))
    groups = groups_of(spec)
    tmp = job_dir / ".pickle-pgfixed.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for path in sorted(src.iterdir()):
        rank = int(path.name.rsplit("_", 1)[1])
        dump = safe_loads(path.read_bytes(), str(path))
        if not isinstance(dump, dict):
            continue
        dump["pg_config"] = {name: {"name": name, "desc": desc, "ranks": str(members)}
                             for name, desc, members in groups if rank in members}
        (tmp / path.name).write_bytes(pickle.dumps(dump))
    tmp.replace(dst)
    return dst


def run_torchfrtrace(job_dirs: list[Path]) -> None:
    """torchfrtrace on every job's pickle form that has not been run yet, one warm process per torch
    version (frscope/testing/sweep/tft_worker.py)."""
    by_version: dict[str, list[Path]] = {}
    for job in job_dirs:
        version = json.loads((job / "truth.json").read_text())["torch"]
        if not (job / "torchfrtrace.rc").exists() and (job / "pickle").is_dir():
            by_version.setdefault(version, []).append(job / "pickle")
        if not (job / "torchfrtrace-pgfixed.rc").exists():
            fixed = repair_pg_config(job)
            if fixed is not None:
                by_version.setdefault(version, []).append(fixed)
    repo = Path(__file__).resolve().parents[3]
    for version, dirs in by_version.items():
        python = python_for(version)
        if python is None:
            continue
        env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
        subprocess.run(["nice", "-n", "10", python, "-m", "frscope.testing.sweep.tft_worker"],
                       input="".join(f"{d}\n" for d in dirs), text=True, env=env, capture_output=True,
                       timeout=120 + 70 * len(dirs))


def score_dir(root: Path, *, torchfrtrace: bool = True, classes: set[str] | None = None,
              results_path: Path | None = None) -> str:
    jobs = sorted(d for d in root.iterdir() if (d / "meta.json").exists() and (d / "truth.json").exists())
    if classes is not None:
        jobs = [d for d in jobs if json.loads((d / "truth.json").read_text())["class"] in classes]
    if torchfrtrace:
        run_torchfrtrace(jobs)
    rows: list[dict[str, Any]] = []
    for job in jobs:
        job_rows = score_job(job)
        truth = current_truth(job)
        tft = torchfrtrace_verdict(job, truth)
        tft_fixed = torchfrtrace_verdict(job, truth, "-pgfixed")
        for row in job_rows:
            if row["form"] == "pickle":
                row["torchfrtrace"] = tft
                row["torchfrtrace_pgfixed"] = tft_fixed
        rows.extend(job_rows)
    batches = [json.loads(line) for line in (root / "batches.jsonl").read_text().splitlines()] \
        if (root / "batches.jsonl").exists() else []
    right = sum(r["right"] for r in rows)
    decidable = [r for r in rows if not r.get("undecidable")]
    results = {"root": str(root), "batches": batches, "stuck_after_s": STUCK_AFTER_S,
               "scored_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "right": right, "total": len(rows), "rows": rows}
    path = results_path or root / "results.json"
    path.write_text(json.dumps(results, indent=0) + "\n")
    by_class: Counter[str] = Counter()
    by_class_right: Counter[str] = Counter()
    by_class_undecidable: Counter[str] = Counter()
    by_class_undecidable_right: Counter[str] = Counter()
    for r in rows:
        by_class[r["class"]] += 1
        by_class_right[r["class"]] += r["right"]
        if r.get("undecidable"):
            by_class_undecidable[r["class"]] += 1
            by_class_undecidable_right[r["class"]] += r["right"]
    lines = [f"{right} of {len(rows)} verdicts right ({len(jobs)} jobs); results in {path}",
             f"  forms the evidence can decide: {sum(r['right'] for r in decidable)} of {len(decidable)} right; "
             f"undecidable ones (truth.json says why): {len(rows) - len(decidable)} verdicts, "
             f"{right - sum(r['right'] for r in decidable)} of them naming the culprits as candidates"]
    lines += [f"  {c}: {by_class_right[c]} / {n}" + (
        f" (of them in undecidable forms: {by_class_undecidable_right[c]} / {by_class_undecidable[c]})"
        if by_class_undecidable[c] else "") for c, n in sorted(by_class.items())]
    misses = [r for r in rows if not r["right"]]
    lines += [f"  {'UNDECIDED' if r.get('undecidable') else 'MISS'} {r['job']} [{r['form']}] truth {r['culprits']} "
              f"got {r['got']}" for r in misses[:200]]
    return "\n".join(lines)
