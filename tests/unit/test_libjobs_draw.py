"""The library sweep's seeded draw (frscope.testing.libjobs): a holdout seed gives jobs every program can run,
the same jobs for the same seed, and covers ranks, steps and world sizes beyond the fixed sweep's."""

from frscope.testing.libjobs.__main__ import EVEN_ONLY, draw_jobs, faults_for
from frscope.testing.libjobs.launch import PROGRAMS


def test_a_seed_draws_the_same_runnable_jobs() -> None:
    jobs = draw_jobs(31, 200, list(PROGRAMS), ["2.13", "2.15"])
    assert jobs == draw_jobs(31, 200, list(PROGRAMS), ["2.13", "2.15"])
    assert jobs != draw_jobs(32, 200, list(PROGRAMS), ["2.13", "2.15"])
    assert len({job.name for job in jobs}) == len(jobs) == 200
    for job in jobs:
        assert job.fault in faults_for(job.program)
        assert 2 <= job.world <= 8 and 0 <= job.rank < job.world
        assert job.program not in EVEN_ONLY or job.world % 2 == 0
        assert job.fault == "none" or 2 <= job.step <= 5
    assert {job.torch for job in jobs} == {"2.13", "2.15"}
    faulty = [job for job in jobs if job.fault != "none"]
    assert {job.world for job in jobs} == set(range(2, 9))
    assert any(0 < job.rank < job.world - 1 for job in faulty)  # a middle rank, not only 0, 1 and the last
    assert {job.step for job in faulty} == {2, 3, 4, 5}


def test_only_the_dataloader_program_gets_the_loader_fault() -> None:
    assert faults_for("dataloader") == ("none", "loader")
    assert "loader" not in faults_for("ddp") and "stuckmid" not in faults_for("ddp")
    assert "stuckmid" in faults_for("objects")
