"""Mutations of pickle dumps for the scanner fuzzer: a pickle re-written with hostile Python values at every
protocol (huge or overflowing ints, NaN, lone surrogates, bytes, sets, cycles, shared references), or its opcode
stream edited at opcode boundaries (memo indexes and lengths that lie, LONG4 / BINUNICODE8 / FRAME sizes past
the buffer, STOP missing or early, PROTO 5 and beyond, opcodes the dumps never hold, repeated dict keys, GETs of
memoized containers in place of scalars).
"""

from __future__ import annotations

import math
import pickle
import pickletools
import random
import struct
from typing import Any

from frscope.records.errors import DumpError
from frscope.records.safe_pickle import safe_loads
from frscope.testing.scanfuzz.mutate import Mutator, chop, cut, flip, json_target, set_path, splice


def _evil_ops(rng: random.Random) -> bytes:
    huge4 = struct.pack("<I", rng.choice((0xFFFFFFFF, 0x7FFFFFFF, 1 << 20, 300)))
    huge8 = struct.pack("<Q", rng.choice((1 << 63, (1 << 64) - 1, 1 << 40, 1 << 20, 300)))
    return rng.choice((
        b"h\xff", b"j" + huge4, b"r" + huge4, b"q\x00", b"q\xff", b"\x94", b"h\x00", b"j\x00\x00\x00\x00",
        b"\x8b" + huge4, b"\x8b\x09\x00\x00\x00" + b"\xff" * 9, b"\x8a\x09" + b"\x01" * 9, b"\x8a\xff",
        b"\x8a\x08" + b"\xff" * 7 + b"\x7f", b"\x8a\x08" + b"\x00" * 7 + b"\x80", b"\x8a\x00",
        b"X" + huge4 + b"abc", b"\x8d" + huge8 + b"abc", b"\x8c\xff", b"X\x02\x00\x00\x00\xed\xa0",
        b"X\x03\x00\x00\x00\xed\xa0\x80", b"X\x01\x00\x00\x00\xff", b"\x95" + huge8, b"\x95" + bytes(8),
        b"\x80\x05", b"\x80\x02", b"0", b"1", b"2", b"(", b"t", b"e", b"u", b"s", b"a", b".", b")", b"]", b"}", b"N",
        b"cos\nsystem\n", b"R", b"b", b"\x93", b"P0\n", b"Q", b"B" + huge4, b"\x8e" + huge8, b"\x96" + huge8,
        b"\x97", b"\x98", b"\x8f", b"\x90", b"\x91", b"I1\n", b"I99999999999999999999999\n", b"L5L\n", b"F1.5\n",
        b"Vabc\n", b"S'x'\n", b"U\x01x", b"T" + huge4, b"g0\n", b"p0\n", b"J\xff\xff\xff\xff", b"K\x00", b"M\xff\xff",
        b"G" + struct.pack(">d", rng.choice((math.nan, math.inf, -0.0, 1e308, -1.0))), b"\x88", b"\x89",
        b"\x85", b"\x86", b"\x87", b"(" * 40 + b"t" * 40, b"]" * 40 + b"a" * 39, b"\x00", b"\xff",
    ))


def _ops(data: bytes) -> list[tuple[int, int, str, Any]]:
    """(start, end, opcode name, arg) of each opcode, as far as pickletools reads the stream."""
    out: list[tuple[int, int, str, Any]] = []
    try:
        ops = list(pickletools.genops(data))
    except Exception:  # a stream already broken: as far as it reads
        return out
    for i, (op, arg, pos) in enumerate(ops):
        end = ops[i + 1][2] if i + 1 < len(ops) else len(data)
        out.append((pos or 0, end or 0, op.name, arg))
    return out


def pickle_ops(data: bytes, rng: random.Random, _others: list[bytes]) -> bytes:
    """The opcode stream edited at opcode boundaries: evil opcodes in, one out, one twice, or an argument
    (a memo index, a length, a frame's size, an int) changed."""
    ops = _ops(data)
    if not ops:
        return flip(data, rng, _others)
    start, end, name, arg = rng.choice(ops)
    roll = rng.random()
    if roll < 0.35:
        return data[:start] + _evil_ops(rng) + data[start:]
    if roll < 0.45:
        return data[:start] + data[end:]
    if roll < 0.5:
        return data[:end] + data[start:end] * rng.choice((1, 2, 50)) + data[end:]
    # an argument changed
    op = data[start]
    if name in ("BINPUT", "BINGET"):
        return data[: start + 1] + bytes([rng.randrange(256)]) + data[end:]
    if name in ("LONG_BINPUT", "LONG_BINGET"):
        index = rng.choice((0xFFFFFFFF, 1 << 20, len(data), len(data) + 1, rng.randrange(64)))
        return data[: start + 1] + struct.pack("<I", index) + data[end:]
    if name == "BINUNICODE":
        length = rng.choice((0xFFFFFFFF, len(data), len(arg.encode("utf-8", "surrogatepass")) + rng.choice((-1, 1, 8))))
        return data[: start + 1] + struct.pack("<I", max(0, length)) + data[start + 5:]
    if name == "SHORT_BINUNICODE":
        return data[: start + 1] + bytes([rng.randrange(256)]) + data[start + 2:]
    if name == "FRAME":
        return data[: start + 1] + struct.pack("<Q", rng.choice((0, 1, arg - 1, arg + 1, 1 << 62))) + data[end:]
    if name in ("BININT", "BININT1", "BININT2", "LONG1"):
        value = rng.choice((2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, -1, 0, 2**31))
        return data[:start] + b"\x8a" + bytes([_nbytes(value)]) + _le(value) + data[end:]
    if name == "BINFLOAT":
        return data[:start] + b"G" + struct.pack(">d", rng.choice((math.nan, -math.inf, math.inf, -0.0, 5e-324)))\
            + data[end:]
    if name == "PROTO":
        return data[:start] + b"\x80" + bytes([rng.choice((0, 1, 2, 3, 4, 5, 6, 0xFF))]) + data[end:]
    if name == "STOP":
        return data[:start] + rng.choice((b"", b"..", b".\x00", b"N."))
    del op
    return data[:start] + _evil_ops(rng) + data[end:]


def _nbytes(value: int) -> int:
    return len(_le(value))


def _le(value: int) -> bytes:
    return pickle.encode_long(value)


def _hostile_py(rng: random.Random, old: Any) -> Any:
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    deep: Any = 1
    for _ in range(rng.choice((33, 70, 200))):
        deep = [deep]
    return rng.choice((
        None, True, False, 0, -1, 2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30, 10**400,
        math.nan, math.inf, -math.inf, -0.0, 1.5, 1e308, "", "\ud800", "\udfff x", "\x00", "x" * 100_000, b"bytes",
        bytearray(b"x"), (1, 2), [], {}, {1: 2}, {"a": 1}, [old], (old,), [old] * 1000, {old if isinstance(old, str)
        else "k": old}, cyclic, deep, set(), frozenset({1}), [[1, 2]] * 20_000, str(old), [str(old)],
        old * 3 if isinstance(old, (str, list)) else old,
    ))


def pickle_value(data: bytes, rng: random.Random, _others: list[bytes]) -> bytes:
    """A value of the decoded dump replaced by a hostile Python value (or a shared or cyclic one), written
    again at a random protocol."""
    try:
        obj = safe_loads(data, "seed")
    except DumpError:
        return pickle_ops(data, rng, _others)
    path = json_target(obj, rng) if isinstance(obj, dict) else ()
    old: Any = obj
    for key in path:
        old = old[key]
    value = _hostile_py(rng, old)
    if rng.random() < 0.1 and path:  # shared: the same object elsewhere too (memo references)
        other = json_target(obj, rng)
        if other and other[: len(path)] != path and path[: len(other)] != other:
            set_path(obj, other, value)
    try:
        obj = set_path(obj, path, value)
        return pickle.dumps(obj, protocol=rng.choice((2, 2, 3, 4, 5)))
    except (RecursionError, ValueError, TypeError):
        return pickle_ops(data, rng, _others)


_SCALARS = {"BININT", "BININT1", "BININT2", "LONG1", "BINUNICODE", "SHORT_BINUNICODE", "NONE", "NEWTRUE", "NEWFALSE",
            "BINFLOAT", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE"}


def pickle_share(data: bytes, rng: random.Random, _others: list[bytes]) -> bytes:
    """A scalar's push replaced by a GET of something memoized before it (often a container: the entries'
    list in an entry's field is a cycle; one dict as many entries): shared references, as the memo makes them."""
    ops = _ops(data)
    puts: list[tuple[int, int]] = []  # (position, memo index)
    memo = 0
    for start, _end, name, arg in ops:
        if name in ("BINPUT", "LONG_BINPUT"):
            puts.append((start, arg))
        elif name == "MEMOIZE":
            puts.append((start, memo))
            memo += 1
    spots = [(start, end) for start, end, name, _a in ops if name in _SCALARS]
    if not puts or not spots:
        return pickle_ops(data, rng, _others)
    # from the last spot back, so that the earlier spots' positions still hold
    for start, end in sorted(rng.sample(spots, min(len(spots), rng.choice((1, 1, 3, 50)))), reverse=True):
        earlier = [index for at, index in puts if at < start]
        if earlier:
            index = rng.choice(earlier)
            get = b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)
            data = data[:start] + get + data[end:]
    return data


def pickle_dup_key(data: bytes, rng: random.Random, _others: list[bytes]) -> bytes:
    """A SETITEM of an existing key spliced in after some dict's SETITEMS (the last one wins)."""
    ops = _ops(data)
    keys = [arg for _s, _e, name, arg in ops if name in ("SHORT_BINUNICODE", "BINUNICODE") and len(arg) < 40]
    ends = [end for _s, end, name, _a in ops if name in ("SETITEMS", "SETITEM")]
    if not keys or not ends:
        return pickle_ops(data, rng, _others)
    at = rng.choice(ends)
    key: bytes = rng.choice(keys).encode("utf-8", "surrogatepass")
    value = rng.choice((b"N", b"K\x07", b"\x88", b"]", b"\x8c\x01x", b"G" + struct.pack(">d", 1.5)))
    return data[:at] + b"\x8c" + bytes([len(key)]) + key + value + b"s" + data[at:]


PICKLE_MUTATORS: list[tuple[Mutator, int]] = [
    (flip, 3), (cut, 2), (chop, 2), (splice, 1), (pickle_ops, 6), (pickle_value, 5), (pickle_dup_key, 2),
    (pickle_share, 3),
]
