"""The differential check of one input: the C scanner's path against the pure-Python path.

A dump file is read by `loader.load_path` (columnar, as the CLI reads it) twice: with the scanner and with
`FRSCOPE_NO_SCANNER=1` (the path a machine without the extension takes). A snapshot body is decoded by both of
the operator's decoders (`pod_evidence.from_bytes`, `push_decode.decode_file`) both ways. The two readings
must be equal: the same ranks and entries, or the same problems (a typed error, its message naming the field).
Neither may let another exception out (a SystemError, an OverflowError...: the loader would only report it as
"could not be read"), or take more than `SLOW_S`. The extension's entry points are also called directly, at
odd arguments and at budgets too small for the input (every allocation-failure path): None or a result, never
an exception. Each breach is a `Finding`.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frscope.records import scan
from frscope.records.errors import DumpError
from frscope.records.limits import memory_budget
from frscope.records.loader import load_path
from frscope.records.model import Entry, LazyFrames, LoadProblem, RankDump
from frscope.records.normalize import parse_profiling_name

SLOW_S = 1.0


@dataclass
class Finding:
    kind: str  # 'divergence', 'leak', 'slow', 'c-error'
    detail: str


def canon(value: Any) -> Any:
    """`value` with NaN made comparable (NaN != NaN), containers walked."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return {k: canon(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(canon(v) for v in value)
    return value


def _entry(entry: Entry) -> tuple[Any, ...]:
    return tuple(getattr(entry, name) for name in Entry.__slots__ if name != "_frames") + (entry.frames,)


def summary(item: RankDump | LoadProblem) -> Any:
    if isinstance(item, LoadProblem):
        return ("problem", item.source, item.message, item.rank, item.kind)
    return canon((item.rank, item.version, item.backend, item.pg_config, item.pg_status, item.comm_lib_version,
                  item.stacks, item.captured_at_ns, item.captured_at_source, item.host, item.warnings,
                  [_entry(e) for e in item.entries]))


class _Scanner:
    """The scanner on or off (FRSCOPE_NO_SCANNER) for a `with` block."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.saved: str | None = None

    def __enter__(self) -> None:
        self.saved = os.environ.get(scan.ENV_OFF)
        os.environ[scan.ENV_OFF] = "" if self.on else "1"

    def __exit__(self, *exc: object) -> None:
        if self.saved is None:
            os.environ.pop(scan.ENV_OFF, None)
        else:
            os.environ[scan.ENV_OFF] = self.saved


def _timed(findings: list[Finding], what: str, call: Any, slow_s: float) -> Any:
    start = time.process_time()
    try:
        return call()
    finally:
        spent = time.process_time() - start
        if spent > slow_s:
            findings.append(Finding("slow", f"{what}: {spent:.2f} s of CPU"))


def _read_file(path: Path, on: bool, findings: list[Finding], slow_s: float) -> Any:
    with _Scanner(on):
        try:
            got = _timed(findings, f"load_path, scanner {'on' if on else 'off'}",
                         lambda: load_path(path, columnar=True), slow_s)
        except (RecursionError, MemoryError) as exc:  # _load_one reports these as the file's problem, by name
            return ("refused", type(exc).__name__)
        except Exception as exc:
            findings.append(Finding("leak", f"load_path (scanner {'on' if on else 'off'}) raised "
                                            f"{type(exc).__name__}: {str(exc)[:200]}"))
            return ("raised", type(exc).__name__)
        try:
            return [summary(item) for item in got]
        except DumpError as exc:  # frames read again from the file on demand
            return ("frames refused", type(exc).__name__, str(exc))


def check_file(data: bytes, workdir: Path, name: str = "trace_rank_3", slow_s: float = SLOW_S,
               reference: bool = True) -> list[Finding]:
    """A dump file's bytes: the loader's reading with the scanner equals its reading without. Where the
    scanner declines the file the loader reads it the reference way whether the scanner is on or not: then
    only the reference reading is checked (no foreign exception, bounded time), and only when `reference`."""
    findings: list[Finding] = []
    read = _direct(data, findings, slow_s, "json" if name.endswith(".json") else "pickle")
    if not read and not reference:
        return findings
    path = workdir / name
    path.write_bytes(data)
    fast = _read_file(path, True, findings, slow_s) if read else None
    slow = _read_file(path, False, findings, slow_s)
    if read and fast != slow:
        findings.append(Finding("divergence", f"scanner: {str(fast)[:600]}\nreference: {str(slow)[:600]}"))
    return findings


def _direct(data: bytes, findings: list[Finding], slow_s: float, target: str) -> bool:
    """The extension's entry points on the raw bytes, at full and at starved budgets, odd windows and
    prefixes: None or a tuple, never an exception. Returns whether the loader's call (`scan.scan_dump` or
    `scan.scan_json_dump`; for a body, `scan.scan_envelope` or `scan.scan_piece`) reads it."""
    ext = vars(scan).get("_frscan")  # the extension, or None where it is not built
    if ext is None:
        return False
    full = memory_budget(len(data))
    starved = (len(data) // 3, 4096, 0)
    calls: list[tuple[str, Any]] = []
    if target == "pickle":
        calls += [("scan", (data, budget)) for budget in (full, *starved)]
    elif target == "json":
        calls += [("scan_json", (data, budget, pieces, last, prefix)) for budget, pieces, last, prefix in (
            (full, False, 0, False), (full, True, 0, False), (full, True, 1, True), (full, True, -5, True),
            (starved[0], True, 0, False), (starved[1], True, 3, True), (starved[2], False, 0, False))]
        calls += [("scan_json", (data[: len(data) * k // 4], full, True, 2, True)) for k in (1, 2, 3)]
    else:
        calls += [("scan_envelope", (data, budget, last, pieces)) for budget, last, pieces in (
            (full, 3, 4096), (full, 0, 4096), (full, 1, 1), (full, -1, 0), (starved[0], 2, 4096),
            (starved[1], 0, 4096))]
        at = data.find(b'"ranks"')
        at = data.find(b"{", at) if at >= 0 else -1
        if at >= 0:
            calls += [("scan_json", (data[at:], full, True, last, True)) for last in (0, 3)]
    for fn, args in calls:
        try:
            got = _timed(findings, f"_frscan.{fn}{args[1:]}", lambda fn=fn, args=args: getattr(ext, fn)(*args),
                         slow_s)
        except Exception as exc:
            findings.append(Finding("c-error", f"_frscan.{fn}{args[1:]} raised {type(exc).__name__}: {exc}"))
            continue
        if got is not None and not isinstance(got, tuple):
            findings.append(Finding("c-error", f"_frscan.{fn}{args[1:]} returned {type(got).__name__}"))
        if fn == "scan_json" and got is not None and args[4] and not 0 < got[23] <= len(args[0]):
            findings.append(Finding("c-error", f"_frscan.scan_json prefix end {got[23]} outside the text"))
    parse = parse_profiling_name
    try:
        if target == "pickle":
            return scan.scan_dump(data, LazyFrames(list), parse) is not None
        if target == "json":
            return scan.scan_json_dump(data, LazyFrames(list), parse) is not None
        return scan.scan_envelope(data, 3, 4096, parse) is not None or (at >= 0 and scan.scan_piece(
            data[at:], 3, parse) is not None)
    except Exception as exc:
        findings.append(Finding("c-error", f"the scan wrapper raised {type(exc).__name__}: {exc}"))
        return True


def _evidence(data: bytes, from_file: bool) -> Any:
    from frscope.operator.evidence import push_decode
    from frscope.operator.evidence.pod_evidence import from_bytes
    from frscope.operator.evidence.sidecars import SidecarError
    try:
        if from_file:
            with tempfile.NamedTemporaryFile(suffix=".json") as handle:
                handle.write(data)
                handle.flush()
                ev = push_decode.decode_file(handle.name, "ep", origin="push", max_entries=3)
        else:
            ev = from_bytes(data, "ep", origin="push", max_entries=3)
    except (SidecarError, DumpError) as exc:
        return ("refused", type(exc).__name__, str(exc))
    return canon((ev.namespace, ev.pod, ev.reason, ev.captured_at_ns, ev.entries_dropped, ev.cut_here,
                  ev.size_bytes, [summary(d) for d in ev.dumps],
                  [(p.source, p.message, p.rank, p.kind) for p in ev.problems]))


def check_body(data: bytes, slow_s: float = SLOW_S, reference: bool = True) -> list[Finding]:
    """A sidecar's snapshot body (a push): the operator's evidence with the scanner equals it without, from
    bytes and from a file (where the scanner reads none of it: the reference's only, when `reference`)."""
    findings: list[Finding] = []
    read = _direct(data, findings, slow_s, "envelope")
    if not read and not reference:
        return findings
    for from_file in (False, True):
        got = []
        for on in (True, False) if read else (False,):
            with _Scanner(on):
                what = f"{'decode_file' if from_file else 'from_bytes'}, scanner {'on' if on else 'off'}"
                try:
                    got.append(_timed(findings, what, lambda ff=from_file: _evidence(data, ff), slow_s))
                except Exception as exc:
                    findings.append(Finding("leak", f"{what} raised {type(exc).__name__}: {str(exc)[:200]}"))
                    got.append(("raised", type(exc).__name__))
        if read and got[0] != got[1]:
            findings.append(Finding("divergence", f"{'file' if from_file else 'bytes'}: scanner {str(got[0])[:600]}"
                                                  f"\nreference: {str(got[1])[:600]}"))
    return findings


def scratch() -> tempfile.TemporaryDirectory[str]:
    """A folder for the files the loader reads (in memory where the system has /dev/shm)."""
    shm = Path("/dev/shm")
    return tempfile.TemporaryDirectory(prefix="frscope-fuzz-", dir=shm if shm.is_dir() else None)
