"""Several operator replicas, one active (`--leader-election-lease`; docs/operator.md, "Several replicas").

A replica starts as a standby: it serves its probes (ready: a healthy standby counts for the
PodDisruptionBudget) and answers every other request 503 with `Retry-After` and `Connection: close`, so
a sidecar's push that reaches it is tried again on a new connection; it watches nothing, polls no
sidecar and writes nothing but the Lease's election. Once it holds the Lease (kube.lease) it labels its
pod `frscope.io/operator-role=leader` (the chart's Service selects that label, so pushes, the webhook
and the web UI reach the leader only) and runs the whole operator. It starts cold: kopf lists the jobs,
pods and reports (the reports are the ledger of what was published, so nothing is published twice),
and the first status sweep finds the incident under way at the sidecars, which keep their evidence.

A leader that loses the Lease (not renewed within the renew deadline, or taken) stops at once and the
process exits 1: the kubelet restarts it as a standby with no state of the old term. A leader asked to
stop (SIGTERM) stops the operator first, then releases the Lease, so a standby takes over at its next
try.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from frscope.operator import names
from frscope.operator.engine.settings import LeaderElection
from frscope.operator.kube import PODS, KubeClient, KubeError, NotFound
from frscope.operator.kube.lease import LeaderElector

log = logging.getLogger(__name__)

ROLE_LEADER = "leader"
ROLE_STANDBY = "standby"
STOP_AFTER_LOSS_S = 10.0  # how long a leader that lost the Lease waits for its operator to stop


class PodRole:
    """The `frscope.io/operator-role` label on the replicas' pods, in the Lease's namespace."""

    def __init__(self, kube: KubeClient, namespace: str, pod: str) -> None:
        self._kube = kube
        self.namespace = namespace
        self.pod = pod

    async def _set(self, pod: str, role: str) -> None:
        patch = {"metadata": {"labels": {names.LABEL_OPERATOR_ROLE: role}}}
        await self._kube.merge_patch(PODS, self.namespace, pod, patch)

    async def standby(self) -> None:
        """At start: a container restarted in a former leader's pod must not keep its label."""
        await self._set(self.pod, ROLE_STANDBY)

    async def lead(self) -> None:
        """This pod leads; any other pod still labelled leader (one whose process died with the Lease) stands by."""
        selector = f"{names.LABEL_OPERATOR_ROLE}={ROLE_LEADER}"
        for other in await self._kube.list(PODS, self.namespace, label_selector=selector):
            name = (other.get("metadata") or {}).get("name")
            if isinstance(name, str) and name != self.pod:
                with contextlib.suppress(NotFound):
                    await self._set(name, ROLE_STANDBY)
        await self._set(self.pod, ROLE_LEADER)


class StandbyHttp:
    """The standby's HTTP server on the operator's port: probes only."""

    def __init__(self, elector: LeaderElector) -> None:
        self._elector = elector
        app = web.Application()
        app.add_routes([web.get("/healthz", self._probe), web.get("/readyz", self._probe)])
        app.router.add_route("*", "/{tail:.*}", self._elsewhere)
        self._runner = web.AppRunner(app, access_log=None)
        self.port: int | None = None

    def _state(self) -> dict[str, object]:
        return {"ok": True, "ready": True, "leader": False, "holder": self._elector.holder or None}

    async def _probe(self, _: web.Request) -> web.Response:
        return web.json_response(self._state())

    async def _elsewhere(self, _: web.Request) -> web.Response:
        holder = self._elector.holder or "none yet"
        return web.json_response(
            {"error": f"standby replica: the leader ({holder}) serves this", **self._state()}, status=503,
            headers={"Retry-After": str(max(1, round(self._elector.options.retry_period_s))),
                     "Connection": "close"})

    async def start(self, host: str, port: int) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else port

    async def stop(self) -> None:
        await self._runner.cleanup()


async def run_elected(election: LeaderElection, kube: KubeClient, *, host: str, port: int, stop: asyncio.Event,
                      lead: Callable[[Callable[[], Awaitable[None]]], Awaitable[None]]) -> int:
    """Stand by until this replica holds the Lease, then run `lead(on_ready)` (the operator, until `stop`;
    it calls `on_ready()` once it serves, which labels the pod leader) while renewing the Lease. 0 after a
    clean stop; 1 when the Lease was lost (the operator was stopped)."""
    elector = LeaderElector(kube, election.options)
    roles = PodRole(kube, election.namespace, election.pod) if election.pod else None
    if roles is not None:
        try:
            await roles.standby()
        except KubeError as exc:
            log.error("leader election: could not label pod %s/%s %s (%s)", roles.namespace, roles.pod,
                      ROLE_STANDBY, exc)
    standby = StandbyHttp(elector)
    await standby.start(host, port)
    log.info("leader election: standing by for Lease %s/%s as %s (HTTP on %s:%s answers probes only)",
             election.namespace, election.lease, election.identity, host, standby.port)
    try:
        acquiring = asyncio.ensure_future(elector.acquire())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not acquiring.done():
            acquiring.cancel()
            await asyncio.gather(acquiring, return_exceptions=True)
            return 0
        acquiring.result()
    finally:
        await standby.stop()
    log.warning("leader election: this replica (%s) leads now: starting the operator", election.identity)

    async def on_ready() -> None:
        if roles is None:
            return
        try:
            await roles.lead()
        except KubeError as exc:
            log.error("leader election: could not label pod %s/%s %s: the Service may not route to it (%s)",
                      roles.namespace, roles.pod, ROLE_LEADER, exc)

    keeping = asyncio.ensure_future(elector.keep())
    running = asyncio.ensure_future(lead(on_ready))
    await asyncio.wait({keeping, running}, return_when=asyncio.FIRST_COMPLETED)
    if keeping.done():  # keep() only ever ends by losing the Lease
        log.error("leader election: %s: stopping (this process exits; it comes back as a standby)",
                  keeping.exception() if not keeping.cancelled() else "cancelled")
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, STOP_AFTER_LOSS_S)
        return 1
    keeping.cancel()
    await asyncio.gather(keeping, return_exceptions=True)
    try:
        running.result()  # the operator's own failure, if it ended with one
    finally:
        await elector.release()
    return 0
