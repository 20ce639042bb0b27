"""The analyzer against every synthetic scenario with a known answer, in both dump shapes (NCCL:
states, durations, pg_config by name, p2p; gloo: 'scheduled' only, the '' pg_config bug), with
tensor, pipeline and data parallel groups, ring buffers that wrapped, and clock skew between hosts.
Exactly one root cause must come out, and it must be the planted one."""

from __future__ import annotations

from pathlib import Path

import pytest

from frscope.analysis import Category, analyze
from frscope.records import load_dumps
from frscope.testing.synthetic import generate

CASES = [
    (scenario, shape)
    for scenario in (
        "healthy",
        "not_joined",
        "type_mismatch",
        "size_mismatch",
        "dtype_mismatch",
        "not_completed",
        "straggler",
        "missing",
        "cross_group",
        "p2p_mismatch",
    )
    for shape in ("nccl", "gloo")
    if not (scenario == "p2p_mismatch" and shape == "gloo")  # gloo records no p2p at all
]


@pytest.mark.parametrize(("scenario", "shape"), CASES)
def test_planted_fault_is_the_one_root_cause(tmp_path: Path, scenario: str, shape: str) -> None:
    # JSON for the gloo shape (what fr_trace_json gives), pickle for NCCL (what torch dumps on timeout).
    fmt = "json" if shape == "gloo" else "pickle"
    pp = 2 if scenario == "p2p_mismatch" else 1
    truth = generate(
        tmp_path, 16, fmt=fmt, scenario=scenario, shape=shape, seed=7, entries=300, tp=4, pp=pp, clock_skew_ms=5
    )
    report = analyze(load_dumps([tmp_path]))
    if truth.category is None:
        assert report.findings == []
        return
    [root] = report.findings
    assert root.category is Category(truth.category)
    assert root.culprit_ranks and set(root.culprit_ranks) <= set(truth.culprit_ranks)
    if truth.collective_seq_id is not None and root.category is not Category.STRAGGLER:
        assert root.collective_seq_id == truth.collective_seq_id
    if truth.group_name is not None:
        assert root.process_group.name == truth.group_name
