#!/usr/bin/env python3
"""Score frscope's verdicts on the project's own real-torch fixtures (tests/data/real) and write
docs/accuracy-fixtures.md.

    .venv/bin/python scripts/accuracy.py                          # writes docs/accuracy-fixtures.md
    .venv/bin/python scripts/accuracy.py --print                  # only prints it
    .venv/bin/python scripts/accuracy.py --baseline 9b6204b       # adds a column: frscope at that commit

Each fixture is a real gloo job with one injected fault (scripts/make_fixtures.py; what each one did
is in tests/data/real/README.md). A verdict is right when the first finding's category is one of
the expected ones and its culprit ranks are exactly the ranks that misbehaved; a healthy job is right
with no finding at all. Snapshots were taken ~12 s after the job stopped moving, so every fixture is
analysed with stall_after_s=1 (as `frscope demo` does).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# FRSCOPE_SRC: score another checkout's frscope on this corpus (what --baseline runs).
sys.path.insert(0, os.environ.get("FRSCOPE_SRC") or str(REPO))

from frscope.analysis import AnalysisOptions, analyze  # noqa: E402
from frscope.records import load_dumps  # noqa: E402

REAL = REPO / "tests" / "data" / "real"
OPTIONS = AnalysisOptions(stall_after_s=1.0)
COPIED_LATER_S = 14 * 3600


@dataclass(frozen=True)
class Case:
    fixture: str
    fault_class: str
    categories: frozenset[str]  # empty: healthy, no finding expected
    culprits: tuple[int, ...]
    exits: bool = False  # pass tests/data/real/crash-exits.json as exit evidence
    copied: bool = False  # copy the files first and push their mtimes COPIED_LATER_S later


def _c(fixture: str, cls: str, cats: str, culprits: tuple[int, ...], **kw: Any) -> Case:
    return Case(fixture, cls, frozenset(c for c in cats.split(",") if c), culprits, **kw)


CASES = [
    *(_c(f, "healthy", "", ()) for f in ("none", "none-pickle", "jitter", "jitter-pickle")),
    *(_c(f, "hang", "RankNotJoined", (1,)) for f in ("hang", "hang-pickle", "skip", "skip-pickle")),
    *(_c(f, "mismatch", cat, (1,)) for f, cat in (
        ("type", "CollectiveTypeMismatch"), ("type-pickle", "CollectiveTypeMismatch"),
        ("size", "SizeMismatch"), ("size-pickle", "SizeMismatch"),
        ("dtype", "DtypeMismatch"), ("dtype-pickle", "DtypeMismatch"))),
    *(_c(f, "p2p (stacks)", "P2PMismatch", (0, 1)) for f in ("p2p",)),
    *(_c(f, "p2p (no stacks)", "RankNotJoined", (0, 1)) for f in ("p2p-pickle",)),
    *(_c(f, "p2p chain (stacks)", "P2PMismatch", (1,)) for f in ("pipeline", "pipeline-6")),
    *(_c(f, "p2p chain (no stacks)", "P2PMismatch,RankNotJoined", (1,))
      for f in ("pipeline-pickle", "pipeline-6-pickle")),
    *(_c(f, "straggler (every collective)", "Straggler", (2,)) for f in ("straggler", "straggler-pickle")),
    *(_c(f, "straggler (step boundaries)", "Straggler", (2,))
      for f in ("steps", "steps-pickle", "steps-6", "steps-6-pickle")),
    *(_c(f, "cross-group skip", "RankNotJoined", (1,))
      for f in ("crossgroup", "crossgroup-pickle", "crossgroup-6", "crossgroup-6-pickle")),
    _c("crash", "crash", "RankStopped,RankNotJoined,MissingDumps", (2,)),
    _c("crash", "crash (+ exit codes)", "RankStopped", (2,), exits=True),
    _c("crash-pickle", "crash", "RankStopped,MissingDumps", (2,)),
    _c("crash-pickle", "crash (+ exit codes)", "RankStopped", (2,), exits=True),
    _c("stale-pickle", "stale dump", "RankStopped", (2,)),
    _c("hang-pickle", "copied files (mtime +14 h)", "RankNotJoined", (1,), copied=True),
]


def form(fixture: str) -> str:
    return "pickle" if fixture.endswith("-pickle") else "snapshot (JSON + stacks)"


def run_case(case: Case) -> tuple[bool, str]:
    directory = REAL / case.fixture
    if not directory.is_dir():
        return False, "fixture missing"
    with tempfile.TemporaryDirectory() as tmp:
        if case.copied:
            copy = Path(tmp) / case.fixture
            shutil.copytree(directory, copy)
            later = time.time() + COPIED_LATER_S
            for path in copy.iterdir():
                os.utime(path, (later, later))
            directory = copy
        dumpset = load_dumps([directory])
        kwargs: dict[str, Any] = {}
        if case.exits:
            try:
                from frscope.records import exits_from_json
            except ImportError:  # an older frscope (a baseline) without exit evidence
                return False, "(exit evidence not supported)"
            obj = json.loads((REAL / "crash-exits.json").read_text())
            kwargs["exits"] = {e.rank: e for e in exits_from_json(obj, "crash-exits.json")}
        report = analyze(dumpset, OPTIONS, **kwargs)
    if not case.categories:
        got = ", ".join(f"{f.category.value} {list(f.culprit_ranks)}" for f in report.findings) or "no finding"
        return not report.findings, got
    if not report.findings:
        return False, "no finding"
    top = report.findings[0]
    got = f"{top.category.value} {list(top.culprit_ranks)}"
    ok = top.category.value in case.categories and tuple(top.culprit_ranks) == case.culprits
    if case.copied:
        age = top.stalled_for_s
        timeout_s = 1800.0
        shown = f"{age / 3600:.0f} h" if age is not None and age >= 7200 else f"{age:.0f} s" if age is not None else ""
        got += f", stalled for {shown}" if age is not None else ", no age"
        ok = ok and age is not None and age <= timeout_s
    return ok, got


def _label(case: Case) -> str:
    return case.fixture + (" + exits" if case.exits else "") + (" (copied)" if case.copied else "")


def baseline(commit: str) -> dict[str, tuple[bool, str]]:
    """Every case scored with frscope as it was at `commit` (extracted with git archive), in a child process."""
    with tempfile.TemporaryDirectory() as src:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "frscope"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
        out = subprocess.run([sys.executable, __file__, "--json"], env={**os.environ, "FRSCOPE_SRC": src},
                             capture_output=True, text=True, check=True).stdout
    return {k: (v[0], v[1]) for k, v in json.loads(out).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the table, do not write docs/accuracy-fixtures.md")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", metavar="COMMIT", help="also score frscope as it was at this commit (a column)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "accuracy-fixtures.md")
    args = parser.parse_args(argv)
    if args.json:
        print(json.dumps({_label(c): run_case(c) for c in CASES}))
        return 0
    before = baseline(args.baseline) if args.baseline else {}
    rows = []
    by_class: dict[tuple[str, str], list[bool]] = defaultdict(list)
    before_class: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for case in CASES:
        ok, got = run_case(case)
        expected = " or ".join(sorted(case.categories)) + f" {list(case.culprits)}" if case.categories else "no finding"
        shown = _label(case)
        was = before.get(shown)
        then = f" {'yes' if was[0] else '**no**'}: {was[1]} |" if was else ""
        rows.append(f"| `{shown}` | {form(case.fixture)} | {case.fault_class} | {expected} | {got} | "
                    f"{'yes' if ok else '**no**'} |{then}")
        by_class[(case.fault_class, form(case.fixture))].append(ok)
        if was:
            before_class[(case.fault_class, form(case.fixture))].append(was[0])
    right = sum(ok for oks in by_class.values() for ok in oks)
    total = sum(len(oks) for oks in by_class.values())
    summary = [f"| {cls} | {frm} | {sum(oks)} / {len(oks)} |"
               + (f" {sum(before_class[(cls, frm)])} / {len(oks)} |" if before else "")
               for (cls, frm), oks in by_class.items()]
    then_right = sum(ok for oks in before_class.values() for ok in oks)
    command = ".venv/bin/python scripts/accuracy.py" + (f" --baseline {args.baseline}" if args.baseline else "")
    text = "\n".join([
        "# Diagnosis accuracy on the real-torch fixture corpus",
        "",
        "Generated by `scripts/accuracy.py` (do not edit by hand):",
        "",
        "```",
        command,
        "```",
        "",
        "The corpus is `tests/data/real`: real torch gloo jobs on loopback, one injected fault each, made by",
        "`scripts/make_fixtures.py` (what each job did and what each rank's recorder shows is in",
        "`tests/data/real/README.md`). Input forms: frscope snapshots (`fr_trace_json` plus live stacks",
        "from the worker server, as the sidecar takes them) and raw `_dump_fr_trace()` pickles (torch's dump",
        "format, frames per entry, no live stacks). A verdict counts as right when the first finding's",
        "category is an expected one and its culprit ranks are exactly the ranks that misbehaved; healthy",
        "jobs (including one with uneven but unbiased per-step jitter) must have no finding. `copied`: the",
        "files copied and their mtimes set 14 h later (as `cp`/`kubectl cp` do); the age must stay within",
        "the collective's timeout. `+ exits`: the exit codes of the run passed as evidence (`--exits`).",
        "",
        f"**{right} of {total} right**"
        + (f" ({then_right} of {total} with frscope at `{args.baseline}`, before issue 13)." if before else "."),
        "",
        "| fault class | input form | right |" + (" baseline |" if before else ""),
        "|---|---|---|" + ("---|" if before else ""),
        *summary,
        "",
        "## Every case",
        "",
        "| fixture | input form | class | expected | frscope says | right |" + (" baseline |" if before else ""),
        "|---|---|---|---|---|---|" + ("---|" if before else ""),
        *rows,
        "",
    ])
    if args.print:
        print(text)
    else:
        args.out.write_text(text)
        print(f"{right} of {total} right; written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
