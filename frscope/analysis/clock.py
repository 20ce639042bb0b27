"""When the recorders were read: the 'now' that every age in a report is measured against.

A file's mtime is not a capture time: `cp`, `kubectl cp` and object storage give copies new mtimes,
and a copied dump of a 14-second hang would read 'blocked for 14 h'. So, per rank, in this order:

1. `captured`: the collector's own clock when it read the recorder (snapshot metadata);
2. `mtime`: the file's mtime, but only as a bounded hint. It can be no earlier than the rank's own newest
   entry (a recorder is read after everything in it happened; one read before other ranks' newest entries
   is an earlier read: a periodic dump, a rank that stopped), and no later than
   the moment the first open collective's timeout ran out (its creation plus its `timeout_ms`): by
   then the watchdog has fired and an on-timeout dump was written. Beyond that the mtime is a
   copy's, and the age is capped there (`mtime-capped`);
3. `entries`: the newest entry across ranks, a lower bound, when there is nothing else.

The report says which one an age came from (`age_source`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from frscope.analysis.tracks import Track, newest_created
from frscope.analysis.wording import fmt_duration
from frscope.records import CAPTURED_MTIME, CAPTURED_SNAPSHOT, DumpSet

# Without a recorded timeout, the longest an on-timeout dump can follow its newest entry (torch's
# gloo default, the longest of its defaults: NCCL's is 10 min).
DEFAULT_TIMEOUT_S = 30 * 60.0

GIVEN = "given"
CAPTURED = "captured"
MTIME = "mtime"
MTIME_CAPPED = "mtime-capped"
ENTRIES = "entries"

_WORDS = {
    GIVEN: "the time given to the analysis",
    CAPTURED: "the capture time the collector recorded",
    MTIME: "the dump files' modification time",
    ENTRIES: "the newest recorder entry across ranks (a lower bound: the age may be longer)",
}


@dataclass(frozen=True, slots=True)
class Clock:
    """Each rank's capture time (ns since the epoch) and where it came from."""

    at_ns: dict[int, int]
    source: dict[int, str]
    newest_entry_ns: int | None
    cap_s: float
    copied_by_s: float | None  # how far the mtimes ran past the cap (a copy), when they did

    def now_for(self, ranks: list[int]) -> tuple[int | None, str | None]:
        best: tuple[int, str] | None = None
        for rank in ranks:
            at = self.at_ns.get(rank)
            if at is not None and (best is None or at > best[0]):
                best = (at, self.source[rank])
        return best if best is not None else (None, None)

    def lost(self, rank: int) -> bool:
        """When the rank's recorder was read is lost (a copy's mtime, or no time at all)."""
        return self.source.get(rank, ENTRIES) in (MTIME_CAPPED, ENTRIES)

    def unknown_age(self, since_ns: int | None) -> str:
        """For a report whose capture time is lost (copied files): both readings instead of an age."""
        copied = f" ({fmt_duration(self.copied_by_s)} after it)" if self.copied_by_s is not None else ""
        entered = f"entered at {_utc(since_ns)}; " if since_ns else ""
        return (f"unknown: the dump files' modification times are a copy's{copied}, not when the recorders were "
                f"read; {entered}if the dump was written when the collective's timeout ({fmt_duration(self.cap_s)}) "
                "ran out it had waited that long, if taken earlier (a periodic or requested dump) less: a dump "
                "reason or a snapshot's capture time decides")

    def describe(self, source: str | None) -> str | None:
        """One line for a report: where an age came from."""
        if source is None:
            return None
        if source == MTIME_CAPPED:
            copied = f"{fmt_duration(self.copied_by_s)} " if self.copied_by_s is not None else ""
            return (
                f"the dump files' modification time, capped where the stuck collective's timeout "
                f"({fmt_duration(self.cap_s)}) ran out: the mtimes are {copied}later than that, as after a copy"
            )
        return _WORDS.get(source, source)


def build_clock(dumpset: DumpSet, tracks: dict[str, dict[int, Track]], now_ns: int | None) -> Clock:
    newest: int | None = None
    for dump in dumpset.dumps.values():
        created = newest_created(dump.entries)
        if created:
            newest = created if newest is None or created > newest else newest
    expires: int | None = None  # when the first open collective's timeout ran out
    cap_s = DEFAULT_TIMEOUT_S
    for by_rank in tracks.values():
        for track in by_rank.values():
            bucket = track.by_seq.get(track.next_seq)  # the rank's first open collective of the group
            if not bucket:
                continue
            first = bucket[0]
            if first.timeout_ms and first.time_created_ns:
                end = first.time_created_ns + first.timeout_ms * 1_000_000
                if expires is None or end < expires:
                    expires, cap_s = end, first.timeout_ms / 1000
    at: dict[int, int] = {}
    source: dict[int, str] = {}
    copied_by: float | None = None
    for rank, dump in dumpset.dumps.items():
        if now_ns is not None:
            at[rank], source[rank] = now_ns, GIVEN
        elif dump.captured_at_ns is not None and dump.captured_at_source != CAPTURED_MTIME:
            at[rank], source[rank] = dump.captured_at_ns, CAPTURED if dump.captured_at_source in (
                None, CAPTURED_SNAPSHOT) else dump.captured_at_source
        elif dump.captured_at_ns is not None and newest is not None:
            limit = max(newest, expires) if expires is not None else newest + int(cap_s * 1e9)
            if dump.captured_at_ns > limit:
                late = (dump.captured_at_ns - limit) / 1e9
                copied_by = late if copied_by is None else max(copied_by, late)
                at[rank], source[rank] = limit, MTIME_CAPPED
            elif dump.captured_at_ns < (newest_created(dump.entries) or newest):
                # an mtime older than the rank's own contents: not a capture time (one older than other
                # ranks' newest entries is an earlier read: a periodic dump, a rank that stopped)
                at[rank], source[rank] = newest, ENTRIES
            else:
                at[rank], source[rank] = dump.captured_at_ns, MTIME
        elif dump.captured_at_ns is not None:
            at[rank], source[rank] = dump.captured_at_ns, MTIME
        elif newest is not None:
            at[rank], source[rank] = newest, ENTRIES
    return Clock(at, source, newest, cap_s, copied_by)


def _utc(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
