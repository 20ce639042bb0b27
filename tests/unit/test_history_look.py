"""The history scan looks at each rank's oldest few seqs of every group (where its window begins) without keeping
the entries it built for them: kept in a columnar rank's buckets, they stayed until the analysis ended, ~5 KiB a
rank of a 200-entry window (bench/RESULTS.md, "Operator: a gathered rank's evidence")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from frscope.analysis import AnalysisOptions, analyze
from frscope.analysis import diagnose as diagnose_module
from frscope.analysis.tracks import Buckets, Track
from frscope.records import load_dumps
from frscope.records.columns import EntryTable
from frscope.records.model import entry_rows
from frscope.testing.synthetic import generate


def _load(tmp_path: Path, scenario: str) -> Any:
    generate(tmp_path, 16, entries=120, shape="nccl", fmt="pickle", scenario=scenario, seed=4, tp=2, pp=2)
    dumpset = load_dumps([tmp_path], jobs=1)
    assert all(isinstance(d.entries, EntryTable) for d in dumpset.dumps.values())
    return dumpset


@pytest.mark.parametrize("scenario", ["not_joined", "size_mismatch"])
def test_the_oldest_seqs_looked_at_are_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 scenario: str) -> None:
    seen: list[dict[str, dict[int, Track]]] = []
    build = diagnose_module.build_tracks

    def keep(dumpset: Any) -> dict[str, dict[int, Track]]:
        seen.append(build(dumpset))
        return seen[-1]

    monkeypatch.setattr(diagnose_module, "build_tracks", keep)
    report = analyze(_load(tmp_path, scenario), AnalysisOptions(stall_after_s=60))
    assert report.findings
    (tracks,) = seen
    buckets = [t.by_seq for by_rank in tracks.values() for t in by_rank.values() if isinstance(t.by_seq, Buckets)]
    assert buckets
    kept = sum(1 for b in buckets if b.index.first_seq in b._built)
    assert kept < len(buckets) // 4, f"{kept} of {len(buckets)} ranks' oldest seq kept"


def test_a_peek_is_what_get_builds_and_keeps_nothing(tmp_path: Path) -> None:
    dumpset = _load(tmp_path, "not_joined")
    table = dumpset.dumps[0].entries
    assert isinstance(table, EntryTable)
    for index in table.groups().values():
        buckets = Buckets(table, index)
        for seq in list(index.seq_list())[:5]:
            looked = buckets.peek(seq)
            assert not buckets._built
            assert entry_rows(looked) == entry_rows(buckets.get(seq) or [])
            assert buckets.peek(seq) is buckets.get(seq)  # once kept by `get`, the same list
            buckets._built.clear()
        assert buckets.peek(index.last_seq + 10) == [] and not buckets._built


def test_the_timeline_keeps_no_cells_entries_and_draws_the_same(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The timeline builds a cell's entries where a rank differs from its peers; kept in the rank's buckets they
    stayed until the whole timeline was built (~9 KiB a rank). Not kept, the timeline is the same."""
    import json

    from frscope.report import timeline as timeline_module

    dumpset = _load(tmp_path, "not_joined")
    report = analyze(dumpset, AnalysisOptions(stall_after_s=60))
    seen: list[dict[str, dict[int, Track]]] = []
    build = timeline_module.build_tracks

    def keep(dumps: Any) -> dict[str, dict[int, Track]]:
        seen.append(build(dumps))
        return seen[-1]

    monkeypatch.setattr(timeline_module, "build_tracks", keep)
    drawn = json.dumps(timeline_module.build_timeline(dumpset, report), sort_keys=True, default=str)
    kept = sum(len(t.by_seq._built) for by_rank in seen[-1].values() for t in by_rank.values()
               if isinstance(t.by_seq, Buckets))
    # as before: every look kept
    monkeypatch.setattr(Buckets, "peek", lambda self, seq: self.get(seq, []))
    before = json.dumps(timeline_module.build_timeline(dumpset, report), sort_keys=True, default=str)
    kept_before = sum(len(t.by_seq._built) for by_rank in seen[-1].values() for t in by_rank.values()
                      if isinstance(t.by_seq, Buckets))
    assert drawn == before
    assert kept_before > 4 * max(1, kept), (kept, kept_before)
