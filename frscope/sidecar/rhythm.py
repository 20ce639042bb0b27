"""A group's own rhythm: how long its collectives usually wait, learned from the polls that found one
in flight, and the suspicion threshold it sets (docs/sidecar.md, "Suspected and confirmed stalls").

An *episode* is one stretch in which a group has a collective in flight and makes no progress. Every
poll inside it sees how long the group has been quiet so far; when the group progresses again, the
longest of those is the episode's wait, and it is kept (the last `RHYTHM_EPISODES` of them). The
group's usual wait is the longest kept one: a job whose collectives routinely wait 3 s (a slow rank
at every step, an asynchronous all_reduce overlapping the backward pass) is suspected after 3 x that,
a job whose collectives return at once after `--suspect-min`. Never later than `--suspect-after`.

Only waits count, not the gaps between collectives: a pause with nothing in flight (a checkpoint, an
evaluation, a data loader refilling) is no wait at all and never suspected, however long it is.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# A wait this many times the group's usual one is far beyond its rhythm.
RHYTHM_FACTOR = 3.0
# Episodes remembered per (rank, group): the usual wait follows a job whose rhythm changes.
RHYTHM_EPISODES = 32


@dataclass(slots=True)
class Rhythm:
    waits: deque[float] = field(default_factory=lambda: deque(maxlen=RHYTHM_EPISODES))
    episode_s: float = 0.0  # the current episode's longest quiet time seen so far (0: none seen)

    def observe(self, quiet_s: float) -> None:
        """A poll found the group in flight, quiet for `quiet_s`."""
        self.episode_s = max(self.episode_s, quiet_s)

    def resolve(self) -> None:
        """The group progressed or has nothing in flight: the episode (if any poll saw it) is kept."""
        if self.episode_s > 0:
            self.waits.append(self.episode_s)
        self.episode_s = 0.0

    @property
    def usual_wait_s(self) -> float:
        return max(self.waits, default=0.0)

    def threshold_s(self, suspect_min_s: float, suspect_after_s: float) -> float:
        """Quiet time with a collective in flight after which the group is suspected."""
        return min(suspect_after_s, max(suspect_min_s, RHYTHM_FACTOR * self.usual_wait_s))
