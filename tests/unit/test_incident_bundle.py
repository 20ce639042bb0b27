"""`frscope analyze BUNDLE`: an incident bundle (records.bundle) re-diagnosed like the evidence it holds."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from frscope import wire
from frscope.cli import main
from frscope.records import exits_from_json, load_dumps
from frscope.records.bundle import make_bundle, window

REAL = Path(__file__).resolve().parents[1] / "data" / "real"


def _envelope(pieces: list[dict[str, Any]], pod: str) -> dict[str, Any]:
    head = wire.snapshot_head(pod=pod, namespace="train", node="node-a",
                              captured_at_ns=max(p["captured_at_ns"] for p in pieces), reason="stall")
    return {**head, "ranks": pieces, "errors": []}


def _bundle_of(fixture: str, exits_file: str | None = None) -> dict[str, Any]:
    """The real fixture's snapshot pieces as a two-pod job's bundle (even ranks in one pod, odd in the other)."""
    pieces = [json.loads(p.read_text()) for p in sorted((REAL / fixture).glob("rank-*.json"))]
    windows = [_envelope([p for p in pieces if p["rank"] % 2 == parity], f"job-worker-{parity}") for parity in (0, 1)]
    exits = {e.rank: e for e in exits_from_json(json.loads((REAL / exits_file).read_text()), exits_file)} \
        if exits_file else {}
    return make_bundle(job={"namespace": "train", "name": "job", "uid": "u-1", "kind": "PyTorchJob"},
                       incident={"id": "i-1", "category": "", "verdict": "", "at": ""},
                       windows=windows, exits=exits, report={"findings": []}, timeline=None)


def _write(path: Path, bundle: dict[str, Any]) -> Path:
    path.write_bytes(gzip.compress(json.dumps(bundle).encode()))
    return path


def _analyze(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["analyze", *args, "--format", "json", "--no-progress"])
    return code, json.loads(capsys.readouterr().out)


def _verdict(report: dict[str, Any]) -> list[tuple[str, list[int]]]:
    return [(f["category"], f["culprit_ranks"]) for f in report["findings"]]


@pytest.mark.parametrize("fixture", ["crash", "crossgroup", "dtype", "none"])
def test_bundle_gives_the_fixtures_verdict(fixture: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    direct_code, direct = _analyze(capsys, str(REAL / fixture))
    bundle = _write(tmp_path / "incident.frscope-bundle.json.gz", _bundle_of(fixture))
    code, again = _analyze(capsys, str(bundle))
    assert code == direct_code
    assert _verdict(again) == _verdict(direct)
    assert again["ranks_loaded"] == direct["ranks_loaded"]


def test_bundle_carries_the_exits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The crash fixture's exits come with the bundle: the same verdict as `--exits FILE` beside the dumps."""
    _, direct = _analyze(capsys, str(REAL / "crash"), "--exits", str(REAL / "crash-exits.json"))
    bundle = _write(tmp_path / "b.json.gz", _bundle_of("crash", "crash-exits.json"))
    _, again = _analyze(capsys, str(bundle))
    _, without = _analyze(capsys, str(REAL / "crash"))
    assert _verdict(again) == _verdict(direct) == [("RankStopped", [2])]
    assert _verdict(without) != _verdict(direct)  # the exits decide it: the bundle must carry them


def test_one_bad_window_names_itself_and_spares_the_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = _bundle_of("none")
    bundle["windows"][1] = {"schema": wire.SNAPSHOT_SCHEMA, "ranks": "nope"}
    code, report = _analyze(capsys, str(_write(tmp_path / "b.json.gz", bundle)))
    assert report["ranks_loaded"] == [0, 2]
    assert any("windows[1]" in p["source"] and "'ranks'" in p["message"] for p in report["problems"])


@pytest.mark.parametrize(("damage", "says"), [
    (lambda b: b.update(windows={"a": 1}), "field 'windows' is dict"),
    (lambda b: b.update(windows=[]), "field 'windows' is empty"),
])
def test_a_bad_bundle_is_a_clear_problem(damage: Any, says: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    bundle = _bundle_of("none")
    damage(bundle)
    path = _write(tmp_path / "bad.json.gz", bundle)
    assert main(["analyze", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and says in err


def test_bad_exits_leave_the_bundles_ranks_analysed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exits that cannot be read are a warning naming the field: the ranks the bundle carries are still the report."""
    bundle = _bundle_of("none")
    bundle["exits"] = {"x": 1}
    path = _write(tmp_path / "bad-exits.json.gz", bundle)
    code, report = _analyze(capsys, str(path))
    assert code == 0 and report["healthy"] and report["ranks_loaded"] == [0, 1, 2, 3]
    [problem] = report["problems"]
    assert problem["source"] == str(path) and problem["kind"] == "warning" and "field 'exits'" in problem["message"]


def test_corrupt_and_oversized_bundles_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = gzip.compress(json.dumps(_bundle_of("none")).encode())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(good[: len(good) // 2])
    assert main(["analyze", str(cut), "--no-progress"]) == 2
    assert f"{cut}" in (err := capsys.readouterr().err) and "gzip" in err
    whole = tmp_path / "whole.json.gz"
    whole.write_bytes(good)
    assert main(["analyze", str(whole), "--no-progress", "--max-bytes", str(len(good) + 100)]) == 2
    assert f"{whole}" in (err := capsys.readouterr().err) and "cap" in err


@pytest.mark.parametrize("fixture", ["crash", "crossgroup-6", "dtype-pickle", "none"])
def test_loaded_ranks_written_back_give_the_same_verdict(fixture: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """What the operator keeps: the ranks it loaded (RankDumps, not the bodies) written back as windows."""
    _, direct = _analyze(capsys, str(REAL / fixture))
    dumpset = load_dumps([REAL / fixture], jobs=1)
    windows = [window(namespace="train", pod=f"job-worker-{d.rank}", dumps=[d]) for d in dumpset.dumps.values()]
    bundle = make_bundle(job={"namespace": "train", "name": "job"}, incident={"id": "i-2"}, windows=windows,
                         exits={}, report=None, timeline=None)
    _, again = _analyze(capsys, str(_write(tmp_path / "b.json.gz", bundle)))
    assert _verdict(again) == _verdict(direct)
    assert [f["summary"] for f in again["findings"]] == [f["summary"] for f in direct["findings"]]
    assert not [p for p in again["problems"] if p["kind"] == "error"]
