"""When a job's evidence is complete enough to diagnose, and which copy of a pod's snapshot counts.

A pod's evidence comes fetched from its sidecar (`gather`) or pushed by it (`push_store`: at a stall,
and when its trainer exits). `collect` fetches from every pod of the job and lets pushes stand in where
a fetch brought nothing; `take_pushes` is the one rule for that.

A crash ends ranks in several pods within a second, and the kubelet reports each container's end a
few seconds apart: diagnosed on the first end alone, a peer that died of the crash (gloo's "Connection
closed by peer") would be named instead of the rank that raised, or the crashed pod's ranks reported
missing. So while a crash is under way (`crash_under_way`), `await_exits` waits up to `--exit-settle`
for the ends that are coming (`exits_coming`), then takes the pushes that arrived meanwhile (a pod's
second rank going down pushes again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Set
from typing import Any

from frscope.operator.evidence.gather import Decoder, Gathered, GatherOptions, Target, gather
from frscope.operator.evidence.pod_evidence import PodEvidence
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.evidence.sidecars import SidecarClient
from frscope.operator.model.objects import PodInfo
from frscope.operator.model.store import JobView

log = logging.getLogger(__name__)

SETTLE_POLL_S = 0.5  # how often the store is looked at while waiting for a kubelet's word on an exit


def pod_uids(pods: tuple[PodInfo, ...]) -> dict[str, str]:
    return {p.name: p.uid for p in pods if p.uid}


def belongs(uids: Mapping[str, str], pod: str, evidence: PodEvidence) -> bool:
    """Whether a push from `pod` is from the pod of that name now (`uids`: the job's pods now, by name).
    A job's pods keep their names across a restart; a push that names its pod's uid is told from the
    previous pod's by it. A pod that is no longer in the job (deleted) keeps what it pushed."""
    return not evidence.pod_uid or uids.get(pod, evidence.pod_uid) == evidence.pod_uid


def not_asked(pod: PodInfo, push: PodEvidence | None) -> str | None:
    """Why a pod's sidecar is not asked: the pod has ended, and its native sidecar stopped with it (its
    address may stay in the status while nothing answers there: each try would wait out its timeout);
    or its trainer's current run has ended and the sidecar pushed what it had at the exit (it is being
    stopped). Its pushes are the evidence then."""
    if pod.phase in ("Succeeded", "Failed"):
        return f"the pod has ended (phase {pod.phase}); its sidecar stopped with it"
    if push is not None and push.reason == "exit" and any(t.run == pod.run for t in pod.terminations):
        return "its trainer has ended and its sidecar pushed what it had at the exit"
    return None


def take_pushes(gathered: Gathered, pushed: Mapping[str, PodEvidence], uids: Mapping[str, str], *,
                emptied: Set[str] = frozenset()) -> None:
    """Each pod's push stands in for what was gathered from it, when the push is that pod's
    (`belongs`) and what was gathered is nothing, a push (a newer one may have come), no rank at all,
    or, for the pods in `emptied` (their trainers were ending as they were asked), ranks without
    recorder entries."""
    for pod, evidence in pushed.items():
        if not belongs(uids, pod, evidence):
            continue
        current = gathered.pods.get(pod)
        if (current is None or pod in gathered.from_push or not current.dumps
                or (pod in emptied and not any(d.entries for d in current.dumps))):
            gathered.pods[pod] = evidence
            gathered.from_push.add(pod)
            gathered.failures.pop(pod, None)


async def collect(client: SidecarClient, view: JobView, options: GatherOptions, pushes: PushStore, *,
                  gone_pods: set[str], decoder: Decoder) -> Gathered:
    """Every pod of the job gathered, its push standing in where its fetch brought nothing; `gone_pods`:
    pods already deleted whose pushes still count."""
    namespace = view.ref.namespace
    names = {p.name for p in view.pods}
    uids = pod_uids(view.pods)
    pushed = {n: e for n, e in pushes.for_namespace_pods(namespace, names).items() if belongs(uids, n, e)}
    targets = [Target(p.name, p.endpoint, not_asked(p, pushed.get(p.name)), p.uid) for p in view.pods]
    started = time.monotonic()
    gathered = await gather(client, namespace, targets, options, decoder=decoder)
    take_pushes(gathered, pushes.for_namespace_pods(namespace, names | gone_pods), uids)
    gathered.duration_s = time.monotonic() - started
    return gathered


def _has_live_rank(evidence: PodEvidence | None) -> bool:
    """Whether the pod delivered a recorder with entries for a rank its sidecar does not report down
    (a hung peer of a crash: its pod is not about to end)."""
    if evidence is None:
        return False
    down = {p.rank for p in evidence.problems if p.kind == "error" and p.rank is not None}
    return any(d.entries and d.rank not in down for d in evidence.dumps)


def crash_under_way(pods: tuple[PodInfo, ...], gathered: Gathered, pushed_exit: bool = False) -> bool:
    """A trainer run has ended with a failure, or a sidecar saw its ranks exit (`pushed_exit`: one
    pushed at an exit, whatever the gather then fetched from it)."""
    if pushed_exit or any(e.reason == "exit" for e in gathered.pods.values()):
        return True
    return any(t.run == p.run and t.exit_code not in (None, 0) for p in pods for t in p.terminations)


def exits_coming(pods: tuple[PodInfo, ...], gathered: Gathered, crashed: bool = False,
                 runs: dict[str, int] | None = None) -> set[str]:
    """Pods whose trainer's end the kubelet has not reported yet although it is likely coming: the
    sidecar pushed at its trainer's exit; or, while a crash is under way (`crashed`), the pod
    delivered no rank that is still up (nothing gathered, or only ranks its sidecar reports down or
    empty recorders). A pod with a live rank (a hung peer) is not waited for, nor one whose trainer
    has restarted since the wait began (`runs`: each pod's run then; the end came and went)."""
    out = set()
    for pod in pods:
        if pod.phase in ("Succeeded", "Failed") or any(t.run == pod.run for t in pod.terminations):
            continue
        if runs is not None and pod.run > runs.get(pod.name, pod.run):
            continue
        evidence = gathered.pods.get(pod.name)
        if (evidence is not None and evidence.reason == "exit") or (crashed and not _has_live_rank(evidence)):
            out.add(pod.name)
    return out


async def await_exits(view: JobView, gathered: Gathered, pushes: PushStore, settle_s: float,
                      refresh: Callable[[], JobView | None], log_extra: dict[str, Any] | None = None) -> JobView:
    """The job as `refresh()` has it once the kubelet reported the end of every trainer run whose sidecar
    says it ended, and, while a crash is under way, of every pod that delivered no live rank
    (`exits_coming`); or `settle_s` seconds later. Then what the ended pods pushed meanwhile replaces
    what was gathered from them when that held no recorder entries (a sidecar asked while its ranks
    were going down)."""
    uids = pod_uids(view.pods)
    pushed = pushes.for_namespace_pods(view.ref.namespace, {p.name for p in view.pods})
    crashed = crash_under_way(view.pods, gathered, any(
        e.reason == "exit" and belongs(uids, n, e) for n, e in pushed.items()))
    waiting = exits_coming(view.pods, gathered, crashed)
    if not waiting:
        return view
    waited = set(waiting)
    runs = {p.name: p.run for p in view.pods}
    deadline = time.monotonic() + settle_s
    log.info("job %s: waiting up to %g s for the kubelet to report the end of %s", view.key,
             settle_s, ", ".join(sorted(waiting)), extra=log_extra)
    while waiting and time.monotonic() < deadline:
        await asyncio.sleep(min(SETTLE_POLL_S, max(0.0, deadline - time.monotonic())))
        fresh = refresh()
        if fresh is None:
            break
        view = fresh
        waiting = exits_coming(view.pods, gathered, crashed, runs)
    take_pushes(gathered, pushes.for_namespace_pods(view.ref.namespace, set(gathered.from_push) | waited),
                pod_uids(view.pods), emptied=waited)
    return view
