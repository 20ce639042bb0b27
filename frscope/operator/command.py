"""`frscope operator`: the CLI's entry into this package (frscope/cli.py calls these two)."""

from __future__ import annotations

import argparse
import sys

from frscope.operator.config import add_arguments, from_args


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser: argparse.ArgumentParser = sub.add_parser(
        "operator",
        help="watch PyTorchJobs, diagnose hangs from the sidecars, write the diagnosis into the job (kopf)",
        description="See docs/operator.md. Credentials: the pod's service account, else $KUBECONFIG.",
    )
    add_arguments(parser)
    parser.set_defaults(func=cmd_operator)
    return parser


def cmd_operator(args: argparse.Namespace) -> int:
    import kopf

    from frscope.operator.runner import run_operator

    try:
        config = from_args(args)
    except ValueError as exc:
        print(f"frscope operator: {exc}", file=sys.stderr)
        return 2
    try:
        return run_operator(config)
    except (kopf.LoginError, ValueError, OSError) as exc:
        print(f"frscope operator: {exc}", file=sys.stderr)
        return 1
