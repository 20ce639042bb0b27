"""Retries with exponential backoff and jitter, for the API server and for sidecars."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Backoff:
    attempts: int = 5  # total tries, including the first
    base_s: float = 0.2
    cap_s: float = 5.0
    jitter: float = 0.2  # +- fraction of each delay

    def delays(self) -> Iterator[float]:
        """The waits between tries (attempts - 1 of them)."""
        for i in range(max(self.attempts - 1, 0)):
            delay = min(self.cap_s, self.base_s * (2**i))
            yield max(0.0, delay * (1 + random.uniform(-self.jitter, self.jitter)))


async def retrying(fn: Callable[[], Awaitable[T]], backoff: Backoff,
                   retry_if: Callable[[BaseException], bool],
                   delay_hint: Callable[[BaseException], float | None] = lambda _: None) -> T:
    """Call `fn` until it succeeds, raises something `retry_if` rejects, or the tries run out."""
    delays = backoff.delays()
    while True:
        try:
            return await fn()
        except Exception as exc:
            if not retry_if(exc):
                raise
            delay = next(delays, None)
            if delay is None:
                raise
            hint = delay_hint(exc)
            await asyncio.sleep(min(hint, backoff.cap_s) if hint is not None else delay)
