"""Would a JobSet come back if every one of its pods were deleted? The JobSet failurePolicy arithmetic of
JobSet v0.12.0 and v0.11.0 (pkg/controllers/failure_policy.go; v0.11 has neither the RestartJob actions
nor per-Job restart counts, so neither is in its JobSets) over the batch Job controller of Kubernetes
1.36 (pkg/controller/job), read from the JobSet object alone.

- The Job controller counts a deleted pod that had not succeeded as a failure: within the Job's
  backoffLimit (default 6) it makes a new pod; past it the Job fails (`BackoffLimitExceeded`); with
  `backoffLimitPerIndex: 0` an index fails (`FailedIndexes`); a podFailurePolicy rule may match the
  deleted pods first: `FailJob` fails the Job (`PodFailurePolicy`), `FailIndex` its indexes
  (`FailedIndexes`). Which rule matches is not known beforehand, so every way is checked.
- A failed Job makes the JobSet apply its failurePolicy: the first rule that applies (its
  `onJobFailureReasons` empty or naming the reason, its `onJobFailureMessagePatterns` empty or one of
  them matching the Job's failure message, its `targetReplicatedJobs` empty or naming the replicated
  job) decides, `RestartJobSet` when none does. `RestartJobSet` recreates every Job and `RestartJob`
  only the failed one, each while the restarts counted so far (`status.restartsCountTowardsMax` plus
  every `replicatedJobsStatus[].jobRestartsCountTowardsMax[]`) are below `maxRestarts`; their
  `...AndIgnoreMaxRestarts` twins always do; `FailJobSet`, or no failurePolicy at all, fails the JobSet.

Failures a Job had before are in the Job's status, which frscope does not read: a Job already close to
its backoffLimit can still fail, and then only the failurePolicy brings it back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

# batch/v1 Job: the default backoffLimit.
JOB_DEFAULT_BACKOFF_LIMIT: Final = 6
# The Job controller's message for each failure reason a deletion of its pods can cause (Kubernetes 1.36,
# job_controller.go); a PodFailurePolicy failure's message names the pod and the rule, unknown beforehand.
JOB_FAILURE_MESSAGES: Final = {
    "BackoffLimitExceeded": "Job has reached the specified backoff limit",
    "FailedIndexes": "Job has failed indexes",
}
DEFAULT_ACTION: Final = "RestartJobSet"
# Actions that bring the failed Job(s) back, and those of them that count toward maxRestarts.
RESTART_ACTIONS: Final = frozenset({"RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts",
                                    "RestartJob", "RestartJobAndIgnoreMaxRestarts"})
COUNTED_ACTIONS: Final = frozenset({"RestartJobSet", "RestartJob"})


def int_field(value: Any) -> int | None:
    """A count as Kubernetes objects carry it: an int, or a string of digits; None for anything else
    (a bool, a negative or malformed string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def job_failures_without_its_pods(job_spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every way deleting every running pod of a Job of this template may fail the Job: (its failure
    reason, why); empty when the Job controller makes new pods instead. Whether a podFailurePolicy rule
    matches the deleted pods is not known beforehand, so a Job may fail more than one way: a FailJob rule
    (PodFailurePolicy), a FailIndex rule (FailedIndexes), or its counted failures when no rule matches."""
    failures: list[tuple[str, str]] = []
    parallelism = int_field(job_spec.get("parallelism", 1))
    per_index = job_spec.get("backoffLimitPerIndex")
    if per_index is not None:
        if int_field(per_index) == 0:
            failures.append(("FailedIndexes", "backoffLimitPerIndex is 0"))
    else:
        backoff = int_field(job_spec.get("backoffLimit", JOB_DEFAULT_BACKOFF_LIMIT))
        if parallelism is None or backoff is None:
            failures.append(("BackoffLimitExceeded", "its parallelism or backoffLimit is not a number"))
        elif parallelism > backoff:
            failures.append(("BackoffLimitExceeded", f"{parallelism} pod(s) deleted at once > backoffLimit {backoff}"))
    policy = job_spec.get("podFailurePolicy")
    rules = policy.get("rules") if isinstance(policy, dict) else None
    actions = {r.get("action") for r in rules or [] if isinstance(r, dict)}
    if "FailJob" in actions:
        failures.append(("PodFailurePolicy", "its podFailurePolicy may fail it"))
    if "FailIndex" in actions and not any(reason == "FailedIndexes" for reason, _ in failures):
        failures.append(("FailedIndexes", "its podFailurePolicy may fail its indexes"))
    return failures


def _message_matches(patterns: list[Any], reason: str) -> bool | None:
    """Whether one of a rule's message patterns matches the Job's failure message (an unanchored search,
    as Go's regexp.MatchString; an invalid pattern is skipped, as JobSet does); None when the message
    is not known beforehand."""
    message = JOB_FAILURE_MESSAGES.get(reason)
    if message is None:
        return None
    for pattern in patterns:
        try:
            if re.search(str(pattern), message):
                return True
        except re.error:
            continue
    return False


def _rule_applies(rule: Mapping[str, Any], replicated_job: str, reason: str) -> bool | None:
    """JobSet's ruleIsApplicable for a Job of `replicated_job` failed with `reason`; None: cannot tell."""
    reasons = rule.get("onJobFailureReasons") or []
    targets = rule.get("targetReplicatedJobs") or []
    if (reasons and reason not in reasons) or (targets and replicated_job not in targets):
        return False
    patterns = rule.get("onJobFailureMessagePatterns") or []
    return _message_matches(list(patterns), reason) if patterns else True


def possible_actions(rules: Any, replicated_job: str, reason: str) -> list[str]:
    """The actions the failurePolicy may take for such a failure, in rule order: the first rule that
    surely applies ends the list; a rule that may apply (its message pattern against a message unknown
    beforehand) adds its action and the search goes on; the default when no rule surely applies."""
    actions: list[str] = []
    for rule in rules if isinstance(rules, list) else []:
        if not isinstance(rule, dict):
            continue
        applies = _rule_applies(rule, replicated_job, reason)
        if applies is False:
            continue
        actions.append(str(rule.get("action") or ""))
        if applies:
            return actions
    return [*actions, DEFAULT_ACTION]


def restarts_counted(status: Mapping[str, Any]) -> int:
    """The restarts that count toward maxRestarts: the JobSet's and every Job's (JobSet v0.12). Not
    `status.restarts`: restartsCountTowardsMax is `omitempty` (v0.11 and v0.12), absent while no restart
    counted, also after RestartJobSetAndIgnoreMaxRestarts restarts."""
    total = int_field(status.get("restartsCountTowardsMax", 0)) or 0
    for rjob in status.get("replicatedJobsStatus") or []:
        counts = rjob.get("jobRestartsCountTowardsMax") if isinstance(rjob, dict) else None
        total += sum(int_field(c) or 0 for c in counts or [])
    return total


def jobset_restart_refusal(jobset: Mapping[str, Any]) -> str | None:
    """Why deleting every pod of this JobSet would end it instead of bringing it back, else None."""
    spec = jobset.get("spec")
    if not isinstance(spec, dict):
        return "the JobSet has no spec"
    failing: list[tuple[str, str, str]] = []
    for rjob in spec.get("replicatedJobs") or []:
        if not isinstance(rjob, dict):
            continue
        template = rjob.get("template")
        job_spec = template.get("spec") if isinstance(template, dict) else None
        for fails in job_failures_without_its_pods(job_spec if isinstance(job_spec, dict) else {}):
            failing.append((str(rjob.get("name") or ""), *fails))
    if not failing:
        return None
    name, reason, why = failing[0]
    policy = spec.get("failurePolicy")
    if not isinstance(policy, dict):
        return (f"deleting its pods fails the Job(s) of replicated job {name} ({why}) and the JobSet has no "
                "failurePolicy: the JobSet would fail instead of restarting")
    status = jobset.get("status")
    counted = restarts_counted(status if isinstance(status, dict) else {})
    max_restarts = int_field(policy.get("maxRestarts", 0)) or 0
    for name, reason, why in failing:
        actions = possible_actions(policy.get("rules"), name, reason)
        for action in actions:
            maybe = "may answer" if len(actions) > 1 else "answers"
            if action not in RESTART_ACTIONS:
                return (f"deleting its pods fails the Job(s) of replicated job {name} ({why}) and the JobSet's "
                        f"failurePolicy {maybe} {action or 'nothing'}: the JobSet would fail")
            if action in COUNTED_ACTIONS and counted >= max_restarts:
                return (f"deleting its pods fails the Job(s) of replicated job {name} ({why}) and the JobSet has "
                        f"used {counted} of its failurePolicy.maxRestarts={max_restarts}: it would fail")
    return None
