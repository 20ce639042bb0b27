"""The node ledger: keeps one FlightRecorderNode per implicated node up to date (docs/actions.md, "The
node ledger").

- `on_report(event, report)`, from the operator's watch of FlightRecorderReports (every report at
  start, then each one published): a report the operator sealed (ledger.seal; any other is ignored)
  has its incident recorded on the nodes its culprit ranks ran on, with its evidence class and weight
  (analysis.suspicion) and what each node says about itself (ledger.node_signals: its conditions, the
  kubelet's OOM Events; the only hardware evidence), their score and state are written; a node that
  becomes suspected gets a Warning Event; a node ready to fence is fenced (or, by default, a dry run says it would be);
- `refresh()`, every `--node-ledger-refresh` seconds: scores decay, old incidents are forgotten, a
  fence a person lifted is recorded as released, the metrics follow.

Each object is written read-modify-write with its resourceVersion; an incident is recorded once per
node (its report's namespace/name is the key), so a restart or a second operator adds nothing twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from frscope.analysis.suspicion import Assessment, LedgerPolicy, NodeIncident, NodeState, assess, implicate, remember
from frscope.operator import names
from frscope.operator.actions import ActionOptions
from frscope.operator.kube import (
    EVENTS,
    NODE_LEDGER,
    NODES,
    REPORTS,
    AlreadyExists,
    Conflict,
    Forbidden,
    KubeClient,
    KubeError,
    NotFound,
    retry_on_conflict,
)
from frscope.operator.ledger import fencing, pools
from frscope.operator.ledger.fencing import FencingOptions
from frscope.operator.ledger.incident_input import incident_from_report, parse_time, report_key
from frscope.operator.ledger.ledger_metrics import LedgerMetrics
from frscope.operator.ledger.ledger_object import (
    FAILED,
    FENCED,
    FENCING,
    SKIPPED,
    WOULD_FENCE,
    FenceRecord,
    LedgerEntry,
    rfc3339,
)
from frscope.operator.ledger.node_signals import NodeSignals, SignalOptions
from frscope.operator.ledger.seal import LedgerSeal
from frscope.operator.model.objects import JobRef
from frscope.operator.publish import build_event, clip_line

log = logging.getLogger(__name__)

MAX_SEEN = 100_000
# A claim ('fencing') this old was left by an operator that died before recording the outcome.
STALE_CLAIM_S = 30.0


@dataclass(frozen=True, slots=True)
class NodeLedgerOptions:
    """The ledger's own settings; the limits it shares with the action policy (--action-rate,
    --cordon-max-nodes, the watched namespaces) come from its ActionOptions."""

    policy: LedgerPolicy = field(default_factory=LedgerPolicy)
    fencing: FencingOptions = field(default_factory=FencingOptions)
    signals: SignalOptions = field(default_factory=SignalOptions)
    refresh_s: float = 60.0
    # The seal's key (ledger.seal): this file, else the sidecar CA's key, else random per process.
    key_file: Path | None = None

    def __post_init__(self) -> None:
        if not self.refresh_s > 0:
            raise ValueError("--node-ledger-refresh must be > 0")


def by_whom(by: str) -> str:
    return f"by {by}" if by != fencing.NOT_RECORDED else f"who: {by}"


def _tag(key: str) -> str:
    """A label-safe stand-in for an incident's key (namespace/name) in Event names and labels."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class NodeLedger:
    def __init__(self, kube: KubeClient, metrics: LedgerMetrics, options: NodeLedgerOptions, actions: ActionOptions,
                 *, instance: str, seal: LedgerSeal, clock: Callable[[], float] = time.time) -> None:
        self._kube = kube
        self._seal = seal
        self._signals = NodeSignals(kube, options.signals)
        self._metrics = metrics
        self.options = options
        self._actions = actions
        # Reports already recorded (or found recorded): their watch events (an action written, a revision)
        # need no API read. Bounded: past MAX_SEEN it starts again (the objects dedupe anyway).
        self._seen: set[str] = set()
        # The ledger as last read or written, for the web UI: node -> (entry, assessment).
        self.latest: dict[str, tuple[LedgerEntry, Assessment]] = {}
        self._instance = instance
        self._clock = clock
        # One node at a time: the fence budget is counted from the ledger, so a decision must see the ones before.
        self._lock = asyncio.Lock()

    # -- recording ---------------------------------------------------------------------------------
    async def record_report(self, namespace: str, name: str) -> None:
        """Record a published report's incident (the Controller's hook). Never raises for API errors."""
        try:
            report = await self._kube.get(REPORTS, namespace, name)
        except NotFound:
            return
        except KubeError as exc:
            log.error("node ledger: report %s/%s not read: %s", namespace, name, exc)
            return
        await self.record(report)

    async def on_report(self, event_type: str | None, report: dict[str, Any]) -> None:
        """A FlightRecorderReport's watch event (kopf lists every report at start, then each change): a
        report not recorded yet is. Never raises for API errors."""
        if event_type == "DELETED":
            return
        key = report_key(report)
        if key in self._seen:
            return
        if await self.record(report):
            if len(self._seen) >= MAX_SEEN:
                self._seen.clear()
            self._seen.add(key)

    async def record(self, report: dict[str, Any]) -> bool:
        """Record the report's incident on each node it implicates; False when a write failed (try again
        on the report's next event). A report the operator did not seal is never recorded."""
        incident = incident_from_report(report)
        if incident is None:
            return True
        if not self._seal.verify(report):
            self._metrics.unsealed.inc()
            log.warning("node ledger: report %s ignored: not sealed by this operator (made or changed by someone "
                        "else, or sealed under another key)", incident.key)
            return True
        ok = True
        for node in sorted(n for n in incident.nodes if n):
            try:
                if incident.key in (await self._read(node)).known_keys:
                    continue
                signal = await self._signals.read(node, incident.at)
                with_signal = replace(incident, node_signals={node: signal} if signal is not None else {})
                await self._record_on(node, implicate(with_signal)[node])
            except KubeError as exc:
                ok = False
                log.error("node ledger: incident %s not recorded on node %s: %s", incident.key, node, exc)
        return ok

    def _assess(self, entry: LedgerEntry, now: float) -> Assessment:
        return assess(entry.incidents, now, self.options.policy,
                      fenced=entry.fence is not None and entry.fence.holding, released_at=entry.released_at)

    async def _read(self, node: str) -> LedgerEntry:
        try:
            return LedgerEntry.from_object(await self._kube.get(NODE_LEDGER, None, node))
        except NotFound:
            pass
        try:
            pool = pools.pool_of(await self._kube.get(NODES, None, node), self.options.fencing.pool_labels)
        except NotFound:
            pool = ""
        return LedgerEntry(node=node, pool=pool)

    async def _write(self, entry: LedgerEntry, assessment: Assessment, now: float) -> LedgerEntry:
        body = entry.to_object(assessment, now)
        if entry.resource_version:
            written = await self._kube.replace(NODE_LEDGER, None, entry.node, body)
        else:
            written = await self._kube.create(NODE_LEDGER, None, body)
        out = LedgerEntry.from_object(written)
        self.latest[out.node] = (out, assessment)
        return out

    async def _record_on(self, node: str, item: NodeIncident) -> None:
        async with self._lock:
            now = self._clock()

            async def cycle() -> tuple[LedgerEntry, Assessment, str] | None:
                entry = await self._read(node)
                if item.key in entry.known_keys:
                    return None
                was = entry.state
                entry.incidents = remember(entry.incidents, [item], now, self.options.policy)
                if item.key not in entry.known_keys:
                    return None  # older than the ledger's memory
                assessment = self._assess(entry, now)
                return await self._write(entry, assessment, now), assessment, was

            try:
                done = await retry_on_conflict(cycle)
            except AlreadyExists:  # created meanwhile by another writer: read it and merge again
                done = await retry_on_conflict(cycle)
            if done is None:
                return
            entry, assessment, was = done
            self._metrics.incidents.labels(evidence=item.evidence.value).inc()
            self._metrics.one(node, assessment.score)
            log.info("node ledger: %s: %s (%s, weight %s): %s", node, item.key, item.evidence.value, item.weight,
                     assessment.why)
            if assessment.state is NodeState.SUSPECTED and was != NodeState.SUSPECTED.value:
                await self._node_event(node, names.REASON_NODE_SUSPECTED, item.key, now, "Warning",
                                       f"frscope: node {node} is suspected: {assessment.why}. Latest: job {item.job}, "
                                       f"{item.why}. kubectl get frnode {node} -o yaml")
            if assessment.fence_ready and item.weight > 0:  # only evidence against the node decides a fence
                await self._fence(entry, assessment, item, now)

    # -- fencing -----------------------------------------------------------------------------------
    async def _entries(self) -> list[LedgerEntry]:
        return [LedgerEntry.from_object(o) for o in await self._kube.list(NODE_LEDGER)]

    async def _set_fence(self, node: str, fence: FenceRecord, now: float, *, resource_version: str | None = None
                         ) -> LedgerEntry:
        """Write the fence record (and the summary it changes). With `resource_version`: only if the object
        is still that version (the claim: Conflict when another writer came first)."""

        async def cycle() -> LedgerEntry:
            entry = await self._read(node)
            if resource_version is not None and entry.resource_version != resource_version:
                raise Conflict(409, "Conflict", f"frnode {node} changed since it was read")
            entry.fence = fence
            return await self._write(entry, self._assess(entry, now), now)

        if resource_version is not None:
            return await cycle()
        return await retry_on_conflict(cycle)

    async def _fence(self, entry: LedgerEntry, assessment: Assessment, item: NodeIncident, now: float) -> None:
        opts = self.options.fencing
        if opts.mode == "off":
            return
        node, stamp = entry.node, rfc3339(now)
        base = entry.fence or FenceRecord(state=WOULD_FENCE, at=stamp)
        what = "cordon" + (" and taint" if opts.taint else "")
        try:
            why_not = await fencing.refusal(self._kube, node, item.key, await self._entries(), options=opts,
                                            rate_per_hour=self._actions.rate_per_hour,
                                            max_nodes=self._actions.cordon.max_nodes, now=now)
        except KubeError as exc:
            why_not = f"the cluster could not be read: {exc}"
        record = replace(base, at=stamp, mode=opts.mode, incident=item.key, cordoned=False, tainted=False)
        if opts.mode == "dry-run":
            message = clip_line(f"Dry run: would {what} node {node}: {assessment.why}"
                                + (f"; but {why_not}" if why_not else "") + " (--node-fencing dry-run)")
            await self._set_fence(node, replace(record, state=WOULD_FENCE, message=message), now)
            self._metrics.fences.labels(outcome="dry-run").inc()
            await self._node_event(node, names.REASON_NODE_FENCE_DRY_RUN, item.key, now, "Normal", message)
            return
        if why_not is not None:
            message = clip_line(f"Not fencing node {node}: {why_not}. {assessment.why}")
            await self._set_fence(node, replace(record, state=SKIPPED, message=message), now)
            self._metrics.fences.labels(outcome="skipped").inc()
            await self._node_event(node, names.REASON_NODE_FENCE_SKIPPED, item.key, now, "Normal", message)
            return
        try:
            await self._set_fence(node, replace(record, state=FENCING, message=f"{what} under way"), now,
                                            resource_version=entry.resource_version)
        except Conflict:
            log.info("node ledger: %s changed meanwhile (another operator?): not fencing now", node)
            return
        try:
            _, tainted = await fencing.cordon_node(self._kube, node, trigger=item.key,
                                                          evidence=item.evidence.value, taint=opts.taint, now=stamp)
        except KubeError as exc:
            message = clip_line(f"Fencing node {node} failed: {exc}")
            await self._set_fence(node, replace(record, state=FAILED, message=message), now)
            self._metrics.fences.labels(outcome="failed").inc()
            await self._node_event(node, names.REASON_NODE_FENCE_FAILED, item.key, now, "Warning", message)
            return
        message = clip_line(f"Cordoned node {node}" + (f", tainted {names.TAINT_SUSPECT}:NoSchedule" if tainted else "")
                            + f": {assessment.why}. Latest: job {item.job}, {item.why}. Uncordon it when it is "
                            "fixed (kubectl uncordon); frscope fences it again only on new incidents.")
        await self._set_fence(node, replace(record, state=FENCED, cordoned=True, tainted=opts.taint, message=message),
                              now)
        self._metrics.fences.labels(outcome="done").inc()
        await self._node_event(node, names.REASON_NODE_FENCED, item.key, now, "Warning", message)

    # -- refreshing --------------------------------------------------------------------------------
    async def refresh(self) -> None:
        """Decay, forget, notice a person's uncordon, and show the metrics."""
        now = self._clock()
        async with self._lock:
            objects = await self._kube.list(NODE_LEDGER)
            nodes = {pools.node_name(n): n for n in await self._kube.list(NODES)}
            scores: dict[str, float] = {}
            states: dict[str, NodeState] = {}
            for obj in objects:
                entry = LedgerEntry.from_object(obj)
                try:
                    assessment = await self._refresh_one(obj, entry, nodes.get(entry.node), now)
                except Conflict:
                    continue  # written meanwhile: the next round sees it
                except KubeError as exc:
                    log.error("node ledger: refreshing %s failed: %s", entry.node, exc)
                    continue
                if assessment is not None:
                    scores[entry.node] = assessment.score
                    states[entry.node] = assessment.state
            self._metrics.show(scores, states)

    async def _refresh_one(self, obj: dict[str, Any], entry: LedgerEntry, node: dict[str, Any] | None,
                           now: float) -> Assessment | None:
        changed = False
        fence = entry.fence
        claimed_at = parse_time(fence.at) if fence is not None else None
        if fence is not None and fence.state == FENCING and node is not None and claimed_at is not None \
                and now - claimed_at >= STALE_CLAIM_S:
            # An operator died between claiming the fence and recording it: finish the same, idempotent cordon.
            log.warning("node ledger: finishing the fence of %s claimed at %s", entry.node, fence.at)
            _, tainted = await fencing.cordon_node(self._kube, entry.node, trigger=fence.incident, evidence="unknown",
                                                   taint=self.options.fencing.taint, now=rfc3339(now))
            entry.fence = replace(fence, state=FENCED, cordoned=True, tainted=self.options.fencing.taint,
                                  message=f"{fence.message}; finished after an operator restart")
            changed = True
        elif entry.fence is not None and fencing.lifted(entry, node):
            assert node is not None
            by = fencing.released_by(node, parse_time(entry.fence.at) or 0.0)
            entry.fence = entry.fence.released(rfc3339(now), by)
            changed = True
            self._metrics.fences.labels(outcome="released").inc()
            await self._node_event(entry.node, names.REASON_NODE_RELEASED, f"released-{entry.fence.at}", now, "Normal",
                                   f"frscope: node {entry.node} was made schedulable again ({by_whom(by)}): recorded; "
                                   "frscope fences it again only on new incidents.")
        kept = remember(entry.incidents, [], now, self.options.policy)
        changed |= len(kept) != len(entry.incidents)
        entry.incidents = kept
        holding = entry.fence is not None and entry.fence.holding
        if not kept and not holding:
            await self._kube.delete(NODE_LEDGER, None, entry.node)
            self.latest.pop(entry.node, None)
            return None
        assessment = self._assess(entry, now)
        self.latest[entry.node] = (entry, assessment)
        raw = obj.get("summary")
        summary: dict[str, Any] = raw if isinstance(raw, dict) else {}
        old_score = summary.get("score") if isinstance(summary.get("score"), (int, float)) else None
        if changed or old_score is None or abs(old_score - assessment.score) >= 0.01 \
                or summary.get("state") != assessment.state.value:
            await self._write(entry, assessment, now)
        return assessment

    async def run(self) -> None:
        """Refresh every `refresh_s` (the operator runs it as a task; cancel to stop). Reports come from
        the operator's report watch (`on_report`), which lists every report at start too."""
        unavailable = False
        while True:
            try:
                await self.refresh()
                unavailable = False
            except (NotFound, Forbidden) as exc:
                if not unavailable:  # said once, until it works: the CRD is not installed, or no permission
                    log.warning("node ledger: cannot read flightrecordernodes or nodes (is the FlightRecorderNode "
                                "CRD installed, the chart's nodeLedger RBAC granted?): %s", exc)
                unavailable = True
            except KubeError as exc:
                log.error("node ledger: refresh failed: %s", exc)
            await asyncio.sleep(self.options.refresh_s)

    # -- events ------------------------------------------------------------------------------------
    async def _node_event(self, node: str, reason: str, key: str, now: float, event_type: str, message: str) -> None:
        """An Event on the Node (in 'default', where node Events live). Never raises: the ledger has it."""
        try:
            obj = await self._kube.get(NODES, None, node)
            ref = JobRef(namespace="default", name=node, uid=str((obj.get("metadata") or {}).get("uid") or ""),
                         api_version="v1", kind="Node")
            event = build_event(ref, reason=reason, message=message, incident=_tag(key), now=rfc3339(now),
                                instance=self._instance, event_type=event_type)
            event["involvedObject"]["namespace"] = ""
            await self._kube.create(EVENTS, "default", event)
        except AlreadyExists:
            pass
        except KubeError as exc:
            log.warning("node ledger: Event %s on node %s not posted: %s", reason, node, exc)
