"""Real gloo jobs through the demo launcher: every fault, the raw facts each rank's snapshot shows.

These check what torch and the launcher produce (sockets answered, recorders and stacks say what
the fault did), not frscope's verdict: analyzer assertions live with the analyzer's tests.
"""

from __future__ import annotations

import json
import pickletools
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from frscope.demo.faults import FAULT_STEP, FAULTS, LAYER_STEPS, LAYERS, STEP_LATE_S, STEPS, STRAGGLER_STEPS
from frscope.demo.launcher import CollectedJob, run_fault_job, start_job

WORLD = 4
FAULT_SEQ = FAULT_STEP + 1  # the fault step's all_reduce on default_pg
SNAPSHOT_KEYS = {"frscope_snapshot", "rank", "captured_at_ns", "source", "stacks", "trace"}


def load(job: CollectedJob, rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(job.snapshots[rank].read_text())
    return data


def main_stack(snapshot: dict[str, Any]) -> str:
    """The main thread's block of the faulthandler text (the one that ran the module)."""
    blocks = [b for b in snapshot["stacks"].split("\n\n") if "in <module>" in b]
    assert len(blocks) == 1, snapshot["stacks"]
    return blocks[0]


def innermost(snapshot: dict[str, Any]) -> str:
    """The function the main thread is in right now (faulthandler lists the innermost first)."""
    for line in main_stack(snapshot).splitlines():
        if line.strip().startswith("File "):
            return line.rsplit(" in ", 1)[1].strip()
    raise AssertionError(snapshot["stacks"])


def default_pg(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in snapshot["trace"]["entries"] if e["process_group"][1] == "default_pg"]


def run(fault: str, tmp_path: Path, world: int = WORLD) -> tuple[CollectedJob, dict[int, dict[str, Any]]]:
    job = run_fault_job(fault, world, tmp_path / fault, timeout_s=60)
    assert job.skipped == {}, job.log_tails
    assert sorted(job.snapshots) == list(range(world)), job.log_tails
    assert job.settled
    # The job is over and every rank was ended by the launcher, none died by itself.
    assert job.exit_codes == dict.fromkeys(range(world)), job.log_tails
    snaps = {rank: load(job, rank) for rank in range(world)}
    for rank, snap in snaps.items():
        assert set(snap) == SNAPSHOT_KEYS
        assert snap["frscope_snapshot"] == 1 and snap["rank"] == rank
        assert snap["source"].startswith("socket:") and snap["source"].endswith(f"rank-{rank}.sock")
        assert abs(snap["captured_at_ns"] - time.time_ns()) < 120e9
        assert snap["trace"]["version"] == "2.10"
    return job, snaps


def test_launcher_does_not_import_torch() -> None:
    # The CLI, sidecar and operator import the launcher; none of them may need torch.
    code = "import sys, frscope.demo.launcher, frscope.demo.faults; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.torch
@pytest.mark.timeout(90)
def test_none_every_rank_idles_and_everything_completed(tmp_path: Path) -> None:
    _, snaps = run("none", tmp_path)
    for snap in snaps.values():
        assert innermost(snap) == "wait_for_shutdown"
        entries = default_pg(snap)
        assert [e["collective_seq_id"] for e in entries] == list(range(1, STEPS + 1))
        assert all(e["retired"] for e in snap["trace"]["entries"])
    # The subgroup: its members recorded one broadcast on a second process group.
    for rank in (0, 1):
        sub = [e for e in snaps[rank]["trace"]["entries"] if e["process_group"][1] == "param_sync"]
        assert [(e["collective_seq_id"], e["profiling_name"]) for e in sub] == [(1, "gloo:broadcast")]


@pytest.mark.torch
@pytest.mark.timeout(90)
def test_hang_culprit_is_stuck_in_load_batch(tmp_path: Path) -> None:
    _, snaps = run("hang", tmp_path)
    assert innermost(snaps[1]) == "load_batch"
    assert default_pg(snaps[1])[-1]["collective_seq_id"] == FAULT_SEQ - 1
    for rank in (0, 2, 3):
        last = default_pg(snaps[rank])[-1]
        assert (last["collective_seq_id"], last["profiling_name"], last["retired"]) == (
            FAULT_SEQ, "gloo:all_reduce", False)
        assert innermost(snaps[rank]) == "all_reduce"


@pytest.mark.torch
@pytest.mark.timeout(90)
def test_skip_culprit_idles_in_save_checkpoint(tmp_path: Path) -> None:
    _, snaps = run("skip", tmp_path)
    assert innermost(snaps[1]) == "save_checkpoint"
    assert default_pg(snaps[1])[-1]["collective_seq_id"] == STEPS - 1
    for rank in (0, 2, 3):
        last = default_pg(snaps[rank])[-1]
        assert (last["collective_seq_id"], last["retired"]) == (STEPS, False)
        assert innermost(snaps[rank]) == "all_reduce"


@pytest.mark.torch
@pytest.mark.timeout(90)
def test_type_culprit_broadcasts_where_others_all_reduce(tmp_path: Path) -> None:
    _, snaps = run("type", tmp_path)
    for rank, snap in snaps.items():
        last = default_pg(snap)[-1]
        op = "gloo:broadcast" if rank == 1 else "gloo:all_reduce"
        assert (last["collective_seq_id"], last["profiling_name"], last["retired"]) == (FAULT_SEQ, op, False)
        assert innermost(snap) == op.split(":")[1]


@pytest.mark.torch
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("fault", "field", "culprit_value", "others_value"),
    [("size", "input_sizes", [[4, 8]], [[8, 4]]), ("dtype", "input_dtypes", ["Int"], ["Float"])],
)
def test_same_byte_mismatch_completes_silently(
    tmp_path: Path, fault: str, field: str, culprit_value: list[Any], others_value: list[Any]
) -> None:
    _, snaps = run(fault, tmp_path)
    for rank, snap in snaps.items():
        entry = next(e for e in default_pg(snap) if e["collective_seq_id"] == FAULT_SEQ)
        assert entry[field] == (culprit_value if rank == 1 else others_value)
        # Gloo completed it with wrong data: nothing is stuck, only the recorder tells.
        assert entry["retired"]
        assert innermost(snap) == "wait_for_shutdown"


@pytest.mark.torch
@pytest.mark.timeout(90)
def test_p2p_deadlock_shows_only_in_stacks(tmp_path: Path) -> None:
    _, snaps = run("p2p", tmp_path)
    for rank in (0, 1):
        assert innermost(snaps[rank]) == "recv"
        assert "exchange_halo" in main_stack(snaps[rank])
        # Gloo records no p2p op: the recorder ends at the step before.
        assert not any(e["is_p2p"] for e in snaps[rank]["trace"]["entries"])
        assert default_pg(snaps[rank])[-1]["collective_seq_id"] == FAULT_SEQ - 1
    for rank in (2, 3):
        assert innermost(snaps[rank]) == "all_reduce"
        last = default_pg(snaps[rank])[-1]
        assert (last["collective_seq_id"], last["retired"]) == (FAULT_SEQ, False)


@pytest.mark.torch
@pytest.mark.timeout(90)
def test_straggler_enters_every_all_reduce_late(tmp_path: Path) -> None:
    _, snaps = run("straggler", tmp_path)
    created = {r: {e["collective_seq_id"]: e["time_created_ns"] for e in default_pg(s)} for r, s in snaps.items()}
    assert all(len(c) == STRAGGLER_STEPS for c in created.values())
    for rank in (0, 1, 3):
        late_ms = statistics.median((created[2][seq] - created[rank][seq]) / 1e6 for seq in created[rank])
        assert 100 < late_ms < 400, late_ms
    assert all(innermost(s) == "wait_for_shutdown" for s in snaps.values())


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_pickle_dumps_taken_while_blocked(tmp_path: Path) -> None:
    job = run_fault_job("hang", WORLD, tmp_path / "json", timeout_s=80, pickle_dir=tmp_path / "pickle")
    assert sorted(job.pickle_dumps) == list(range(WORLD)), job.log_tails
    assert sorted(p.name for p in (tmp_path / "pickle").iterdir()) == [f"nccl_trace_rank_{r}" for r in range(WORLD)]
    for path in job.pickle_dumps.values():
        data = path.read_bytes()
        # Read without unpickling: torch's dump is plain data, no globals to resolve.
        opcodes = {op.name for op, _, _ in pickletools.genops(data)}
        assert not opcodes & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ", "BUILD"}
        assert b"gloo:all_reduce" in data and b"frames" in data


@pytest.mark.torch
@pytest.mark.timeout(90)
def test_size_bytes_mismatch_aborts_the_receiver(tmp_path: Path) -> None:
    assert FAULTS["size-bytes"].collect == "poll"
    job = run_fault_job("size-bytes", 3, tmp_path / "sb", timeout_s=60)
    # Nobody hangs: every rank is gone by itself, the launcher killed none.
    assert all(code is not None for code in job.exit_codes.values()), job.exit_codes
    assert job.settled
    aborted = [r for r, tail in job.log_tails.items() if "Received data size doesn't match" in tail]
    assert len(aborted) == 1 and aborted[0] != 2, job.log_tails
    assert job.exit_codes[aborted[0]] == -6  # SIGABRT: gloo::EnforceNotMet thrown on a gloo thread
    # The poller kept each rank's last good snapshot, from before (or just after) the failure.
    assert sorted(job.snapshots) + sorted(job.skipped) == [0, 1, 2]
    for rank in job.snapshots:
        assert default_pg(load(job, rank))[-1]["collective_seq_id"] in (FAULT_SEQ - 1, FAULT_SEQ)


@pytest.mark.torch
@pytest.mark.timeout(90)
def test_a_rank_that_does_not_answer_is_skipped_not_fatal(tmp_path: Path) -> None:
    result = CollectedJob("none", 2, tmp_path, ())
    with start_job("none", 2, lifetime_s=60) as job:
        deadline = time.monotonic() + 60
        job.wait_for_sockets(deadline)
        assert job.wait_settled(deadline, settle_s=0.5)
        job.procs[1].kill()  # a rank we started, ended by its PID
        job.procs[1].wait(timeout=10)
        job.collect(tmp_path, result)
        procs = list(job.procs.values())
    assert sorted(result.snapshots) == [0]
    assert "exited" in result.skipped[1]
    # Leaving the context ended every rank.
    assert all(p.poll() is not None for p in procs)


def sub_pg(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in snapshot["trace"]["entries"] if e["process_group"][1] == "param_sync"]


@pytest.mark.torch
@pytest.mark.timeout(90)
def test_crossgroup_skip_makes_a_wait_cycle_between_two_groups(tmp_path: Path) -> None:
    _, snaps = run("crossgroup", tmp_path)
    # Rank 0 waits in param_sync's all_reduce of the fault step (its seq: broadcast 1, then one per step).
    assert (sub_pg(snaps[0])[-1]["collective_seq_id"], sub_pg(snaps[0])[-1]["retired"]) == (FAULT_STEP + 2, False)
    assert default_pg(snaps[0])[-1]["collective_seq_id"] == FAULT_SEQ - 1
    # Rank 1 skipped it: its param_sync stops a step earlier, and it waits in default_pg's all_reduce.
    assert sub_pg(snaps[1])[-1]["collective_seq_id"] == FAULT_STEP + 1
    for rank in (1, 2, 3):
        last = default_pg(snaps[rank])[-1]
        assert (last["collective_seq_id"], last["retired"]) == (FAULT_SEQ, False)
        assert innermost(snaps[rank]) == "all_reduce"


@pytest.mark.torch
@pytest.mark.timeout(90)
def test_steps_culprit_is_late_only_at_each_steps_first_collective(tmp_path: Path) -> None:
    _, snaps = run("steps", tmp_path, world=3)
    seqs = range(1, LAYER_STEPS * LAYERS + 1)
    created = {r: {e["collective_seq_id"]: e["time_created_ns"] for e in default_pg(s)} for r, s in snaps.items()}
    assert all(len(c) == LAYER_STEPS * LAYERS for c in created.values())
    late = {seq: (created[2][seq] - max(created[0][seq], created[1][seq])) / 1e9 for seq in seqs}
    first = [late[seq] for seq in seqs if seq % LAYERS == 1]
    rest = [late[seq] for seq in seqs if seq % LAYERS != 1]
    assert statistics.median(first) > STEP_LATE_S * 0.75  # the loader's delay, at every step's first all_reduce
    assert statistics.median(rest) < STEP_LATE_S * 0.25  # lockstep in between
