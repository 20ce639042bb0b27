"""Judge frscope's analysis on random cases, in process: `frscope.records.load_dumps` on the written files,
then `frscope.analysis.analyze` (what `frscope analyze` runs), judged as ../shared/accuracy-dev/score.py
judges real jobs: the first finding's category is one the truth accepts and its culprit ranks are exactly
the truth's (an answer marked ambiguous also counts when its candidates hold the culprits and are at most
twice as many); a healthy program must give no finding. Forms the evidence cannot decide are scored apart.
"""

from __future__ import annotations

import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from frscope.analysis import AnalysisOptions, Report, analyze
from frscope.records import exits_from_json, load_dumps
from frscope.testing.randprog.case import FORMS, Case, make_case, write_form


@dataclass(slots=True)
class Verdict:
    seed: int
    fault: str
    form: str
    world: int
    backend: str
    truth: str  # category and culprits
    right: bool
    undecidable: bool
    got: str
    healthy: bool


def judge(report: Report | None, case: Case) -> tuple[bool, str]:
    truth = case.truth
    if report is None:
        return False, "no dump loaded"
    findings = report.findings
    if truth.category == "healthy":
        return not findings, (f"{findings[0].category.value} {sorted(findings[0].culprit_ranks)}" if findings
                              else "no finding")
    if not findings:
        return False, "no finding"
    top = findings[0]
    got, want = set(top.culprit_ranks), set(truth.culprits)
    ranks_ok = got == want or (top.ambiguous and want <= got and len(got) <= 2 * len(want))
    text = f"{top.category.value} {sorted(got)}" + (" (ambiguous)" if top.ambiguous else "")
    return top.category.value in truth.accepted and ranks_ok, text


def run_form(case: Case, form: str, folder: Path) -> Report | None:
    paths = write_form(case, form, folder)
    if not paths:
        return None
    dumpset = load_dumps([folder], jobs=1)
    if not dumpset.dumps:
        return None
    exits = {e.rank: e for e in exits_from_json({str(r): c for r, c in case.exits.items()}, "exits")}
    return analyze(dumpset, AnalysisOptions(), exits=exits)


def score_case(seed: int, forms: Iterable[str] = FORMS) -> list[Verdict]:
    case = make_case(seed)
    out = []
    with tempfile.TemporaryDirectory(prefix="randprog-", dir=_tmp_root()) as tmp:
        for form in forms:
            report = run_form(case, form, Path(tmp) / form)
            right, got = judge(report, case)
            out.append(Verdict(seed, case.fault.name, form, case.program.layout.world, case.program.backend,
                               f"{case.truth.category} {list(case.truth.culprits)}", right,
                               bool(case.undecidable(form)), got, case.truth.category == "healthy"))
    return out


def _tmp_root() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None


def _chunk(seeds: list[int]) -> list[dict[str, object]]:
    return [asdict(v) for s in seeds for v in score_case(s)]


def sweep(seed: int, programs: int, jobs: int = 1) -> list[dict[str, object]]:
    """Verdicts for programs seed, seed+1, ... (one seed per program)."""
    seeds = list(range(seed, seed + programs))
    if jobs <= 1:
        return _chunk(seeds)
    size = max(1, min(50, programs // (jobs * 4)))
    chunks = [seeds[i:i + size] for i in range(0, len(seeds), size)]
    with ProcessPoolExecutor(jobs) as pool:
        return [row for rows in pool.map(_chunk, chunks) for row in rows]


def summarize(rows: list[dict[str, object]], misses: int = 30) -> str:
    """Per class and form (decidable cases), the undecidable ones apart, healthy false alarms, and the
    top miss patterns with a seed to replay each."""
    table: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    apart: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    patterns: Counter[tuple[str, str, str, str]] = Counter()
    sample: dict[tuple[str, str, str, str], int] = {}
    for row in rows:
        form, fault = str(row["form"]), str(row["fault"])
        if row["undecidable"]:
            apart[form][0] += bool(row["right"])
            apart[form][1] += 1
            continue
        for key in ((fault, form), (fault, "all"), ("ALL", form), ("ALL", "all")):
            table[key][0] += bool(row["right"])
            table[key][1] += 1
        if not row["right"]:
            truth_cat = str(row["truth"]).split(" ")[0]
            got_cat = str(row["got"]).split(" [")[0].split(" (")[0]
            pat = (fault, form, truth_cat, got_cat)
            patterns[pat] += 1
            sample.setdefault(pat, int(row["seed"]))  # type: ignore[call-overload]
    classes = sorted({k[0] for k in table if k[0] != "ALL"}) + ["ALL"]
    lines = ["| class | " + " | ".join(FORMS) + " | all |", "|---|" + "---|" * (len(FORMS) + 1)]
    for c in classes:
        cells = []
        for f in (*FORMS, "all"):
            ok, n = table.get((c, f), [0, 0])
            cells.append(f"{ok}/{n} ({100 * ok / n:.1f}%)" if n else "-")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines.append("")
    cuts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in sorted(rows, key=lambda r: (str(r["backend"]), int(str(r["world"])))):
        if row["undecidable"]:
            continue
        world = int(str(row["world"]))
        size = ("2 ranks" if world == 2 else "3-8 ranks" if world <= 8 else "9-16 ranks" if world <= 16
                else "17-64 ranks")
        for cut in (str(row["backend"]), size):
            cuts[cut][0] += bool(row["right"])
            cuts[cut][1] += 1
    lines.append("other cuts (decidable, all forms): " + ", ".join(
        f"{k} {ok}/{n} ({100 * ok / n:.1f}%)" for k, (ok, n) in cuts.items()))
    lines.append("")
    lines.append("undecidable (scored apart; right = the ambiguous rule): " + ", ".join(
        f"{f} {ok}/{n}" for f, (ok, n) in sorted(apart.items())))
    for label, picked in (("fault-free programs", [r for r in rows if r["fault"] == "healthy"]),
                          ("programs whose truth is healthy (fault-free, stale reads, faults without effect)",
                           [r for r in rows if r["healthy"]])):
        alarms = [r for r in picked if not r["right"]]
        lines.append(f"{label}: {len(alarms)} finding(s) in {len(picked)} verdicts")
    lines.append("")
    lines.append("top miss patterns (class, form, truth, frscope's first finding): count, a seed to replay")
    for pat, n in patterns.most_common(misses):
        lines.append(f"  {n:5d}  {pat[0]:13s} {pat[1]:8s} truth {pat[2]:23s} got {pat[3]:24s} "
                     f"replay {sample[pat]}")
    return "\n".join(lines)
