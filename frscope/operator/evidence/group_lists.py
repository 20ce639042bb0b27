"""Process groups' rank lists across the decoder processes' boundary: each distinct large list sent once.

Every rank's recorder lists the members of each of its groups (`pg_config`), so each decoded rank carries
its default group's N members. From a decoder process a rank's evidence travels back pickled: a tuple of
N ints pickled there, and N int objects made again in the operator's process (which hashed the tuple once
more to share one copy across the gather: `RankDump.share_group_ranks`). That is O(N) per rank, O(N^2) a
gather: at 8,192 ranks ~36 KiB a rank through the pipe, and unpickling it was the operator process's
largest cost after the event loop's (bench/RESULTS.md, "Operator at 32,768 pods").

Here a list of at least BIG members travels as a 16-byte digest (blake2b of its members), with the list
itself only when the operator's process did not say it holds that digest already (`known`, given with
each body); the operator's process maps digests to its one tuple per gather (`GroupTable`). Smaller lists
travel as before and are shared by value.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from frscope.records.model import PgConfig
from frscope.records.sharing import share_rank

if TYPE_CHECKING:
    from frscope.operator.evidence.pod_evidence import PodEvidence

# A list shorter than this travels as it is (a tensor-parallel group of 8: digesting it saves nothing).
BIG = 256
# At most this many digests are named as known with one body (16 bytes each); a list whose digest is
# not named is sent whole, which is always right, only larger.
MAX_KNOWN = 256
# Digests remembered by a decoder process (by the identity of the tuple normalize's cache keeps).
_MAX_REMEMBERED = 4096
_remembered: dict[int, tuple[tuple[int, ...], bytes]] = {}


@dataclass(slots=True)
class Packed:
    """What replaced a rank's large lists in transit: (dump index, pg_config key, digest), and the lists
    the receiver did not say it has, by digest."""

    refs: list[tuple[int, str, bytes]] = field(default_factory=list)
    lists: dict[bytes, tuple[int, ...]] = field(default_factory=dict)


@dataclass(slots=True)
class GroupTable:
    """One gather's rank lists in the operator's process: one tuple per distinct list (`tuples`, by value,
    for the small ones) and per digest (`digests`, the large ones)."""

    tuples: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict)
    digests: dict[bytes, tuple[int, ...]] = field(default_factory=dict)
    # Everything else the gather's ranks repeat, one object each (`records.sharing.share_rank`'s memo).
    shared: dict[Any, Any] = field(default_factory=dict)

    def known(self) -> frozenset[bytes]:
        """The digests to name with the next body (at most MAX_KNOWN of them)."""
        if len(self.digests) <= MAX_KNOWN:
            return frozenset(self.digests)
        return frozenset(list(self.digests)[:MAX_KNOWN])


def digest(ranks: tuple[int, ...]) -> bytes:
    """The list's digest (blake2b, 16 bytes), computed once per tuple object in a process."""
    hit = _remembered.get(id(ranks))
    if hit is not None and hit[0] is ranks:
        return hit[1]
    value = hashlib.blake2b(array("q", ranks).tobytes(), digest_size=16).digest()
    if len(_remembered) >= _MAX_REMEMBERED:
        _remembered.clear()
    _remembered[id(ranks)] = (ranks, value)
    return value


def pack(evidence: PodEvidence, known: frozenset[bytes]) -> PodEvidence:
    """In the decoder process, before the evidence is sent back: each large list replaced by its digest
    (`evidence.packed_groups`), the list itself kept beside it unless its digest is in `known`."""
    packed = Packed()
    for index, dump in enumerate(evidence.dumps):
        for key, cfg in list(dump.pg_config.items()):
            if cfg.ranks is None or len(cfg.ranks) < BIG:
                continue
            value = digest(cfg.ranks)
            packed.refs.append((index, key, value))
            if value not in known:
                packed.lists[value] = cfg.ranks
            dump.pg_config[key] = PgConfig(cfg.key, cfg.name, cfg.desc, None)
    evidence.packed_groups = packed if packed.refs else None
    return evidence


def unpack(evidence: PodEvidence, table: GroupTable) -> PodEvidence:
    """In the operator's process: every list back in place, the gather's one tuple of each, small lists
    shared by value (as `RankDump.share_group_ranks` does); then whatever else a rank has that the gather's
    other ranks have too, one object for the gather (`records.sharing.share_rank`): a gather holds every
    rank's evidence until the analysis, and most of a rank's tables equal its peers'."""
    packed = evidence.packed_groups
    if packed is not None:
        for value, ranks in packed.lists.items():
            table.digests.setdefault(value, ranks)
        for index, key, value in packed.refs:
            dump = evidence.dumps[index]
            cfg = dump.pg_config[key]
            # Always there: `known` named only digests this table holds, and the others came with it.
            dump.pg_config[key] = PgConfig(cfg.key, cfg.name, cfg.desc, table.digests[value])
        evidence.packed_groups = None
    for dump in evidence.dumps:
        for key, cfg in dump.pg_config.items():
            # A large list is the gather's one tuple already (by digest above; decoded in this process,
            # normalize's cache made it one object): hashing N members again would be O(N) a rank.
            if cfg.ranks is not None and len(cfg.ranks) < BIG:
                ranks = table.tuples.setdefault(cfg.ranks, cfg.ranks)
                if ranks is not cfg.ranks:
                    dump.pg_config[key] = PgConfig(cfg.key, cfg.name, cfg.desc, ranks)
        share_rank(dump, table.shared)
    evidence.namespace = table.shared.setdefault(("text", evidence.namespace), evidence.namespace)
    evidence.reason = table.shared.setdefault(("text", evidence.reason), evidence.reason)
    return evidence


def packed_call(fn: Any, known: frozenset[bytes], /, *args: Any, **kwargs: Any) -> PodEvidence:
    """`fn(*args, **kwargs)` (a decode) in the decoder process, its evidence packed for the way back."""
    return pack(fn(*args, **kwargs), known)
