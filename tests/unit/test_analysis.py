"""Cross-rank diagnosis on precise, hand-built situations (NCCL-shaped unless said otherwise)."""

from __future__ import annotations

from pathlib import Path

from frscope.analysis import AnalysisOptions, Category, Report, analyze
from frscope.records import load_dumps
from tests.unit import builders as b

OLD = AnalysisOptions(now_ns=b.T0 + 3600 * 10**9)  # an hour after the entries: anything open is stuck
YOUNG = AnalysisOptions(now_ns=b.T0 + 10**9)  # a second after: open entries are just in flight


def _analyze(
    tmp_path: Path,
    per_rank: dict[int, list[dict[str, object]]],
    options: AnalysisOptions = OLD,
    world: int | None = None,
) -> Report:
    return analyze(load_dumps([b.job(tmp_path, per_rank, world)], world_size=world), options)


def _steps(n: int, **kw: object) -> list[dict[str, object]]:
    return [b.entry(s, **kw) for s in range(1, n + 1)]  # type: ignore[arg-type]


def test_healthy_job_has_no_finding(tmp_path: Path) -> None:
    report = _analyze(tmp_path, {r: _steps(20) for r in range(4)})
    assert report.findings == [] and report.healthy


def test_in_flight_collectives_of_a_healthy_job_are_not_a_hang(tmp_path: Path) -> None:
    per_rank = {r: _steps(9) + [b.entry(10, state="started")] for r in range(4)}
    per_rank[3] = _steps(9)  # rank 3 has not enqueued #10 yet, a millisecond behind
    assert _analyze(tmp_path, per_rank, YOUNG).findings == []


def test_rank_not_joined(tmp_path: Path) -> None:
    per_rank = {r: _steps(9) + [b.entry(10, state="started")] for r in range(4)}
    per_rank[2] = _steps(9)
    report = _analyze(tmp_path, per_rank)
    [finding] = report.findings
    assert finding.category is Category.RANK_NOT_JOINED
    assert finding.culprit_ranks == (2,)
    assert finding.collective_seq_id == 10 and finding.op == "all_reduce"
    assert finding.process_group.name == "0" and finding.process_group.ranks == (0, 1, 2, 3)
    assert "Rank 2 never joined all_reduce #10" in finding.summary


def test_type_mismatch_majority_and_culprit_frames(tmp_path: Path) -> None:
    per_rank = {r: _steps(4) + [b.entry(5, state="scheduled", retired=False)] for r in range(4)}
    per_rank[1][-1] = b.entry(
        5,
        op="broadcast",
        state="scheduled",
        retired=False,
        frames=[{"name": "checkpoint", "filename": "/app/ckpt.py", "line": 7}],
    )
    [finding] = _analyze(tmp_path, per_rank).findings
    assert finding.category is Category.COLLECTIVE_TYPE_MISMATCH
    assert finding.culprit_ranks == (1,) and finding.collective_seq_id == 5 and finding.op == "all_reduce"
    assert finding.culprit_frames[1][0].filename == "/app/ckpt.py"
    assert "ckpt.py:7" in finding.summary
    assert not finding.ambiguous


def test_two_rank_tie_is_broken_by_history(tmp_path: Path) -> None:
    per_rank = {r: _steps(4) + [b.entry(5, state="scheduled", retired=False)] for r in range(2)}
    per_rank[0][-1] = b.entry(5, op="broadcast", state="scheduled", retired=False)
    [finding] = _analyze(tmp_path, per_rank).findings
    assert finding.culprit_ranks == (0,) and not finding.ambiguous


def test_silent_size_mismatch_earliest_divergence_wins(tmp_path: Path) -> None:
    """Equal byte counts: the collective completes with wrong data; later ones disagree too."""
    per_rank = {r: _steps(10) for r in range(4)}
    for seq in range(4, 11):
        per_rank[3][seq - 1] = b.entry(seq, sizes=[[8, 4]])
    [finding] = _analyze(tmp_path, per_rank).findings
    assert finding.category is Category.SIZE_MISMATCH
    assert finding.culprit_ranks == (3,) and finding.collective_seq_id == 4
    assert finding.input_sizes == [[4, 8]]
    assert any("6 later collectives" in e for e in finding.evidence)


def test_dtype_mismatch(tmp_path: Path) -> None:
    per_rank = {r: _steps(3) for r in range(3)}
    per_rank[0][2] = b.entry(3, dtype="BFloat16")
    [finding] = _analyze(tmp_path, per_rank).findings
    assert finding.category is Category.DTYPE_MISMATCH and finding.culprit_ranks == (0,)


def test_all_gather_size_rule(tmp_path: Path) -> None:
    per_rank = {r: [b.entry(1, op="_allgather_base", sizes=[[4]], out_sizes=[[16]])] for r in range(4)}
    per_rank[2] = [b.entry(1, op="_allgather_base", sizes=[[4]], out_sizes=[[12]])]
    [finding] = _analyze(tmp_path, per_rank).findings
    assert finding.category is Category.SIZE_MISMATCH and finding.culprit_ranks == (2,)


def test_all_to_all_split_sizes_may_differ_per_rank(tmp_path: Path) -> None:
    per_rank = {
        0: [b.entry(1, op="all_to_all_single", sizes=[[6]], out_sizes=[[2]])],
        1: [b.entry(1, op="all_to_all_single", sizes=[[2]], out_sizes=[[6]])],
    }
    assert _analyze(tmp_path, per_rank).findings == []


def test_not_completed_nccl_states(tmp_path: Path) -> None:
    per_rank = {r: _steps(5) + [b.entry(6, state="started")] for r in range(4)}
    [finding] = _analyze(tmp_path, per_rank).findings
    assert finding.category is Category.NOT_COMPLETED
    assert finding.culprit_ranks == (0, 1, 2, 3) and finding.collective_seq_id == 6
    assert "GPU, NCCL or the network" in finding.summary

    # One rank's device never started it: that rank is the culprit.
    per_rank[1][-1] = b.entry(6, state="scheduled")
    (tmp_path / "x").mkdir()
    [finding] = _analyze(tmp_path / "x", per_rank).findings
    assert finding.category is Category.NOT_COMPLETED and finding.culprit_ranks == (1,)


def test_missing_dump_named_not_blamed(tmp_path: Path) -> None:
    per_rank = {r: _steps(5) + [b.entry(6, state="started")] for r in range(3)}  # rank 3 left no file
    report = _analyze(tmp_path, per_rank, world=4)
    assert report.missing_ranks == (3,)
    [finding] = report.findings
    assert finding.category is Category.MISSING_DUMPS and finding.culprit_ranks == (3,)
    assert finding.collective_seq_id == 6 and "not proof of guilt" in " ".join(finding.evidence)


def test_ring_buffer_wrapped(tmp_path: Path) -> None:
    per_rank = {r: [b.entry(s) for s in range(500 + r, 2000)] for r in range(4)}  # different windows
    for r in range(3):
        per_rank[r].append(b.entry(2000, state="started"))
    [finding] = _analyze(tmp_path, per_rank).findings
    assert finding.category is Category.RANK_NOT_JOINED and finding.culprit_ranks == (3,)
    assert finding.collective_seq_id == 2000


TWO_GROUPS = {
    "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
    "1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"},
}
TP = ("1", "tp")


def _write(tmp_path: Path, per_rank: dict[int, list[dict[str, object]]]) -> Report:
    for r, entries in per_rank.items():
        b.write_pickle(tmp_path, r, b.dump(entries, world=4, pg_config=TWO_GROUPS))
    return analyze(load_dumps([tmp_path]), OLD)


def test_cross_group_root_cause(tmp_path: Path) -> None:
    """Rank 0 is stuck in Python and never calls the tensor-parallel all_reduce #2 (group 1, ranks 0-1);
    rank 1 waits there, so it never joins the data-parallel all_reduce #4 (group 0) that ranks 2-3 wait
    in. One root cause: group 1, rank 0; group 0's stop nests under it."""
    per_rank = {
        0: _steps(3) + [b.entry(1, pg=TP, record_id=3)],
        1: _steps(3) + [b.entry(1, pg=TP, record_id=3), b.entry(2, pg=TP, record_id=4, state="started")],
        2: _steps(3) + [b.entry(4, record_id=3, state="started")],
        3: _steps(3) + [b.entry(4, record_id=3, state="started")],
    }
    [root] = _write(tmp_path, per_rank).findings
    assert root.category is Category.RANK_NOT_JOINED
    assert root.process_group.name == "1" and root.culprit_ranks == (0,) and root.collective_seq_id == 2
    [consequence] = root.consequences
    assert consequence.process_group.name == "0" and consequence.culprit_ranks == (0, 1)


def test_cross_group_deadlock_from_different_orders(tmp_path: Path) -> None:
    """Rank 0 calls group 0's #4 before group 1's #2; rank 1 the other way round."""
    per_rank = {
        0: _steps(3) + [b.entry(1, pg=TP, record_id=3), b.entry(4, record_id=4, state="started", created_ns=b.T0 + 50)],
        1: _steps(3)
        + [b.entry(1, pg=TP, record_id=3), b.entry(2, pg=TP, record_id=4, state="started", created_ns=b.T0 + 40)],
        2: _steps(3) + [b.entry(4, record_id=3, state="started", created_ns=b.T0 + 60)],
        3: _steps(3) + [b.entry(4, record_id=3, state="started", created_ns=b.T0 + 60)],
    }
    [root] = _write(tmp_path, per_rank).findings
    assert root.process_group.name == "1" and root.culprit_ranks == (0,)
    assert "cross-group deadlock" in root.evidence[0]
    assert [c.process_group.name for c in root.consequences] == ["0"]


def test_nccl_p2p_unmatched_send(tmp_path: Path) -> None:
    per_rank = {r: _steps(3) for r in range(2)}
    per_rank[0].append(b.entry(0, op="send", peer=" 0->1", p2p_seq=1, state="started", record_id=3))
    report = _analyze(tmp_path, per_rank)
    [finding] = report.findings
    assert finding.category is Category.P2P_MISMATCH and finding.culprit_ranks == (1,)
    assert "never posted the recv from rank 0" in finding.summary


def test_straggler_and_clock_skew(tmp_path: Path) -> None:
    def steps(late_ms: float, duration: float) -> list[dict[str, object]]:
        return [
            b.entry(s, created_ns=b.T0 + s * 10**9 + int(late_ms * 1e6), duration_ms=duration) for s in range(1, 41)
        ]

    per_rank = {0: steps(0, 160.0), 1: steps(1, 158.0), 2: steps(150, 9.0), 3: steps(2, 157.0)}
    [finding] = _analyze(tmp_path, per_rank).findings
    assert finding.category is Category.STRAGGLER and finding.culprit_ranks == (2,)
    assert finding.late_by_ms is not None and 140 < finding.late_by_ms < 160

    # A constant clock offset with equal durations is skew, not a straggler.
    skewed = {0: steps(0, 50.0), 1: steps(1, 50.0), 2: steps(150, 50.0), 3: steps(2, 50.0)}
    (tmp_path / "skew").mkdir()
    assert _analyze(tmp_path / "skew", skewed).findings == []


def test_gloo_unretired_last_entry_alone_is_not_a_hang(tmp_path: Path) -> None:
    """Gloo sets `retired` a moment after wait() returns."""
    per_rank = {r: [b.entry(s, backend="gloo", state="scheduled", retired=True) for s in range(1, 5)] for r in range(2)}
    per_rank[0].append(b.entry(5, backend="gloo", state="scheduled", retired=False))
    per_rank[1].append(b.entry(5, backend="gloo", state="scheduled", retired=True))
    assert _analyze(tmp_path, per_rank, YOUNG).findings == []
