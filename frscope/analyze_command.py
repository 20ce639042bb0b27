"""`frscope analyze`: dumps -> records -> analysis -> report, on stdout or into files (the parser is in
frscope/cli.py).

What the user gets wrong is a usage error (`UsageError`: one line on stderr, exit code 2), never an
internal error: an output path in a missing folder, a filter value that matches nothing in the dumps, an
unreadable `--exits` file. A dump that cannot be used is a problem in the report (one bad file named on the
command line as one inside a folder), and the exit code is always the whole job's: a filter shows less,
it never makes a hung job exit 0."""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from frscope.analysis import AnalysisOptions, Report, analyze
from frscope.analysis.perf import PerfReport, analyze_perf
from frscope.frtrace_flags import apply as apply_torchfrtrace_flags
from frscope.records import DumpSet, LoadProblem, RankExit, exits_from_json, load_dumps
from frscope.records.bundle_exits import read_bundle_exits
from frscope.records.errors import DumpError
from frscope.records.gcpause import gc_paused
from frscope.report import render_markdown, render_text, report_to_dict
from frscope.report.entries import build_entries, render_entries, render_entries_markdown
from frscope.report.filters import Filters
from frscope.report.html import render_report_html
from frscope.report.perf import perf_to_dict, render_perf_markdown, render_perf_text
from frscope.report.printable import printable
from frscope.report.trace import build_trace

EXIT_HEALTHY = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A mistake of the command line (a path, a value): one line on stderr and exit code 2, never a crash."""


def _progress_bar(enabled: bool) -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    """A tqdm bar on stderr for long loads, only when stderr is a terminal."""
    if not enabled or not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm

    bar: list[tqdm] = []

    def update(done: int, total: int) -> None:
        if total < 16:
            return
        if not bar:
            bar.append(tqdm(total=total, unit="file", desc="loading dumps", file=sys.stderr, leave=False))
        bar[0].n = done
        bar[0].refresh()

    def close() -> None:
        if bar:
            bar[0].close()

    return update, close


def _options(args: argparse.Namespace) -> AnalysisOptions:
    return AnalysisOptions(stall_after_s=args.stuck_after, clock_skew_ms=args.clock_skew_ms)


def _render(report: Report, dumpset: DumpSet, args: argparse.Namespace, filters: Filters,
            perf: PerfReport | None) -> str:
    """What goes to stdout (or `-o`): the entries, the perf view or the report, each in `--format`."""
    findings = filters.apply(report.findings)
    if args.entries:
        if args.format == "json":
            return _json(build_entries(dumpset, filters, args.last))
        if args.format == "markdown":
            return render_entries_markdown(dumpset, filters, args.last)
        return render_entries(dumpset, filters, args.last)
    if perf is not None:
        if args.format == "json":
            return _json(perf_to_dict(perf))
        return render_perf_markdown(perf) if args.format == "markdown" else render_perf_text(perf)
    if args.format == "json":
        return _json(report_to_dict(report, findings=findings, filters=filters))
    if args.format == "markdown":
        return render_markdown(report, findings, filters)
    return render_text(report, findings, filters)


def _json(obj: object) -> str:
    return json.dumps(obj, indent=2, allow_nan=False) + "\n"


def _emit(report: Report, dumpset: DumpSet, args: argparse.Namespace, filters: Filters) -> int:
    perf = analyze_perf(dumpset, args.clock_skew_ms, keep_group=filters.group_ok if filters.groups else None,
                        keep_op=filters.op_ok if filters.ops else None,
                        keep_rank=filters.rank_ok if filters.ranks is not None else None) if args.perf else None
    out = _render(report, dumpset, args, filters, perf)
    if args.output:
        _write(args.output, "-o", out)
    else:
        sys.stdout.write(out)
    if args.html:
        findings = filters.apply(report.findings)
        _write(args.html, "--html", render_report_html(
            report, dumpset, findings, perf=perf_to_dict(perf) if perf is not None else None))
        print(f"frscope analyze: timeline written to {args.html} (opens offline in a browser)", file=sys.stderr)
    if args.trace:
        _write(args.trace, "--trace", json.dumps(build_trace(dumpset), separators=(",", ":")))
        print(f"frscope analyze: trace written to {args.trace} (open it in ui.perfetto.dev or chrome://tracing)",
              file=sys.stderr)
    # The whole job's findings, whatever the filters show: a filter never makes a hung job exit 0.
    return EXIT_FINDINGS if report.findings else EXIT_HEALTHY


def _write(path: str, flag: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {flag} {path}: {exc.strerror or exc}") from exc


def _check_output(path: str | None, flag: str) -> None:
    """Before the analysis (which can take minutes): an output path whose folder is missing or closed, or that
    is a folder, is a usage error now, not a failure after the work is done."""
    if not path:
        return
    target = Path(path)
    try:
        if target.is_dir():
            raise UsageError(f"cannot write {flag} {path}: it is a directory")
        parent = target.parent
        if not parent.is_dir():
            raise UsageError(f"cannot write {flag} {path}: no such directory {str(parent)!r}")
        if not os.access(parent, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
            raise UsageError(f"cannot write {flag} {path}: permission denied")
    except OSError as exc:  # a folder on the way that this user cannot enter
        raise UsageError(f"cannot write {flag} {path}: {exc.strerror or exc}") from exc


def cmd_analyze(args: argparse.Namespace) -> int:
    """`frscope analyze`. The cyclic garbage collector stays off throughout, and what the command built is then
    frozen (`gc.freeze`): the dump set and the report are millions of objects in no cycle worth collecting, and a
    full collection over them when the collector came back on, or when the process exits, cost more than the
    analysis (0.7 s at 8,192 ranks)."""
    with gc_paused():
        try:
            return _analyze(args)
        finally:
            gc.freeze()


def _analyze(args: argparse.Namespace) -> int:
    problem = apply_torchfrtrace_flags(args)
    if problem:
        raise UsageError(problem)
    try:
        filters = Filters.parse(args.op, args.pg, args.rank)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    for path, flag in ((args.output, "-o"), (args.html, "--html"), (args.trace, "--trace")):
        _check_output(path, flag)
    exits = _exits(args.exits)
    update, close = _progress_bar(not args.no_progress)
    try:
        dumpset = load_dumps(
            args.dump_paths, max_bytes=args.max_bytes, world_size=args.world_size, progress=update, jobs=args.jobs
        )
    finally:
        close()
    if not dumpset.dumps:
        why = [printable(str(p)) for p in dumpset.problems]
        if len(why) == 1:
            raise UsageError(f"no dump could be loaded: {why[0]}")
        print("frscope analyze: no dump could be loaded" + (":" if why else
              f" (no file under {printable(' '.join(args.paths))})"), file=sys.stderr)
        for line in why:
            print(f"  - {line}", file=sys.stderr)
        return EXIT_USAGE
    bundled, problems = _bundle_exits(args.paths, args.max_bytes, dumpset)
    report = analyze(dumpset, _options(args), exits={**bundled, **exits})
    report.problems.extend(problems)
    unmatched = filters.unmatched(dumpset, report)
    if unmatched:
        raise UsageError(unmatched)
    return _emit(report, dumpset, args, filters)


def _bundle_exits(paths: Sequence[str], max_bytes: int,
                  dumpset: DumpSet) -> tuple[dict[int, RankExit], list[LoadProblem]]:
    """How ranks ended, from the incident bundles named on the command line (`--exits` overrides), and a
    problem for each bundle whose exits cannot be read. A file the loader could not use is already a problem
    of the report: one bad file named on the command line is one problem, as it is inside a directory."""
    out: dict[int, RankExit] = {}
    problems: list[LoadProblem] = []
    failed = {p.source for p in dumpset.problems if p.kind == "error"}
    for path in map(Path, paths):
        if not path.is_file() or str(path) in failed:
            continue
        try:
            out.update((e.rank, e) for e in read_bundle_exits(path, max_bytes))
        except (DumpError, ValueError) as exc:
            message = exc.what if isinstance(exc, DumpError) else str(exc)
            problems.append(LoadProblem(str(path), f"its exits are not used: {printable(message)}", kind="warning"))
    return out, problems


def _exits(path: str | None) -> dict[int, RankExit]:
    """`--exits FILE`: how ranks' processes ended ({"2": 137} or {"2": {"exit_code": 137, "reason": ...}})."""
    if not path:
        return {}
    try:
        with open(path, "rb") as handle:
            raw = handle.read(1 << 20)
        obj = json.loads(raw)
        return {e.rank: e for e in exits_from_json(obj, path)}
    except OSError as exc:
        raise UsageError(f"--exits {path}: cannot read: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise UsageError(f"--exits {path}: {printable(str(exc))}") from exc
