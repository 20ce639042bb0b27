"""A gather's ranks share what they repeat (`records.sharing.share_rank`, applied by `group_lists.unpack` as each
decoded rank arrives in the operator's process): the analysis, the report and the timeline read the same values
as from a plain decode of each body, while the gather holds one object where every rank had its own."""

from __future__ import annotations

import json
import pickle
import sys
from array import array
from typing import Any

import pytest

from frscope import wire
from frscope.analysis import AnalysisOptions
from frscope.operator.evidence.diagnosis import diagnose_sync
from frscope.operator.evidence.gather import Gathered
from frscope.operator.evidence.group_lists import GroupTable, pack, unpack
from frscope.operator.evidence.pod_evidence import PodEvidence, from_bytes, kept_bytes
from frscope.records.columns import EntryTable
from frscope.records.model import entry_rows
from frscope.records.sharing import exact, share_rank, shared_array
from frscope.report.serialize import report_to_dict
from frscope.report.timeline import build_timeline
from frscope.testing.synthetic import make_plan
from tests.unit.operator.fakes import real_snapshots
from tests.unit.operator.test_window import T_NS, envelope


def synthetic_bodies(world: int, entries: int = 300, window: int = 50, shape: str = "nccl") -> dict[str, bytes]:
    plan = make_plan(world, entries=entries, shape=shape, scenario="not_joined", seed=3, hang_age_s=120.0)
    out = {}
    for rank in range(world):
        piece = wire.snapshot_piece(rank, T_NS, f"synthetic:{rank}", None, plan.dump(rank, json_shape=True,
                                                                                       newest=window))
        out[f"p{rank}"] = envelope(f"p{rank}", [piece])
    return out


def real_bodies() -> dict[str, bytes]:
    return {f"p{r}": envelope(f"p{r}", [piece]) for r, piece in real_snapshots("hang").items()}


def plain(bodies: dict[str, bytes], window: int) -> Gathered:
    """Each body decoded on its own, nothing shared (the reference)."""
    gathered = Gathered("ml")
    for pod, body in bodies.items():
        gathered.pods[pod] = from_bytes(body, f"http://{pod}", origin="sidecar", max_entries=window, pod=pod,
                                        namespace="ml")
    return gathered


def round_trip(value: Any) -> Any:
    """Through a pickle, as a decoder process's answer comes back (our own objects only)."""
    return pickle.loads(pickle.dumps(value))  # noqa: S301


def received(bodies: dict[str, bytes], window: int) -> Gathered:
    """As a gather receives them from its decoder processes: packed, pickled, unpacked into one table."""
    gathered = Gathered("ml")
    table = GroupTable()
    for pod, body in bodies.items():
        evidence = pack(from_bytes(body, f"http://{pod}", origin="sidecar", max_entries=window, pod=pod,
                                   namespace="ml"), table.known())
        gathered.pods[pod] = unpack(round_trip(evidence), table)
    return gathered


def outputs(gathered: Gathered, world: int, stall_after_s: float) -> tuple[str, str]:
    diagnosis = diagnose_sync(gathered, world, AnalysisOptions(stall_after_s=stall_after_s))
    report = json.dumps(report_to_dict(diagnosis.report), sort_keys=True)
    return report, json.dumps(build_timeline(diagnosis.dumpset, diagnosis.report), sort_keys=True, default=str)


def tables(gathered: Gathered) -> list[EntryTable]:
    out = []
    for evidence in gathered.pods.values():
        for dump in evidence.dumps:
            assert isinstance(dump.entries, EntryTable)
            out.append(dump.entries)
    return out


@pytest.mark.parametrize(("source", "world", "window", "stall_after_s"),
                         [("nccl", 48, 50, 60.0), ("gloo", 24, 50, 60.0), ("real", 0, 200, 0.5), ("real", 0, 5, 0.5)])
def test_shared_evidence_gives_the_report_and_timeline_of_a_plain_decode(source: str, world: int, window: int,
                                                                          stall_after_s: float) -> None:
    bodies = synthetic_bodies(world, window=window, shape=source) if source != "real" else real_bodies()
    world = world or len(bodies)
    reference, shared = plain(bodies, window), received(bodies, window)
    for a, b in zip(tables(reference), tables(shared), strict=True):
        assert entry_rows(a) == entry_rows(b)  # every entry, every field
        assert {k: (g.seq_list(), list(g.members), list(g.sig), list(g.p2p), g.next_seq)
                for k, g in a.groups().items()} == {k: (g.seq_list(), list(g.members), list(g.sig), list(g.p2p),
                                                        g.next_seq) for k, g in b.groups().items()}
    for pod, evidence in reference.pods.items():
        other = shared.pods[pod]
        for a_dump, b_dump in zip(evidence.dumps, other.dumps, strict=True):
            assert a_dump.pg_config == b_dump.pg_config and a_dump.pg_status == b_dump.pg_status
            assert (a_dump.version, a_dump.backend, a_dump.comm_lib_version, a_dump.source) == (
                b_dump.version, b_dump.backend, b_dump.comm_lib_version, b_dump.source)
    report, timeline = outputs(reference, world, stall_after_s)
    assert json.loads(report)["findings"], "the evidence tells the fault"
    assert outputs(shared, world, stall_after_s) == (report, timeline)


def held(gathered: Gathered) -> int:
    """What the gathered ranks keep, objects shared between ranks counted once."""
    return kept_bytes([d for e in gathered.pods.values() for d in e.dumps], [])


def test_a_gathers_ranks_hold_what_they_repeat_once() -> None:
    bodies = synthetic_bodies(32)
    reference, shared = plain(bodies, 50), received(bodies, 50)
    ranks = tables(shared)
    first = ranks[0]
    names = ("shapes", "states", "timeouts", "pgs", "names", "threads", "pg", "name", "shape", "state", "timeout",
             "thread", "flags", "seq", "p2p_seq")
    alike = 0
    for other in ranks[1:]:  # whatever two ranks hold alike is one object
        for name in names:
            if getattr(first, name) == getattr(other, name):
                assert getattr(first, name) is getattr(other, name), name
                alike += 1
        for mine, theirs in zip(first.groups().values(), other.groups().values(), strict=False):
            if mine.members == theirs.members:
                assert mine.members is theirs.members
    assert alike > len(ranks) * 4
    for name in ("pgs", "names", "threads"):  # each item (and each string in it) one object for the set
        objects: dict[Any, set[int]] = {}
        for table in ranks:
            for item in getattr(table, name):
                objects.setdefault(item, set()).add(id(item))
                for value in item:
                    objects.setdefault(value, set()).add(id(value))
        assert all(len(ids) == 1 for value, ids in objects.items() if value is not None), name
    a = first
    # each rank's own times held at their size, not with an unpickled array's slack
    assert sys.getsizeof(a.created) == sys.getsizeof(array("q", a.created))
    # less than half of what the same ranks decoded one by one keep
    assert held(shared) * 2 < held(reference)


def test_an_array_is_shared_only_with_an_equal_one() -> None:
    shared: dict[Any, Any] = {}
    column = array("B", [1, 2, 3])
    other = array("B", [3, 2, 1])
    # Another array under `column`'s key (as a hash collision would put it there): not taken for it.
    shared[("array", "B", 3, hash(column.tobytes()))] = other
    got = shared_array(column, shared)
    assert got == column and got is not other
    same = array("B", [3, 2, 1])
    assert shared_array(same, {("array", "B", 3, hash(same.tobytes())): other}) is other
    assert shared_array(array("H", [3, 2, 1]), {("array", "B", 3, hash(same.tobytes())): other}) is not other
    assert shared_array(range(5), shared) == range(5) and shared_array(None, shared) is None
    grown = round_trip(array("q", range(200)))
    assert sys.getsizeof(exact(grown)) < sys.getsizeof(grown) and exact(grown) == grown


def test_sharing_a_rank_changes_nothing_another_rank_reads() -> None:
    """Two ranks share a column; re-coding one rank's signatures (as `unify_signatures` does) makes new
    arrays, so the other still reads its own."""
    from frscope.records.columns import SignatureSpace, unify_signatures

    bodies = synthetic_bodies(16)
    shared = received(bodies, 50)
    a, b = tables(shared)[8], tables(shared)[9]
    before = {k: list(g.sig) for k, g in b.groups().items()}
    space = SignatureSpace()
    space.code(("an op no rank ran",))  # the space's code 0 taken: a's codes all move
    unify_signatures([a], space)
    assert {k: list(g.sig) for k, g in b.groups().items()} == before


def test_a_push_shares_too_and_its_store_still_measures_it() -> None:
    bodies = synthetic_bodies(4)
    table = GroupTable()
    got: list[PodEvidence] = []
    for pod, body in bodies.items():
        evidence = from_bytes(body, pod, origin="push", max_entries=50, pod=pod, namespace="ml")
        assert evidence.measured_bytes > 0
        got.append(unpack(round_trip(pack(evidence, table.known())), table))
    assert all(e.measured_bytes > 0 for e in got)
    share_rank(got[0].dumps[0], table.shared)  # once more: nothing changes
    reference = plain({"p0": bodies["p0"]}, 50).pods["p0"].dumps[0].entries
    assert entry_rows(got[0].dumps[0].entries) == entry_rows(reference)


def test_time_columns_of_one_value_are_shared() -> None:
    """gloo records no start or end times (0 throughout): those columns are one array for the gather; times
    that differ stay each rank's own."""
    ranks = tables(received(synthetic_bodies(8, shape="gloo"), 50))
    assert all(t.started is ranks[0].started and t.completed is ranks[0].completed for t in ranks)
    assert not any(ranks[0].started) and len({id(t.created) for t in ranks}) == len(ranks)
