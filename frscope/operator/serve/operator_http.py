"""The operator's own HTTP server: probes, metrics, the sidecars' push endpoint, and a seam for the
web UI.

    GET  /healthz   200 while the event loop turns and kopf's watchers are running (liveness)
    GET  /readyz    200 once kopf has started (readiness)
    GET  /metrics   Prometheus text of the injected registry, behind `--metrics-auth` (`guards`)
    POST /v1/push   a sidecar's snapshot body (docs/sidecar-api.md), gzip or plain, checked by `push_auth`;
                    `max_push_bytes` caps it as sent, `pod_evidence` what it may inflate to
                    (by default the pod's own service-account token: the pod and namespace come from it);
                    streamed to a file (`push_body`) and decoded from it in the decoder processes, one
                    rank at a time (`evidence.push_decode`): the body is never in this process's memory

Other components add their routes with `OperatorHttp.add_routes()` (or `add_subapp()`) before
`start()`; `frscope/webui` mounts itself this way and reads `JobsView`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from frscope.operator.evidence.gather import Decoder
from frscope.operator.evidence.pod_evidence import DEFAULT_MAX_ENTRIES, PodEvidence
from frscope.operator.evidence.push_store import Full
from frscope.operator.evidence.sidecars import SidecarError
from frscope.operator.evidence.spill import EvidenceDir
from frscope.operator.model.objects import JobKey
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.serve.access import OpenPush, PushAuth, Refused
from frscope.operator.serve.guards import Check
from frscope.operator.serve.push_body import TooLarge, receive, spool_dir
from frscope.operator.serve.push_gate import PushGate

log = logging.getLogger(__name__)

PushHandler = Callable[[PodEvidence], JobKey | None]


class Health:
    """Liveness: a heartbeat the event loop refreshes, and kopf's state; readiness: kopf started."""

    def __init__(self, *, max_silence_s: float = 60.0) -> None:
        self.max_silence_s = max_silence_s
        self.ready = False
        self.failed: str | None = None
        self._beat = time.monotonic()

    def beat(self) -> None:
        self._beat = time.monotonic()

    def alive(self) -> tuple[bool, str]:
        if self.failed:
            return False, self.failed
        silence = time.monotonic() - self._beat
        if silence > self.max_silence_s:
            return False, f"event loop heartbeat {silence:.0f} s old"
        return True, "ok"


class OperatorHttp:
    def __init__(self, *, registry: CollectorRegistry, metrics: OperatorMetrics, health: Health,
                 on_push: PushHandler, push_auth: PushAuth | None = None,
                 max_push_bytes: int = 256 * 1024 * 1024, max_entries: int = DEFAULT_MAX_ENTRIES,
                 spill: EvidenceDir | None = None, gate: PushGate | None = None,
                 metrics_guard: Check | None = None, decoder: Decoder | None = None) -> None:
        self._registry = registry
        self._metrics = metrics
        self._health = health
        self._on_push = on_push
        self._spill = spill  # accepted bodies are kept there too (--evidence-dir): a restart keeps them
        self._push_auth: PushAuth = push_auth if push_auth is not None else OpenPush()
        self._max_entries = max_entries
        self._gate = gate if gate is not None else PushGate()
        self._metrics_guard = metrics_guard  # `--metrics-auth` (guards.metrics_guard); None: open
        # Push bodies decode where fetched snapshots do (the decode processes): json holds the GIL for a
        # whole body, which in a thread of this process would stall the event loop.
        self._decoder = decoder if decoder is not None else Decoder()
        self._max_push_bytes = max_push_bytes
        self._spool = spool_dir(spill.path if spill is not None else None)
        self.app = web.Application(client_max_size=max_push_bytes)
        self.app.add_routes([
            web.get("/healthz", self._healthz),
            web.get("/readyz", self._readyz),
            web.get("/metrics", self._metrics_text),
            web.post("/v1/push", self._push),
        ])
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.https_port: int | None = None

    # -- the seam for other components (web UI) ----------------------------------------------------
    def add_routes(self, routes: Iterable[web.AbstractRouteDef]) -> None:
        self.app.add_routes(list(routes))

    def add_subapp(self, prefix: str, app: web.Application) -> None:
        self.app.add_subapp(prefix, app)

    # -- handlers ----------------------------------------------------------------------------------
    async def _healthz(self, _: web.Request) -> web.Response:
        ok, why = self._health.alive()
        return web.json_response({"ok": ok, "detail": why}, status=200 if ok else 503)

    async def _readyz(self, _: web.Request) -> web.Response:
        ready = self._health.ready and self._health.alive()[0]
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    async def _metrics_text(self, request: web.Request) -> web.Response:
        if self._metrics_guard is not None:
            refused = await self._metrics_guard(request)
            if refused is not None:
                return refused
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _push(self, request: web.Request) -> web.Response:
        retry_after = self._gate.try_enter()
        if retry_after is not None:
            # Before the token review and the body: a storm's excess costs a response line each.
            self._metrics.pushes.labels(result="throttled").inc()
            return web.json_response({"error": f"{self._gate.in_flight} pushes are being taken in; "
                                      f"retry after {retry_after} s", "retry_after_s": retry_after},
                                     status=429, headers={"Retry-After": str(retry_after)})
        started = time.monotonic()
        try:
            return await self._take_push(request)
        finally:
            self._gate.leave(time.monotonic() - started)

    async def _take_push(self, request: web.Request) -> web.Response:
        try:
            caller = await self._push_auth.caller(request.headers.get("Authorization", ""), request.remote)
        except Refused as exc:
            self._metrics.pushes.labels(result="rejected").inc()
            log.warning("push refused (%d): %s", exc.status, exc.message)
            headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
            if exc.retry_after_s is not None:
                headers = {"Retry-After": str(exc.retry_after_s)}
            return web.json_response({"error": exc.message}, status=exc.status, headers=headers)
        # An authenticated pod speaks for itself only: its token names it; headers that name another
        # pod are refused (and the body's own pod/namespace fields are overridden).
        claimed = (request.headers.get("X-Frscope-Namespace"), request.headers.get("X-Frscope-Pod"))
        if caller.pod is not None and any(c and c != t for c, t in zip(claimed, (caller.namespace, caller.pod),
                                                                       strict=True)):
            self._metrics.pushes.labels(result="rejected").inc()
            message = (f"the token is for pod {caller.namespace}/{caller.pod}; a pod may push only its own "
                       f"evidence (the push names {claimed[0] or '?'}/{claimed[1] or '?'})")
            log.warning("push refused (403): %s", message)
            return web.json_response({"error": message}, status=403)
        namespace = caller.namespace or claimed[0]
        pod = caller.pod or claimed[1]
        try:
            # As it came (the server does not undo Content-Encoding): the decoder inflates it, capped.
            path = await receive(request, self._spool, self._max_push_bytes)
        except TooLarge:
            self._metrics.pushes.labels(result="rejected").inc()
            return web.json_response({"error": f"body too large (over {self._max_push_bytes} bytes)"}, status=413)
        try:
            return await self._decode_push(path, caller.who, caller.pod_uid or "", namespace, pod)
        finally:
            path.unlink(missing_ok=True)

    async def _decode_push(self, path: Path, who: str, uid: str, namespace: str | None,
                           pod: str | None) -> web.Response:
        try:
            evidence = await self._decoder.decode_file(str(path), "push", origin="push", max_entries=self._max_entries,
                                                       pod=pod, namespace=namespace)
        except SidecarError as exc:
            self._metrics.pushes.labels(result="rejected").inc()
            return web.json_response({"error": f"not a sidecar snapshot: {exc.message}"}, status=400)
        evidence.pod_uid = uid
        if not evidence.pod or not evidence.namespace:
            self._metrics.pushes.labels(result="rejected").inc()
            return web.json_response({"error": "pod and namespace are required"}, status=400)
        try:
            job = self._on_push(evidence)
        except Full as exc:
            self._metrics.pushes.labels(result="throttled").inc()
            log.warning("push from %s/%s refused (429, retry after %d s): %s", evidence.namespace, evidence.pod,
                        exc.retry_after_s, exc.message)
            return web.json_response({"error": exc.message, "retry_after_s": exc.retry_after_s}, status=429,
                                     headers={"Retry-After": str(exc.retry_after_s)})
        if self._spill is not None:
            await asyncio.to_thread(self._spill.keep_file, evidence.namespace, evidence.pod, path, evidence.pod_uid)
        self._metrics.pushes.labels(result="accepted").inc()
        log.info("push from %s/%s by %s (%s, ranks %s, job %s)", evidence.namespace, evidence.pod, who,
                 evidence.reason, list(evidence.ranks), job or "unknown")
        return web.json_response({"accepted": True, "pod": f"{evidence.namespace}/{evidence.pod}",
                                  "job": str(job) if job else None}, status=202)

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self, host: str, port: int, *, https_port: int | None = None,
                    ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on `port` (and with `ssl_context`, the same routes over HTTPS on `https_port`); the HTTP port."""
        # Request bodies are not inflated by aiohttp (a 16 KiB gzip push would become its whole
        # inflation in memory before any check): pushes are inflated capped by `from_bytes`.
        self._runner = web.AppRunner(self.app, handle_signals=False, access_log=None, auto_decompress=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        if ssl_context is not None and https_port is not None:
            secure = web.TCPSite(self._runner, host, https_port, ssl_context=ssl_context)
            await secure.start()
            found = getattr(secure._server, "sockets", None) or []
            self.https_port = int(found[0].getsockname()[1]) if found else https_port
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
