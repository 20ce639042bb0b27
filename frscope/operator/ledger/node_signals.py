"""What a node says about itself, for the node ledger (docs/actions.md, "The node ledger"): the only
hardware and node-OOM evidence it takes. A tenant writes its pods, their termination messages and its
own namespace's objects; it cannot write these:

- the Node's `.status.conditions` (the nodes/status subresource: the kubelet, node-problem-detector, a
  GPU health agent such as NVSentinel or DCGM's exporter). A condition other than the kubelet's own
  (Ready, MemoryPressure, DiskPressure, PIDPressure, NetworkUnavailable) that is `True` is a problem the
  node reports, by node-problem-detector's convention (KernelDeadlock, ReadonlyFilesystem, a GPU's Xid
  condition): hardware evidence. `--node-hardware-conditions` narrows it to a list of types.
  `MemoryPressure=True` is node-OOM evidence.
- the kubelet's Events on the Node, in `default` (where node Events live, a namespace tenants do not
  write): `SystemOOM` (the kernel's OOM killer ran outside any container's own limit) near the incident.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from frscope.analysis.suspicion import EvidenceClass, NodeSignal
from frscope.operator.kube import EVENTS, NODES, Forbidden, KubeClient, KubeError, NotFound
from frscope.operator.ledger.incident_input import parse_time

log = logging.getLogger(__name__)

# The kubelet's own conditions: Ready is good when True; the pressures are load, not faults (except memory).
KUBELET_CONDITIONS = frozenset({"Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"})
# The kubelet's Event when the kernel's OOM killer ran on the node (pkg/kubelet/oom).
OOM_EVENT_REASONS = frozenset({"SystemOOM"})
KUBELET = "kubelet"
NODE_EVENTS_NAMESPACE = "default"
ANY = "*"
MAX_CONDITIONS = 64
MAX_TEXT = 160


@dataclass(frozen=True, slots=True)
class SignalOptions:
    # Condition types that mean a hardware problem when True; "*": any but the kubelet's own.
    hardware_conditions: tuple[str, ...] = (ANY,)
    # A kubelet OOM Event this close to an incident (seconds, either side) is evidence about it.
    oom_window_s: float = 3600.0

    def __post_init__(self) -> None:
        if not self.oom_window_s > 0:
            raise ValueError("the node OOM window must be > 0 seconds")


def _text(value: Any) -> str:
    line = " ".join(value.split()) if isinstance(value, str) else ""
    return line if len(line) <= MAX_TEXT else line[: MAX_TEXT - 3] + "..."


def _conditions(node: dict[str, Any]) -> list[dict[str, Any]]:
    raw = (node.get("status") or {}).get("conditions")
    return [c for c in raw[:MAX_CONDITIONS] if isinstance(c, dict)] if isinstance(raw, list) else []


def condition_signal(node: dict[str, Any], options: SignalOptions) -> NodeSignal | None:
    """A problem the Node's conditions report now: hardware first, then memory pressure."""
    pressure: NodeSignal | None = None
    for cond in _conditions(node):
        kind, status = cond.get("type"), cond.get("status")
        if not isinstance(kind, str) or status != "True":
            continue
        said = f"{_text(cond.get('reason')) or 'no reason'}: {_text(cond.get('message'))}".rstrip(": ")
        if kind == "MemoryPressure":
            pressure = NodeSignal(EvidenceClass.NODE_OOM, f"the node's condition MemoryPressure=True ({said})")
            continue
        if kind in KUBELET_CONDITIONS:
            continue
        if ANY in options.hardware_conditions or kind in options.hardware_conditions:
            return NodeSignal(EvidenceClass.HARDWARE_EXIT, f"the node's condition {_text(kind)}=True ({said})")
    return pressure


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _event_time(event: dict[str, Any]) -> float | None:
    series = _dict(event.get("series"))
    for value in (event.get("lastTimestamp"), series.get("lastObservedTime"), event.get("eventTime"),
                  event.get("firstTimestamp")):
        at = parse_time(value)
        if at is not None:
            return at
    return None


def is_kubelet_event(event: dict[str, Any], node: str) -> bool:
    """An Event the kubelet posted about the Node `node` (its source or reporting controller)."""
    obj, source = _dict(event.get("involvedObject")), _dict(event.get("source"))
    return (obj.get("kind") == "Node" and obj.get("name") == node
            and _dict(event.get("metadata")).get("namespace", NODE_EVENTS_NAMESPACE) == NODE_EVENTS_NAMESPACE
            and KUBELET in (source.get("component"), event.get("reportingController")))


def oom_signal(events: Iterable[dict[str, Any]], node: str, at: float, options: SignalOptions) -> NodeSignal | None:
    """The kubelet's SystemOOM Event on `node` within the window around `at`."""
    for event in events:
        if not isinstance(event, dict) or event.get("reason") not in OOM_EVENT_REASONS \
                or not is_kubelet_event(event, node):
            continue
        when = _event_time(event)
        if when is not None and abs(when - at) <= options.oom_window_s:
            message = _text(event.get("message"))
            return NodeSignal(EvidenceClass.NODE_OOM, f"the kubelet reported {event['reason']} on the node"
                              + (f" ({message})" if message else ""))
    return None


class NodeSignals:
    """Reads what each implicated node says (the Node object, the kubelet's Events on it)."""

    def __init__(self, kube: KubeClient, options: SignalOptions) -> None:
        self._kube = kube
        self.options = options
        self._events_forbidden = False

    async def _kubelet_events(self, node: str) -> list[dict[str, Any]]:
        if self._events_forbidden:
            return []
        selector = f"involvedObject.kind=Node,involvedObject.name={node},source={KUBELET}"
        try:
            return await self._kube.list(EVENTS, NODE_EVENTS_NAMESPACE, field_selector=selector)
        except Forbidden as exc:  # said once: the chart's ledger Role in `default` grants list
            log.warning("node ledger: cannot list the kubelet's node Events in %s (node OOM evidence off): %s",
                        NODE_EVENTS_NAMESPACE, exc)
            self._events_forbidden = True
            return []

    async def read(self, node: str, at: float) -> NodeSignal | None:
        """What `node` says about itself around `at`; None when nothing (or it cannot be read)."""
        try:
            obj = await self._kube.get(NODES, None, node)
        except NotFound:
            return None
        except KubeError as exc:
            log.warning("node ledger: node %s not read for its conditions: %s", node, exc)
            return None
        said = condition_signal(obj, self.options)
        if said is not None and said.evidence is EvidenceClass.HARDWARE_EXIT:
            return said
        try:
            oom = oom_signal(await self._kubelet_events(node), node, at, self.options)
        except KubeError as exc:
            log.warning("node ledger: the kubelet's Events on node %s not read: %s", node, exc)
            oom = None
        return oom or said

    async def read_all(self, nodes: Iterable[str], at: float) -> dict[str, NodeSignal]:
        out: dict[str, NodeSignal] = {}
        for node in nodes:
            said = await self.read(node, at)
            if said is not None:
                out[node] = said
        return out
