"""How a loader worker's result travels to the parent process (`loader.load_dumps`): compact, and shared where
every rank repeats the same thing.

A columnar rank (`EntryTable`) pickles as a few byte buffers and small tables; a rank read row by row sends its
entries as plain tuples (`entry_rows`). pg_config rank lists travel by reference (`_RankLists`), stacks' frames
are made one object per distinct frame on arrival.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Any

from frscope.records.columns import EntryTable
from frscope.records.model import EntryRow, LoadProblem, PgConfig, RankDump, entries_from_rows, entry_rows
from frscope.records.sharing import share_small_tables

# What a worker sends back for one file: the dump (list entries travel apart, as rows; pg_config rank lists
# apart, as references), or the problem.
RanksRef = tuple[bytes, tuple[int, ...] | None]
Shipped = tuple[RankDump, list[EntryRow] | None, dict[str, RanksRef]] | LoadProblem


class _RankLists:
    """A worker's record of the pg_config rank lists it has sent in this load (`session`). Every rank lists its
    default group's N members: sent whole with every rank, they cost N² ints to pickle, unpickle, hash and
    compare (10^9 at 32,768 ranks). Each list is named by a digest of its contents and travels whole
    only the first time this worker sends it; the parent reads a worker's results in the order the worker
    produced them (`pool.map` hands out chunks in order, each worker takes one at a time), so it has met the
    list before any reference to it."""

    LIMIT = 1 << 16  # distinct lists marked sent (16-byte digests); past it, lists travel whole
    HELD = 4096  # lists whose digest is kept (each held alive, as normalize's parse cache holds 4,096)

    def __init__(self) -> None:
        self.session: object = None
        self.digests: dict[int, tuple[tuple[int, ...], bytes]] = {}  # id(list) -> (the list, its digest)
        self.sent: set[bytes] = set()

    def ref(self, ranks: tuple[int, ...], session: object) -> RanksRef:
        if session != self.session:
            self.session, self.sent = session, set()
        held = self.digests.get(id(ranks))
        if held is not None and held[0] is ranks:
            digest = held[1]
        else:  # normalize parses each distinct text once (parse_ranks): mostly the same tuple object
            digest = hashlib.blake2b(array("q", ranks).tobytes(), digest_size=16).digest()
            if len(self.digests) < self.HELD:
                self.digests[id(ranks)] = (ranks, digest)
        if digest in self.sent:
            return digest, None
        if len(self.sent) < self.LIMIT:
            self.sent.add(digest)
        return digest, ranks


_RANK_LISTS = _RankLists()


class UnknownRanks(Exception):
    """A rank list referenced before it was received (never expected: see `_RankLists`)."""


def ship(result: RankDump | LoadProblem, session: object) -> Shipped:
    if isinstance(result, LoadProblem):
        return result
    refs: dict[str, RanksRef] = {}
    for key, cfg in result.pg_config.items():
        if cfg.ranks is not None:
            refs[key] = _RANK_LISTS.ref(cfg.ranks, session)
            result.pg_config[key] = PgConfig(cfg.key, cfg.name, cfg.desc, None)
    if isinstance(result.entries, EntryTable):
        return result, None, refs  # a few arrays and small tables: pickles as bytes
    rows = entry_rows(result.entries)
    result.entries = []
    return result, rows, refs


def _share_tables(table: EntryTable, shared: dict[Any, Any]) -> None:
    """One object across the set for each of a table's small tables (groups, op names, states, timeouts,
    threads, shapes, stacks) and their items that other ranks have too (`sharing.share_small_tables`): every
    rank of a group runs the same code, and at 32,768 ranks a copy per rank was ~10 KiB a rank."""
    share_small_tables(table, shared)
    # An unpickled array is allocated 1/16 larger than its items (array's growth rule); a slice is exact: at
    # 32,768 ranks the slack was ~6 KiB a rank.
    for name in _ARRAY_SLOTS:
        column = getattr(table, name)
        if isinstance(column, array) and len(column) >= 256:
            setattr(table, name, column[:])
    for index in (table._groups or {}).values():
        index.members, index.sig = index.members[:], index.sig[:]


_ARRAY_SLOTS = ("record_id", "seq", "p2p_seq", "created", "started", "completed", "duration", "flags", "pg", "name",
                "state", "timeout", "thread", "shape", "stack")


def unship(shipped: Shipped, rank_lists: dict[bytes, tuple[int, ...]],
            shared_frames: dict[Any, Any]) -> RankDump | LoadProblem:
    if isinstance(shipped, LoadProblem):
        return shipped
    dump, rows, refs = shipped
    if rows is not None:
        dump.entries = entries_from_rows(rows)
    elif isinstance(dump.entries, EntryTable):
        _share_tables(dump.entries, shared_frames)
    # One tuple per rank list for the whole set (by digest: no N-int hash or comparison per rank).
    for key, (digest, ranks) in refs.items():
        if ranks is None:
            ranks = rank_lists.get(digest)
            if ranks is None:
                raise UnknownRanks(dump.source)
        else:
            ranks = rank_lists.setdefault(digest, ranks)
        cfg = dump.pg_config[key]
        dump.pg_config[key] = PgConfig(cfg.key, cfg.name, cfg.desc, ranks)
    return dump
