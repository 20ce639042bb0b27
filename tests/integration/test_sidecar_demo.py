"""`frscope demo` on its live path: the demo job with a local `frscope sidecar` process beside it.
Exit 0 when the diagnosis showed what the fault was meant to show (make demo ends cleanly), with the
stuck rank's stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frscope.cli import main

pytestmark = pytest.mark.torch


@pytest.mark.timeout(150)
def test_demo_hang_through_the_sidecar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep = tmp_path / "kept"
    assert main(["demo", "--fault", "hang", "--world-size", "3", "--keep", str(keep)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].startswith("Rank 1 never joined all_reduce #4 of group 0 (default_pg)")
    assert "rank 1 now (most recent call first):" in captured.out
    now = captured.out.split("rank 1 now (most recent call first):", 1)[1].splitlines()
    assert now[1].strip().startswith("load_batch (")
    assert "local frscope sidecar" in captured.err
    for rank in range(3):
        piece = json.loads((keep / f"rank-{rank}.json").read_text())
        assert piece["rank"] == rank and piece["source"].endswith(f"rank-{rank}.sock")
        assert piece["stacks"] and piece["trace"]["version"] == "2.10"
    # The kept files are what `frscope analyze` reads: same verdict again.
    assert main(["analyze", str(keep), "--stall-after", "1"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == lines[0]


@pytest.mark.timeout(150)
def test_demo_healthy_job_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--fault", "none", "--world-size", "2", "--keep", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("No problem found: 2 ranks")
