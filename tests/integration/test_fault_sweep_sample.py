"""A fixed-seed sample of the fault sweep (frscope/testing/sweep, issue 23) in CI: real torch gloo jobs with
injected faults, forked from one warm zygote, captured as a sidecar snapshot, a pickle and a JSON dump, and
scored against what was injected. Only classes whose evidence does not depend on timing margins (no
stragglers): a hang in Python, a collective type mismatch, a shape mismatch, a subgroup skip that forms a
cycle with the default group, a rank stuck until the others' collective timeout, and a healthy job with
every op type (no finding). The full sweep (300+ jobs) is `make accuracy-sweep`, a benchmark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frscope.testing.sweep.runner import run_batch
from frscope.testing.sweep.score import score_dir

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(240)]

SEED = 23
CLASSES = ["hang", "type", "size", "cycle", "timeout", "healthy"]


def test_fixed_seed_sample_is_diagnosed_right(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    results = run_batch(SEED, len(CLASSES), CLASSES, ["2.13"], out, parallel=3, command="pytest sample",
                        max_world=4)
    assert not [r for r in results if "error" in r], results
    unsettled = [r["job_id"] for r in results if not r.get("settled")]
    assert not unsettled, f"jobs did not reach their end state: {unsettled}"
    score_dir(out, torchfrtrace=False)
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["class"] for r in rows} == set(CLASSES)
    assert len(rows) == 3 * len(CLASSES), "every job scored in every form (snapshot, pickle, JSON)"
    wrong = [f"{r['job']} [{r['form']}]: truth {r['culprits']}, frscope said {r['got']}" for r in rows
             if not r["right"]]
    assert not wrong, "\n".join(wrong)
