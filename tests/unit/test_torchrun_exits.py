"""torchrun's failure summary in a termination message -> each failed worker's own exit."""

from __future__ import annotations

from frscope.records.torchrun_exits import torchrun_failures

# The tail of a torchrun container's log as it ends (torch 2.13, two workers: rank 2 timed out in gloo,
# the agent then stopped rank 3), cut the way the kubelet's 2048-byte tail cuts it (paths shortened).
TAIL = """\
[rank2]:     work.wait()
[rank2]: RuntimeError: [/gloo/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete
W1203 12:34:05.087000 1 api.py:1028] Sending process 42 closing signal SIGTERM
E1203 12:34:05.258000 1 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 41) of binary: /opt/trainer/bin/python3
Traceback (most recent call last):
  File "/opt/trainer/bin/torchrun", line 6, in <module>
    sys.exit(main())
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/scripts/train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-03_12:34:05
  host      : train-worker-0
  rank      : 3 (local_rank: 1)
  exitcode  : -15 (pid: 42)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 42
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_12:34:05
  host      : train-worker-0
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 41)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_each_listed_worker_gets_its_own_code_and_line() -> None:
    root, stopped = torchrun_failures(TAIL)  # by rank
    assert (root.rank, root.local_rank, root.exit_code, root.root_cause) == (2, 0, 1, True)
    assert root.line.startswith("RuntimeError: [") and root.line.endswith("Timed out waiting 5000ms for recv "
                                                                          "operation to complete")
    # A worker the agent stopped: SIGTERM, as a container runtime says it (128 + 15).
    assert (stopped.rank, stopped.local_rank, stopped.exit_code, stopped.root_cause) == (3, 1, 143, False)
    assert stopped.line == "Signal 15 (SIGTERM) received by PID 42"


def test_the_summary_alone_still_names_the_ranks() -> None:
    summary = TAIL[TAIL.index("torch.distributed.elastic.multiprocessing.errors.ChildFailedError"):]
    root = next(f for f in torchrun_failures(summary) if f.root_cause)
    assert root.rank == 2 and root.exit_code == 1 and root.line == ""  # the boilerplate is no error line


def test_no_summary_no_failures() -> None:
    assert torchrun_failures("") == []
    assert torchrun_failures("Traceback (most recent call last):\nRuntimeError: boom\n") == []
    assert torchrun_failures("x" * 100_000 + "FAILED") == []


def test_a_hostile_message_is_read_without_harm() -> None:
    odd = "FAILED\n[0]:\n  rank : 99999999999 (local_rank: 0)\n  exitcode : 1\n" + "[1]:\n" * 2000
    assert torchrun_failures(odd) == []
