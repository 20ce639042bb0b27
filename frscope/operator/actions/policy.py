"""Which action a diagnosis calls for: the policy a job asked for, what the operator allows, and
whether the verdict is one to act on. Pure functions; the Actor does the I/O.

    job annotation frscope.io/on-diagnosis  >  Namespace annotation  >  operator default (--default-policy)

The operator performs only what `--allow-actions` lists; anything else asked for is a dry run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from frscope.operator import names


class Policy(StrEnum):
    NONE = "none"
    DRY_RUN = "dry-run"
    RESTART = "restart"
    STOP = "stop"
    CORDON = "cordon"


# Policies that change the cluster (and so must be allowed with --allow-actions).
ACTIONS: tuple[Policy, ...] = (Policy.RESTART, Policy.STOP, Policy.CORDON)

# Verdicts that mean "this job will not finish this collective": restarting or stopping it ends idle
# GPUs early. A straggler is slow, not stuck; missing dumps say too little.
HANG_CATEGORIES = frozenset({"RankNotJoined", "NotCompleted", "CollectiveTypeMismatch", "SizeMismatch",
                             "DtypeMismatch", "P2PMismatch"})
# Verdicts that point at a device or the fabric (every rank joined, one never completed; a rank
# repeatedly slow): the only ones a node may be cordoned for.
NODE_CATEGORIES = frozenset({"NotCompleted", "Straggler"})


def parse_policy(value: Any) -> Policy | None:
    """The policy an annotation names, None for a missing or unknown value (the next level decides)."""
    if not isinstance(value, str):
        return None
    try:
        return Policy(value.strip().lower())
    except ValueError:
        return None


def parse_allowed(text: str | Iterable[str]) -> frozenset[Policy]:
    """`--allow-actions restart,stop,cordon` (or 'none'/''). Unknown names are an error, named."""
    items = text.split(",") if isinstance(text, str) else list(text)
    allowed: set[Policy] = set()
    for raw in items:
        item = raw.strip().lower()
        if not item or item == "none":
            continue
        policy = parse_policy(item)
        if policy not in ACTIONS:
            raise ValueError(f"--allow-actions: {raw.strip()!r} is not one of {', '.join(ACTIONS)}")
        assert policy is not None
        allowed.add(policy)
    return frozenset(allowed)


@dataclass(frozen=True, slots=True)
class Requested:
    policy: Policy
    source: str  # 'job annotation', 'namespace annotation', 'operator default'


def requested_policy(job_annotations: Mapping[str, Any] | None, namespace_annotations: Mapping[str, Any] | None,
                     default: Policy) -> Requested:
    job = parse_policy((job_annotations or {}).get(names.ANN_ON_DIAGNOSIS))
    if job is not None:
        return Requested(job, "job annotation")
    namespace = parse_policy((namespace_annotations or {}).get(names.ANN_ON_DIAGNOSIS))
    if namespace is not None:
        return Requested(namespace, "namespace annotation")
    return Requested(default, "operator default")


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do about one diagnosis: `act` is the policy carried out (NONE: nothing, DRY_RUN: an
    Event saying what `requested` would have done), `why` one line for the Event and the report."""

    requested: Requested
    act: Policy
    why: str

    @property
    def changes_cluster(self) -> bool:
        return self.act in ACTIONS


def eligible(policy: Policy, category: str, ambiguous: bool) -> str | None:
    """None when `policy` may act on this verdict; else why not (one line)."""
    if ambiguous:
        return "the verdict is ambiguous (no majority among the ranks): frscope acts only on a clear one"
    if policy in (Policy.RESTART, Policy.STOP) and category not in HANG_CATEGORIES:
        return f"{category} is not a hang: {policy} acts only on {', '.join(sorted(HANG_CATEGORIES))}"
    if policy is Policy.CORDON and category not in NODE_CATEGORIES:
        return f"{category} does not point at a node: cordon acts only on {', '.join(sorted(NODE_CATEGORIES))}"
    return None


def decide(requested: Requested, allowed: frozenset[Policy], category: str, ambiguous: bool) -> Decision:
    """The policy asked for, gated by the verdict and by what the operator was started to allow."""
    policy = requested.policy
    if policy is Policy.NONE:
        return Decision(requested, Policy.NONE, f"policy none ({requested.source})")
    # A dry run says what the job's own policy would do; a bare 'dry-run' is a restart's dry run.
    target = policy if policy is not Policy.DRY_RUN else Policy.RESTART
    refused = eligible(target, category, ambiguous)
    if refused is not None:
        return Decision(requested, Policy.NONE, refused)
    if policy is Policy.DRY_RUN:
        return Decision(requested, Policy.DRY_RUN, f"policy dry-run ({requested.source})")
    if policy not in allowed:
        listed = ",".join(sorted(allowed)) or "none"
        return Decision(requested, Policy.DRY_RUN,
                        f"policy {policy} ({requested.source}) is not allowed by --allow-actions={listed}: dry run")
    return Decision(requested, policy, f"policy {policy} ({requested.source}), allowed by --allow-actions")
