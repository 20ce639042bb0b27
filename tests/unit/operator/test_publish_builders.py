"""Condition placement, Events and the report object (pure builders), on real and synthetic reports."""

from __future__ import annotations

import json
from typing import Any

import pytest

from frscope.analysis import AnalysisOptions, analyze
from frscope.operator import names
from frscope.operator.model.objects import JobRef
from frscope.operator.publish import build_event, build_report_cr, make_condition, needs_write, place_condition
from frscope.records import assemble, normalize_dump
from tests.unit.operator.fakes import real_snapshots

JOB = JobRef("ml", "train", "uid-1")


def real_report(fault: str = "hang") -> Any:
    dumps = [normalize_dump(obj, f"rank {r}", r) for r, obj in real_snapshots(fault).items()]
    return analyze(assemble(dumps, []), AnalysisOptions(stall_after_s=0.5))


def test_condition_goes_first_and_never_becomes_the_state() -> None:
    ours = make_condition("RankNotJoined", "Rank 1 never joined ...", "2026-01-01T00:00:00Z")
    created = {"type": "Created", "status": "True"}
    running = {"type": "Running", "status": "True"}
    placed = place_condition([created, running], ours)
    assert placed == [ours, created, running]
    assert placed[-1:][0]["type"] == "Running"  # `.status.conditions[-1:].type` is still the job's state
    # The training operator appends after ours: still fine, nothing to write.
    assert not needs_write([ours, created, running, {"type": "Failed", "status": "True"}], ours)
    # It rewrote the list without ours, or put ours last: write again, first.
    assert needs_write([created, running], ours)
    assert place_condition([created, ours], ours) == [ours, created]
    # Identical condition keeps its original timestamps (no flapping writes).
    older = dict(ours, lastTransitionTime="2025-01-01T00:00:00Z")
    assert not needs_write([older, created], ours)
    # Alone in the list: nothing better is possible, and no endless rewriting.
    assert not needs_write([ours], ours)


def test_event_is_warning_camelcase_and_at_most_1024_bytes() -> None:
    event = build_event(JOB, reason="RankNotJoined", message="é" * 2000 + "\nsecond line", incident="abc",
                        now="2026-01-01T00:00:00Z", instance="op-0")
    assert event["type"] == "Warning" and event["reason"] == "RankNotJoined"
    assert len(event["message"].encode()) <= 1024 and "\n" not in event["message"]
    assert event["involvedObject"] == {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train",
                                       "namespace": "ml", "uid": "uid-1"}
    again = build_event(JOB, reason="RankNotJoined", message="x", incident="abc", now="t", instance="op-1")
    assert again["metadata"]["name"] == event["metadata"]["name"]  # deterministic: re-posting is a no-op
    with pytest.raises(ValueError):
        build_event(JOB, reason="not camel", message="x", incident="abc", now="t", instance="i")


def test_report_object_from_a_real_hang() -> None:
    report = real_report("hang")
    assert report.findings and report.findings[0].culprit_ranks == (1,)
    obj = build_report_cr(JOB, report, incident="abc123", attempt="deadbeef/r0", signal="SidecarStall: x",
                          missing_pods={}, gathered_at="2026-01-01T00:00:00Z")
    assert obj["kind"] == names.REPORT_KIND and obj["metadata"]["name"] == "train-abc123"
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train", "uid": "uid-1"}]
    diag = obj["diagnosis"]
    assert diag["verdict"].startswith("Rank 1 never joined all_reduce #4")
    assert diag["what"]["category"] == "RankNotJoined" and diag["what"]["collectiveSeqId"] == 4
    assert diag["who"]["culprits"] == "1" and diag["who"]["culpritRanks"] == [1]
    stack = obj["evidence"]["culpritStacks"]["1"]
    # One frame per item: `kubectl describe` prints each on its own line.
    assert isinstance(stack, list) and all("\n" not in line for line in stack)
    assert stack[0].startswith("(live stack") and any(line.startswith("load_batch (") for line in stack)
    assert any("ranks 0, 2-3" in line and "all_reduce #4" in line
               for line in obj["progress"]["group 0 (default_pg)"])
    assert obj["report"]["schema"] == "frscope.report/v1"
    # kubectl describe sorts fields by name: the diagnosis (verdict first) comes before anything else.
    assert sorted(k for k in obj if k not in ("apiVersion",))[0] == "diagnosis"
    assert sorted(diag)[0] == "verdict"


def test_report_object_trimmed_to_the_limit() -> None:
    report = real_report("hang")
    # Inflate: 4,096 ranks of progress in one group (what a 4k-GPU job looks like to report_to_dict).
    from frscope.analysis import GroupProgress, RankProgress

    group = report.groups[0]
    ranks = {r: RankProgress(812, 811, "all_reduce", 812) for r in range(4096)}
    report.groups = [GroupProgress(group.group, group.membership_source, ranks)] * 8
    obj = build_report_cr(JOB, report, incident="abc", attempt="a/r0", signal="s", missing_pods={},
                          gathered_at="t", limit_bytes=64 * 1024)
    size = len(json.dumps(obj).encode())
    assert size <= 64 * 1024, size
    assert obj["job"]["reportTrimmed"]
    assert obj["diagnosis"]["verdict"]  # the verdict is never trimmed away
    assert obj["progress"]["group 0 (default_pg)"] == ["ranks 0-4095: completed #811, in all_reduce #812"]


def test_trimming_cuts_step_by_step_and_leaves_the_full_report_as_it_was() -> None:
    from frscope.operator.publish.report_cr import _trim_report

    def full() -> dict[str, Any]:
        sub = {"ranks": {"1": {"op": "x"}, "2": {"op": "y" * 300}}, "culprit_frames": {"1": [{"name": "f"}]}}
        return {"schema": "s", "verdict": "v", "problems": ["p"] * 10,
                "findings": [{**sub, "summary": "s", "consequences": [dict(sub)]}],
                "groups": [{"name": "0", "progress": {str(r): {"last": r} for r in range(200)}}]}

    original = full()
    whole, note = _trim_report(original, {1}, 1 << 20, 0)
    assert whole is original and note is None
    first, note = _trim_report(original, {1}, len(json.dumps(original)) - 1000, 0)
    assert note and "culprit ranks only" in note and original == full()  # the full one unchanged
    assert first["groups"] == [{"name": "0", "progress": {"1": {"last": 1}}, "progress_truncated": 199}]
    second, note = _trim_report(original, {1}, 500, 0)
    assert note and "left out" in note and original == full() and "groups" not in second
    finding = second["findings"][0]
    assert finding["ranks"] == {"1": {"op": "x"}} and finding["culprit_frames"] == {} and finding["summary"] == "s"
    assert finding["consequences"] == [{"ranks": {"1": {"op": "x"}}, "culprit_frames": {}}]
    last, note = _trim_report(original, {1}, 10, 0)
    assert last == {"schema": "s", "verdict": "v", "truncated": True} and note and original == full()
