"""One sweep job, drawn from a seed: the class, world size, group layout, culprits, step and op, and the
capture's modifiers. The rank program, the controller and the scorer read the same JSON (`spec.json`)."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from frscope.testing.sweep.classes import CLASSES, FaultClass

HANG_FUNCTIONS = ("load_batch", "compute_loss", "save_checkpoint", "log_metrics", "prefetch_shards")


@dataclass
class JobSpec:
    job_id: str
    cls: str
    world: int
    layout: str
    tp: int  # group size of the contiguous groups (grid: tp, hsdp: shard); 0 where unused
    steps: int
    fault_step: int
    op_index: int  # which of the step's ops the fault hits
    culprits: list[int]
    torch: str  # "2.13", "2.15"
    seed: int
    copied_hours: float  # the file forms are scored as copies whose mtimes are this much later (0: not)
    exits: bool  # score with the exit codes (--exits) too
    params: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(obj: dict[str, Any]) -> JobSpec:
        return JobSpec(**obj)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @property
    def fault(self) -> FaultClass:
        return CLASSES[self.cls]


def _layout_ok(layout: str, world: int) -> bool:
    if layout in ("grid", "hsdp"):
        return world >= 4 and world % 2 == 0
    if layout == "strided":
        return world >= 4 and world % 2 == 0
    if layout == "pipeline":
        return world >= 3
    return True


def _group_size(layout: str, world: int, rng: random.Random) -> int:
    if layout in ("grid", "hsdp"):
        return rng.choice([t for t in (2, world // 2) if world % t == 0 and 2 <= t < world] or [2])
    return 0


def ops_of(layout: str, world: int, tp: int, cls: str) -> list[tuple[str, str]]:
    """The collectives of one step, (op, group), in the order every healthy rank calls them."""
    if cls == "healthy":
        rich = [("all_reduce", "world"), ("broadcast", "world"), ("all_gather_into_tensor", "world"),
                ("reduce_scatter_tensor", "world"), ("all_to_all_single", "world"), ("barrier", "world"),
                ("reduce", "world"), ("gather", "world"), ("scatter", "world"), ("async_buckets", "world")]
        return _layout_ops(layout) + rich
    if cls == "async":
        return [("async_buckets", "world")]
    if cls in ("a2a",):
        return [("all_reduce", "world"), ("all_to_all_single", "world")]
    if cls == "straggler-steps":
        return [("all_reduce", "world")] * 4
    return _layout_ops(layout) or [("all_reduce", "world"), ("all_reduce", "world")]


def _layout_ops(layout: str) -> list[tuple[str, str]]:
    return {
        "default": [("all_reduce", "world")],
        "grid": [("all_reduce", "tp"), ("all_reduce", "dp"), ("all_reduce", "world")],
        "strided": [("all_reduce", "strided"), ("all_reduce", "world")],
        "hsdp": [("all_gather_into_tensor", "shard"), ("reduce_scatter_tensor", "shard"),
                 ("all_reduce", "replicate")],
        "pipeline": [("pipeline_forward", "p2p"), ("all_reduce", "world")],
    }[layout]


def draw_job(rng: random.Random, index: int, cls_name: str, torch_version: str, seed: int,
             max_world: int = 8) -> JobSpec:
    cls = CLASSES[cls_name]
    worlds = [w for w in range(cls.min_world, min(cls.max_world, max_world) + 1)
              if any(_layout_ok(lay, w) for lay in cls.layouts)]
    # Small jobs are cheaper and as telling; 8 ranks still drawn often enough.
    world = rng.choices(worlds, weights=[3 if w <= 4 else 2 for w in worlds])[0]
    layout = rng.choice([lay for lay in cls.layouts if _layout_ok(lay, world)])
    tp = _group_size(layout, world, rng)
    ops = ops_of(layout, world, tp, cls_name)
    timing = cls.timing
    steps = rng.randint(12, 16) if timing else rng.randint(4, 7)
    fault_step = rng.randint(1, steps - 2)
    op_index = _fault_op(rng, cls_name, ops)
    culprits = _culprits(rng, cls_name, world, layout, tp, ops[op_index])
    params: dict[str, Any] = {"function": rng.choice(HANG_FUNCTIONS), "ops": ops}
    if cls_name == "healthy":
        params["jitter_s"] = round(rng.uniform(0.02, 0.12), 3)
    if timing:
        params["delay_s"] = round(rng.uniform(0.3, 0.45), 3)
    if cls.collect == "poll":
        params["step_s"] = 0.3  # slow steps: a sidecar polling every 0.3 s sees the job before it breaks
    if cls_name == "crash":
        params["how"] = rng.choice(["raise", "sigkill"])
    if cls_name in ("timeout", "after-timeout"):
        params["timeout_s"] = 3.0
    if cls_name == "async":
        params["buckets"] = rng.randint(2, 4)
    job_id = f"{index:04d}-{cls_name}-w{world}-{layout}-t{torch_version}"
    file_forms_copied = rng.random() < 0.3
    spec = JobSpec(
        job_id=job_id, cls=cls_name, world=world, layout=layout, tp=tp, steps=steps, fault_step=fault_step,
        op_index=op_index, culprits=sorted(culprits), torch=torch_version, seed=rng.randrange(1 << 30),
        copied_hours=round(rng.uniform(1.0, 20.0), 1) if file_forms_copied else 0.0,
        exits=cls.exits and rng.random() < 0.5, params=params,
    )
    if cls_name == "a2a":
        # From the job's own seed (no draw): the same seed keeps drawing the same jobs as before this variant.
        spec.params["a2a"] = "hang" if spec.seed % 2 else "abort"
    return spec


def _fault_op(rng: random.Random, cls: str, ops: list[tuple[str, str]]) -> int:
    candidates = list(range(len(ops)))
    if cls in ("type", "barrier", "dtype"):
        candidates = [i for i, (op, _) in enumerate(ops) if op == "all_reduce"]
    elif cls == "size":
        candidates = [i for i, (op, _) in enumerate(ops)
                      if op in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")]
    elif cls in ("hang-strided", "cycle", "order"):
        candidates = [i for i, (_, g) in enumerate(ops) if g not in ("world", "p2p")][:1]
    elif cls == "pipeline":
        candidates = [i for i, (op, _) in enumerate(ops) if op == "pipeline_forward"]
    elif cls == "a2a":
        candidates = [i for i, (op, _) in enumerate(ops) if op == "all_to_all_single"]
    return rng.choice(candidates or [0])


def _culprits(rng: random.Random, cls: str, world: int, layout: str, tp: int, op: tuple[str, str]) -> list[int]:
    if cls == "healthy":
        return []
    if cls == "two-hang":
        node = rng.randrange(world // 2)
        return [2 * node, 2 * node + 1]
    if cls == "p2p":
        a = rng.randrange(world)
        return sorted({a, (a + rng.randrange(1, world)) % world})
    if cls == "pipeline":
        return [rng.randrange(1, world - 1)]  # a middle stage: someone waits before and after it
    if cls == "a2a":
        return [rng.randrange(1, world)]  # rank 0 receives the extra element and aborts
    return [rng.randrange(world)]


def draw_jobs(seed: int, count: int, classes: list[str], torch_versions: list[str],
              max_world: int = 8) -> list[JobSpec]:
    """`count` jobs, classes and versions in turn (so every class gets its share), the rest drawn."""
    rng = random.Random(seed)
    jobs = []
    for index in range(count):
        cls = classes[index % len(classes)]
        version = torch_versions[(index // len(classes)) % len(torch_versions)]
        jobs.append(draw_job(rng, index, cls, version, seed, max_world))
    return jobs


def groups_of(spec: JobSpec) -> list[tuple[str, str, list[int]]]:
    """Every process group of the job as torch names it: (pg name, desc, ranks), in creation order (the
    default group '0', then each `new_group` call, which every rank makes, members or not). What the rank
    program builds (`rank.py`, Job.init)."""
    world, tp = spec.world, spec.tp
    blocks = [list(range(s, s + tp)) for s in range(0, world, tp)] if tp else []
    strides = [list(range(i, world, tp)) for i in range(tp)] if tp else []
    layouts: dict[str, list[tuple[str, list[list[int]]]]] = {
        "grid": [("tp", blocks), ("dp", strides)],
        "hsdp": [("shard", blocks), ("replicate", strides)],
        "strided": [("strided", [list(range(0, world, 2)), list(range(1, world, 2))])],
    }
    out = [("0", "default_pg", list(range(world)))]
    for desc, partition in layouts.get(spec.layout, []):
        for members in partition:
            out.append((str(len(out)), desc, members))
    return out
