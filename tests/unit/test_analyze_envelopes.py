"""`frscope analyze` reads what frscope itself serves or saves: a sidecar's `/v1/snapshot` body (plain or
gzip, as `curl` saves it), a push / evidence capture (the same envelope, gzipped), snapshot pieces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from frscope import wire
from frscope.cli import main
from tests.unit import builders as b


def _envelope(pieces: list[dict[str, object]], errors: list[wire.SnapshotError], pod: str = "w-0") -> bytes:
    head = wire.snapshot_head(pod=pod, namespace="ml", node="n1", captured_at_ns=b.T0 + 60 * 10**9, reason="stall")
    return wire.snapshot_envelope_bytes(head, [json.dumps(p).encode() for p in pieces], errors)


def _hang_pieces(ranks: list[int], world: int) -> list[dict[str, object]]:
    """Every listed rank enqueued all_reduce #1..#3; rank 1 never enqueued #3 (it is the culprit)."""
    out: list[dict[str, object]] = []
    for rank in ranks:
        seqs = (1, 2) if rank == 1 else (1, 2, 3)
        entries = [b.entry(s, state="completed" if s < 3 else "scheduled") for s in seqs]
        out.append(wire.snapshot_piece(rank, b.T0 + 60 * 10**9, f"socket:/run/rank-{rank}.sock", None,
                                       b.dump(entries, world=world)))
    return out


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_saved_sidecar_snapshot_is_analyzed_as_it_is(tmp_path: Path, gzipped: bool,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    body = _envelope(_hang_pieces([0, 1, 2], 3), [])
    path = tmp_path / ("snap.json.gz" if gzipped else "snap.json")
    path.write_bytes(gzip.compress(body) if gzipped else body)
    out = tmp_path / "report.json"
    assert main(["analyze", str(path), "--format", "json", "-o", str(out), "--no-progress"]) == 1
    report = json.loads(out.read_text())
    assert report["findings"][0]["culprit_ranks"] == [1]
    assert report["world_size"] == 3


def test_pods_envelopes_together_and_their_errors_are_named(tmp_path: Path) -> None:
    """Two pods' pushes in one folder: one job; a rank a sidecar could not read is a problem naming the pod."""
    (tmp_path / "capture-1-stall.json.gz").write_bytes(gzip.compress(_envelope(_hang_pieces([0, 1], 4), [])))
    bad = {"frscope_snapshot": 1, "rank": 3, "trace": "not a recorder"}
    (tmp_path / "w-1.json").write_bytes(
        _envelope(_hang_pieces([2], 4) + [bad], [{"rank": 3, "message": "socket gone"}], pod="w-1"))
    out = tmp_path / "report.json"
    assert main(["analyze", str(tmp_path), "--format", "json", "-o", str(out), "--no-progress"]) == 1
    report = json.loads(out.read_text())
    assert report["findings"][0]["culprit_ranks"] == [1]
    problems = " | ".join(f"{p['source']}: {p['message']}" for p in report["problems"])
    assert "pod ml/w-1" in problems and "socket gone" in problems and "rank 3" in problems


def test_an_empty_envelope_says_no_rank_answered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "snap.json"
    path.write_bytes(_envelope([], []))
    assert main(["analyze", str(path), "--no-progress"]) == 2
    assert "no rank in it" in capsys.readouterr().err
