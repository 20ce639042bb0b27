"""What the ranks of one set repeat, held once for the set: a rank that arrives from another process (a loader
worker, an operator's decoder process) is made of objects of its own, although every rank of a group runs the
same code and most of what it recorded equals its peers'.

`share_small_tables`: a columnar rank's small tables (groups, op names, states, timeouts, threads, shapes,
stacks), each item and each whole table one object across the set (the loader's transfer; the operator's).
`share_rank` (the operator's gathered ranks) goes further: the code and sequence-number columns and the group
index's arrays shared by content, the time columns held at their exact size (shared where they hold one value
throughout), `pg_config` and `pg_status` items and the short strings one object each. What a rank keeps of its
own is then its times, its record ids and anything in which it differs from every rank before it: ~10 KiB a rank
of 200 entries instead of ~27 (bench/RESULTS.md, "Operator: a gathered rank's evidence").

Shared objects are never changed in place: the tables, their arrays and the group index's arrays are read
(`EntryTable`, `GroupIndex`: a re-coding makes new arrays); `PgConfig`, `PgStatus` and tuples are immutable.
`shared` is the set's memo (a dict owned by the caller: its keys add a tuple per distinct table, a shape
table's repr and a hash per distinct array); dropped with the set's reading, the shared objects stay with the
ranks that use them.
"""

from __future__ import annotations

from array import array
from typing import Any

from frscope.records.columns import EntryTable
from frscope.records.model import RankDump

# Columns shared by content (codes into the small tables, sequence numbers): equal across the ranks that ran
# the same collectives. Time columns are a rank's own and are only held at their size, unless they hold one
# value throughout (gloo records no start or end times).
_CODE_COLUMNS = ("pg", "name", "shape", "state", "timeout", "thread", "flags", "seq", "p2p_seq", "stack")
_OWN_COLUMNS = ("created", "started", "completed", "duration")


def share_small_tables(table: EntryTable, shared: dict[Any, Any]) -> None:
    """One object across the set for each item of a table's small tables and for each whole table that
    other ranks have too (`shared`: the set's memo). The tables are read, never changed (`EntryTable`)."""
    if table.stacks is not None:  # one object per distinct frame, then per distinct list of stacks
        frames = [tuple(shared.setdefault(f, f) for f in stack) for stack in table.stacks]
        table.stacks = shared.setdefault(("stacks", tuple(frames)), frames)
    for name in ("pgs", "names", "threads", "states", "timeouts"):
        items = getattr(table, name)
        held = shared.get((name, tuple(items)))  # most ranks: a table another rank has, whole
        if held is None:
            items = [shared.setdefault(("item", item), _texts(item, shared)) for item in items]
            held = shared.setdefault((name, tuple(items)), items)
        setattr(table, name, held)
    # Sizes are lists (not hashable); their repr tells them apart (ints and strings only: records.fields).
    whole = repr(table.shapes)
    held = shared.get(("shapes", whole))
    if held is None:
        held = shared[("shapes", whole)] = [shared.setdefault(("shape", repr(shape)), shape) for shape in table.shapes]
    table.shapes = held


def _texts(item: Any, shared: dict[Any, Any]) -> Any:
    """A tuple item with each of its strings the set's one (a thread's name where its id is its own)."""
    if type(item) is not tuple:
        return _text(item, shared)
    return tuple(_text(value, shared) for value in item)


def exact(column: array[Any]) -> array[Any]:
    """The same array at its exact size: an unpickled array is allocated 1/16 larger than its items (array's
    growth rule); a slice is not."""
    return column[:] if len(column) else column


def shared_array(column: Any, shared: dict[Any, Any]) -> Any:
    """The set's one array equal to `column` (type code and items), else `column` at its exact size, now the
    set's. A range or None is returned as it is."""
    if not isinstance(column, array):
        return column
    key = ("array", column.typecode, len(column), hash(column.tobytes()))
    held = shared.get(key)
    if held is not None and held.tobytes() == column.tobytes():  # bit for bit (a NaN equals no float)
        return held
    mine = exact(column)
    if held is None:
        shared[key] = mine
    return mine


def _text(value: Any, shared: dict[Any, Any]) -> Any:
    return shared.setdefault(("text", value), value) if isinstance(value, str) else value


def _int(value: Any, shared: dict[Any, Any]) -> Any:
    if type(value) is not int or -5 <= value <= 256:  # small ints are Python's own shared objects
        return value
    return shared.setdefault(("int", value), value)


def _content(content: Any, shared: dict[Any, Any]) -> Any:
    try:
        return shared.setdefault(("sig", content), content)
    except TypeError:  # not hashable (normalization never makes such a shape): kept as it is
        return content


def share_rank(dump: RankDump, shared: dict[Any, Any]) -> None:
    """Everything of `dump` that other ranks of the set have too, one object for the set (see the module
    docstring); the values read back are the same."""
    table = dump.entries
    if isinstance(table, EntryTable):
        share_small_tables(table, shared)
        for name in _CODE_COLUMNS:
            setattr(table, name, shared_array(getattr(table, name, None), shared))
        for name in _OWN_COLUMNS:
            column = getattr(table, name)
            if isinstance(column, array):
                # One value throughout (0: not recorded, as gloo's start and end times; NaN durations): shared.
                constant = len(column) and column.tobytes() == column[:1].tobytes() * len(column)
                setattr(table, name, shared_array(column, shared) if constant else exact(column))
        if not isinstance(table.record_id, range):
            table.record_id = exact(table.record_id) if isinstance(table.record_id, array) else table.record_id
        for index in (table._groups or {}).values():
            index.name = _text(index.name, shared)
            index.first_seq, index.last_seq = _int(index.first_seq, shared), _int(index.last_seq, shared)
            index.next_seq = _int(index.next_seq, shared)
            index.members, index.sig = shared_array(index.members, shared), shared_array(index.sig, shared)
            index.p2p, index.offsets = shared_array(index.p2p, shared), shared_array(index.offsets, shared)
            index.seqs = shared_array(index.seqs, shared)
        if table._groups is not None:
            table._groups = {_text(name, shared): index for name, index in table._groups.items()}
        if table.sigs:
            table.sigs = [_content(content, shared) for content in table.sigs]
    # A rank list is the set's one tuple already (the caller's: shared by value or by digest), so its identity
    # names it here: hashing its N members again would be O(N) a rank.
    dump.pg_config = {_text(key, shared): shared.setdefault(
        ("pg_config", cfg.key, cfg.name, cfg.desc, None if cfg.ranks is None else id(cfg.ranks)), cfg)
        for key, cfg in dump.pg_config.items()}
    dump.pg_status = {_text(key, shared): shared.setdefault(("pg_status", status), status)
                      for key, status in dump.pg_status.items()}
    for name in ("version", "backend", "comm_lib_version", "host", "captured_at_source"):
        setattr(dump, name, _text(getattr(dump, name), shared))


__all__ = ["exact", "share_rank", "share_small_tables", "shared_array"]
