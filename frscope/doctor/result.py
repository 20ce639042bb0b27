"""One check's outcome, its line, and the command's exit code. Pure."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

EXIT_ALL_PASS = 0
EXIT_SOME_FAIL = 1
EXIT_UNREACHABLE = 2


class Outcome(enum.Enum):
    PASS = "ok"
    FAIL = "FAIL"
    SKIP = "skip"  # nothing to check yet (no job pods): never a failure


@dataclass(frozen=True)
class CheckResult:
    check: str  # a stable name: `frscope doctor` prints it, tests and scripts select on it
    outcome: Outcome
    detail: str
    fix: str = ""  # what to do, for a failure

    @property
    def failed(self) -> bool:
        return self.outcome is Outcome.FAIL


def passed(check: str, detail: str) -> CheckResult:
    return CheckResult(check, Outcome.PASS, detail)


def failed(check: str, detail: str, fix: str) -> CheckResult:
    return CheckResult(check, Outcome.FAIL, detail, fix)


def skipped(check: str, detail: str) -> CheckResult:
    return CheckResult(check, Outcome.SKIP, detail)


def render_line(result: CheckResult) -> str:
    line = f"[{result.outcome.value:>4}] {result.check}: {result.detail}"
    if result.fix:
        line += f"\n       -> {result.fix}"
    return line


def exit_code(results: Sequence[CheckResult]) -> int:
    return EXIT_SOME_FAIL if any(r.failed for r in results) else EXIT_ALL_PASS
