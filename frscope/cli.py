"""frscope: why did my distributed PyTorch job hang?

frscope reads PyTorch's Flight Recorder (the ring buffer of collectives every NCCL/Gloo process group
keeps) from every rank and says which rank, which process group and which collective, and what the
stuck rank was doing. Offline on a folder of dumps (`frscope analyze`), on a local demo job
(`frscope demo`), or in a cluster: a sidecar beside each trainer (`frscope sidecar`) and an operator
that writes the diagnosis into the PyTorchJob (`frscope operator`). Docs: README.md and docs/.
"""

# (This module is the CLI's thin wiring over records -> analysis -> report; its docstring is the
# top-level --help.)

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from frscope import __version__
from frscope.analysis import AnalysisOptions, Report, analyze
from frscope.analysis.context import DEFAULT_CLOCK_SKEW_MS, DEFAULT_STALL_AFTER_S
from frscope.analysis.perf import analyze_perf
from frscope.demo.faults import DEMO_FAULTS
from frscope.records import DEFAULT_MAX_BYTES, DumpSet, RankExit, exits_from_json, load_dumps, scan
from frscope.records.bundle_exits import read_bundle_exits
from frscope.records.errors import DumpError
from frscope.records.limits import MAX_RANK
from frscope.report import render_markdown, render_text, report_to_dict
from frscope.report.entries import render_entries
from frscope.report.filters import Filters
from frscope.report.html import render_report_html
from frscope.report.perf import perf_to_dict, render_perf_text
from frscope.report.trace import build_trace

_SERVICES = {
    "sidecar": ("frscope.sidecar.main", "collect local ranks' recorders, detect stalls, serve metrics and the API"),
    "operator": ("frscope.operator.command", "watch PyTorchJobs, gather from the sidecars, write the diagnosis (kopf)"),
    "doctor": ("frscope.doctor.command", "check the cluster's frscope setup: operator, webhook, CRD, opt-in, pods"),
}

EXIT_HEALTHY = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
# frscope itself failed (a bug, not the dumps): CI can tell this apart from findings and bad usage.
EXIT_CRASH = 3
DEBUG_ENV = "FRSCOPE_DEBUG"

_EXIT_CODES = (
    "Exit codes: 0 healthy, 1 findings, 2 bad usage or nothing loadable, 3 frscope itself failed "
    f"(a bug; {DEBUG_ENV}=1 prints the traceback). Unreadable dumps are listed as problems, never a crash."
)
# `frscope demo`: 0 when the diagnosis showed what the fault was meant to show, else this.
EXIT_DEMO_FAILED = 1


def _size(text: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    text = text.strip().lower().rstrip("ib").rstrip("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _world_size(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_RANK:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_RANK}")
    return value


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


def _emit(report: Report, dumpset: DumpSet, args: argparse.Namespace, filters: Filters) -> int:
    findings = filters.apply(report.findings)
    perf = analyze_perf(dumpset, args.clock_skew_ms, keep_group=filters.group_ok if filters.groups else None,
                        keep_op=filters.op_ok if filters.ops else None,
                        keep_rank=filters.rank_ok if filters.ranks is not None else None) if args.perf else None
    if args.entries:
        out = render_entries(dumpset, filters, args.last)
    elif perf is not None:
        out = json.dumps(perf_to_dict(perf), indent=2, allow_nan=False) + "\n" if args.format == "json" \
            else render_perf_text(perf)
    elif args.format == "json":
        out = json.dumps(report_to_dict(report, findings=findings), indent=2, allow_nan=False) + "\n"
    elif args.format == "markdown":
        out = render_markdown(report, findings)
    else:
        out = render_text(report, findings)
    if args.output:
        Path(args.output).write_text(out)
    else:
        sys.stdout.write(out)
    if args.html:
        Path(args.html).write_text(render_report_html(
            report, dumpset, findings, perf=perf_to_dict(perf) if perf is not None else None), encoding="utf-8")
        print(f"frscope analyze: timeline written to {args.html} (opens offline in a browser)", file=sys.stderr)
    if args.trace:
        with open(args.trace, "w", encoding="utf-8") as handle:
            json.dump(build_trace(dumpset), handle, separators=(",", ":"))
        print(f"frscope analyze: trace written to {args.trace} (open it in ui.perfetto.dev or chrome://tracing)",
              file=sys.stderr)
    return EXIT_FINDINGS if findings else EXIT_HEALTHY


def cmd_analyze(args: argparse.Namespace) -> int:
    try:
        filters = Filters.parse(args.op, args.pg, args.rank)
    except ValueError as exc:
        print(f"frscope analyze: {exc}", file=sys.stderr)
        return EXIT_USAGE
    update, close = _progress_bar(not args.no_progress)
    try:
        dumpset = load_dumps(
            args.paths, max_bytes=args.max_bytes, world_size=args.world_size, progress=update, jobs=args.jobs
        )
    finally:
        close()
    if not dumpset.dumps:
        print("frscope analyze: no dump could be loaded", file=sys.stderr)
        for problem in dumpset.problems:
            print(f"  - {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        exits = {**_bundle_exits(args.paths, args.max_bytes), **_exits(args.exits)}
    except (ValueError, DumpError) as exc:
        print(f"frscope analyze: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report = analyze(dumpset, _options(args), exits=exits)
    return _emit(report, dumpset, args, filters)


def _bundle_exits(paths: Sequence[str], max_bytes: int) -> dict[int, RankExit]:
    """How ranks ended, from the incident bundles named on the command line (`--exits` overrides)."""
    out: dict[int, RankExit] = {}
    for path in map(Path, paths):
        if path.is_file():
            out.update((e.rank, e) for e in read_bundle_exits(path, max_bytes))
    return out


def _exits(path: str | None) -> dict[int, RankExit]:
    """`--exits FILE`: how ranks' processes ended ({"2": 137} or {"2": {"exit_code": 137, "reason": ...}})."""
    if not path:
        return {}
    try:
        with open(path, "rb") as handle:
            raw = handle.read(1 << 20)
        obj = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--exits {path}: {exc}") from exc
    return {e.rank: e for e in exits_from_json(obj, path)}


# The demo captures seconds after its job stops moving (the watchdog would wait minutes): a collective
# in flight for this long is stuck, in the demo.
DEMO_STUCK_AFTER_S = 1.0


def cmd_demo(args: argparse.Namespace) -> int:
    from frscope.demo.launcher import LaunchError
    from frscope.demo.live import run_with_sidecar

    out_dir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="frscope-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"frscope demo: launching a real {args.world_size}-rank gloo job on loopback with fault {args.fault!r}; "
        "a local frscope sidecar beside it collects every rank's recorder and stack while it is blocked...",
        file=sys.stderr,
    )
    try:
        collected = run_with_sidecar(args.fault, args.world_size, out_dir, timeout_s=args.timeout,
                                     stall_after_s=DEMO_STUCK_AFTER_S)
    except LaunchError as exc:
        print(f"frscope demo: the demo job could not be run: {exc}", file=sys.stderr)
        return EXIT_DEMO_FAILED
    dumpset = load_dumps([out_dir])
    if not dumpset.dumps:
        print(f"frscope demo: no rank could be collected ({collected})", file=sys.stderr)
        return EXIT_DEMO_FAILED
    report = analyze(dumpset, AnalysisOptions(stall_after_s=DEMO_STUCK_AFTER_S))
    sys.stdout.write(render_text(report))
    html_path = out_dir / "report.html"
    html_path.write_text(render_report_html(report, dumpset), encoding="utf-8")
    print(f"\nrecorders and stacks kept in {out_dir} (re-run: frscope analyze {out_dir})", file=sys.stderr)
    print(f"collective timeline: open {html_path.resolve().as_uri()} in a browser", file=sys.stderr)
    missed = demo_missed(args.fault, set(collected.culprit_ranks), report)
    if missed is None:
        return EXIT_HEALTHY
    print(f"frscope demo: {missed}", file=sys.stderr)
    return EXIT_DEMO_FAILED


def demo_missed(fault: str, expected: set[int], report: Report) -> str | None:
    """None when the diagnosis shows what `fault` is meant to show (its culprit ranks named by the
    findings; no finding for a healthy job), else what it missed."""
    named = {rank for finding in report.findings for rank in finding.culprit_ranks}
    if (expected <= named) if expected else not report.findings:
        return None
    return (f"the diagnosis did not show what fault {fault!r} should: expected "
            + (f"culprit rank(s) {sorted(expected)}" if expected else "no finding")
            + (f", got culprit rank(s) {sorted(named)}" if named else ", got no culprit"))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="frscope", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `frscope COMMAND --help` for a command's options. " + _EXIT_CODES,
    )
    parser.add_argument("--version", action="version",
                        version=f"frscope {__version__} (dump reader: {scan.describe()})")
    sub = parser.add_subparsers(dest="command", required=True)

    analyze_p = sub.add_parser(
        "analyze",
        help="diagnose a folder (or list) of per-rank Flight Recorder dumps",
        description=_EXIT_CODES,
    )
    analyze_p.add_argument("paths", nargs="+", help="dump files or directories (pickle or JSON, any version)")
    analyze_p.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    analyze_p.add_argument("-o", "--output", help="write the report here instead of stdout")
    analyze_p.add_argument("--html", metavar="PATH", help="also write the collective timeline as one HTML file")
    analyze_p.add_argument(
        "--trace", metavar="FILE",
        help="also write a Chrome/Perfetto trace (JSON): a track per rank and process group, a slice per collective",
    )
    analyze_p.add_argument("--op", help="only these ops, e.g. all_reduce,broadcast (or ALLREDUCE)")
    analyze_p.add_argument("--pg", help="only these process groups (name or description)")
    analyze_p.add_argument("--rank", help="only these ranks, e.g. 0-7,12")
    analyze_p.add_argument(
        "--perf", action="store_true",
        help="where the time goes (a slow job, not a hung one): per group/op/size the time waiting for late peers "
        "and in transfer, and the ranks that make the others wait, the costliest first",
    )
    analyze_p.add_argument("--entries", action="store_true", help="print collectives side by side across ranks")
    analyze_p.add_argument("--last", type=int, help="with --entries: only the last N collectives per group")
    analyze_p.add_argument("--max-bytes", type=_size, default=DEFAULT_MAX_BYTES, help="size cap per file (e.g. 512M)")
    analyze_p.add_argument("--world-size", type=_world_size, help="expected world size (to name ranks with no dump)")
    analyze_p.add_argument(
        "--stuck-after",
        type=float,
        default=DEFAULT_STALL_AFTER_S,
        metavar="SECONDS",
        help="a collective in flight at least this long (at the capture) counts as stuck (default %(default)s)",
    )
    # The name this flag had until the sidecar's "no progress for N s" threshold and this one got a name each.
    analyze_p.add_argument("--stall-after", dest="stuck_after", type=float, default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)
    analyze_p.add_argument(
        "--clock-skew-ms",
        type=float,
        default=DEFAULT_CLOCK_SKEW_MS,
        help="clock skew allowed between hosts before lateness counts (default %(default)s)",
    )
    analyze_p.add_argument(
        "--exits", metavar="FILE",
        help='JSON: how ranks\' processes ended, e.g. {"2": 137} or {"2": {"exit_code": 137, "reason": "OOMKilled"}}',
    )
    analyze_p.add_argument("--no-progress", action="store_true", help="no progress bar")
    analyze_p.add_argument(
        "--jobs",
        type=int,
        help="processes that decode dumps (default: one per core from 32 files on, else one; a dump that "
        "crashes its process is reported, the others load). 1 = decode in this process: faster for a few "
        "files, not isolated from crafted pickles",
    )
    analyze_p.set_defaults(func=cmd_analyze)

    demo_p = sub.add_parser(
        "demo",
        help="run a real local gloo job that breaks, and diagnose it (no cluster)",
        description="Exit codes: 0 the diagnosis showed what the fault was meant to show (the culprit "
                    "ranks; no finding for --fault none), 1 it did not, or the job could not be run.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    demo_p.add_argument("--fault", choices=DEMO_FAULTS, default="hang", help="what goes wrong in the job")
    demo_p.add_argument("--world-size", type=int, default=4, help="ranks of the job")
    demo_p.add_argument("--keep", help="keep the collected recorders in this directory")
    demo_p.add_argument("--timeout", type=float, default=90.0, help="hard limit for the job, seconds")
    demo_p.set_defaults(func=cmd_demo)

    # The sidecar and the operator pull in aiohttp, kopf and their worlds (a second of imports):
    # only the command that runs loads its module; the others are listed for --help.
    for name, (module, summary) in _SERVICES.items():
        if command == name:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, help=summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(args_list)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug in frscope, never a bad dump (those are problems in the report)
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        message = " ".join(str(exc).split())[:300]
        print(f"frscope {args.command}: internal error ({type(exc).__name__}: {message}); exit code {EXIT_CRASH}. "
              f"Please report it{'' if os.environ.get(DEBUG_ENV) else f'; {DEBUG_ENV}=1 shows the traceback'}.",
              file=sys.stderr)
        return EXIT_CRASH
    return code


if __name__ == "__main__":
    raise SystemExit(main())
