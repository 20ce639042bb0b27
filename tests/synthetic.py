"""A synthetic job at scale (ranks x entries) built straight from the model, for size/speed tests.

Real recorders come from real jobs (tests/data/real, frscope.demo); this only exists because nobody
can run 1,024 ranks here. Shape: every rank all_reduces / broadcasts in group '0'; the culprit rank
stops one collective early (RankNotJoined), the others are blocked in the last one.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from frscope.analysis import Category, Finding, GroupRef, Report
from frscope.records import DumpSet, Entry, GroupInfo, RankDump
from frscope.report import report_to_dict
from frscope.report.timeline import build_timeline

FRAMES = [
    {"name": "all_reduce", "filename": "/venv/site-packages/torch/distributed/distributed_c10d.py", "line": 3252},
    {"name": "train_step", "filename": "/app/train.py", "line": 145},
]


def synthetic_hang(world: int, entries: int, culprit: int = 0, t0: int = 1_700_000_000_000_000_000) -> DumpSet:
    sizes_a: list[list[int]] = [[1024, 1024]]
    sizes_b: list[list[int]] = [[16]]
    dt = ["Float"]
    dumps: dict[int, RankDump] = {}
    for rank in range(world):
        last = entries - 1 if rank == culprit else entries
        out: list[Entry] = []
        for seq in range(1, last + 1):
            op = "broadcast" if seq % 7 == 0 else "all_reduce"
            sizes = sizes_b if op == "broadcast" else sizes_a
            done = seq < entries
            created = t0 + seq * 5_000_000 + (rank % 3) * 1000
            out.append(
                Entry(
                    seq - 1,
                    "0",
                    "default_pg",
                    seq,
                    0,
                    False,
                    op,
                    "nccl:" + op,
                    None,
                    sizes,
                    dt,
                    sizes,
                    dt,
                    "completed" if done else "started",
                    None,
                    created,
                    created + 1000 if True else None,
                    created + 900_000 if done else None,
                    0.9 if done else None,
                    600_000,
                    "1",
                    "python",
                    FRAMES,
                )
            )
        dumps[rank] = RankDump(
            rank, f"synthetic-{rank}", "2.10", "nccl", out, captured_at_ns=t0 + (entries + 4000) * 5_000_000
        )
    group = GroupInfo("0", "default_pg", tuple(range(world)), "world")
    return DumpSet(dumps, {"0": group}, world)


def hand_report(dumpset: DumpSet, culprit: int, seq: int) -> Report:
    """The verdict the analysis gives on `synthetic_hang` (tested there), written down, so that size and
    speed tests of the renderers do not pay for an analysis at scale."""
    group = dumpset.groups["0"]
    finding = Finding(
        Category.RANK_NOT_JOINED,
        (culprit,),
        GroupRef(group.name, group.desc, group.ranks),
        f"Rank {culprit} never joined all_reduce #{seq} of group 0 (default_pg).",
        collective_seq_id=seq,
        op="all_reduce",
        input_sizes=[[1024, 1024]],
        input_dtypes=["Float"],
        evidence=[f"rank {culprit}: last entered #{seq - 1}"],
    )
    return Report([finding], dumpset.ranks_loaded, (), dumpset.world_size, [], [], "nccl", ("2.10",))


@cache
def big_job(world: int = 1024, entries: int = 2000, culprit: int = 517) -> tuple[dict[str, Any], dict[str, Any]]:
    """(report dict, timeline) of a world x entries hang, built once per test process."""
    dumpset = synthetic_hang(world, entries, culprit=culprit)
    report = hand_report(dumpset, culprit, entries)
    return report_to_dict(report), build_timeline(dumpset, report)
