"""FR format 2.10's buffer reset epochs (torch 2.15: `torch._C._distributed_c10d._reset_fr_trace()`): torch keeps
the epoch to itself and dumps only the current epoch's entries, their record ids starting again at 0 while the
groups' collective sequence numbers go on. A dump taken after a reset is read as it is (nothing to add to the
records: no epoch field exists) and a healthy job stays healthy. Real torch 2.15, one gloo rank on loopback;
torch 2.13/2.14 have no reset."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from frscope.analysis import analyze
from frscope.records import load_dumps
from tests.integration.test_sidecar_support import free_port
from tests.integration.torch_venvs import python_for

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

JOB = """
import sys, torch, torch.distributed as dist
from torch._C import _distributed_c10d as c10d
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=0, world_size=1)
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
c10d._reset_fr_trace()
for _ in range(2):
    dist.all_reduce(t)
open(sys.argv[1], "wb").write(c10d._dump_fr_trace_json())
dist.destroy_process_group()
"""


def test_a_dump_after_a_buffer_reset_reads_and_stays_healthy(tmp_path: Path) -> None:
    python = python_for("2.15")
    dump = tmp_path / "rank_0.json"
    subprocess.run([python, "-W", "ignore", "-c", JOB, str(dump), str(free_port())], check=True, timeout=150,
                   env={"TORCH_FR_BUFFER_SIZE": "100", "PATH": "/usr/bin:/bin"}, capture_output=True)
    dumpset = load_dumps([tmp_path], jobs=1)
    [entries] = [d.entries for d in dumpset.dumps.values()]
    assert [(e.record_id, e.collective_seq_id, e.op) for e in entries] == [(0, 4, "all_reduce"), (1, 5, "all_reduce")]
    assert all(e.thread_name for e in entries)  # 2.10's thread fields are read
    assert not dumpset.problems
    assert not analyze(dumpset).findings
