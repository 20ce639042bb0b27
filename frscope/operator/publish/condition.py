"""frscope's condition in a PyTorchJob's `status.conditions`.

The training operator's CRD shows `.status.conditions[-1:].type` as the job's STATE, and appends its
own conditions at the end. frscope's condition therefore goes first in the list: never the last
element while the training operator has written any condition of its own, and kept first when the
training operator appends. When the list holds frscope's condition alone, nothing better is possible
(it is the last element until the training operator writes one).
"""

from __future__ import annotations

from typing import Any

from frscope.operator import names


def make_condition(reason: str, message: str, now: str) -> dict[str, Any]:
    return {
        "type": names.CONDITION_TYPE,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastUpdateTime": now,
        "lastTransitionTime": now,
    }


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
