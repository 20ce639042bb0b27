"""torchfrtrace's command line, accepted by `frscope analyze`: a user's command keeps working after
`s/torchfrtrace/frscope analyze/` (or `s/python -m torch.distributed.flight_recorder.fr_trace/frscope analyze/`).

Each flag of torch's fr_trace (torch/distributed/flight_recorder/components/config_manager.py, torch 2.13-2.15,
and the older tools/flight_recorder's `-d/--dir`) maps to what frscope does for it (README.md, "Coming from
torchfrtrace", has the same table):

| torchfrtrace                        | frscope analyze                                                            |
| TRACE_DIR (positional), -d/--dir D  | the dump directory (PATHS)                                                 |
| -p/--prefix P                       | only the files of the directories whose name contains P (none: exit 2)     |
| -j/--just_print_entries             | --entries                                                                  |
| --selected-ranks R [R ...]          | --rank R,R,... (shows less, never changes the verdict; no such rank: exit 2) |
| --pg-filters S [S ...]              | --pg S,S,... (the same rule)                                               |
| --allow-incomplete-ranks            | always so: ranks without a dump are named, the rest analyzed               |
| --print_stack_trace                 | always so: each finding names its stuck collective's call site (frames)   |
| --mismatch_cap N                    | none needed: mismatches are reported once, at the first collective        |
| -v/--verbose                        | accepted (the report is the same)                                          |
| -o/--output F                       | -o: the report goes to F (torchfrtrace wrote a pickle of its DB there)     |
| --transform-ft, --group-world-size  | refused (exit 2): torchft replica groups are not read                      |

Both spellings of torch's mixed names are taken (`--just-print-entries`, `--print-stack-trace`, ...).
Nothing here changes a verdict: the filters are frscope's own, the rest are views or no-ops.
"""

from __future__ import annotations

import argparse
from pathlib import Path

TORCHFRTRACE = "torchfrtrace compatibility (each maps to frscope's own behaviour; README.md)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(TORCHFRTRACE)
    group.add_argument("-d", "--dir", dest="frtrace_dirs", action="append", default=[], metavar="DIR",
                       help="the dump directory, as a positional PATH")
    group.add_argument("-p", "--prefix", dest="frtrace_prefix", metavar="PREFIX",
                       help="only the files of the given directories whose name contains PREFIX")
    group.add_argument("-j", "--just_print_entries", "--just-print-entries", dest="entries", action="store_true",
                       help="= --entries")
    group.add_argument("--selected-ranks", "--selected_ranks", dest="frtrace_ranks", nargs="+", type=int,
                       metavar="RANK", help="= --rank R,R,...")
    group.add_argument("--pg-filters", "--pg_filters", dest="frtrace_pgs", nargs="+", metavar="PG",
                       help="= --pg PG,PG,...")
    group.add_argument("--allow-incomplete-ranks", "--allow_incomplete_ranks", action="store_true",
                       help="accepted: frscope always analyzes the ranks it has and names the missing ones")
    group.add_argument("--print_stack_trace", "--print-stack-trace", action="store_true",
                       help="accepted: findings always name the stuck collective's call site")
    group.add_argument("--mismatch_cap", "--mismatch-cap", type=int, metavar="N",
                       help="accepted: each mismatch is reported once")
    group.add_argument("-v", "--verbose", action="store_true", help="accepted")
    group.add_argument("--transform-ft", "--transform_ft", action="store_true",
                       help="refused (exit code 2): torchft replica groups are not read")
    group.add_argument("--group-world-size", "--group_world_size", type=int, metavar="N", help=argparse.SUPPRESS)


def _joined(mine: str | None, theirs: list[str] | None) -> str | None:
    values = [v for v in ([mine] if mine else []) + (theirs or []) if v]
    return ",".join(values) if values else None


def _with_prefix(paths: list[str], prefix: str) -> tuple[list[str], str | None]:
    """Each directory replaced by its files whose name contains `prefix` (files named on the command line stay)."""
    chosen: list[str] = []
    for path in paths:
        directory = Path(path)
        if not directory.is_dir():
            chosen.append(path)
            continue
        try:
            found = sorted(str(f) for f in directory.iterdir() if prefix in f.name and f.is_file())
        except OSError as exc:
            return paths, f"cannot list {path}: {exc.strerror or exc}"
        if not found:
            return paths, f"--prefix {prefix!r}: no file in {path} has it in its name"
        chosen.extend(found)
    return chosen, None


def apply(args: argparse.Namespace) -> str | None:
    """Fold the torchfrtrace flags into frscope's own (in place); a usage error to report, or None.

    `args.dump_paths`: what to load (the paths, each directory narrowed by --prefix); `args.paths` stays what
    was named (bundles and exits are looked up there)."""
    if getattr(args, "transform_ft", False) or getattr(args, "group_world_size", None) is not None:
        return ("--transform-ft/--group-world-size: frscope analyze does not read torchft replica groups; "
                "analyze each replica group's dumps as its own job")
    args.paths = [*args.paths, *getattr(args, "frtrace_dirs", [])]
    if not args.paths:
        return "give the dump directory (or files): frscope analyze DIR"
    ranks = getattr(args, "frtrace_ranks", None)
    args.rank = _joined(args.rank, [str(r) for r in ranks] if ranks else None)
    args.pg = _joined(args.pg, getattr(args, "frtrace_pgs", None))
    args.dump_paths = list(args.paths)
    prefix = getattr(args, "frtrace_prefix", None)
    if prefix:
        args.dump_paths, problem = _with_prefix(args.paths, prefix)
        return problem
    return None
