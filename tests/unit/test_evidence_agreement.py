"""Issue 33's principles 2 and 4 on small exact gloo situations: a recorder that lags behind its peers
is an older read, not a place anyone waits; a live stack says the process is there; where nothing can
tell a stale dump of a job that ended from a rank that stopped, both readings are said. Each test
builds torch-shaped dumps (gloo: 'scheduled' entries, 'retired' once finished or failed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.records import load_dumps
from frscope.wire import SnapshotError, snapshot_envelope_bytes, snapshot_head, snapshot_piece, snapshot_piece_bytes
from tests.unit import builders as b

SECOND = 10**9
CONFIG = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}}
IN_PYTHON = ('Thread 0x00007f53d0d9c000 (most recent call first):\n'
             '  File "/app/train.py", line 310 in wait_for_next_epoch\n'
             '  File "/app/train.py", line 318 in main\n')


def _gloo(seqs: range, step_ns: int = SECOND) -> list[dict[str, Any]]:
    return [b.entry(s, backend="gloo", state="scheduled", retired=True, created_ns=b.T0 + s * step_ns)
            for s in seqs]


def _snapshots(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]], captured: dict[int, int],
               stacks: dict[int, str]) -> Path:
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e.setdefault("record_id", i)
        piece = snapshot_piece(rank, captured[rank], "worker-server", stacks.get(rank),
                               b.dump(entries, world=0, pg_config=CONFIG))
        b.write_json(tmp_path, rank, piece)
    return tmp_path


def test_a_live_rank_read_long_before_its_peers_finished_is_no_stopped_rank(tmp_path: Path) -> None:
    # The job ended: ranks 0, 1, 3 finished #1-#40, read at the end; rank 2's recorder is a read from 30 s
    # before (#1-#10), and its worker server answered for its stack at the capture (in Python). The others
    # finished #11-#40 with it: its recorder is only older, and nobody waits for anyone.
    end = b.T0 + 41 * SECOND
    per_rank = {r: _gloo(range(1, 41)) for r in (0, 1, 3)}
    per_rank[2] = _gloo(range(1, 11))
    captured = {0: end, 1: end, 2: b.T0 + 11 * SECOND, 3: end}
    report = analyze(load_dumps([_snapshots(tmp_path, per_rank, captured, dict.fromkeys(range(4), IN_PYTHON))]))
    assert report.findings == [], [f.summary for f in report.findings]


def test_peers_that_went_past_a_lagging_recorder_do_not_wait_where_it_ends(tmp_path: Path) -> None:
    # A small ring: rank 2's recorder (read early) holds #3-#5, its peers' hold #8-#12, all finished. They
    # went past #6 (a failed collective raises: nothing follows it), so #6 finished with rank 2 in it:
    # nobody is blocked in #6, and rank 2 (alive, in Python) never "failed to join" it.
    end = b.T0 + 13 * SECOND
    per_rank = {r: _gloo(range(8, 13)) for r in (0, 1, 3)}
    per_rank[2] = _gloo(range(3, 6))
    captured = {0: end, 1: end, 2: b.T0 + 6 * SECOND, 3: end}
    report = analyze(load_dumps([_snapshots(tmp_path, per_rank, captured, dict.fromkeys(range(4), IN_PYTHON))]))
    assert report.findings == [], [f.summary for f in report.findings]


def test_peers_blocked_after_going_past_a_lagging_recorder_wait_for_it_there(tmp_path: Path) -> None:
    # The same lagging read, but the others now wait in #13, which rank 2 (in Python) never joined: the
    # hang is at #13, where they stand, not at #6, which they finished.
    end = b.T0 + 700 * SECOND
    per_rank = {r: [*_gloo(range(8, 13)), b.entry(13, backend="gloo", state="scheduled", retired=False,
                                                  created_ns=b.T0 + 13 * SECOND)] for r in (0, 1, 3)}
    per_rank[2] = _gloo(range(3, 6))
    captured = {0: end, 1: end, 2: b.T0 + 6 * SECOND, 3: end}
    report = analyze(load_dumps([_snapshots(tmp_path, per_rank, captured, dict.fromkeys(range(4), IN_PYTHON))]))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (2,), first.summary
    assert first.collective_seq_id == 13


def test_copied_gloo_dumps_of_a_job_that_ended_with_one_older_dump_give_both_readings(tmp_path: Path) -> None:
    # Copies (their mtimes are days later: when each was read is lost). Rank 1's dump ends at #5, 4 s of
    # entries behind its peers, who finished #6-#8 and nothing is open anywhere. On gloo a collective that
    # failed for want of a member is retired as finished: rank 1 stopped and the others failed at #8, or the
    # job ended and rank 1's dump is only older. Not "rank 1 never joined #6", which the others finished.
    per_rank = {r: _gloo(range(1, 9), step_ns=SECOND // 2) for r in (0, 2, 3)}
    per_rank[1] = _gloo(range(1, 6), step_ns=SECOND // 2)
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e.setdefault("record_id", i)
        b.write_pickle(tmp_path, rank, b.dump(entries, world=0, pg_config=CONFIG))
    report = analyze(load_dumps([tmp_path]))
    first = report.findings[0]
    assert first.category is Category.RANK_STOPPED and first.culprit_ranks == (1,), first.summary
    assert "or the job ended" in first.summary and "exit codes decide" in first.summary


def test_a_gone_rank_whose_peers_used_seq_ids_without_entries_stopped(tmp_path: Path) -> None:
    # monitored_barrier uses two seq ids and records nothing. Rank 0's last read holds #1-#18; its peers went
    # through #19-#20 (the barrier) and recorded #21 retired 40 ms after rank 0's read, long before any
    # timeout; every process is gone (each collector kept its last read). #21 finished or failed as rank 0
    # went away: rank 0 stopped.
    per_rank = {r: [*_gloo(range(1, 19)), *_gloo(range(21, 22))] for r in (1, 2, 3)}
    per_rank[0] = _gloo(range(1, 19))
    after = b.T0 + 21 * SECOND + 6_000_000
    captured = {0: b.T0 + 21 * SECOND - 40_000_000, 1: after, 2: after, 3: after}
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e.setdefault("record_id", i)
        piece = snapshot_piece_bytes(rank, captured[rank], "worker-server", None,
                                     json.dumps(b.dump(entries, world=0, pg_config=CONFIG)).encode())
        head = snapshot_head(pod=f"job-{rank}", namespace="ns", node="node", captured_at_ns=after, reason="exit")
        gone: SnapshotError = {"rank": rank, "message": f"rank {rank}: fr_trace_json: socket is gone"}
        (tmp_path / f"rank-{rank}.json").write_bytes(snapshot_envelope_bytes(head, [piece], [gone]))
    first = analyze(load_dumps([tmp_path])).findings[0]
    assert first.category is Category.RANK_STOPPED and first.culprit_ranks == (0,), first.summary


def _nccl_all_to_all(sizes: dict[int, int], state: str) -> dict[int, list[dict[str, Any]]]:
    t = b.T0 + 10 * SECOND
    return {r: [*(b.entry(s, created_ns=b.T0 + s * SECOND) for s in range(1, 4)),
                b.entry(4, op="all_to_all", sizes=[[n]], state=state, created_ns=t)] for r, n in sizes.items()}


def test_an_all_to_all_that_never_finished_where_one_rank_passed_other_counts_is_a_size_mismatch(
        tmp_path: Path) -> None:
    # all_to_all's sizes may differ by design (uneven splits): alone they decide nothing. Here it started on
    # every rank's device and finished nowhere, and rank 0 alone passed twice the others' count.
    per_rank = _nccl_all_to_all({0: 8192, 1: 4096, 2: 4096, 3: 4096}, "started")
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(now_ns=b.T0 + 700 * SECOND))
    first = report.findings[0]
    assert first.category is Category.SIZE_MISMATCH and first.culprit_ranks == (0,), first.summary


def test_an_all_to_all_of_uneven_counts_that_finished_is_healthy(tmp_path: Path) -> None:
    per_rank = _nccl_all_to_all({0: 8192, 1: 4096, 2: 4096, 3: 4096}, "completed")
    assert analyze(load_dumps([b.job(tmp_path, per_rank, 4)])).findings == []


def test_a_stuck_all_to_all_whose_counts_all_differ_names_no_odd_rank(tmp_path: Path) -> None:
    # Routed tokens: every rank's count differs; nothing sets one apart, so it is the hang itself.
    per_rank = _nccl_all_to_all({0: 8192, 1: 4096, 2: 2048, 3: 1024}, "started")
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(now_ns=b.T0 + 700 * SECOND))
    assert report.findings[0].category is Category.NOT_COMPLETED


def test_a_gone_rank_whose_only_read_was_empty_counts_as_missing(tmp_path: Path) -> None:
    # Every process is gone (each collector kept its last read). Rank 0's last read came before its first
    # collective (an empty recorder) while the others recorded two; one of them still waits in #2. The empty
    # read says nothing of where rank 0 stood after it: rank 0 is missing, not a rank with nothing to do.
    per_rank = {r: _gloo(range(1, 3)) for r in (1, 2, 3)}
    per_rank[3][-1]["retired"] = False
    per_rank[0] = []
    after = b.T0 + 3 * SECOND
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e.setdefault("record_id", i)
        read = b.T0 if rank == 0 else after
        piece = snapshot_piece_bytes(rank, read, "worker-server", None,
                                     json.dumps(b.dump(entries, world=0, pg_config=CONFIG)).encode())
        head = snapshot_head(pod=f"job-{rank}", namespace="ns", node="node", captured_at_ns=after, reason="exit")
        gone: SnapshotError = {"rank": rank, "message": f"rank {rank}: fr_trace_json: socket is gone"}
        (tmp_path / f"rank-{rank}.json").write_bytes(snapshot_envelope_bytes(head, [piece], [gone]))
    report = analyze(load_dumps([tmp_path]))
    first = report.findings[0]
    assert first.category is Category.MISSING_DUMPS and first.culprit_ranks == (0,), first.summary
    assert any("is gone: counted as missing" in p.message for p in report.problems)
