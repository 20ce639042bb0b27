"""A synthetic job at scale (ranks x entries) built straight from the model, for size/speed tests.

Real recorders come from real jobs (tests/data/real, frscope.demo); this only exists because nobody
can run 1,024 ranks here. Shape: every rank all_reduces / broadcasts in group '0'; the culprit rank
stops one collective early (RankNotJoined), the others are blocked in the last one.
"""

from __future__ import annotations

from frscope.records import DumpSet, Entry, GroupInfo, RankDump

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
                Entry(seq - 1, "0", "default_pg", seq, 0, False, op, "nccl:" + op, None, sizes, dt, sizes, dt,
                      "completed" if done else "started", None, created, created + 1000 if True else None,
                      created + 900_000 if done else None, 0.9 if done else None, 600_000, "1", "python", FRAMES)
            )
        dumps[rank] = RankDump(rank, f"synthetic-{rank}", "2.10", "nccl", out,
                               captured_at_ns=t0 + (entries + 4000) * 5_000_000)
    group = GroupInfo("0", "default_pg", tuple(range(world)), "world")
    return DumpSet(dumps, {"0": group}, world)
