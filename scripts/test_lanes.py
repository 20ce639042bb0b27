"""`make test`'s pytest, in lanes that run at once (docs/testenv.md, "The whole of CI").

Run one after the other, the folders of tests/ took 58 minutes on two cores, idle most of that time:
the cluster and torch tests mostly wait (pods starting, stall thresholds, watchdog timeouts),
measured at 31-39% busy. Each lane is its own pytest process over whole folders, as a developer runs
them, with its own --basetemp; the lanes share nothing else (every control plane, node, job and port is
the test's own, found free at start). Lanes are balanced by the times measured on two cores:

- the node lane: the CPU-bound tests/unit (8-12 min), then tests/node (13 min, 31% busy), whose node is
  up only for its own tests;
- the e2e lane: tests/e2e (20 min, 34% busy);
- the local lane: tests/integration (real torch jobs on loopback, 15 min, 39% busy) and tests/browser.

Measured with three lanes (2026-12-07, warm caches): node lane 19.9 min, e2e lane 23.2 min (with
tests/browser then), local lane 17.6 min: the suite in 23 min instead of 58.

A lane's output goes to its own log, printed whole when the lane ends (so lines never interleave); every
two minutes a line says where each running lane is. Stopped (CI's time limit, ^C), the lanes are ended and
the tail of each unfinished log is printed. The exit status is non-zero when any lane failed.

Arguments are pytest's (PYTEST_ARGS): given to every lane. With a test path among them, one pytest runs
them as given, in the foreground.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
LANES = {
    "node": ["tests/unit", "tests/node"],
    "e2e": ["tests/e2e"],
    "local": ["tests/integration", "tests/browser"],
}
PROGRESS_EVERY_S = 120.0


def _pytest() -> str:
    return str(Path(os.environ.get("BIN", ".venv/bin")) / "pytest")


def _every_folder_is_in_a_lane() -> None:
    """A folder of tests added later must be given a lane here, not silently left out of `make test`."""
    laned = {path for paths in LANES.values() for path in paths}
    for path in sorted(laned):
        if not (ROOT / path).is_dir():
            sys.exit(f"test_lanes: lane folder {path} does not exist (scripts/test_lanes.py, LANES)")
    for folder in sorted((ROOT / "tests").iterdir()):
        rel = f"tests/{folder.name}"
        if folder.is_dir() and any(folder.glob("test_*.py")) and rel not in laned:
            sys.exit(f"test_lanes: {rel} holds tests but is in no lane (scripts/test_lanes.py, LANES)")


def _last_progress(log: Path) -> str:
    """The newest pytest progress mark ('[ 42%]') in a lane's log, or how many bytes it has."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 4096))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return "no output yet"
    # the window may open inside a line: a mark counts only with its opening bracket
    marks = [line[line.rfind("[") :] for line in tail.splitlines() if line.rstrip().endswith("%]") and "[" in line]
    return marks[-1].strip() if marks else f"{log.stat().st_size} bytes of output"


def _print_log(title: str, log: Path, tail_lines: int | None = None) -> None:
    text = log.read_text("utf-8", "replace") if log.exists() else ""
    lines = text.splitlines()
    if tail_lines is not None:
        lines = lines[-tail_lines:]
    print(f"\n{'=' * 24} lane {title} {'=' * 24}", flush=True)
    print("\n".join(lines), flush=True)


def main(args: list[str]) -> int:
    os.chdir(ROOT)
    if any(not arg.startswith("-") for arg in args):
        return subprocess.call([_pytest(), *args])
    _every_folder_is_in_a_lane()
    work = Path(tempfile.mkdtemp(prefix="frscope-lanes."))
    running: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    codes: dict[str, int] = {}
    started = time.monotonic()
    for name, paths in LANES.items():
        log = work / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [_pytest(), f"--basetemp={work / name}", "--durations=15", *args, *paths],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        running[name] = (proc, log)
        print(f"test_lanes: lane {name} ({' '.join(paths)}): pid {proc.pid}, log {log}", flush=True)

    def stop(signum: int, _frame: FrameType | None) -> None:
        for name, (proc, log) in running.items():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            _print_log(f"{name} (stopped by signal {signum}; its last 60 lines)", log, 60)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        _follow(running, codes, started)
    finally:
        # whatever ended this process (an error here included), no lane is left running behind it
        for proc, _ in running.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
    print("\ntest_lanes: " + ", ".join(f"lane {n} exit {c}" for n, c in codes.items()), flush=True)
    # 5: the lane's folders hold no test the given -m / -k selects
    ok = {0, 5} if args else {0}
    return 0 if all(code in ok for code in codes.values()) else 1


def _follow(running: dict[str, tuple[subprocess.Popen[bytes], Path]], codes: dict[str, int], started: float) -> None:
    """Until every lane has ended: each lane's log printed whole as it ends, a progress line every
    PROGRESS_EVERY_S."""
    next_progress = time.monotonic() + PROGRESS_EVERY_S
    while running:
        time.sleep(1.0)
        for name in [n for n, (proc, _) in running.items() if proc.poll() is not None]:
            proc, log = running.pop(name)
            codes[name] = proc.returncode
            _print_log(f"{name}: exit {proc.returncode} after {time.monotonic() - started:.0f} s", log)
        if running and time.monotonic() >= next_progress:
            where = ", ".join(f"{n} {_last_progress(log)}" for n, (_, log) in running.items())
            print(f"test_lanes: {time.monotonic() - started:.0f} s: {where}", flush=True)
            next_progress += PROGRESS_EVERY_S


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
