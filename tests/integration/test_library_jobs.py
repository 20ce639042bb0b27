"""Library-driven real jobs (frscope.testing.libjobs): torch's own DDP, pipelining and object collectives
on real gloo ranks, a fault injected, captured while the ranks are blocked, and frscope's verdict judged
in every form the way the project is judged (`make library-sweep` runs every program, fault and torch
version; this is its sample)."""

from __future__ import annotations

from pathlib import Path

import pytest

from frscope.testing.libjobs.launch import Job, python_for, run_job, score_job

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(
    "job",
    [
        # DDP's buckets with no_sync and unused parameters; rank 1 stuck in its data loader at step 3.
        Job("ddp", "stuck", rank=1),
        # A GPipe schedule: stage 1 stuck before its receive; gloo records no send/recv, so the stacks decide.
        Job("pipeline", "stuck", rank=1),
        # all_gather_object / broadcast_object_list / gather_object / scatter_object_list: healthy shapes.
        Job("objects", "none"),
    ],
    ids=lambda job: job.name,
)
def test_library_job_is_diagnosed_in_every_form(job: Job, tmp_path: Path) -> None:
    python = python_for(job.torch)
    assert python is not None
    truth = run_job(job, python, tmp_path / job.name)
    assert truth["outcome"] == ("finished" if job.fault == "none" else "fault"), truth
    for verdict in score_job(tmp_path / job.name, tmp_path / "scratch"):
        if verdict["apart"]:
            continue  # the forms without live stacks cannot see a hang in unrecorded ops
        assert verdict["right"], (verdict["form"], verdict["why"])
