"""Per (process group, rank) view of the recorder, built in one pass over every entry.

Matching is by `collective_seq_id` within a group (and p2p by `p2p_seq_id` and peer), never by
`record_id`: record ids count every op of a rank across all its groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from frscope.records import COMPLETED, DumpSet, Entry


@dataclass(slots=True)
class Track:
    """One rank's collectives in one group."""

    rank: int
    by_seq: dict[int, list[Entry]] = field(default_factory=dict)  # coalesced ops share a seq id
    p2p: list[Entry] = field(default_factory=list)
    first_seq: int = 0
    last_seq: int = 0  # highest collective_seq_id enqueued; 0: none visible
    next_seq: int = 1  # first collective not completed on this rank (last_seq + 1 when all done)

    @property
    def last_completed(self) -> int:
        return self.next_seq - 1


def build_tracks(dumpset: DumpSet) -> dict[str, dict[int, Track]]:
    tracks: dict[str, dict[int, Track]] = {}
    for rank, dump in dumpset.dumps.items():
        mine: dict[str, Track] = {}
        open_seq: dict[str, int] = {}
        for entry in dump.entries:
            name = entry.pg_name
            track = mine.get(name)
            if track is None:
                track = mine[name] = Track(rank)
            if entry.is_p2p:
                track.p2p.append(entry)
                continue
            seq = entry.collective_seq_id
            bucket = track.by_seq.get(seq)
            if bucket is None:
                track.by_seq[seq] = [entry]
            else:
                bucket.append(entry)
            # Inlined Entry.completed: this loop sees every entry of every rank.
            if not (entry.state == COMPLETED or entry.retired is True):
                known = open_seq.get(name)
                if known is None or seq < known:
                    open_seq[name] = seq
        for name, track in mine.items():
            if track.by_seq:
                seqs = track.by_seq.keys()
                track.first_seq, track.last_seq = min(seqs), max(seqs)
                track.next_seq = open_seq.get(name, track.last_seq + 1)
            tracks.setdefault(name, {})[rank] = track
    return tracks


def blocked_entry(entries: list[Entry]) -> Entry | None:
    """Where a rank is blocked: its oldest op (by record id, across groups) not completed."""
    for entry in entries:
        if not entry.completed:
            return entry
    return None
