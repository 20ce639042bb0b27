"""A randomized sweep of frscope's JobSet restart refusal (frscope/operator/model/jobset_restart.py) over
JobSets shaped as JobSet v0.11.0 stores them, against an oracle written here from the controllers' own
rules rather than from the model:

- JobSet v0.11.0 (pkg/controllers/failure_policy.go): no failurePolicy fails the JobSet; otherwise the
  first rule (in rule order) that applies to ANY of the Jobs failed at that reconcile decides, the
  default RestartJobSet when none does; its actions are only FailJobSet, RestartJobSet (while
  status.restartsCountTowardsMax < maxRestarts) and RestartJobSetAndIgnoreMaxRestarts; its status has
  no replicatedJobsStatus[].jobRestartsCountTowardsMax, and restartsCountTowardsMax is `omitempty`
  (absent when 0, even after restarts that did not count).
- The batch Job controller, when every running pod of a Job is deleted: a podFailurePolicy rule may
  match the deleted pods (whether it does depends on their exit code and conditions, unknown
  beforehand): FailJob fails the Job (PodFailurePolicy), FailIndex fails the indexes (FailedIndexes),
  Ignore does not count them; counted failures fail the Job past backoffLimit (BackoffLimitExceeded)
  or, with backoffLimitPerIndex, each index past its limit (FailedIndexes).

The oracle enumerates every way it can go (which podFailurePolicy rule matched, which of the failed
Jobs the JobSet controller saw first, which message patterns an unknown message matches). frscope must
refuse exactly when one of them ends the JobSet: a restart it allows must never fail the JobSet, and
it must not refuse one that always comes back.
"""

from __future__ import annotations

import itertools
import random
import re
from typing import Any

import pytest

from frscope.operator.model.jobset_restart import jobset_restart_refusal

SEEDS = range(6)
CASES_PER_SEED = 600
V011_ACTIONS = ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts")
REASONS = ("BackoffLimitExceeded", "FailedIndexes", "PodFailurePolicy", "DeadlineExceeded")
# The Job controller's messages (Kubernetes 1.36, job_controller.go); a PodFailurePolicy failure's names
# the pod and the rule, so it is not known beforehand.
MESSAGES = {"BackoffLimitExceeded": "Job has reached the specified backoff limit",
            "FailedIndexes": "Job has failed indexes"}
# Patterns that Go's regexp and Python's re read alike ("(" is invalid in both and skipped by JobSet).
PATTERNS = ("backoff limit", "^Job has", "failed indexes", "exit code 143", "^OOM", "(", "limit$", "")
REPLICATED = ("node", "launcher", "init")


# -- the oracle --------------------------------------------------------------------------------------
def job_failures(job_spec: dict[str, Any]) -> set[str | None]:
    """Every way a Job ends up when all its running pods are deleted: a failure reason, or None (it
    makes new pods)."""
    pods = job_spec.get("parallelism", 1)
    rules = (job_spec.get("podFailurePolicy") or {}).get("rules") or []
    outcomes: set[str | None] = set()
    # Whichever rule matched first (each may, none may): its action for every deleted pod.
    for action in [r["action"] for r in rules] + ["Count"]:
        if action == "FailJob":
            outcomes.add("PodFailurePolicy")
        elif action == "FailIndex":
            outcomes.add("FailedIndexes")
        elif action == "Ignore":
            outcomes.add(None)
        elif "backoffLimitPerIndex" in job_spec:
            outcomes.add("FailedIndexes" if job_spec["backoffLimitPerIndex"] < 1 else None)
        else:
            outcomes.add("BackoffLimitExceeded" if pods > job_spec.get("backoffLimit", 6) else None)
    return outcomes


def jobset_ends(jobset: dict[str, Any]) -> bool:
    """Whether some way of deleting every pod of this JobSet ends it (Failed) instead of restarting it."""
    spec, status = jobset["spec"], jobset.get("status", {})
    per_job = [[(r["name"], f) for f in job_failures(r["template"]["spec"])] for r in spec["replicatedJobs"]]
    policy = spec.get("failurePolicy")
    for outcome in itertools.product(*per_job):
        failed = [(name, reason) for name, reason in outcome if reason is not None]
        if not failed:
            continue
        if policy is None:
            return True
        rules = policy.get("rules") or []
        # Which failed Jobs the controller saw when it applied the policy: any non-empty subset.
        for size in range(1, len(failed) + 1):
            for seen in itertools.combinations(failed, size):
                # A message pattern against an unknown message: each rule's match either way.
                unknown = [i for i, r in enumerate(rules) if r.get("onJobFailureMessagePatterns")]
                for matches in itertools.product((False, True), repeat=len(unknown)):
                    guessed = dict(zip(unknown, matches, strict=True))
                    if _action_ends(_action(rules, seen, guessed), policy, status):
                        return True
    return False


def _applies(rule: dict[str, Any], name: str, reason: str, guessed: bool) -> bool:
    if rule.get("onJobFailureReasons") and reason not in rule["onJobFailureReasons"]:
        return False
    patterns = rule.get("onJobFailureMessagePatterns")
    if patterns:
        message = MESSAGES.get(reason)
        if message is None:
            matched = guessed
        else:
            matched = False
            for pattern in patterns:
                try:
                    matched = matched or re.search(pattern, message) is not None
                except re.error:
                    continue
        if not matched:
            return False
    return not rule.get("targetReplicatedJobs") or name in rule["targetReplicatedJobs"]


def _action(rules: list[dict[str, Any]], seen: tuple[tuple[str, str], ...], guessed: dict[int, bool]) -> str:
    for index, rule in enumerate(rules):
        if any(_applies(rule, name, reason, guessed.get(index, False)) for name, reason in seen):
            return str(rule["action"])
    return "RestartJobSet"


def _action_ends(action: str, policy: dict[str, Any], status: dict[str, Any]) -> bool:
    if action == "FailJobSet":
        return True
    if action == "RestartJobSet":
        return int(status.get("restartsCountTowardsMax", 0)) >= int(policy.get("maxRestarts", 0))
    return False  # RestartJobSetAndIgnoreMaxRestarts


# -- v0.11-shaped JobSets ------------------------------------------------------------------------------
def random_job_spec(rng: random.Random) -> dict[str, Any]:
    spec: dict[str, Any] = {"completionMode": "Indexed"}
    parallelism = rng.choice([None, 1, 2, 4, 6, 7, 8, 16])
    if parallelism is not None:
        spec["parallelism"] = spec["completions"] = parallelism
    per_index = rng.random() < 0.25
    if per_index:
        spec["backoffLimitPerIndex"] = rng.choice([0, 0, 1, 3])
    elif rng.random() < 0.7:
        spec["backoffLimit"] = rng.choice([0, 1, 2, 6, 8, 100])
    if rng.random() < 0.3:
        actions = ["FailJob", "Ignore", "Count"] + (["FailIndex"] if per_index else [])
        spec["podFailurePolicy"] = {"rules": [
            {"action": rng.choice(actions), "onExitCodes": {"operator": "In", "values": [rng.choice([1, 137, 143])]}}
            for _ in range(rng.randint(1, 2))]}
    return spec


def random_rule(rng: random.Random, index: int, names: list[str]) -> dict[str, Any]:
    rule: dict[str, Any] = {"name": f"r{index}", "action": rng.choice(V011_ACTIONS)}
    if rng.random() < 0.4:
        rule["onJobFailureReasons"] = rng.sample(REASONS, rng.randint(1, 2))
    if rng.random() < 0.35:
        rule["onJobFailureMessagePatterns"] = rng.sample(PATTERNS, rng.randint(1, 2))
    if rng.random() < 0.35:
        rule["targetReplicatedJobs"] = rng.sample(names, rng.randint(1, len(names)))
    return rule


def random_jobset(rng: random.Random) -> dict[str, Any]:
    names = list(REPLICATED[:rng.randint(1, 3)])
    spec: dict[str, Any] = {
        "successPolicy": {"operator": "All"}, "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "replicatedJobs": [{"name": n, "replicas": rng.randint(1, 3), "template": {"spec": random_job_spec(rng)}}
                           for n in names]}
    if rng.random() < 0.8:
        policy: dict[str, Any] = {"restartStrategy": rng.choice(["Recreate", "BlockingRecreate"])}
        if rng.random() < 0.85:
            policy["maxRestarts"] = rng.randint(0, 4)
        if rng.random() < 0.7:
            policy["rules"] = [random_rule(rng, i, names) for i in range(rng.randint(1, 3))]
        spec["failurePolicy"] = policy
    # v0.11's status: restarts, restartsCountTowardsMax (omitempty: absent when 0), no per-Job counts.
    restarts = rng.randint(0, 4)
    counted = rng.randint(0, restarts)
    status: dict[str, Any] = {"restarts": restarts, "replicatedJobsStatus": [
        {"name": n, "ready": 0, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0} for n in names]}
    if counted:
        status["restartsCountTowardsMax"] = counted
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"},
            "spec": spec, "status": status}


@pytest.mark.parametrize("seed", SEEDS)
def test_the_refusal_matches_jobset_v0_11_on_random_jobsets(seed: int) -> None:
    rng = random.Random(seed)
    wrong: list[str] = []
    refused = 0
    for case in range(CASES_PER_SEED):
        jobset = random_jobset(rng)
        refusal = jobset_restart_refusal(jobset)
        ends = jobset_ends(jobset)
        refused += refusal is not None
        if ends != (refusal is not None):
            wrong.append(f"case {case}: the JobSet {'ends' if ends else 'comes back'}, frscope said {refusal!r}: "
                         f"{jobset['spec']} {jobset['status']}")
    assert not wrong, f"{len(wrong)} of {CASES_PER_SEED} wrong (seed {seed}); first:\n" + "\n".join(wrong[:3])
    # The sweep reaches both answers, not only one.
    assert CASES_PER_SEED // 10 < refused < CASES_PER_SEED - CASES_PER_SEED // 10, refused


def test_the_oracle_knows_the_cases_the_model_was_written_for() -> None:
    """The oracle itself, on hand-made JobSets whose fate the controllers' rules fix."""
    def js(job: dict[str, Any], policy: dict[str, Any] | None, status: dict[str, Any]) -> dict[str, Any]:
        spec: dict[str, Any] = {"replicatedJobs": [{"name": "node", "template": {"spec": job}}]}
        if policy is not None:
            spec["failurePolicy"] = policy
        return {"spec": spec, "status": status}

    assert not jobset_ends(js({}, None, {}))  # within the default backoffLimit 6
    assert jobset_ends(js({"backoffLimit": 0}, None, {}))
    assert not jobset_ends(js({"backoffLimit": 0}, {"maxRestarts": 1}, {"restarts": 3}))  # none counted
    assert jobset_ends(js({"backoffLimit": 0}, {"maxRestarts": 1}, {"restarts": 1, "restartsCountTowardsMax": 1}))
    fail_job = {"backoffLimit": 6, "podFailurePolicy": {"rules": [{"action": "FailJob"}]}}
    assert jobset_ends(js(fail_job, {"maxRestarts": 5, "rules": [
        {"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]}, {}))
    assert not jobset_ends(js(fail_job, {"maxRestarts": 5, "rules": [
        {"action": "FailJobSet", "onJobFailureReasons": ["BackoffLimitExceeded"]}]}, {}))
