"""Container statuses -> RankExit evidence: which ranks a dead pod held, and how it ended."""

from __future__ import annotations

from frscope.operator.evidence.pod_evidence import PodEvidence
from frscope.operator.evidence.trainer_exits import pod_ranks, rank_exits
from frscope.operator.model.objects import pod_info
from frscope.records import RankDump
from tests.unit.operator.builders import pod, terminated

OOM = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": ""}}


def _evidence(name: str, ranks: list[int]) -> PodEvidence:
    out = PodEvidence("ml", name, "stall", None)
    out.dumps = [RankDump(rank=r, source=f"pod {name}", version="2.10", backend="gloo", entries=[]) for r in ranks]
    return out


def test_dead_pod_gets_its_node_ranks_and_exit_reason() -> None:
    pods = [pod_info(pod("train-master-0", replica_type="Master", index=0)),
            pod_info(pod("train-worker-0", index=0)),
            pod_info(pod("train-worker-1", index=1, restarts=2, state=OOM,
                         last_state=terminated("CUDA out of memory\nTried to allocate 2 GiB", 1)))]
    evidence = {"train-master-0": _evidence("train-master-0", [0, 1]),
                "train-worker-0": _evidence("train-worker-0", [2, 3])}
    # World size 6 over 3 pods: the dead worker-1 (node rank 2) held ranks 4 and 5.
    assert pod_ranks(pods, evidence, 6)["train-worker-1"] == (4, 5)
    exits = rank_exits(pods, evidence, 6)
    assert sorted(exits) == [4, 5]
    exit = exits[4]
    assert exit.exit_code == 137 and exit.reason == "OOMKilled" and exit.restart_count == 2 and exit.failed
    assert "SIGKILL" in exit.describe() and "OOMKilled" in exit.describe() and "restarted 2 times" in exit.describe()
    assert "train-worker-1" in exit.source


def test_running_pods_without_a_termination_give_no_evidence() -> None:
    pods = [pod_info(pod("train-worker-0", index=0)), pod_info(pod("train-worker-1", index=1))]
    assert rank_exits(pods, {}, 2) == {}


def test_termination_message_is_kept_to_one_line() -> None:
    pods = [pod_info(pod("train-worker-0", index=0, state=terminated("line one\n\nRuntimeError: boom\n", 1)))]
    [exit] = rank_exits(pods, {}, 1).values()
    assert exit.message == "line one | RuntimeError: boom" and exit.exit_code == 1


def test_finished_at_is_kept_in_ns() -> None:
    ended = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-12-03T09:00:05Z"}}
    [exit] = rank_exits([pod_info(pod("train-worker-0", index=0, state=ended))], {}, 1).values()
    assert exit.finished_at_ns == 1796288405 * 10**9


def test_torchrun_summary_gives_each_rank_its_own_exit() -> None:
    from tests.unit.test_torchrun_exits import TAIL

    pods = [pod_info(pod("train-master-0", replica_type="Master", index=0)),
            pod_info(pod("train-worker-0", index=0, state=terminated(TAIL, 1)))]
    exits = rank_exits(pods, {"train-master-0": _evidence("train-master-0", [0, 1])}, 4)
    assert sorted(exits) == [2, 3]
    root, stopped = exits[2], exits[3]
    assert root.exit_code == 1 and "Timed out waiting 5000ms" in root.message and "first failure" in root.source
    assert stopped.exit_code == 143 and "SIGTERM" in stopped.describe() and "Signal 15" in stopped.message
    assert "container exit code 1" in stopped.source


def test_a_previous_runs_end_is_not_evidence_about_the_run_that_replaced_it() -> None:
    """The container crashed once and the kubelet restarted it (restartPolicy OnFailure): its ranks are
    new processes, alive. An incident in the new run must not see them as failed; one about the run
    that ended (the exit's own signal, handled after the restart) still does."""
    running = {"running": {"startedAt": "2026-12-03T09:00:10Z"}}
    restarted = pod_info(pod("train-worker-0", index=0, restarts=1, state=running,
                             last_state=terminated("RuntimeError: boom", 1)))
    pods = [pod_info(pod("train-master-0", replica_type="Master", index=0)), restarted]
    assert rank_exits(pods, {}, 2) == {}
    [exit] = rank_exits(pods, {}, 2, about=("train-worker-0", 0)).values()
    assert exit.rank == 1 and exit.exit_code == 1 and exit.restart_count == 0
    assert rank_exits(pods, {}, 2, about=("train-master-0", 0)) == {}
