"""How many pushes the operator takes in at once, and when a refused one should come back.

When the watchdog fires in a 1,000-pod job every sidecar pushes within seconds: each body is ~1 MiB of
JSON to read and decode (GIL-bound). Taken in all at once, every request's body sits in memory while it
waits for a decode slot, and the waiting outlasts the sidecars' 10 s timeout, so they retry and the work
is done again (measured in bench/push_storm.py: 1,250 pushes, 1.7% accepted, 1.1 GiB peak). Past
`max_in_flight` pushes being read or decoded, a push is answered 429 before its body is read, with a
Retry-After drawn at random over the time the pushes refused lately would take to decode, so the
retries arrive spread out instead of as a second storm.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable

MAX_RETRY_AFTER_S = 120  # the sidecar caps a longer one at this anyway


class PushGate:
    def __init__(self, max_in_flight: int = 8, *, window_s: float = 10.0, decode_s: float = 0.05,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        self.max_in_flight = max(1, max_in_flight)
        self.in_flight = 0
        self._window_s = window_s
        self._decode_s = decode_s  # moving average of one push's share of the read + decode time, seconds
        self._clock = clock
        self._rng = rng or random.Random()
        self._refused: deque[float] = deque()

    def try_enter(self) -> int | None:
        """None: admitted (call `leave` when done); else the Retry-After, in seconds, to answer with."""
        now = self._clock()
        while self._refused and now - self._refused[0] > self._window_s:
            self._refused.popleft()
        if self.in_flight < self.max_in_flight:
            self.in_flight += 1
            return None
        self._refused.append(now)
        backlog_s = (len(self._refused) + self.in_flight) * self._decode_s
        return min(MAX_RETRY_AFTER_S, max(1, math.ceil(self._rng.uniform(1.0, 1.0 + backlog_s))))

    def leave(self, took_s: float | None = None) -> None:
        """`took_s`: how long this push took in; the pushes in flight shared the time (one GIL), so each
        one's cost is its share of it."""
        if took_s is not None and took_s >= 0:
            self._decode_s = 0.8 * self._decode_s + 0.2 * took_s / max(1, self.in_flight)
        self.in_flight = max(0, self.in_flight - 1)
