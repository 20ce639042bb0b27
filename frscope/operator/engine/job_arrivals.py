"""A job's recent arrivals (when each pod reached each collective) as its sidecars report them in
`/v1/status`, merged across sweeps, and each pod's clock against the operator's: what
frscope.analysis.pod_lateness compares across pods.

Arrivals: each answer carries the newest `wire.STATUS_ARRIVALS` per rank and group; each is reduced to
the pod's arrivals at once (`pod_arrivals`: its last rank, its least wait) and kept per pod and group
across sweeps. Bounded whatever the job's size: a sweep reads at most MERGE_BUDGET of its answers'
arrivals (each rank's newest `read_each` per group: all of them up to a few hundred ranks, 32 at
8,192), and a job keeps at most about KEPT_TOTAL pod arrivals (`kept_each` per pod and group, between
MIN_KEPT and KEPT). Fewer collectives per pod at large scale still decide: with n pods a pod late at
chance level is late at 1 / n of them, so a handful of late arrivals is already far beyond chance.

Clocks (`PodClockEstimate`): a status answer says the sidecar's wall clock when it answered
(`answered_at_ns`), which its pod's ranks share (one node); the operator read its own clock just
before asking and when the answer's head arrived. So the pod's offset (pod minus operator) lies in
[answered - received, answered - asked]. The newest CLOCK_SAMPLES such intervals, each widened by
DRIFT_PPM x its age, are intersected (the quickest round trips decide); the offset is the middle, its
bound half the width plus DRIFT_PPM x the lateness window (the arrivals compared are up to that old).
A pod whose sidecar does not say its clock has none here: the comparison takes it at offset 0 within
the operator's `--clock-skew-ms`.

Not thread-safe: the operator updates a job's arrivals and compares them in one worker thread at a time
(engine/pod_stragglers)."""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping

from frscope.analysis.pod_lateness import POD_WINDOW_S, PodArrival, PodClock, pod_arrivals
from frscope.wire import STATUS_ARRIVALS, SidecarStatus

# Per pod and group: enough for the lateness window (15 s) at many collectives per second; fewer for
# jobs of many pods and groups, so a job's arrivals stay about KEPT_TOTAL (tens of MB) however large.
KEPT = 512
MIN_KEPT = 32
KEPT_TOTAL = 1 << 18
# Groups kept per pod (the first seen stay; a pod's ranks are in a few groups each): with the floor
# MIN_KEPT, a pod keeps at most MAX_GROUPS_PER_POD x KEPT arrivals whatever its sidecar reports.
MAX_GROUPS_PER_POD = 64
# The most (rank, group, collective) arrivals one sweep's answers of a job are read for, and the
# fewest per rank and group.
MERGE_BUDGET = 1 << 18
MIN_READ = 32
CLOCK_SAMPLES = 8
# The most two hosts' clocks are assumed to drift apart, in parts per million (NTP-disciplined clocks
# stay within a few ppm).
DRIFT_PPM = 20.0


def kept_each(lists: int) -> int:
    """How many collectives are kept per (pod, group) of a job with `lists` of them."""
    return max(MIN_KEPT, min(KEPT, KEPT_TOTAL // max(1, lists)))


def read_each(rank_lists: int) -> int:
    """How many of each rank's newest arrivals per group a sweep with `rank_lists` of them reads."""
    return max(MIN_READ, min(STATUS_ARRIVALS, MERGE_BUDGET // max(1, rank_lists)))


class PodClockEstimate:
    def __init__(self) -> None:
        self._samples: deque[tuple[int, int, int]] = deque(maxlen=CLOCK_SAMPLES)  # (at, low, high) offset ns

    def add(self, asked_ns: int, answered_ns: int, received_ns: int) -> None:
        if received_ns >= asked_ns:
            self._samples.append((received_ns, answered_ns - received_ns, answered_ns - asked_ns))

    def clock(self, now_ns: int) -> PodClock | None:
        if not self._samples:
            return None
        widened = [(low - (drift := int(DRIFT_PPM * 1e-6 * max(0, now_ns - at))), high + drift)
                   for at, low, high in self._samples]
        low, high = max(w[0] for w in widened), min(w[1] for w in widened)
        if low > high:  # the clock stepped (or drifted faster): the newest sample alone
            low, high = widened[-1]
        window = int(DRIFT_PPM * 1e-6 * POD_WINDOW_S * 1e9)
        return PodClock((low + high) // 2, (high - low + 1) // 2 + window)


class JobArrivals:
    def __init__(self) -> None:
        self._by_pod: dict[str, dict[str, dict[int, PodArrival]]] = {}  # pod -> group -> seq -> arrival
        self._ranks: dict[str, tuple[int, ...]] = {}
        self._clocks: dict[str, PodClockEstimate] = {}
        self._seen: dict[str, tuple[tuple[int, str, int], ...]] = {}  # pod -> its last answer's newest seqs

    def add(self, statuses: Mapping[str, SidecarStatus], pods: Collection[str]) -> None:
        """One sweep's answers; pods no longer in the job are forgotten. Only what can be kept is read
        (each rank's newest `read_each` per group, at most `kept_each`), and an answer whose newest
        arrivals are those of the pod's previous answer (no full recorder read between two sweeps) not
        at all. A pod whose newest
        reported seq in a group is below what is kept restarted (its seqs start again): its old arrivals
        are dropped."""
        for gone in [p for p in self._by_pod if p not in pods]:
            del self._by_pod[gone]
            self._ranks.pop(gone, None)
            self._clocks.pop(gone, None)
            self._seen.pop(gone, None)
        lists = sum(len(g) for p, g in self._by_pod.items() if p not in statuses) + sum(
            min(MAX_GROUPS_PER_POD, len({g for groups in st.arrivals.values() for g in groups}))
            for st in statuses.values())
        each = kept_each(lists)
        read = min(each, read_each(sum(len(groups) for st in statuses.values() for groups in st.arrivals.values())))
        for pod, status in statuses.items():
            if pod not in pods:
                continue
            if status.answered_at_ns and status.asked_ns is not None and status.received_ns is not None:
                self._clocks.setdefault(pod, PodClockEstimate()).add(status.asked_ns, status.answered_at_ns,
                                                                     status.received_ns)
            newest = tuple(sorted((rank, group, rows[-1][0]) for rank, groups in status.arrivals.items()
                                  for group, rows in groups.items() if rows))
            if not newest or self._seen.get(pod) == newest:
                continue
            self._seen[pod] = newest
            self._ranks[pod] = tuple(sorted(status.arrivals))
            by_group = self._by_pod.setdefault(pod, {})
            recent = {rank: {group: rows[-read:] for group, rows in groups.items()}
                      for rank, groups in status.arrivals.items()}
            for group, seqs in pod_arrivals(recent).items():
                if not seqs or (group not in by_group and len(by_group) >= MAX_GROUPS_PER_POD):
                    continue
                kept = by_group.setdefault(group, {})
                if kept and max(seqs) < max(kept):
                    kept.clear()
                kept.update(seqs)
                if len(kept) > each:
                    for seq in sorted(kept)[:len(kept) - each]:
                        del kept[seq]

    def arrivals(self) -> Mapping[str, Mapping[str, Mapping[int, PodArrival]]]:
        return self._by_pod

    def ranks(self) -> Mapping[str, tuple[int, ...]]:
        return self._ranks

    def clocks(self, now_ns: int) -> dict[str, PodClock]:
        return {pod: clock for pod, est in self._clocks.items() if (clock := est.clock(now_ns)) is not None}

    def __len__(self) -> int:
        return len(self._by_pod)
