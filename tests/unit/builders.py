"""Small builders of raw recorder dumps, shaped exactly like torch 2.13's (see DESIGN.md), for unit
tests that need a precise situation. Whole-job realism comes from tests/data/real (real torch jobs)
and frscope.testing.synthetic (large NCCL/gloo-shaped sets)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

T0 = 1_796_226_757_000_000_000  # an epoch-ns timestamp like torch writes


def entry(
    seq: int,
    *,
    op: str = "all_reduce",
    backend: str = "nccl",
    pg: tuple[str, str] = ("0", "default_pg"),
    record_id: int | None = None,
    sizes: list[list[int]] | None = None,
    out_sizes: list[list[int]] | None = None,
    dtype: str = "Float",
    state: str = "completed",
    retired: bool | None = None,
    created_ns: int | None = None,
    duration_ms: float | None = None,
    p2p_seq: int = 0,
    peer: str = "",
    frames: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    sizes = [[4, 8]] if sizes is None else sizes
    is_p2p = op in ("send", "recv")
    completed = state == "completed"
    return {
        "record_id": seq - 1 if record_id is None else record_id,
        "pg_id": int(pg[0]) if pg[0].isdigit() else 0,
        "process_group": pg,
        "collective_seq_id": 0 if is_p2p else seq,
        "p2p_seq_id": p2p_seq,
        "op_id": seq,
        "profiling_name": f"{backend}:{op}{peer}",
        "time_created_ns": (T0 + seq * 1_000_000) if created_ns is None else created_ns,
        "duration_ms": duration_ms,
        "input_sizes": sizes,
        "input_dtypes": [dtype] * len(sizes),
        "output_sizes": sizes if out_sizes is None else out_sizes,
        "output_dtypes": [dtype] * len(sizes if out_sizes is None else out_sizes),
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": completed if retired is None else retired,
        "timeout_ms": 600_000,
        "is_p2p": is_p2p,
        "frames": frames
        if frames is not None
        else [
            {"name": op, "filename": "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", "line": 1},
            {"name": "train_step", "filename": "/app/train.py", "line": 42},
        ],
        "thread_id": "140000000000000",
        "thread_name": "pt_main_thread",
    }


def dump(
    entries: list[dict[str, Any]],
    *,
    world: int,
    version: str = "2.10",
    pg_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if pg_config is None:
        pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    return {
        "version": version,
        "pg_config": pg_config,
        "pg_status": {},
        "comm_lib_version": "2.21.5",
        "entries": entries,
    }


def write_pickle(directory: Path, rank: int, data: Any, prefix: str = "nccl_trace_rank_") -> Path:
    path = directory / f"{prefix}{rank}"
    path.write_bytes(pickle.dumps(data, protocol=2))
    return path


def write_json(directory: Path, rank: int, data: Any, name: str | None = None) -> Path:
    path = directory / (name or f"rank_{rank}.json")
    path.write_text(json.dumps(data))
    return path


def job(directory: Path, per_rank: dict[int, list[dict[str, Any]]], world: int | None = None) -> Path:
    """Write one NCCL-shaped pickle per rank; returns the directory."""
    world = world or (max(per_rank) + 1)
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e.setdefault("record_id", i)
        write_pickle(directory, rank, dump(entries, world=world))
    return directory


def gloo_entry(seq: int, t_ms: int, *, op: str = "all_reduce", done: bool = True,
               pg: tuple[str, str] = ("0", "default_pg")) -> dict[str, Any]:
    """A gloo entry as gloo records it (state `scheduled` only), created `t_ms` after T0."""
    return entry(seq, op=op, backend="gloo", pg=pg, state="scheduled", retired=done, created_ns=T0 + t_ms * 1_000_000)


def write_gloo_ranks(directory: Path, per_rank: dict[int, list[dict[str, Any]]], pg_config: dict[str, Any]) -> Path:
    """Each rank's entries numbered from record 0 and written as its pickle dump, with gloo's `pg_config`."""
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e["record_id"] = i
        write_pickle(directory, rank, dump(entries, world=0, pg_config=pg_config))
    return directory
