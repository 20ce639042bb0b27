"""Synthetic Flight Recorder dumps with a known answer, for benchmarks and scale tests.

Writes one file per rank in the shapes torch 2.13 writes (verified against real dumps and
torch/csrc/distributed/c10d/FlightRecorderDetail.hpp):

- NCCL: version '2.10'; `pg_config` keyed by group name for every group the rank belongs to, `ranks`
  a string like '[0, 1, 2]'; `pg_status` keyed by the rank-local pg uid (the entries' `pg_id`) with int
  values; states scheduled/started/completed with discovery times, `duration_ms` on completed entries,
  p2p entries ('nccl:send 0->1', 'nccl:recv 1<-0', group-local ranks, `is_p2p`, `p2p_seq_id`).
- gloo: `pg_config` is `{'': {'name': '', 'desc': '', 'ranks': '[]'}}` (the gloo bug: the entries still
  say ('0', 'default_pg')), state 'scheduled' only, no discovery times, no durations, `retired` True once
  an op finished, no p2p entries (gloo records none).

The job is a 3-D parallel training loop (data x pipeline x tensor parallel, DeviceMesh-style group
descs 'mesh_tp' / 'mesh_pp' / 'mesh_dp'): every rank runs the same step of ~30 collectives, the ring
buffer keeps the last `entries` records, so a long run wraps and sequence ids do not start at 1. The
last (hung) step is simulated rank by rank: NCCL enqueues asynchronously until a CPU sync point
(`.item()` after the grad-norm all_reduce and after the loss all_reduce) and runs each rank's ops in
order on one stream; gloo blocks in every op. A fault (scenario) is injected into that step and the
ground truth (category, culprit ranks, group, sequence id) is returned.

Pickle files are plain `pickle.dumps(dump, protocol=2)` named `<prefix><rank>`; JSON files are the
`fr_trace_json` shape (tuples as lists, None times as 0, pg_status values as strings, keys sorted, no
frames) named `<prefix><rank>.json`.

    python -m frscope.testing.synthetic OUT_DIR --ranks 1024 --entries 2000 --shape nccl \
        --scenario not_joined --format pickle [--seed N] [--jobs 2]

prints the ground truth as JSON on stdout. Stdlib only; never imports torch.

Modules: `topology` (groups and constants), `steps` (the training step's collectives and stacks), `plan`
(the ground truth, the plan and each rank's dump), `hung_step` (the hung step simulated, `make_plan`),
`writing` (files, in worker processes), `command_line`.
"""

from __future__ import annotations

from frscope.testing.synthetic.command_line import main
from frscope.testing.synthetic.hung_step import make_plan
from frscope.testing.synthetic.plan import GroundTruth, Plan
from frscope.testing.synthetic.topology import (
    CATEGORY,
    DEFAULT_PREFIX,
    FORMATS,
    SCENARIOS,
    SHAPES,
    VERSION,
    Topology,
)
from frscope.testing.synthetic.writing import encode, file_name, generate, iter_dumps, write_plan

__all__ = [
    "CATEGORY", "DEFAULT_PREFIX", "FORMATS", "SCENARIOS", "SHAPES", "VERSION", "GroundTruth", "Plan", "Topology",
    "encode", "file_name", "generate", "iter_dumps", "main", "make_plan", "write_plan",
]
