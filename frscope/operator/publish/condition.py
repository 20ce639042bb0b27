"""frscope's condition in a job's `status.conditions` (PyTorchJob, TrainJob, JobSet).

The training operator's CRD (and Trainer v2's TrainJob CRD) shows `.status.conditions[-1:].type` as
the job's STATE, and appends its own conditions at the end. frscope's condition therefore goes first
in the list: never the last element while the training operator has written any condition of its own,
and kept first when the training operator appends. When the list holds frscope's condition alone,
nothing better is possible (it is the last element until the training operator writes one).

TrainJob and JobSet conditions are `metav1.Condition` (a map list keyed by `type`): the API server
requires `lastTransitionTime`, a CamelCase `reason`, a message of at most 32,768 bytes, and the
schema has `observedGeneration` but no `lastUpdateTime`; `for_kind` shapes the condition so.
"""

from __future__ import annotations

from typing import Any

from frscope.operator import names
from frscope.operator.model.jobkinds import CONDITION_MESSAGE_MAX, JobKind


def make_condition(reason: str, message: str, now: str) -> dict[str, Any]:
    return {
        "type": names.CONDITION_TYPE,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastUpdateTime": now,
        "lastTransitionTime": now,
    }


def for_kind(ours: dict[str, Any], kind: JobKind, generation: int | None) -> dict[str, Any]:
    """`ours` in the shape of `kind`'s conditions (metav1.Condition for TrainJob and JobSet)."""
    if not kind.metav1_conditions:
        return ours
    shaped = {k: v for k, v in ours.items() if k != "lastUpdateTime"}
    message = str(shaped.get("message") or "")
    if len(message.encode()) > CONDITION_MESSAGE_MAX:
        shaped["message"] = message.encode()[: CONDITION_MESSAGE_MAX - 3].decode(errors="ignore") + "..."
    if generation is not None:
        shaped["observedGeneration"] = generation
    return shaped


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("type", "status", "reason", "message"))


def place_condition(conditions: list[dict[str, Any]], ours: dict[str, Any]) -> list[dict[str, Any]]:
    """The list with `ours` first and no other condition of our type; others keep their order.
    An identical condition already there keeps its timestamps (no needless write, no flapping)."""
    existing = next((c for c in conditions if c.get("type") == ours["type"]), None)
    keep = existing if existing is not None and _same(existing, ours) else ours
    others = [c for c in conditions if c.get("type") != ours["type"]]
    return [keep, *others]


def needs_write(conditions: list[dict[str, Any]], ours: dict[str, Any]) -> bool:
    """True when the list lacks `ours` (or has a different one), or has it somewhere but first."""
    return place_condition(conditions, ours) != conditions
