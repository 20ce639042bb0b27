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
import importlib.util
import os
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path

from frscope import __version__
from frscope.analysis import AnalysisOptions, Report, analyze
from frscope.analysis.context import DEFAULT_CLOCK_SKEW_MS, DEFAULT_STALL_AFTER_S
from frscope.analyze_command import EXIT_FINDINGS, EXIT_HEALTHY, EXIT_USAGE, UsageError, cmd_analyze
from frscope.demo.faults import DEMO_FAULTS
from frscope.frtrace_flags import add_arguments as add_torchfrtrace_arguments
from frscope.records import DEFAULT_MAX_BYTES, load_dumps, scan
from frscope.records.limits import MAX_RANK
from frscope.report import render_text
from frscope.report.html import render_report_html

# The cluster parts need the `cluster` extra (`pip install 'frscope[cluster]'`); `pip install frscope` is the
# offline analyzer alone. A command whose imports name one of these packages says so instead of a traceback.
CLUSTER_PACKAGES = frozenset({"aiohttp", "kopf", "prometheus_client", "cryptography", "jwt", "yaml", "multidict",
                              "yarl", "kubernetes"})
CLUSTER_EXTRA = "pip install 'frscope[cluster]'"
# What the extra installs (pyproject.toml), checked before a cluster command starts (some import late).
CLUSTER_NEEDS = ("aiohttp", "kopf", "prometheus_client", "cryptography", "jwt", "yaml", "kubernetes")
_SERVICES = {
    "sidecar": ("frscope.sidecar.main", "collect local ranks' recorders, detect stalls, serve metrics and the API"),
    "operator": ("frscope.operator.command", "watch PyTorchJobs, gather from the sidecars, write the diagnosis (kopf)"),
    "doctor": ("frscope.doctor.command", "check the cluster's frscope setup: operator, webhook, CRD, opt-in, pods"),
}

__all__ = ["EXIT_FINDINGS", "EXIT_HEALTHY", "EXIT_USAGE", "cmd_analyze", "main"]
# frscope itself failed (a bug, not the dumps): CI can tell this apart from findings and bad usage.
EXIT_CRASH = 3
DEBUG_ENV = "FRSCOPE_DEBUG"

_EXIT_CODES = (
    "Exit codes: 0 healthy, 1 findings (whatever --op/--pg/--rank show), 2 bad usage (a filter value that "
    "matches nothing, a path that cannot be written) or nothing loadable, 3 frscope itself failed "
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


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _world_size(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_RANK:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_RANK}")
    return value


# The demo captures seconds after its job stops moving (the watchdog would wait minutes): a collective
# in flight for this long is stuck, in the demo.
DEMO_STUCK_AFTER_S = 1.0


# What `frscope demo` runs besides frscope: a real torch job, and a local sidecar (the cluster extra's packages).
DEMO_NEEDS = ("torch", "aiohttp", "prometheus_client", "jwt", "cryptography")


def demo_install_hint() -> str | None:
    """None when this Python can run the demo; else the message that says what is missing and the exact
    command that installs it into this Python."""
    missing = [name for name in DEMO_NEEDS if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    what = "PyTorch (torch)" if missing[0] == "torch" else "the cluster extra's packages"
    return (f"the demo runs a real PyTorch job beside a local frscope sidecar, and {what} is not installed in "
            f"this Python ({sys.executable}; missing: {', '.join(missing)}). Install it with:\n"
            f"    {sys.executable} -m pip install 'frscope[demo]'\n"
            "(torch is large, a few GB with CUDA; the CPU build is enough: add "
            "--extra-index-url https://download.pytorch.org/whl/cpu). In a checkout of frscope: make demo")


def cmd_demo(args: argparse.Namespace) -> int:
    hint = demo_install_hint()
    if hint is not None:
        print(f"frscope demo: {hint}", file=sys.stderr)
        return EXIT_USAGE
    from frscope.demo.launcher import LaunchError
    from frscope.demo.live import run_with_sidecar

    out_dir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="frscope-demo-"))
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot use --keep {args.keep}: {exc.strerror or exc}") from exc
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
    analyze_p.add_argument("paths", nargs="*", metavar="PATH",
                           help="dump files or directories (pickle or JSON, any version); at least one (or -d DIR)")
    analyze_p.add_argument(
        "--format", choices=("text", "json", "markdown"), default="text",
        help="of what goes to stdout or -o: the report, --entries or --perf (--html and --trace are their own "
        "formats); default %(default)s",
    )
    analyze_p.add_argument("-o", "--output", help="write the report here instead of stdout")
    analyze_p.add_argument("--html", metavar="PATH", help="also write the collective timeline as one HTML file")
    analyze_p.add_argument(
        "--trace", metavar="FILE",
        help="also write a Chrome/Perfetto trace (JSON): a track per rank and process group, a slice per collective",
    )
    analyze_p.add_argument(
        "--op", help="only these ops, e.g. all_reduce,broadcast (or ALLREDUCE); filters show less, never change the "
        "verdict or the exit code; a value that matches nothing is exit code 2")
    analyze_p.add_argument("--pg", help="only these process groups (name or description)")
    analyze_p.add_argument("--rank", help="only these ranks, e.g. 0-7,12 (exit code 2 when none is in the job)")
    analyze_p.add_argument(
        "--perf", action="store_true",
        help="where the time goes (a slow job, not a hung one): per group/op/size the time waiting for late peers "
        "and in transfer, and the ranks that make the others wait, the costliest first",
    )
    analyze_p.add_argument("--entries", action="store_true", help="print collectives side by side across ranks")
    analyze_p.add_argument("--last", type=_positive, help="with --entries: only the last N collectives per group")
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
        type=_positive,
        help="processes that decode dumps (default: one per core from 32 files on, else one; a dump that "
        "crashes its process is reported, the others load). 1 = decode in this process: faster for a few "
        "files, not isolated from crafted pickles",
    )
    add_torchfrtrace_arguments(analyze_p)
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


def missing_extra(exc: ImportError) -> str | None:
    """The message for a cluster command run without the `cluster` extra (None: another import error)."""
    top = (exc.name or "").split(".")[0]
    if not isinstance(exc, ModuleNotFoundError) or top not in CLUSTER_PACKAGES:
        return None
    return (f"this command needs frscope's cluster extra (the package {top!r} is not installed; "
            f"`pip install frscope` is the offline analyzer alone): {CLUSTER_EXTRA}")


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    if command in _SERVICES:
        missing = [name for name in CLUSTER_NEEDS if importlib.util.find_spec(name) is None]
        if missing:
            print(f"frscope {command}: {missing_extra(ModuleNotFoundError(name=missing[0]))}", file=sys.stderr)
            return EXIT_USAGE
    try:
        parser = build_parser(command)
    except ModuleNotFoundError as exc:
        message = missing_extra(exc)
        if message is None:
            raise
        print(f"frscope {command}: {message}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(args_list)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except UsageError as exc:
        print(f"frscope {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # a bug in frscope, never a bad dump (those are problems in the report)
        extra = missing_extra(exc) if isinstance(exc, ImportError) else None
        if extra is not None:
            print(f"frscope {args.command}: {extra}", file=sys.stderr)
            return EXIT_USAGE
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
