"""frscope beside PyTorch's own analyzer, `torchfrtrace`, on the same dump sets.

Where torchfrtrace works, both must name the same culprit ranks. Where it does not, the test shows
why torchfrtrace is wrong (DESIGN.md): it assumes the first rank is right, reports nothing when every
rank joined a collective that never completed, and crashes on real gloo dumps.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit import builders as b

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

TORCHFRTRACE = Path(sys.executable).with_name("torchfrtrace")
REAL = Path(__file__).parent.parent / "data" / "real"


def _torchfrtrace(directory: Path, prefix: str = "nccl_trace_rank_") -> subprocess.CompletedProcess[str]:
    if not TORCHFRTRACE.exists():
        pytest.skip("torchfrtrace is not installed (torch missing)")
    return subprocess.run(
        [str(TORCHFRTRACE), str(directory), "--prefix", prefix],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _frscope(directory: Path) -> dict[str, object]:
    run = subprocess.run(
        [sys.executable, "-m", "frscope", "analyze", str(directory), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode in (0, 1), run.stderr
    return json.loads(run.stdout)  # type: ignore[no-any-return]


def _torch_culprits(output: str) -> set[int]:
    return {int(r) for r in re.findall(r"Culprit rank (\d+)", output)}


def _steps(n: int) -> list[dict[str, object]]:
    return [b.entry(s) for s in range(1, n + 1)]


def test_same_culprit_where_torchfrtrace_works(tmp_path: Path) -> None:
    cases = {
        "type": (2, {"op": "broadcast"}),
        "size": (3, {"sizes": [[8, 8]]}),
        "dtype": (1, {"dtype": "Int"}),
    }
    for name, (culprit, change) in cases.items():
        directory = tmp_path / name
        directory.mkdir()
        per_rank = {r: _steps(4) + [b.entry(5, state="scheduled", retired=False)] for r in range(4)}
        per_rank[culprit][-1] = b.entry(5, state="scheduled", retired=False, **change)  # type: ignore[arg-type]
        b.job(directory, per_rank)
        run = _torchfrtrace(directory)
        theirs = _torch_culprits(run.stdout + run.stderr)
        ours = _frscope(directory)
        findings = ours["findings"]
        assert isinstance(findings, list)
        assert theirs == {culprit}, name
        assert findings[0]["culprit_ranks"] == [culprit], name


def test_torchfrtrace_blames_everyone_else_when_rank_0_is_the_culprit(tmp_path: Path) -> None:
    per_rank = {r: _steps(4) + [b.entry(5, state="scheduled", retired=False)] for r in range(4)}
    per_rank[0][-1] = b.entry(5, op="broadcast", state="scheduled", retired=False)
    b.job(tmp_path, per_rank)
    run = _torchfrtrace(tmp_path)
    theirs = _torch_culprits(run.stdout + run.stderr)
    ours = _frscope(tmp_path)["findings"]
    assert isinstance(ours, list)
    assert ours[0]["culprit_ranks"] == [0]  # three ranks called all_reduce; rank 0 called broadcast
    assert theirs != {0}, "torchfrtrace takes rank 0's entry as the reference, so it blames the majority"


def test_torchfrtrace_finds_nothing_when_nothing_completed(tmp_path: Path) -> None:
    per_rank = {r: _steps(5) + [b.entry(6, state="started")] for r in range(4)}
    b.job(tmp_path, per_rank)
    theirs = _torchfrtrace(tmp_path)
    ours = _frscope(tmp_path)["findings"]
    assert isinstance(ours, list)
    assert ours[0]["category"] == "NotCompleted" and ours[0]["collective_seq_id"] == 6
    out = theirs.stdout + theirs.stderr
    assert "Culprit rank" not in out and "has errors" not in out


def test_torchfrtrace_crashes_on_real_gloo_dumps(tmp_path: Path) -> None:
    source = REAL / "hang-pickle"
    if not source.is_dir():
        pytest.skip("real gloo pickle fixtures not generated yet (scripts/make_fixtures.py)")
    files = sorted(p for p in source.iterdir() if p.is_file() and not p.suffix)
    assert files, "no pickle dumps in the fixture"
    for path in files:
        shutil.copy(path, tmp_path / path.name)
    prefix = re.sub(r"\d+$", "", files[0].name)
    theirs = _torchfrtrace(tmp_path, prefix)
    assert theirs.returncode != 0 and "KeyError" in theirs.stderr
    ours = _frscope(tmp_path)
    findings = ours["findings"]
    assert isinstance(findings, list) and findings, "frscope reads the same gloo dumps and finds the hang"
