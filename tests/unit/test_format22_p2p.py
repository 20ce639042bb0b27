"""Format 2.2 has no `is_p2p`: a point-to-point entry is told by its name (send/recv) or, for NCCL's `coalesced`
entry of a batch_isend_irecv, by its numbers: a recorder numbers a group's collectives from 1, so an entry
numbered 0 that counts as a point-to-point call is one. Read as a collective, batches of uneven counts were a
type mismatch at "collective #0"."""

from __future__ import annotations

from pathlib import Path

from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.records import load_dumps
from tests.unit import builders as b

S = 1_000_000_000


def _v22(e: dict[str, object]) -> dict[str, object]:
    for key in ("is_p2p", "thread_id", "thread_name", "timeout_ms"):
        e.pop(key, None)
    return e


def _batch(p2p_seq: int, created_ns: int, state: str = "completed") -> dict[str, object]:
    e = b.entry(1, op="coalesced", pg=("1", "mesh_tp"), state=state, created_ns=created_ns, sizes=[[256], [256]])
    e.update(collective_seq_id=0, p2p_seq_id=p2p_seq)
    return _v22(e)


def _write(tmp_path: Path, per_rank: dict[int, list[dict[str, object]]]) -> Path:
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"},
              "1": {"name": "1", "desc": "mesh_tp", "ranks": "[0, 1, 2]"}}
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e["record_id"] = i
        b.write_pickle(tmp_path, rank, b.dump(entries, world=3, version="2.2", pg_config=config))
    return tmp_path


def test_a_coalesced_entry_numbered_0_that_counts_a_p2p_call_is_point_to_point(tmp_path: Path) -> None:
    coll = _v22(b.entry(3, op="coalesced", pg=("1", "mesh_tp")))
    coll.update(p2p_seq_id=2)  # a coalesced collective after two batches: numbered, so a collective
    dumps = load_dumps([_write(tmp_path, {0: [_batch(1, b.T0), _batch(2, b.T0 + S), coll]})], columnar=False)
    entries = list(dumps.dumps[0].entries)
    assert [e.is_p2p for e in entries] == [True, True, False]


def test_uneven_batches_in_format_22_are_no_type_mismatch(tmp_path: Path) -> None:
    """Rank 2 never posted batch #3 (stuck before it); ranks 0 and 1 wait in theirs: a batch it never posted,
    not a collective #0 whose members called different counts of ops."""
    t = b.T0 + 10 * S
    per_rank = {r: [_v22(b.entry(s, created_ns=b.T0 + s * S)) for s in (1, 2)] for r in range(3)}
    for r in range(3):
        per_rank[r] += [_batch(1, t), _batch(2, t + S)]
        if r != 2:
            per_rank[r].append(_batch(3, t + 2 * S, state="started"))
    report = analyze(load_dumps([_write(tmp_path, per_rank)]), AnalysisOptions(now_ns=t + 700 * S))
    assert report.findings
    first = report.findings[0]
    assert first.category is not Category.COLLECTIVE_TYPE_MISMATCH, first.summary
    assert first.culprit_ranks == (2,), first.summary


def test_a_coalesced_entry_that_advanced_the_p2p_count_under_the_last_collective_seq_is_point_to_point(
        tmp_path: Path) -> None:
    """After a group's first collective, format 2.2 records a batch_isend_irecv under the collective seq of the
    collective before it: its own counters say what it is (the p2p count advanced, the collective count did
    not). A coalesced collective advances the collective count and leaves the p2p count."""
    scatter = _v22(b.entry(4, op="scatter", pg=("1", "mesh_tp")))
    scatter.update(p2p_seq_id=11)
    batch = _v22(b.entry(4, op="coalesced", pg=("1", "mesh_tp"), sizes=[[256], [256]]))
    batch.update(p2p_seq_id=12)
    coll = _v22(b.entry(5, op="coalesced", pg=("1", "mesh_tp")))
    coll.update(p2p_seq_id=12)
    dumps = load_dumps([_write(tmp_path, {0: [scatter, batch, coll]})], columnar=False)
    assert [e.is_p2p for e in dumps.dumps[0].entries] == [False, True, False]


def test_a_rank_that_skipped_the_last_collective_before_a_batch_is_no_type_mismatch(tmp_path: Path) -> None:
    """Each step: a scatter, a gather, then a batch (recorded under the gather's seq). In the last step rank 2
    skipped the gather and finished: its batch sits under the scatter's seq, #5. Ranks 0 and 1 wait in gather
    #6, which rank 2 never joined; not a scatter+coalesced against a scatter at #5."""
    per_rank: dict[int, list[dict[str, object]]] = {}
    for r in range(3):
        entries: list[dict[str, object]] = []
        seq, p2p = 0, 0
        for step in range(3):
            last = step == 2
            t = b.T0 + step * 10 * S
            for op in ("scatter", "gather"):
                if last and op == "gather" and r == 2:
                    continue
                seq += 1
                e = _v22(b.entry(seq, op=op, pg=("1", "mesh_tp"), created_ns=t + seq,
                                 state="started" if last and op == "gather" else "completed"))
                e.update(p2p_seq_id=p2p)
                entries.append(e)
            p2p += 1
            e = _v22(b.entry(seq, op="coalesced", pg=("1", "mesh_tp"), created_ns=t + 5 * S, sizes=[[256], [256]]))
            e.update(p2p_seq_id=p2p)
            entries.append(e)
        per_rank[r] = entries
    report = analyze(load_dumps([_write(tmp_path, per_rank)]), AnalysisOptions(now_ns=b.T0 + 700 * S))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (2,), first.summary
    assert first.collective_seq_id == 6
