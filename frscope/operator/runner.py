"""Wires the operator together and runs it: kopf (watchers, webhook) and frscope's HTTP server in
one event loop.

    run_operator(config)                 blocking, for `frscope operator`
    await serve(config, ...)             the same as a coroutine (tests run it in-process)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import aiohttp.web
import kopf
from prometheus_client import CollectorRegistry

from frscope import logs, wire
from frscope.operator import names
from frscope.operator.actions import Actor
from frscope.operator.engine.controller import Controller, PodLister
from frscope.operator.engine.settings import OperatorConfig, WebhookConfig
from frscope.operator.evidence.gather import Decoder
from frscope.operator.evidence.incident_archive import IncidentArchive
from frscope.operator.evidence.incident_bundles import IncidentBundles
from frscope.operator.evidence.push_store import Full, PushStore
from frscope.operator.evidence.sidecar_tls import OperatorServing, SidecarCa
from frscope.operator.evidence.sidecars import SidecarClient
from frscope.operator.evidence.spill import EvidenceDir
from frscope.operator.injection import InjectionConfig, native_sidecars_supported
from frscope.operator.kube import BearerAuth, KubeClient, TokenFile
from frscope.operator.kube.api_client import LIST_PAGE
from frscope.operator.kube.pod_tokens import PodTokens
from frscope.operator.kube.resources import PODS
from frscope.operator.ledger import LedgerMetrics, LedgerSeal, NodeLedger
from frscope.operator.model.objects import JobRef
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.model.store import JobStore
from frscope.operator.publish import Publisher
from frscope.operator.serve.access import KubernetesPush, OpenPush, PushAuth, Reviewer, SharedTokenPush
from frscope.operator.serve.certificates import CertificateIssuer, pod_check
from frscope.operator.serve.guards import metrics_guard
from frscope.operator.serve.handlers import register_watchers, register_webhook
from frscope.operator.serve.leadership import run_elected
from frscope.operator.serve.live_windows import LiveWindows
from frscope.operator.serve.login import Login, login
from frscope.operator.serve.operator_http import Health, OperatorHttp
from frscope.operator.serve.sidecar_policy import SidecarPolicies
from frscope.operator.serve.status_poller import StatusPoller
from frscope.operator.serve.ui import mount_ui, ui_guard

log = logging.getLogger(__name__)
# Seconds a kopf per-object worker waits for the object's next event before it ends (kopf: 5 s).
WORKER_IDLE_S = 0.5


@dataclass(slots=True)
class Operator:
    """The running parts, for tests and for components that mount on the operator (web UI)."""

    config: OperatorConfig
    controller: Controller
    http: OperatorHttp
    store: JobStore
    poller: StatusPoller
    metrics: OperatorMetrics
    kube: KubeClient
    reviewer: Reviewer
    ledger: NodeLedger | None = None


def configure_kopf(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    # frscope posts its own Events; kopf's per-handler Events would be noise on objects it does not own.
    settings.posting.enabled = False
    # Nothing is stored by kopf (no change-detecting handlers); should it ever, it goes under our prefix.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.PREFIX, key="last-handled-configuration")
    settings.persistence.finalizer = f"{names.PREFIX}/kopf-finalizer"
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.error_backoffs = [1, 2, 3, 5, 8, 13]
    # Only opted-in pods are streamed: the API server filters (labelSelector on the list and the watch),
    # instead of kopf receiving every change of every pod in the cluster and dropping most of them
    # against the handlers' `labels=` (the job-name label of each kind's family, which stays as a
    # second check). One selector for every job kind: label selectors only AND, and PyTorchJob and
    # JobSet pods are named by different labels, but every pod frscope serves carries the opt-in label.
    key, value = config.inject_label
    settings.watching.label_selectors["v1", "pods"] = f"{key}={value}"
    # kopf's first LIST of each resource in pages (`limit`/`continue`), one page parsed at a time:
    # unpaged, a 32,768-pod job's list was ~0.6 GiB of parsed JSON at once (~17 KiB a pod), the
    # operator's peak before any stall (bench/pod_watch_memory.py).
    settings.watching.chunk_size = LIST_PAGE
    # A pod's kopf worker (a task and its queue, holding the pod's last raw body) ends this soon after
    # the pod's last event instead of kopf's 5 s: while the list is read, every pod listed in the last
    # idle period had its whole body alive.
    settings.queueing.idle_timeout = WORKER_IDLE_S


def job_pod_lister(kube: KubeClient, inject_label: tuple[str, str]) -> PodLister:
    """A job's opted-in pods, listed from the API server (the same pods the watch streams)."""
    def list_pods(ref: JobRef) -> AsyncIterator[list[dict[str, Any]]]:
        selector = f"{inject_label[0]}={inject_label[1]},{ref.job_kind.pod_selector(ref.name)}"
        return kube.pages(PODS, ref.namespace, label_selector=selector)

    return list_pods


def kube_client(credentials: Login, instance: str) -> KubeClient:
    """The operator's own client. The bearer token is not fixed in the session: the client asks
    `credentials.auth()` for it per request (rotated service-account tokens)."""
    info = credentials.info
    fixed = {k: v for k, v in info.as_http_headers().items() if k.lower() != "authorization" or not info.token}
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=info.as_ssl_context(), limit=32),
        headers={**fixed, "User-Agent": f"{names.COMPONENT}/{instance}"},
    )
    return KubeClient(session, info.server, field_manager=names.COMPONENT, auth=credentials.auth())


async def injection_for(webhook: WebhookConfig, kube: KubeClient) -> InjectionConfig:
    native = webhook.sidecar_mode == "native"
    if webhook.sidecar_mode == "auto":
        try:
            native = native_sidecars_supported(*await kube.server_version())
        except Exception as exc:
            log.warning("could not read the server version (%s): injecting the sidecar as a plain container", exc)
            native = False
    return replace(webhook.injection, native=native)


def webhook_server(webhook: WebhookConfig) -> kopf.WebhookServer:
    certfile = keyfile = cafile = None
    if webhook.cert_dir is not None:
        certfile = webhook.cert_dir / "tls.crt"
        keyfile = webhook.cert_dir / "tls.key"
        cafile = webhook.cert_dir / "ca.crt" if (webhook.cert_dir / "ca.crt").exists() else None
    if certfile is None or keyfile is None:
        raise ValueError("--webhook-port needs --webhook-cert-dir with tls.crt and tls.key")
    return kopf.WebhookServer(addr=webhook.host, port=webhook.port, host=webhook.public_host,
                              certfile=str(certfile), pkeyfile=str(keyfile),
                              cafile=str(cafile) if cafile else None)


def sidecar_auth(config: OperatorConfig, reviewer: Reviewer) -> tuple[BearerAuth | None, PushAuth]:
    """The token shown to the sidecars, and how pushes are checked (`--sidecar-auth`). With Kubernetes
    identity the sidecars get per-pod tokens instead (`pod_tokens`), and no shared one."""
    if config.sidecar_auth == "kubernetes":
        return None, KubernetesPush(reviewer)
    if config.sidecar_auth == "token":
        assert config.sidecar_token_file is not None  # OperatorConfig insists
        shown = TokenFile(config.sidecar_token_file)
        return shown, SharedTokenPush(shown)
    return None, OpenPush()


def pod_tokens(config: OperatorConfig, kube: KubeClient) -> PodTokens | None:
    """Per-pod tokens for the sidecars (TokenRequest, audience naming the pod) with Kubernetes identity."""
    if config.sidecar_auth != "kubernetes":
        return None
    if not config.operator_identity:
        log.warning("--sidecar-auth kubernetes without FRSCOPE_OPERATOR_IDENTITY: no per-pod tokens can be "
                    "minted, and the sidecars accept no other")
        return None
    expiry = config.webhook.injection.token_expiration_s if config.webhook is not None else 3600
    return PodTokens(kube, config.operator_identity, lifetime_s=expiry)


def opted_in_pods(label: tuple[str, str], then: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """`then(pod)` for pods that carry the opt-in label (every pod the webhook injected does)."""
    key, value = label

    def seen(pod: dict[str, Any]) -> None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if isinstance(labels, dict) and str(labels.get(key, "")).lower() == value.lower():
            then(pod)

    return seen


async def _heartbeat(health: Health) -> None:
    while True:
        health.beat()
        await asyncio.sleep(5)


async def serve(config: OperatorConfig, *, registry: CollectorRegistry | None = None,
                stop_flag: asyncio.Event | None = None,
                on_ready: Callable[[Operator], Awaitable[None] | None] | None = None,
                mount: Callable[[Operator], None] | None = None) -> None:
    """Run until `stop_flag` is set (or SIGINT/SIGTERM). `mount(operator)` may add HTTP routes
    (the web UI) before the server starts; `on_ready(operator)` runs once kopf is up."""
    registry = registry if registry is not None else CollectorRegistry()
    settings = kopf.OperatorSettings()
    configure_kopf(settings, config)
    credentials = login(settings)
    kube = kube_client(credentials, config.instance)
    # Snapshot bodies stay gzipped until a decoder process inflates them (SidecarClient).
    sidecar_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=4),
                                            auto_decompress=False)
    metrics = OperatorMetrics(registry)
    # each job's latest incident view, kept across restarts next to the kept pushes (--evidence-dir)
    archive = IncidentArchive(config.evidence_dir / "incidents") if config.evidence_dir is not None else None
    store = JobStore(on_latest=archive.save_soon if archive is not None else None)
    # each incident's evidence as one file, for `frscope analyze BUNDLE` and the web UI's download
    bundles = IncidentBundles(config.evidence_dir / "bundles") if config.evidence_dir is not None else None
    if bundles is not None:
        log.info("evidence dir %s: %d incident bundle(s) kept from before", config.evidence_dir,
                 await asyncio.to_thread(bundles.expire))
    if archive is not None:
        kept_views = await asyncio.to_thread(lambda: list(archive.load()))
        for ref, latest in kept_views:
            store.restore(ref, latest)
        log.info("evidence dir %s: %d incident view(s) kept from before", config.evidence_dir, len(kept_views))
    spill = EvidenceDir(config.evidence_dir) if config.evidence_dir is not None else None
    pushes = PushStore(on_drop=spill.remove if spill is not None else None)
    decoder = Decoder(config.decode_processes)
    if spill is not None:  # decoded in the decoder processes: a big kept push never lands in this one
        async for kept in spill.reload(decoder, max_entries=config.gather.max_entries, ttl_s=pushes.ttl_s,
                                       plain_bytes=config.max_push_bytes):
            with contextlib.suppress(Full):
                pushes.put(kept)
        log.info("evidence dir %s: %d push(es) kept from before", config.evidence_dir, len(pushes))
    reviewer = Reviewer(kube)
    ca_key = config.sidecar_ca_dir / "tls.key" if config.sidecar_ca_dir is not None else None
    seal = (await asyncio.to_thread(LedgerSeal.from_sources, config.node_ledger.key_file, ca_key)
            if config.node_ledger is not None else None)
    publisher = Publisher(kube, instance=config.instance, seal=seal.sealed if seal is not None else None)
    shown, push_auth = sidecar_auth(config, reviewer)
    # TLS to the sidecars: an unreadable CA stops the start here, with the reason.
    sidecar_ca = await asyncio.to_thread(SidecarCa, config.sidecar_ca_dir) if config.sidecar_ca_dir else None
    https_name = config.operator_https_name
    serving = (await asyncio.to_thread(OperatorServing, sidecar_ca, https_name)
               if sidecar_ca is not None and config.https_port is not None and https_name else None)
    controller = Controller(config, store=store, pushes=pushes,
                            sidecars=SidecarClient(sidecar_session, auth=shown, tokens=pod_tokens(config, kube),
                                                   tls=sidecar_ca),
                            publisher=publisher, metrics=metrics, decoder=decoder,
                            actor=Actor(kube, publisher, metrics, config.actions, instance=config.instance),
                            pod_lister=job_pod_lister(kube, config.inject_label), bundles=bundles)
    health = Health()
    http = OperatorHttp(registry=registry, metrics=metrics, health=health, on_push=controller.on_push,
                        push_auth=push_auth, max_push_bytes=config.max_push_bytes,
                        max_entries=config.gather.max_entries, spill=spill,
                        metrics_guard=metrics_guard(config.metrics_auth, reviewer), decoder=decoder)
    if sidecar_ca is not None:
        injection = config.webhook.injection if config.webhook is not None else None
        issuer = CertificateIssuer(sidecar_ca, push_auth, pod_check(kube, injection))
        http.add_routes([aiohttp.web.post(wire.CERTIFICATE_PATH, issuer.handle)])
    poller = StatusPoller(controller, interval_s=config.poll_interval_s, timeout_s=config.poll_timeout_s,
                          max_rps=config.poll_max_rps, concurrency=config.poll_concurrency)
    ledger = (NodeLedger(kube, LedgerMetrics(registry), config.node_ledger, config.actions, instance=config.instance,
                         seal=seal) if config.node_ledger is not None and seal is not None else None)
    operator = Operator(config, controller, http, store, poller, metrics, kube, reviewer, ledger)

    kopf_registry = kopf.OperatorRegistry()
    # Every kopf login reads the credentials again: a rotated token is picked up, never a stale one.
    policies = SidecarPolicies.from_env(kube, config.sidecar_network_policy)
    register_watchers(kopf_registry, controller, lambda: login(settings).info, config.job_kinds, ledger=ledger,
                      on_pod=opted_in_pods(config.inject_label, policies.saw_pod) if policies is not None else None)
    if config.webhook is not None:
        injection = await injection_for(config.webhook, kube)
        if sidecar_ca is not None and serving is not None:
            # The injected sidecars check the operator's HTTPS against this CA.
            injection = replace(injection, operator_ca=base64.b64encode(sidecar_ca.ca_pem).decode("ascii"))
        log.info("sidecar injection: %s sidecar, image %s", "native" if injection.native else "plain",
                 injection.image)
        register_webhook(kopf_registry, injection, by_namespace=config.webhook.managed is None)
        settings.admission.server = webhook_server(config.webhook)
        settings.admission.managed = config.webhook.managed

    if mount is not None:
        mount(operator)
    ready = asyncio.Event()
    stop = stop_flag if stop_flag is not None else asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def stopper() -> None:
        # Stop frscope's own tasks as soon as the operator is asked to stop: kopf otherwise waits 5 s for
        # every task it did not start before cancelling them.
        await stop.wait()
        health.failed = "stopping"
        for task in tasks:
            if task is not asyncio.current_task():
                task.cancel()
        await controller.close()
        # Idle keep-alive connections would keep the servers' handlers (in-process ones, in tests) alive.
        await sidecar_session.close()
        await kube.close()

    try:
        port = await http.start(config.http_host, config.http_port, https_port=config.https_port,
                                ssl_context=serving.context if serving is not None else None)
        if serving is not None:
            tasks.append(asyncio.create_task(serving.run()))
            log.info("operator HTTPS on %s:%s for the sidecars (certificate for %s)", config.http_host,
                     http.https_port, serving.name)
        log.info("operator HTTP on %s:%d (/healthz /readyz /metrics /v1/push%s%s)", config.http_host, port,
                 f" {wire.CERTIFICATE_PATH}" if sidecar_ca is not None else "", " /ui/" if mount is not None else "")
        tasks.append(asyncio.create_task(_heartbeat(health)))
        tasks.append(asyncio.create_task(stopper()))
        await decoder.warm_up()

        async def when_ready() -> None:
            await ready.wait()
            health.ready = True
            tasks.append(asyncio.create_task(poller.run()))
            if ledger is not None:
                tasks.append(asyncio.create_task(ledger.run()))
            if on_ready is not None:
                result = on_ready(operator)
                if result is not None:
                    await result

        tasks.append(asyncio.create_task(when_ready()))
        await kopf.operator(
            registry=kopf_registry,
            settings=settings,
            # Several replicas are coordinated by a Lease (serve.leadership), not by kopf's peering: kopf
            # freezes every replica of equal priority, and would pause its watches only, not frscope's loops.
            standalone=True,
            clusterwide=not config.namespaces,
            namespaces=list(config.namespaces),
            stop_flag=stop,
            ready_flag=ready,
        )
    finally:
        health.failed = "kopf stopped"
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await controller.close()
        if policies is not None:
            await policies.close()
        await asyncio.to_thread(decoder.close)
        if archive is not None:
            await asyncio.to_thread(archive.close)
        if bundles is not None:
            await asyncio.to_thread(bundles.close)
        await http.stop()
        await sidecar_session.close()
        await kube.close()


def mount_default_ui(operator: Operator) -> None:
    """The web UI at /ui/ (docs/timeline.md): the watched jobs, their verdicts, a live page per job;
    behind `--ui-auth`."""
    config = operator.config
    live = (LiveWindows(operator.store, operator.controller.sidecars, entries=config.live_entries,
                        interval_s=config.live_interval_s, metrics=operator.metrics.perf,
                        decoder=operator.controller.incidents.decoder, ranks_per_pod=config.live_ranks_per_pod)
            if config.live_entries > 0 else None)
    mount_ui(operator.http, operator.store, guard=ui_guard(config.ui_auth, operator.reviewer), live=live,
             ledger=operator.ledger, bundles=operator.controller.writer.bundles)


def run_operator(config: OperatorConfig) -> int:
    """`frscope operator`: SIGINT/SIGTERM stop it cleanly (exit 0). With `--leader-election-lease` it stands by
    until it holds the Lease, and exits 1 when it loses it (serve.leadership)."""
    logs.setup(config.log_level, config.log_format)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if config.log_level != "debug":
        # kopf logs every handled event at INFO ("Handler ... succeeded"): one line per pod change.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        election = config.leader_election
        if election is None:
            await serve(config, stop_flag=stop, mount=mount_default_ui)
            return 0
        kube = kube_client(login(kopf.OperatorSettings()), config.instance)

        def lead(on_ready: Callable[[], Awaitable[None]]) -> Awaitable[None]:
            return serve(config, stop_flag=stop, mount=mount_default_ui, on_ready=lambda _operator: on_ready())

        try:
            return await run_elected(election, kube, host=config.http_host,
                                     port=config.http_port, stop=stop, lead=lead)
        finally:
            await kube.close()

    code = 0
    with contextlib.suppress(KeyboardInterrupt):
        code = asyncio.run(main())
    return code
