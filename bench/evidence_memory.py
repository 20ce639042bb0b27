"""What one rank's gathered evidence costs in the operator's process, and what the analysis adds.

The operator's incident path without a cluster: one synthetic sidecar body per rank (built as
`bench/operator_scale.py`'s farm builds them: `frscope.testing.synthetic`, NCCL shape, scenario
`not_joined`, the `?entries=200` window of a 2,000-entry recorder, gzipped), each decoded by the operator's
own `gather.Decoder` in one decoder process (`pod_evidence.from_bytes`, packed, pickled back, unpacked into the
gather's `GroupTable`) and kept in a `Gathered` as `gather.gather` keeps it; then `diagnosis.diagnose_sync`.

Measured in this process (tracemalloc, after a full collection):
- held: what the gathered evidence keeps, per rank;
- analysis peak: the most traced memory while the dump set is assembled and analyzed, over what was held;
- after: what is left once the diagnosis is made and the gathered evidence dropped (the report kept);
and a walk of the held objects by kind (each object counted once, where first met; sys.getsizeof).

    nice -n 10 .venv/bin/python bench/evidence_memory.py --ranks 1024 4096 --tree /tmp/before --tree .

With `--tree`, each tree runs in a child process of its own (its frscope imported from there); the table
compares them side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

WINDOW = 200


def bodies_file(ranks: int, entries: int, seed: int) -> Path:
    """Every rank's body, built once and kept in a file (so that every tree decodes the same bytes)."""
    path = Path(tempfile.gettempdir()) / f"frscope-evidence-bodies-{ranks}-{entries}-{seed}.bin"
    if path.exists():
        return path
    from frscope.testing.synthetic import make_plan

    plan = make_plan(ranks, entries=entries, shape="nccl", scenario="not_joined", seed=seed, hang_age_s=120.0)
    now = time.time_ns()
    part = path.with_suffix(f".{os.getpid()}.part")
    with part.open("wb") as out:
        for rank in range(ranks):
            trace = plan.dump(rank, json_shape=True, newest=WINDOW)
            snap: dict[str, Any] = {"frscope_snapshot": 1, "rank": rank, "captured_at_ns": now,
                                    "source": f"synthetic:{rank}", "stacks": None, "trace": trace}
            dropped = plan.dump_length(rank) - len(trace.get("entries") or ())
            if dropped > 0:
                snap["entries_dropped"] = dropped
            body = {"schema": "frscope.sidecar.snapshot/v1", "pod": f"bench-worker-{rank}", "namespace": "bench",
                    "node": "n", "captured_at_ns": now, "reason": "refresh", "ranks": [snap], "errors": []}
            raw = gzip.compress(json.dumps(body).encode(), 1)
            out.write(struct.pack("<I", len(raw)) + raw)
    part.replace(path)
    return path


def read_bodies(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while head := handle.read(4):
            yield handle.read(struct.unpack("<I", head)[0])


def walk(roots: list[tuple[str, Any]]) -> dict[str, int]:
    """Bytes by kind: each object counted once, under the kind of the root it was first met from
    (the first rank's small tables count under it; what other ranks share is not counted again)."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for kind, root in roots:
        stack = [root]
        while stack:
            obj = stack.pop()
            if obj is None or isinstance(obj, (bool, type)) or id(obj) in seen:
                continue
            if isinstance(obj, int) and -5 <= obj <= 256:
                continue
            seen.add(id(obj))
            out[kind] = out.get(kind, 0) + sys.getsizeof(obj)
            if isinstance(obj, (str, bytes, bytearray, array, int, float, range)):
                continue
            if isinstance(obj, dict):
                stack.extend(obj.keys())
                stack.extend(obj.values())
            elif isinstance(obj, (list, tuple, set, frozenset)):
                stack.extend(obj)
            else:
                for cls in type(obj).__mro__:
                    for name in getattr(cls, "__slots__", ()) or ():
                        stack.append(getattr(obj, name, None))
                if hasattr(obj, "__dict__"):
                    stack.extend(vars(obj).values())
    return out


def roots_of(gathered: Any) -> list[tuple[str, Any]]:
    """The held evidence split into kinds, for `walk`."""
    from frscope.records.columns import EntryTable

    roots: list[tuple[str, Any]] = []
    for evidence in gathered.pods.values():
        for dump in evidence.dumps:
            table = dump.entries
            if isinstance(table, EntryTable):
                for name in ("record_id", "pg", "seq", "p2p_seq", "flags", "name", "shape", "state", "created",
                             "started", "completed", "duration", "timeout", "thread", "stack"):
                    roots.append(("columns", getattr(table, name, None)))
                for name in ("pgs", "names", "shapes", "states", "timeouts", "threads", "stacks", "frames",
                             "frames_each", "_stack_frames"):
                    roots.append(("small tables", getattr(table, name, None)))
                roots.append(("signatures", (getattr(table, "sigs", None), getattr(table, "space", None))))
                roots.append(("group index", getattr(table, "_groups", None)))
                roots.append(("table shell", table))
            else:
                roots.append(("entries (list)", table))
            roots.append(("pg_config", dump.pg_config))
            roots.append(("pg_status", dump.pg_status))
            roots.append(("rank's strings", (dump.source, dump.version, dump.backend, dump.comm_lib_version,
                                             dump.stacks, dump.host, dump.warnings)))
            roots.append(("RankDump", dump))
        roots.append(("problems", evidence.problems))
        roots.append(("PodEvidence", evidence))
    return roots


async def _decode_all(path: Path, processes: int) -> Any:
    from frscope.operator.evidence.gather import Decoder, Gathered
    from frscope.operator.evidence.group_lists import GroupTable

    decoder = Decoder(processes)
    await decoder.warm_up()
    gathered = Gathered("bench")
    shared = GroupTable()
    try:
        for index, raw in enumerate(read_bodies(path)):  # one body at a time, as answers arrive
            pod = f"bench-worker-{index}"
            gathered.pods[pod] = await decoder.decode(raw, f"http://{pod}", max_entries=WINDOW, pod=pod,
                                                      namespace="bench", shared=shared)
            del raw
    finally:
        decoder.close()
    return gathered


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak_rss() -> None:
    """VmHWM back to the current RSS (Linux: `clear_refs` 5), so that a peak is the next phase's own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def measure(path: Path, ranks: int, processes: int, trace: bool) -> dict[str, Any]:
    """One tree, one size: with `trace`, tracemalloc's figures and the walk; without, the process's RSS."""
    from frscope.analysis import AnalysisOptions
    from frscope.operator.evidence.diagnosis import diagnose_sync
    from frscope.operator.evidence.pod_evidence import from_bytes
    from frscope.report.serialize import report_to_dict
    from frscope.report.timeline import build_timeline

    # Everything the path imports, imported before the baseline (one body decoded in this process).
    from_bytes(next(read_bodies(path)), "warm", origin="sidecar", max_entries=WINDOW)
    gc.collect()
    if trace:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0] if trace else status_kib("VmRSS") * 1024
    started = time.monotonic()
    gathered = asyncio.run(_decode_all(path, processes))
    decode_s = time.monotonic() - started
    gc.collect()
    held = (tracemalloc.get_traced_memory()[0] if trace else status_kib("VmRSS") * 1024) - base
    if trace:
        tracemalloc.reset_peak()
    else:
        reset_peak_rss()  # (decoding has a peak of its own in this harness, in both trees)
    started = time.monotonic()
    diagnosis = diagnose_sync(gathered, ranks, AnalysisOptions(stall_after_s=60))
    analyze_s = time.monotonic() - started
    peak = (tracemalloc.get_traced_memory()[1] if trace else status_kib("VmHWM") * 1024) - base
    # What publishing builds while the evidence is still held (engine/ui_data.latest_diagnosis): the report as
    # a dict and the timeline; then what stays once the gathered evidence is dropped (the UI's copy).
    if trace:
        tracemalloc.reset_peak()
    else:
        reset_peak_rss()
    report = report_to_dict(diagnosis.report)
    timeline = build_timeline(diagnosis.dumpset, diagnosis.report)
    publish_peak = (tracemalloc.get_traced_memory()[1] if trace else status_kib("VmHWM") * 1024) - base
    kinds: dict[str, int] = {}
    if trace:
        kinds = walk(roots_of(gathered))
    del diagnosis, gathered
    gc.collect()
    after = (tracemalloc.get_traced_memory()[0] if trace else status_kib("VmRSS") * 1024) - base
    if trace:
        tracemalloc.stop()
    del timeline
    finding = report["findings"][0] if report["findings"] else {}
    return {
        "ranks": ranks, "trace": trace, "held_bytes": held, "held_per_rank": held / ranks, "peak_bytes": peak,
        "publish_peak_bytes": publish_peak, "after_bytes": after,
        "peak_per_rank": peak / ranks, "walk": kinds, "walk_per_rank": sum(kinds.values()) / ranks,
        "decode_s": decode_s, "analyze_s": analyze_s,
        "verdict": finding.get("category"), "culprits": finding.get("culprit_ranks"),
        "report_digest": hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest()[:16],
    }


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def table(results: list[dict[str, Any]]) -> str:
    traced = {(r["ranks"], r["tree"]): r for r in results if r["trace"]}
    plain = {(r["ranks"], r["tree"]): r for r in results if not r["trace"]}
    lines = ["| ranks | tree | held, traced (a rank) | peak analyzing, traced (a rank) | peak publishing, traced | "
             "left after, traced | held, RSS (a rank) | peak RSS analyzing | peak RSS publishing | decode | analysis "
             "| verdict | report digest |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for key, r in traced.items():
        p = plain.get(key, r)
        lines.append(
            f"| {r['ranks']:,} | {r['tree']} | {_mib(r['held_bytes'])} ({r['held_per_rank'] / 1024:,.1f} KiB) | "
            f"{_mib(r['peak_bytes'])} ({r['peak_per_rank'] / 1024:,.1f} KiB) | {_mib(r['publish_peak_bytes'])} | "
            f"{_mib(r['after_bytes'])} | {_mib(p['held_bytes'])} ({p['held_per_rank'] / 1024:,.1f} KiB) | "
            f"{_mib(p['peak_bytes'])} | {_mib(p['publish_peak_bytes'])} | "
            f"{p['decode_s']:.1f} s | {p['analyze_s']:.1f} s | {r['verdict']} {r['culprits']} | {r['report_digest']} |")
    kinds = sorted({k for r in traced.values() for k in r["walk"]})
    lines += ["", "Bytes a rank by kind (the walk, traced runs):", "",
              "| ranks | tree | " + " | ".join(kinds) + " | all |", "|---:|---|" + "---:|" * (len(kinds) + 1)]
    for r in traced.values():
        lines.append(f"| {r['ranks']:,} | {r['tree']} | "
                     + " | ".join(f"{r['walk'].get(k, 0) / r['ranks']:,.0f}" for k in kinds)
                     + f" | {r['walk_per_rank']:,.0f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--entries", type=int, default=2000, help="each rank's whole recorder (the window is 200)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--processes", type=int, default=1, help="decoder processes")
    parser.add_argument("--tree", action="append", default=[], help="run with this tree's frscope (repeatable)")
    parser.add_argument("--child", default="", help="(internal) one measurement of this bodies file, as JSON")
    parser.add_argument("--trace", action="store_true", help="(internal) with tracemalloc")
    parser.add_argument("--table", nargs="+", default=[], help="only print the table of these files of result lines")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(Path(args.child), args.ranks[0], args.processes, args.trace)))
        return 0
    if args.table:
        print(table([json.loads(line) for name in args.table for line in Path(name).read_text().splitlines()
                     if line.startswith("{")]))
        return 0
    trees = args.tree or ["."]
    results = []
    for ranks in args.ranks:
        path = bodies_file(ranks, args.entries, args.seed)
        for trace in (True, False):
            for tree in trees:
                root = Path(tree).resolve()
                env = {**os.environ, "PYTHONPATH": str(root)}
                command = [sys.executable, str(Path(__file__).resolve()), "--child", str(path), "--ranks", str(ranks),
                           "--processes", str(args.processes)] + (["--trace"] if trace else [])
                done = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    print(done.stderr, file=sys.stderr)
                    return 1
                got = json.loads(done.stdout.strip().splitlines()[-1])
                got["tree"] = tree
                results.append(got)
                print(json.dumps(got), file=sys.stderr, flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
