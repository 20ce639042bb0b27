"""The action policy's pure parts: which policy applies, what is allowed, which verdicts qualify, what a
hang costs, the action record, and the evidence for cordoning a node."""

from __future__ import annotations

from typing import Any

import pytest

from frscope.operator.actions import ActionRecord, Policy, parse_allowed
from frscope.operator.actions.cordon import blaming_jobs
from frscope.operator.actions.impact import saving
from frscope.operator.actions.policy import decide, requested_policy
from frscope.operator.actions.record import actions_since
from frscope.operator.model.objects import pod_info

ANN = "frscope.io/on-diagnosis"


def test_job_annotation_beats_namespace_beats_default() -> None:
    assert requested_policy({ANN: "stop"}, {ANN: "restart"}, Policy.NONE).policy is Policy.STOP
    ns = requested_policy({}, {ANN: "Restart "}, Policy.DRY_RUN)
    assert (ns.policy, ns.source) == (Policy.RESTART, "namespace annotation")
    # An unknown value does not count: the next level decides.
    fallback = requested_policy({ANN: "reboot"}, None, Policy.DRY_RUN)
    assert (fallback.policy, fallback.source) == (Policy.DRY_RUN, "operator default")


def test_allow_actions_parses_and_names_a_bad_entry() -> None:
    assert parse_allowed("restart, cordon") == {Policy.RESTART, Policy.CORDON}
    assert parse_allowed("") == frozenset() and parse_allowed("none") == frozenset()
    with pytest.raises(ValueError, match="'dry-run' is not one of restart, stop, cordon"):
        parse_allowed("restart,dry-run")


def test_an_action_not_allowed_becomes_a_dry_run() -> None:
    asked = requested_policy({ANN: "restart"}, None, Policy.NONE)
    denied = decide(asked, frozenset({Policy.STOP}), "RankNotJoined", ambiguous=False)
    assert denied.act is Policy.DRY_RUN and "not allowed by --allow-actions=stop" in denied.why
    assert decide(asked, frozenset({Policy.RESTART}), "RankNotJoined", False).act is Policy.RESTART


@pytest.mark.parametrize(("policy", "category", "ambiguous", "acts"), [
    ("restart", "RankNotJoined", True, False),  # ambiguous verdicts are never acted on
    ("restart", "Straggler", False, False),  # slow is not stuck
    ("stop", "MissingDumps", False, False),
    ("cordon", "RankNotJoined", False, False),  # a rank's Python diverged: not the node's fault
    ("cordon", "NotCompleted", False, True),
    ("cordon", "Straggler", False, True),
    ("dry-run", "SizeMismatch", False, True),
    ("none", "RankNotJoined", False, False),
])
def test_only_clear_verdicts_of_the_right_kind_are_acted_on(policy: str, category: str, ambiguous: bool,
                                                           acts: bool) -> None:
    asked = requested_policy({ANN: policy}, None, Policy.NONE)
    decision = decide(asked, frozenset({Policy.RESTART, Policy.STOP, Policy.CORDON}), category, ambiguous)
    assert (decision.act is not Policy.NONE) == acts, decision.why


def test_saving_counts_what_is_left_of_the_watchdog_times_the_gpus() -> None:
    impact = {"watchdogTimeoutSeconds": 600.0, "gpus": 16, "ranks": 16}
    # Stalled 50 s when gathered, acted 10 s after the gather: 540 s left of 16 GPUs.
    s = saving(impact, 50.0, "2026-01-01T00:00:00Z", now=1767225610.0)
    assert (s.seconds, s.gpu_seconds) == (540.0, 8640.0)
    assert "8640 GPU-seconds saved (16 GPUs x 540 s" in s.describe(16)
    cpu = saving({"watchdogTimeoutSeconds": 1800.0, "gpus": 0, "ranks": 4}, 0.0, "2026-01-01T00:00:00Z",
                 now=1767225600.0)
    assert cpu.gpu_seconds == 0.0 and "0 GPUs held (a CPU job)" in cpu.describe(0) and cpu.rank_seconds == 7200.0
    late = saving(impact, 700.0, "2026-01-01T00:00:00Z", now=1767225600.0)
    assert late.seconds == 0.0  # past the watchdog already: nothing saved, never negative


def test_pods_give_their_gpus_node_and_timeout_env() -> None:
    pod: dict[str, Any] = {"metadata": {"name": "p", "labels": {"training.kubeflow.org/job-name": "j"}},
                           "spec": {"nodeName": "gpu-7", "containers": [
                               {"name": "pytorch", "resources": {"limits": {"nvidia.com/gpu": "8"}},
                                "env": [{"name": "FRSCOPE_WATCHDOG_TIMEOUT_SECONDS", "value": "3600"}]},
                               {"name": "helper", "resources": {"requests": {"amd.com/gpu": 1}}}]}}
    info = pod_info(pod)
    assert (info.node, info.gpus, info.env_timeout_s) == ("gpu-7", 9, 3600.0)
    bad = pod_info({"spec": {"containers": [{"name": "pytorch", "resources": {"limits": {"nvidia.com/gpu": "x"}},
                                              "env": [{"name": "FRSCOPE_WATCHDOG_TIMEOUT_SECONDS", "value": "?"}]}]}})
    assert (bad.gpus, bad.env_timeout_s) == (0, None)


def _report(uid: str, node: str, category: str = "NotCompleted", at: str = "2026-01-01T00:30:00Z",
            ambiguous: bool = False) -> dict[str, Any]:
    return {"job": {"uid": uid, "gatheredAt": at}, "impact": {"culpritNodes": [node]},
            "diagnosis": {"what": {"category": category, "ambiguous": ambiguous}}}


def test_a_node_is_blamed_by_distinct_jobs_with_node_verdicts_in_the_window() -> None:
    since = 1767225600.0  # 2026-01-01T00:00:00Z
    reports = [_report("a", "n1"), _report("a", "n1"), _report("b", "n1", "Straggler"),
               _report("c", "n1", "RankNotJoined"), _report("d", "n1", ambiguous=True),
               _report("e", "n1", at="2025-12-31T23:00:00Z"), _report("f", "n2")]
    assert blaming_jobs(reports, "n1", since) == {"a", "b"}


def test_the_rate_limit_counts_claimed_actions_not_dry_runs() -> None:
    def rec(action: str, state: str, at: str) -> dict[str, Any]:
        return {"action": ActionRecord(action, "job annotation", action, state, "", at).to_json()}

    reports = [rec("restart", "done", "2026-01-01T00:10:00Z"), rec("stop", "acting", "2026-01-01T00:20:00Z"),
               rec("restart", "failed", "2026-01-01T00:30:00Z"), rec("dry-run", "dry-run", "2026-01-01T00:40:00Z"),
               rec("restart", "skipped", "2026-01-01T00:50:00Z"), rec("restart", "done", "2025-12-31T22:00:00Z"),
               {"diagnosis": {}}]
    assert actions_since(reports, 1767225600.0) == 3
    assert actions_since(reports, 1767225600.0, action=Policy.RESTART) == 2
