"""One rank's entries per process group (`GroupIndex`, built by `EntryTable.groups()` where the file is
decoded) and the signature codes that make the groups of different ranks comparable (`SignatureSpace`,
`unify_signatures`): equal codes mean equal contents (op, sizes and dtypes of a sequence number's
entries)."""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, compress, repeat
from operator import add, and_, eq, mul, not_
from typing import TYPE_CHECKING, Any

from frscope.records.model import COMPLETED

try:
    from frscope.records import _frscan  # type: ignore[attr-defined]
except ImportError:  # not built (no compiler): the Python loop below indexes every group
    _frscan = None

if TYPE_CHECKING:
    from frscope.records.columns import EntryTable


class GroupIndex:
    """One rank's view of one process group (see the module docstring).

    Buckets are numbered k = 0.. in order of first appearance; bucket k holds the entries of sequence
    number `seq_at(k)`. When the sequence numbers are exactly first_seq, first_seq + 1, ... (a ring
    buffer always shows such a run) no array of them is kept; when every bucket has one entry, no
    offsets."""

    __slots__ = (
        "_position", "contiguous", "count", "first_seq", "last_seq", "members", "name", "next_seq", "offsets",
        "p2p", "seqs", "sig",
    )

    def __init__(self, name: str, seqs: Sequence[int], members: Sequence[int], offsets: Sequence[int] | None,
                 sig: array[int], p2p: array[int], next_seq: int) -> None:
        """`seqs`: the distinct seqs in order of first appearance; bucket k is `members[k]` (offsets None)
        or `members[offsets[k]:offsets[k + 1]]`."""
        self.name = name
        self.count = len(seqs)
        self.first_seq = min(seqs) if seqs else 0
        self.last_seq = max(seqs) if seqs else 0
        self.next_seq = next_seq
        self.contiguous = not seqs or list(seqs) == list(range(self.first_seq, self.first_seq + len(seqs)))
        self.seqs: array[int] | None = None if self.contiguous else array("q", seqs)
        self.members = array("I", members)
        self.offsets: array[int] | None = None if offsets is None else array("I", offsets)
        self.sig = sig
        self.p2p = p2p
        self._position: dict[int, int] | None = None

    def seq_at(self, k: int) -> int:
        return self.first_seq + k if self.seqs is None else self.seqs[k]

    def seq_list(self) -> Iterable[int]:
        return range(self.first_seq, self.first_seq + self.count) if self.seqs is None else self.seqs

    def position(self, seq: int) -> int | None:
        """The bucket number of `seq`, or None when this rank has no entry of it."""
        if self.seqs is None:
            k = seq - self.first_seq
            return k if 0 <= k < self.count else None
        if self._position is None:
            self._position = {s: k for k, s in enumerate(self.seqs)}
        return self._position.get(seq)

    def bucket_positions(self, k: int) -> Sequence[int]:
        if self.offsets is None:
            return self.members[k : k + 1]
        return self.members[self.offsets[k] : self.offsets[k + 1]]

    def first_member(self, k: int) -> int:
        return self.members[k] if self.offsets is None else self.members[self.offsets[k]]

    def __getstate__(self) -> tuple[Any, ...]:
        return tuple(None if name == "_position" else getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(self.__slots__, state, strict=True):
            setattr(self, name, value)


def _shape_key(value: Any) -> Any:
    """Sizes (a list of lists of ints) or dtypes (a list of strings) as a hashable value that compares
    like the original (normalization made them well-formed)."""
    if isinstance(value, list):
        return tuple(_shape_key(v) for v in value)
    return value


def _sig_content(table: EntryTable, local: tuple[tuple[str, int], ...]) -> Any:
    out = []
    for op, shape in local:
        input_sizes, input_dtypes, output_sizes, output_dtypes = table.shapes[shape]
        out.append((op, _shape_key(input_sizes), _shape_key(output_sizes), _shape_key(input_dtypes),
                    _shape_key(output_dtypes)))
    return tuple(out)


def index_groups(table: EntryTable) -> dict[str, GroupIndex]:
    """Per group name: its buckets by sequence number, p2p entries, first open seq, bucket signatures.

    The common case (a group's collectives carry consecutive seqs, one entry each) is C-level passes
    over the columns; anything else (coalesced ops sharing a seq, gaps, seqs out of order) one Python
    pass over that group's entries."""
    n = len(table)
    group_names = list(dict.fromkeys(name for name, _desc in table.pgs))
    group_of_code = [group_names.index(name) for name, _desc in table.pgs]
    gid = table.pg if group_of_code == list(range(len(group_of_code))) else array(
        "I", map(group_of_code.__getitem__, table.pg))
    op_names = list(dict.fromkeys(op for _pn, op, _peer in table.names))
    op_of_name = [op_names.index(op) for _pn, op, _peer in table.names]
    shape_count = max(1, len(table.shapes))

    def content(key: Any) -> Any:
        items = key if isinstance(key, tuple) else (key,)
        return _sig_content(table, tuple((op_names[k // shape_count], k % shape_count) for k in items))

    fast = _index_contiguous(table, gid, group_names, op_of_name, shape_count)
    if fast is not None:
        out, sig_keys = fast
        table.sigs = [content(key) for key in sig_keys]
        return out
    open_flags = list(table.open_flags())
    p2p_flags = list(map(and_, table.flags, repeat(1)))
    seq_col, name_col, shape_col = table.seq, table.name, table.shape
    sig_index: dict[Any, int] = {}
    sig_keys = []
    out = {}
    for g, name in enumerate(group_names):
        mine: Sequence[int] = range(n) if len(group_names) == 1 else list(compress(range(n), map(eq, gid, repeat(g))))
        p2p = array("I", compress(mine, map(p2p_flags.__getitem__, mine)))
        coll = list(compress(mine, map(not_, map(p2p_flags.__getitem__, mine)))) if p2p else list(mine)
        seqs = list(map(seq_col.__getitem__, coll))
        open_seqs = list(compress(seqs, map(open_flags.__getitem__, coll)))
        if seqs and seqs == list(range(seqs[0], seqs[0] + len(seqs))):
            # One entry per seq: a bucket's signature is its entry's (op, shape), one int.
            keys: Sequence[Any] = list(map(add, map(mul, map(op_of_name.__getitem__, map(name_col.__getitem__, coll)),
                                                  repeat(shape_count)), map(shape_col.__getitem__, coll)))
            members, offsets, distinct = coll, None, seqs
        else:
            buckets: dict[int, list[int]] = {}
            for position, seq in zip(coll, seqs, strict=True):
                bucket = buckets.get(seq)
                if bucket is None:
                    buckets[seq] = [position]
                else:
                    bucket.append(position)
            keys = [tuple(op_of_name[name_col[p]] * shape_count + shape_col[p] for p in b) for b in buckets.values()]
            keys = [k[0] if len(k) == 1 else k for k in keys]
            distinct = list(buckets)
            members = [p for b in buckets.values() for p in b]
            offsets = list(accumulate((len(b) for b in buckets.values()), initial=0))
            if len(offsets) - 1 == len(members):
                offsets = None
        for key in dict.fromkeys(keys):
            if key not in sig_index:
                sig_index[key] = len(sig_keys)
                sig_keys.append(key)
        sig = array("I", map(sig_index.__getitem__, keys))
        last = max(seqs) if seqs else 0
        next_seq = (min(open_seqs) if open_seqs else last + 1) if seqs else 1
        out[name] = GroupIndex(name, distinct, members, offsets, sig, p2p, next_seq)
    table.sigs = [content(key) for key in sig_keys]
    return out


def narrowed(column: array[int], signed: bool) -> array[int]:
    """The same ints in the smallest array type that holds them all: 'b'/'h'/'i' (signed) or 'B'/'H'/'I'
    (unsigned), else as it is. One C pass (`_frscan.narrow`) where the extension is built."""
    if _frscan is not None:
        got = _frscan.narrow(column, signed)
        if got is None:
            return column
        code, raw = got
        if code == column.typecode or code in "qQ":
            return column
        out = array(code)
        out.frombytes(raw)
        return out
    low, high = min(column, default=0), max(column, default=0)
    kinds = (("b", -(1 << 7), 1 << 7), ("h", -(1 << 15), 1 << 15), ("i", -(1 << 31), 1 << 31)) if signed else (
        ("B", 0, 1 << 8), ("H", 0, 1 << 16), ("I", 0, 1 << 32))
    for code, bottom, bound in kinds:
        if bottom <= low and high < bound:
            return column if column.typecode == code else array(code, column)
    return column


def narrow_codes(codes: array[int]) -> array[int]:
    """Signature codes in the smallest unsigned array type that holds them (the same ints read back)."""
    return narrowed(codes, False)


def _u32(raw: bytes) -> array[int]:
    out = array("I")
    out.frombytes(raw)
    return out


def _index_contiguous(table: EntryTable, gid: Sequence[int], group_names: list[str], op_of_name: list[int],
                      shape_count: int) -> tuple[dict[str, GroupIndex], list[Any]] | None:
    """`index_groups`' result in one C pass (`_frscan.index_contiguous`) when every group's collectives carry
    consecutive seqs, one entry each (the common shape); None otherwise, or without the extension."""
    if _frscan is None or not len(table) or os.environ.get("FRSCOPE_NO_SCANNER", "") not in ("", "0"):
        return None
    done = bytes(state == COMPLETED for state in table.states)
    got = _frscan.index_contiguous(gid, len(group_names), table.flags, table.state, done, table.seq, table.name,
                                   op_of_name, table.shape, shape_count)
    if got is None:
        return None
    per_group, keys = got
    out: dict[str, GroupIndex] = {}
    for name, (members, p2p, first_seq, count, next_seq, sig) in zip(group_names, per_group, strict=True):
        index = GroupIndex.__new__(GroupIndex)
        index.name, index.count, index.first_seq, index.next_seq = name, count, first_seq, next_seq
        index.last_seq = first_seq + count - 1 if count else 0
        index.contiguous, index.seqs, index.offsets, index._position = True, None, None, None
        index.members, index.p2p, index.sig = _u32(members), _u32(p2p), _u32(sig)
        out[name] = index
    return out, keys


class SignatureSpace:
    """Signature contents of a whole dump set, one code each: tables unified into one space compare
    their codes directly. `facts(code)` caches what the analysis asks of a signature's contents."""

    __slots__ = ("_facts", "codes", "contents")

    def __init__(self) -> None:
        self.codes: dict[Any, int] = {}
        self.contents: list[Any] = []
        self._facts: dict[tuple[int, str], Any] = {}

    def code(self, content: Any) -> int:
        try:
            got = self.codes.get(content)
        except TypeError:  # not hashable (normalization never makes such a shape): equal to nothing
            got = None
            self.contents.append(content)
            return len(self.contents) - 1
        if got is None:
            got = self.codes[content] = len(self.contents)
            self.contents.append(content)
        return got

    def fact(self, code: int, what: str, compute: Callable[[Any], Any]) -> Any:
        key = (code, what)
        got = self._facts.get(key, self)
        if got is self:
            got = self._facts[key] = compute(self.contents[code])
        return got


def unify_signatures(tables: Iterable[EntryTable], space: SignatureSpace | None = None) -> SignatureSpace:
    """Re-code every table's bucket signatures into one shared space (a table already in it is skipped)."""
    space = space if space is not None else SignatureSpace()
    for table in tables:
        groups = table.groups()
        if table.space is space:
            continue
        contents = table.space.contents if table.space is not None else table.sigs
        remap = [space.code(content) for content in contents]
        if remap != list(range(len(remap))):
            for index in groups.values():
                index.sig = narrow_codes(array("I", map(remap.__getitem__, index.sig)))
        table.space, table.sigs = space, []
    return space


def space_of(tables: Iterable[EntryTable]) -> SignatureSpace | None:
    """The space all these tables were unified into, or None."""
    found: SignatureSpace | None = None
    for table in tables:
        if table.space is None or (found is not None and table.space is not found):
            return None
        found = table.space
    return found
