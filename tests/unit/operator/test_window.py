"""The snapshot window (`/v1/snapshot?entries=N`): a sidecar that serves the newest N entries a rank,
and one that ignores the window (an old sidecar, or a push of the whole ring) which the operator cuts
itself, give the same evidence and byte-identical reports."""

from __future__ import annotations

import copy
import gzip
import json
from typing import Any

import pytest

from frscope import wire
from frscope.analysis import AnalysisOptions
from frscope.operator.evidence.diagnosis import diagnose_sync
from frscope.operator.evidence.gather import Gathered
from frscope.operator.evidence.group_lists import BIG, GroupTable, pack, unpack
from frscope.operator.evidence.pod_evidence import from_bytes
from frscope.records.columns import EntryTable
from frscope.report.serialize import report_to_dict
from frscope.testing.synthetic import make_plan
from tests.unit.operator.fakes import real_snapshots

T_NS = 1_800_000_000_000_000_000


def envelope(pod: str, pieces: list[dict[str, Any]]) -> bytes:
    head = wire.snapshot_head(pod=pod, namespace="ml", node="n", captured_at_ns=T_NS, reason="refresh")
    body = wire.snapshot_envelope_bytes(head, [json.dumps(p).encode() for p in pieces], [])
    return gzip.compress(body, 1)


def windowed(piece: dict[str, Any], n: int) -> dict[str, Any]:
    """What the sidecar serves for ?entries=n (its cut is frscope.wire's)."""
    out = copy.deepcopy(piece)
    wire.window_piece(out, n)
    return out


def report_bytes(bodies: dict[str, bytes], world: int, max_entries: int, stall_after_s: float) -> tuple[bytes, int]:
    gathered = Gathered("ml")
    for pod, body in bodies.items():
        gathered.pods[pod] = from_bytes(body, f"http://{pod}", origin="sidecar", max_entries=max_entries, pod=pod,
                                        namespace="ml")
    diagnosis = diagnose_sync(gathered, world, AnalysisOptions(stall_after_s=stall_after_s))
    return json.dumps(report_to_dict(diagnosis.report), sort_keys=True).encode(), gathered.entries_dropped


@pytest.mark.parametrize("window", [3, 10, 200])
def test_real_hang_windowed_and_whole_bodies_give_identical_reports(window: int) -> None:
    ranks = real_snapshots("hang")
    whole = {f"p{r}": envelope(f"p{r}", [piece]) for r, piece in ranks.items()}
    cut = {f"p{r}": envelope(f"p{r}", [windowed(piece, window)]) for r, piece in ranks.items()}
    a, dropped_a = report_bytes(whole, len(ranks), window, 0.5)
    b, dropped_b = report_bytes(cut, len(ranks), window, 0.5)
    assert a == b and dropped_a == dropped_b
    assert json.loads(a)["findings"], "the window still tells the hang"


def test_synthetic_8_ranks_windowed_by_the_plan_and_whole_give_identical_reports() -> None:
    """The bench's simulated sidecars build the window with Plan.dump(newest=N): the same report too."""
    plan = make_plan(16, entries=300, shape="nccl", scenario="not_joined", seed=1, hang_age_s=120.0)

    def piece(rank: int, newest: int | None) -> dict[str, Any]:
        out = wire.snapshot_piece(rank, T_NS, f"synthetic:{rank}", None,
                                  plan.dump(rank, json_shape=True, newest=newest))
        if newest is not None and plan.dump_length(rank) > newest:
            out[wire.ENTRIES_DROPPED_KEY] = plan.dump_length(rank) - newest
        return out

    whole = {f"p{r}": envelope(f"p{r}", [piece(r, None)]) for r in range(16)}
    cut = {f"p{r}": envelope(f"p{r}", [piece(r, 50)]) for r in range(16)}
    a, dropped_a = report_bytes(whole, 16, 50, 60)
    b, dropped_b = report_bytes(cut, 16, 50, 60)
    assert a == b and dropped_a == dropped_b == 16 * 250
    report = json.loads(a)
    assert report["findings"][0]["culprit_ranks"] == list(plan.truth.culprit_ranks)
    assert any(f"{16 * 250} older entries left out" in p["message"] for p in report["problems"])


def test_evidence_is_columnar_and_cut_before_normalizing() -> None:
    ranks = real_snapshots("hang")
    rank, piece = next(iter(ranks.items()))
    n = len(piece["trace"]["entries"])
    evidence = from_bytes(envelope("p", [piece]), "http://p", origin="push", max_entries=2)
    (dump,) = evidence.dumps
    assert isinstance(dump.entries, EntryTable) and len(dump.entries) == 2
    assert evidence.entries_dropped == evidence.cut_here == n - 2
    # The newest two, in order.
    assert [e.record_id for e in dump.entries] == [e["record_id"] for e in piece["trace"]["entries"][-2:]]
    # A body the sidecar already cut: counted as left out, but not as cut here; what it holds is measured
    # (the same kept evidence as the body cut here, whatever the body's size).
    cut_there = from_bytes(envelope("p", [windowed(piece, 2)]), "http://p", origin="push", max_entries=2)
    assert cut_there.entries_dropped == n - 2 and cut_there.cut_here == 0
    assert cut_there.held_bytes == cut_there.measured_bytes > 0
    assert abs(cut_there.held_bytes - evidence.held_bytes) < evidence.held_bytes // 10


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [64, 2 * BIG])
async def test_group_rank_lists_decoded_in_worker_processes_are_shared(world: int) -> None:
    """Each rank lists its default group's N members; decoded in a worker, each arrives with its own
    copy (8,192 ranks: ~300 KiB a rank). A gather keeps one tuple per distinct list; a large list travels
    back from the worker once per gather, then as its digest (group_lists)."""
    from frscope.operator.evidence.gather import Decoder

    plan = make_plan(world, entries=50, shape="nccl", scenario="not_joined", seed=1)
    bodies = [envelope(f"p{r}", [wire.snapshot_piece(r, T_NS, "s", None, plan.dump(r, json_shape=True))])
              for r in range(3)]
    decoder = Decoder(processes=1)
    try:
        await decoder.warm_up()
        shared = GroupTable()
        a, b, c = [await decoder.decode(body, "e", max_entries=20, pod=f"p{i}", namespace="ml", shared=shared)
                   for i, body in enumerate(bodies)]
    finally:
        decoder.close()
    defaults = [max((c.ranks for c in e.dumps[0].pg_config.values() if c.ranks), key=len) for e in (a, b, c)]
    assert defaults[0] == tuple(range(world)) and defaults[0] is defaults[1] is defaults[2]
    assert all(e.packed_groups is None for e in (a, b, c))
    # every group of every rank as its plain decode has it
    for evidence, body in zip((a, b, c), bodies, strict=True):
        plain = from_bytes(body, "e", origin="sidecar", max_entries=20)
        assert evidence.dumps[0].pg_config == plain.dumps[0].pg_config
    assert bool(shared.digests) == (world >= BIG)


def test_a_large_rank_list_travels_once_and_comes_back_in_place() -> None:
    plan = make_plan(2 * BIG, entries=20, shape="nccl", scenario="not_joined", seed=1)
    body = envelope("p", [wire.snapshot_piece(0, T_NS, "s", None, plan.dump(0, json_shape=True))])
    plain = from_bytes(body, "e", origin="sidecar", max_entries=20).dumps[0].pg_config
    table = GroupTable()
    first = pack(from_bytes(body, "e", origin="sidecar", max_entries=20), table.known())
    assert first.packed_groups is not None and len(first.packed_groups.lists) == 1  # the default group
    assert all(cfg.ranks is None or len(cfg.ranks) < BIG for cfg in first.dumps[0].pg_config.values())
    unpack(first, table)
    assert first.dumps[0].pg_config == plain
    again = pack(from_bytes(body, "e", origin="sidecar", max_entries=20), table.known())
    assert again.packed_groups is not None and not again.packed_groups.lists  # named as known: not sent
    unpack(again, table)
    assert again.dumps[0].pg_config == plain
    big = max((c.ranks for c in again.dumps[0].pg_config.values() if c.ranks), key=len)
    assert big is max((c.ranks for c in first.dumps[0].pg_config.values() if c.ranks), key=len)


def test_only_a_push_is_measured_for_the_push_store() -> None:
    """The object walk that measures what evidence keeps is the push store's: a fetched snapshot is
    analyzed and dropped, and at 8,192 ranks the walk (every group's members) cost more than decoding."""
    plan = make_plan(64, entries=20, shape="nccl", scenario="not_joined", seed=1)
    body = envelope("p", [wire.snapshot_piece(0, T_NS, "s", None, plan.dump(0, json_shape=True))])
    assert from_bytes(body, "e", origin="push", max_entries=20).measured_bytes > 0
    fetched = from_bytes(body, "e", origin="sidecar", max_entries=20)
    assert fetched.measured_bytes == 0 and fetched.held_bytes == fetched.size_bytes
