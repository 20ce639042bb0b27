"""Leader election over a `coordination.k8s.io/v1` Lease, the way client-go's leaderelection does it.

Several operator replicas run; the one that holds the Lease is the leader, the others stand by. Each
attempt is a read and a conditional write (the Lease's resourceVersion): two candidates that write at
once get one 200 and one 409, never two leaders.

- A candidate takes the Lease when it is free (no holder: created, or released by a leader that
  stopped) or expired: its record has not changed for `leaseDurationSeconds`, measured on the
  candidate's own monotonic clock from when it first saw that record. The holder's `renewTime` is
  never compared with the local wall clock, so clock skew between nodes cannot make two leaders.
- The leader renews every `retry_period_s`; when it has not renewed for `renew_deadline_s` (the API
  server unreachable), or it finds another holder, it has lost the Lease (`LeadershipLost`) and must
  stop acting at once: `renew_deadline_s` < `duration_s`, so it stops before a standby may take over.
- A leader that stops cleanly releases the Lease (no holder), so a standby takes over at its next try
  rather than after the whole duration.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from frscope.operator.kube.api_client import KubeClient, Resource
from frscope.operator.kube.api_errors import AlreadyExists, Conflict, KubeError, NotFound

log = logging.getLogger(__name__)

LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
JITTER = 0.2  # a standby's tries are spread by up to this share of the retry period


class LeadershipLost(Exception):
    """The leader could not renew its Lease in time, or found another holder: it must stop acting."""


@dataclass(frozen=True, slots=True)
class ElectionOptions:
    """Which Lease, who this replica is, and the timing (client-go's defaults: 15 s, 10 s, 2 s)."""

    lease: str
    namespace: str
    identity: str  # unique per process: a restarted container is a new candidate
    duration_s: float = 15.0  # a standby takes over after the record has not changed for this long
    renew_deadline_s: float = 10.0  # the leader gives up after failing to renew for this long
    retry_period_s: float = 2.0  # between tries (standby) and renewals (leader)

    def __post_init__(self) -> None:
        if not self.lease or not self.namespace or not self.identity:
            raise ValueError("leader election needs a Lease name, its namespace and this replica's identity")
        if not 0 < self.retry_period_s * (1 + JITTER) < self.renew_deadline_s < self.duration_s:
            raise ValueError("leader election: the lease duration must exceed the renew deadline, which must "
                             f"exceed the retry period (+{JITTER:.0%} jitter): got {self.duration_s:g} s, "
                             f"{self.renew_deadline_s:g} s, {self.retry_period_s:g} s")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What a Lease object says (its `spec`), with the resourceVersion a conditional write needs."""

    holder: str  # "" when nobody holds it
    duration_s: float
    acquired: str
    renewed: str
    transitions: int
    resource_version: str

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> LeaseRecord:
        spec = obj.get("spec") or {}
        meta = obj.get("metadata") or {}
        duration = spec.get("leaseDurationSeconds")
        transitions = spec.get("leaseTransitions")
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=float(duration) if isinstance(duration, int) and duration > 0 else 0.0,
            acquired=str(spec.get("acquireTime") or ""),
            renewed=str(spec.get("renewTime") or ""),
            transitions=transitions if isinstance(transitions, int) and transitions >= 0 else 0,
            resource_version=str(meta.get("resourceVersion") or ""),
        )

    def same_as(self, other: LeaseRecord | None) -> bool:
        """Unchanged since `other` (a renewal changes renewTime and the resourceVersion)."""
        return other is not None and (self.holder, self.renewed, self.resource_version) == (
            other.holder, other.renewed, other.resource_version)


def micro_time(now: float) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with microseconds."""
    return datetime.datetime.fromtimestamp(now, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(options: ElectionOptions, *, holder: str, acquired: str, renewed: str, transitions: int,
               resource_version: str | None = None, duration_s: float | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": options.lease, "namespace": options.namespace}
    if resource_version:
        meta["resourceVersion"] = resource_version
    spec: dict[str, Any] = {
        "holderIdentity": holder or None,
        "leaseDurationSeconds": max(1, round(options.duration_s if duration_s is None else duration_s)),
        "acquireTime": acquired or None,
        "renewTime": renewed or None,
        "leaseTransitions": transitions,
    }
    return {"apiVersion": LEASES.api_version, "kind": LEASES.kind, "metadata": meta, "spec": spec}


class LeaderElector:
    """One replica's side of the election. `acquire()` returns once this replica leads; `keep()` renews
    until the Lease is lost (raising `LeadershipLost`); `release()` hands it back at a clean stop."""

    def __init__(self, kube: KubeClient, options: ElectionOptions, *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self._kube = kube
        self.options = options
        self._clock = clock
        self._wall = wall
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0  # local monotonic time the observed record was first seen
        self.leading = False

    @property
    def holder(self) -> str:
        """The holder as last seen ("" when unknown or free)."""
        return self._observed.holder if self._observed is not None else ""

    def _observe(self, record: LeaseRecord) -> None:
        if not record.same_as(self._observed):
            self._observed, self._observed_at = record, self._clock()

    def _expired(self, record: LeaseRecord) -> bool:
        duration = record.duration_s or self.options.duration_s
        return self._clock() >= self._observed_at + duration

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this replica holds the Lease after it. Raises KubeError."""
        me, now = self.options.identity, micro_time(self._wall())
        name, namespace = self.options.lease, self.options.namespace
        try:
            current = await self._kube.get(LEASES, namespace, name)
        except NotFound:
            try:
                made = await self._kube.create(LEASES, namespace, lease_body(
                    self.options, holder=me, acquired=now, renewed=now, transitions=0))
            except (AlreadyExists, Conflict):
                return False  # another candidate created it first
            self._observe(LeaseRecord.from_object(made))
            return True
        record = LeaseRecord.from_object(current)
        self._observe(record)
        if record.holder and record.holder != me and not self._expired(record):
            return False
        taking = record.holder != me
        body = lease_body(self.options, holder=me, acquired=now if taking else record.acquired, renewed=now,
                          transitions=record.transitions + (1 if taking else 0),
                          resource_version=record.resource_version)
        try:
            written = await self._kube.replace(LEASES, namespace, name, body)
        except Conflict:
            return False  # someone wrote it since the read (a renewal, or another candidate took it)
        self._observe(LeaseRecord.from_object(written))
        if taking:
            log.info("leader election: took Lease %s/%s from %s", namespace, name, record.holder or "nobody")
        return True

    async def _attempt(self, limit_s: float) -> bool:
        try:
            return await asyncio.wait_for(self.try_acquire_or_renew(), timeout=max(limit_s, 0.1))
        except (KubeError, TimeoutError) as exc:
            log.warning("leader election: Lease %s/%s: %s", self.options.namespace, self.options.lease,
                        exc or "timed out")
            return False

    async def acquire(self) -> None:
        """Stand by until this replica holds the Lease."""
        period = self.options.retry_period_s
        while not await self._attempt(self.options.renew_deadline_s):
            await asyncio.sleep(period * (1 + random.uniform(0, JITTER)))
        self.leading = True

    async def keep(self) -> None:
        """Renew every retry period; raises `LeadershipLost` when that fails for the renew deadline, or
        another replica holds the Lease. Never returns otherwise."""
        last = self._clock()
        deadline = self.options.renew_deadline_s
        while True:
            await asyncio.sleep(self.options.retry_period_s)
            if await self._attempt(last + deadline - self._clock()):
                last = self._clock()
                continue
            if self.holder and self.holder != self.options.identity:
                self.leading = False
                raise LeadershipLost(f"Lease {self.options.namespace}/{self.options.lease} is held by {self.holder}")
            if self._clock() - last >= deadline:
                self.leading = False
                raise LeadershipLost(f"Lease {self.options.namespace}/{self.options.lease} not renewed for "
                                     f"{deadline:g} s")

    async def release(self) -> None:
        """Hand the Lease back (no holder) if this replica still holds it, so a standby takes over at once."""
        if not self.leading:
            return
        self.leading = False
        record = self._observed
        if record is None or record.holder != self.options.identity:
            return
        now = micro_time(self._wall())
        body = lease_body(self.options, holder="", acquired=record.acquired, renewed=now,
                          transitions=record.transitions, resource_version=record.resource_version, duration_s=1)
        try:
            await asyncio.wait_for(self._kube.replace(LEASES, self.options.namespace, self.options.lease, body),
                                   timeout=self.options.retry_period_s * 2)
            log.info("leader election: released Lease %s/%s", self.options.namespace, self.options.lease)
        except (KubeError, TimeoutError) as exc:
            log.warning("leader election: could not release Lease %s/%s (%s): a standby takes over when it "
                        "expires", self.options.namespace, self.options.lease, exc or "timed out")
