"""Push snapshots to the operator (`POST <operator-url>/v1/push`), with retries and backoff.

Pushes are rare (a stall, a new dump file, a trainer exit) and may outlive the pod only if they get
out quickly, so the queue is short: when it is full, the oldest waiting push is dropped (and
counted), never the newest.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from frscope.sidecar.metrics import SidecarMetrics

log = logging.getLogger("frscope.sidecar")

QUEUE_SIZE = 4
MAX_RETRY_AFTER_S = 120.0  # a Retry-After longer than this is capped: the evidence must get out while it matters
# How long in all a push waits as 429s ask before their waits count as failed tries (a push storm at a
# 1,000-pod job takes the operator a minute or two to take in; the tries alone ran out before).
MAX_THROTTLED_S = 600.0


@dataclass(frozen=True, slots=True)
class PushItem:
    reason: str
    body_gz: bytes


class Pusher:
    def __init__(
        self,
        url: str,
        *,
        token: Callable[[], str | None],
        pod: str,
        namespace: str,
        timeout_s: float,
        attempts: int,
        backoff_s: float,
        metrics: SidecarMetrics,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url.rstrip("/") + "/v1/push"
        self.token = token
        self.pod = pod
        self.namespace = namespace
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.metrics = metrics
        self.ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True  # True: system CAs
        self.queue: asyncio.Queue[PushItem] = asyncio.Queue(maxsize=QUEUE_SIZE)
        self.delivered: list[str] = []  # reasons of pushes that got a 2xx, newest last (bounded)

    def submit(self, reason: str, body_gz: bytes) -> None:
        while self.queue.full():
            dropped = self.queue.get_nowait()
            self.queue.task_done()
            self.metrics.pushes.labels(result="dropped").inc()
            log.warning("push: queue full, dropped the oldest waiting push (%s)", dropped.reason)
        self.queue.put_nowait(PushItem(reason, body_gz))

    async def run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                item = await self.queue.get()
                try:
                    await self._deliver(session, item)
                finally:
                    self.queue.task_done()

    async def _deliver(self, session: aiohttp.ClientSession, item: PushItem) -> None:
        headers = {
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
            "X-Frscope-Pod": self.pod,
            "X-Frscope-Namespace": self.namespace,
        }
        token = self.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        delay = self.backoff_s
        tries = 0
        throttled_since: float | None = None
        while True:
            problem: str
            wait = delay
            asked = 0.0  # the Retry-After of a 429: the operator is up and asks to come back later
            try:
                async with session.post(
                    self.url, data=item.body_gz, headers=headers, ssl=self.ssl,
                    timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                ) as resp:
                    await resp.read()
                    if 200 <= resp.status < 300:
                        self.metrics.pushes.labels(result="ok").inc()
                        self.delivered = [*self.delivered[-15:], item.reason]
                        log.info("push: %s snapshot delivered to %s (%d bytes)", item.reason, self.url,
                                 len(item.body_gz))
                        return
                    problem = f"HTTP {resp.status}"
                    if resp.status == 429:  # the operator is full for now: wait as long as it asks
                        asked = retry_after(resp.headers.get("Retry-After"))
                        wait = max(delay, asked)
                    if 400 <= resp.status < 500 and resp.status not in (408, 429):
                        break  # the operator refused it: retrying the same body will not help
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            now = time.monotonic()
            if asked > 0:
                # A storm: the operator takes pushes in a few at a time and spreads the others over its
                # backlog. Waiting as asked is no failed try, for up to MAX_THROTTLED_S in all.
                throttled_since = now if throttled_since is None else throttled_since
                if now + wait - throttled_since <= MAX_THROTTLED_S:
                    self.metrics.pushes.labels(result="retry").inc()
                    log.info("push: %s snapshot: the operator is busy (%s); retry in %.1f s", item.reason,
                             problem, wait)
                    await asyncio.sleep(wait)
                    continue
            tries += 1
            if tries >= self.attempts:
                break
            self.metrics.pushes.labels(result="retry").inc()
            log.warning("push: %s snapshot to %s failed (%s); retry %d/%d in %.1f s",
                        item.reason, self.url, problem, tries, self.attempts - 1, wait)
            await asyncio.sleep(wait)
            delay *= 2
        self.metrics.pushes.labels(result="failed").inc()
        log.error("push: %s snapshot to %s failed for good (%s); it stays available at /v1/snapshot",
                  item.reason, self.url, problem)

    async def drain(self, timeout_s: float) -> None:
        """Give waiting pushes up to `timeout_s` to go out (at shutdown)."""
        try:
            await asyncio.wait_for(self.queue.join(), timeout_s)
        except TimeoutError:
            log.warning("push: %d push(es) not delivered before shutdown", self.queue.qsize())


def retry_after(value: str | None) -> float:
    """Seconds from a Retry-After header (delta-seconds only; an HTTP date or garbage counts as 0),
    capped at MAX_RETRY_AFTER_S."""
    try:
        seconds = float(value or "0")
    except ValueError:
        return 0.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S) if seconds == seconds else 0.0
