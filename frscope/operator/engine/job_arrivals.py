"""A job's recent arrivals (when each rank enqueued each collective) as its sidecars report them in
`/v1/status`, merged across sweeps: each answer carries only the newest `wire.STATUS_ARRIVALS` per rank
and group, so at short steps a sweep alone would compare only the last few seconds. Bounded per rank
and group (KEPT); what frscope.analysis.pod_lateness compares across pods."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from frscope.analysis.pod_lateness import PodArrivals
from frscope.wire import SidecarStatus

# Per rank and group: enough for the lateness window (60 s) at a few collectives per second, and a
# bound whatever the job's rate.
KEPT = 512


class JobArrivals:
    def __init__(self) -> None:
        # pod -> rank -> group -> collective_seq_id -> enqueue ns
        self._by_pod: dict[str, dict[int, dict[str, dict[int, int]]]] = {}

    def add(self, statuses: Mapping[str, SidecarStatus], pods: Collection[str]) -> None:
        """One sweep's answers; pods no longer in the job are forgotten. A rank whose newest reported
        seq is below what is kept restarted (its seqs start again): its old arrivals are dropped."""
        for gone in [p for p in self._by_pod if p not in pods]:
            del self._by_pod[gone]
        for pod, status in statuses.items():
            if pod not in pods:
                continue
            by_rank = self._by_pod.setdefault(pod, {})
            for rank, groups in status.arrivals.items():
                by_group = by_rank.setdefault(rank, {})
                for group, pairs in groups.items():
                    if not pairs:
                        continue
                    kept = by_group.setdefault(group, {})
                    if kept and max(seq for seq, _ns in pairs) < max(kept):
                        kept.clear()
                    kept.update(pairs)
                    if len(kept) > KEPT:
                        for seq in sorted(kept)[:len(kept) - KEPT]:
                            del kept[seq]

    def view(self) -> PodArrivals:
        return {pod: {rank: {group: sorted(kept.items()) for group, kept in by_group.items()}
                      for rank, by_group in by_rank.items()}
                for pod, by_rank in self._by_pod.items()}

    def __len__(self) -> int:
        return len(self._by_pod)
