"""Writing a plan's dumps: one file per rank (pickle protocol 2 or the `fr_trace_json` shape), in worker
processes for large sets."""


from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from frscope.testing.synthetic.hung_step import make_plan
from frscope.testing.synthetic.plan import GroundTruth, Plan
from frscope.testing.synthetic.topology import DEFAULT_PREFIX, FORMATS


def file_name(prefix: str, rank: int, fmt: str) -> str:
    return f"{prefix}{rank}.json" if fmt == "json" else f"{prefix}{rank}"


def encode(plan: Plan, rank: int, fmt: str) -> bytes:
    if fmt == "json":
        return json.dumps(plan.dump(rank, json_shape=True), sort_keys=True, separators=(",", ":")).encode()
    return pickle.dumps(plan.dump(rank), protocol=2)


_WORKER: tuple[Plan, str, str, str] | None = None


def _init_worker(plan: Plan, out_dir: str, prefix: str, fmt: str) -> None:
    global _WORKER
    _WORKER = (plan, out_dir, prefix, fmt)


def _write_ranks(ranks: Sequence[int]) -> int:
    assert _WORKER is not None
    plan, out_dir, prefix, fmt = _WORKER
    written = 0
    for rank in ranks:
        data = encode(plan, rank, fmt)
        with open(os.path.join(out_dir, file_name(prefix, rank, fmt)), "wb") as handle:
            handle.write(data)
        written += len(data)
    return written


def write_plan(plan: Plan, out_dir: str | Path, *, fmt: str = "pickle", prefix: str = DEFAULT_PREFIX,
               jobs: int = 1) -> int:
    """Write every rank's file (one rank in memory at a time per process); returns bytes written."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ranks = plan.ranks_to_write()
    chunk = 16
    chunks = [ranks[i : i + chunk] for i in range(0, len(ranks), chunk)]
    if jobs <= 1 or len(chunks) <= 1:
        _init_worker(plan, str(out), prefix, fmt)
        try:
            return sum(_write_ranks(c) for c in chunks)
        finally:
            _init_worker_clear()
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ctx.Pool(jobs, initializer=_init_worker, initargs=(plan, str(out), prefix, fmt)) as pool:
        return sum(pool.imap_unordered(_write_ranks, chunks))


def _init_worker_clear() -> None:
    global _WORKER
    _WORKER = None


def generate(out_dir: str | Path, ranks: int, *, fmt: str = "pickle", prefix: str = DEFAULT_PREFIX,
             jobs: int = 1, **plan_kw: Any) -> GroundTruth:
    """Write a synthetic dump set to `out_dir` and return what a correct analyzer must say."""
    plan = make_plan(ranks, **plan_kw)
    write_plan(plan, out_dir, fmt=fmt, prefix=prefix, jobs=jobs)
    return plan.truth


def iter_dumps(plan: Plan, json_shape: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """Every written rank's dump, in memory (small sets only)."""
    for rank in plan.ranks_to_write():
        yield rank, plan.dump(rank, json_shape=json_shape)
