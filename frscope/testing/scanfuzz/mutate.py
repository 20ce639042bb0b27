"""Mutations of real dumps for the scanner fuzzer: bytes and JSON values (pickle opcodes: `pickles`).

Each mutator takes a seed's bytes (and a random source, and the other seeds) and returns hostile bytes shaped
after it: byte flips, cuts, splices; a JSON value anywhere in the tree (entries' fields favoured) replaced by
raw hostile text (huge or overflowing numbers, lone surrogates, every escape, invalid UTF-8, deep nesting,
wrong types), repeated keys, very long lists. `mutate` applies one or a few of a weighted list.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

Mutator = Callable[[bytes, random.Random, list[bytes]], bytes]

DEEP = 100_000

HOSTILE_NUMBERS = [
    b"1e999", b"-1e999", b"-0", b"-0.0", b"0.0", b"1e-400", b"2.5e-3", b"1E+2", b"0.1000000000000000055511151231257827",
    b"18446744073709551616", b"18446744073709551615", b"9223372036854775808", b"9223372036854775807",
    b"-9223372036854775808", b"-9223372036854775809", b"4294967296", b"2147483648", b"-1", b"0", b"1",
    b"9" * 19, b"9" * 20, b"1" + b"0" * 5000, b"-" + b"7" * 400, b"1." + b"5" * 500, b"1e" + b"9" * 30,
    b"NaN", b"Infinity", b"-Infinity", b"01", b"1.", b".5", b"1e", b"+1", b"0x10", b"1_000",
]
HOSTILE_STRINGS = [
    b'""', b'"\\ud800"', b'"\\udc00"', b'"\\ud800\\u0041"', b'"\\ud83d\\ude00"', b'"\\uDBFF\\uDFFF"', b'"\\u0000"',
    b'"\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\u20AC"', b'"\xff"', b'"\xed\xa0\x80"', b'"\xc0\xaf"', b'"\xf4\x90\x80\x80"',
    b'"\xe2\x82"', b'"a\x00b"', b'"a\tb"', b'"\\x41"', b'"\\u12G4"', b'"\\', b'"\\u00"', b'"\\ud800\\',
    b'"' + b"x" * 100_000 + b'"', b'"' + b"\\n" * 20_000 + b'"', b'"' + "\U0001f600".encode() * 5000 + b'"',
    b'"nccl:all_reduce"', b'"gloo:broadcast"', b'"scheduled"', b'"started"', b'"completed"', b'"0"', b'"default_pg"',
]
HOSTILE_JSON = [
    b"null", b"true", b"false", b"[]", b"{}", b"[1, 2]", b'{"a": 1}', b"[null]", b'[[1, 2], [3]]', b'["0", "x"]',
    b'[{"name": "f", "filename": "x.py", "line": 3}]', b'[{"name": 1, "filename": null, "line": "3"}]',
    b"[" * 100 + b"]" * 100, b'{"a":' * 100 + b"1" + b"}" * 100, b"[" + b"0," * 100_000 + b"0]",
    b"[" + b'"s",' * 50_000 + b'"s"]', b"[" + b"{}," * 2000 + b"{}]", b"[" + b"1.5," * 20_000 + b"1e999]",
]


def deep_json(rng: random.Random) -> bytes:
    """Nesting 100,000 deep, padded to pass the container-density check where asked."""
    depth = rng.choice((65, 100, 1000, DEEP))
    pad = b" " * rng.choice((0, 8))
    if rng.random() < 0.5:
        return (b"[" + pad) * depth + b"1" + b"]" * depth
    return (b'{"a":' + pad) * depth + b"1" + b"}" * depth


# -- bytes ----------------------------------------------------------------------------------------------------


def flip(data: bytes, rng: random.Random, _others: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4, 16))):
        if not buf:
            break
        at = rng.randrange(len(buf))
        roll = rng.random()
        if roll < 0.4:
            buf[at] = rng.randrange(256)
        elif roll < 0.7:
            buf[at] ^= 1 << rng.randrange(8)
        else:
            buf[at] = rng.choice(b'{}[],:"\\0123456789-+.eEnull\x00\x80\xff')
    return bytes(buf)


def cut(data: bytes, rng: random.Random, _others: list[bytes]) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def chop(data: bytes, rng: random.Random, _others: list[bytes]) -> bytes:
    """A range deleted, repeated, or a few bytes (NUL among them) inserted."""
    if not data:
        return data
    a = rng.randrange(len(data))
    b = min(len(data), a + rng.choice((1, 2, 8, 64, 1024)))
    roll = rng.random()
    if roll < 0.4:
        return data[:a] + data[b:]
    if roll < 0.7:
        return data[:b] + data[a:b] * rng.choice((1, 2, 100)) + data[b:]
    return data[:a] + bytes(rng.randrange(256) for _ in range(rng.choice((1, 2, 4)))) + data[a:]


def splice(data: bytes, rng: random.Random, others: list[bytes]) -> bytes:
    other = rng.choice(others) if others else data
    return data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1):]


# -- JSON -----------------------------------------------------------------------------------------------------

_HOLE = "\x00@@hole@@"
_HOLE_TEXT = json.dumps(_HOLE).encode()
_DUP = "\x00@@dup@@"
_DUP_TEXT = json.dumps(_DUP).encode()


def _paths(obj: Any, path: tuple[Any, ...], out: list[tuple[Any, ...]], limit: int = 4000) -> None:
    if len(out) >= limit or len(path) > 40:  # a cyclic or deep seed: its top only
        return
    out.append(path)
    if isinstance(obj, dict):
        for k, v in obj.items():
            _paths(v, (*path, k), out, limit)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _paths(v, (*path, i), out, limit)


def _entry_paths(obj: Any) -> list[tuple[Any, ...]]:
    """Paths into the entries (a field, a field's item, an entry, the list): where the scanner's checks are."""
    for holder in (obj, obj.get("trace") if isinstance(obj, dict) else None):
        if isinstance(holder, dict) and isinstance(holder.get("entries"), list) and holder["entries"]:
            base = ("trace", "entries") if holder is not obj else ("entries",)
            out: list[tuple[Any, ...]] = []
            _paths(holder["entries"], base, out)
            return out
    return []


def set_path(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    """`obj` with the value at `path` (keys and indexes from the top) replaced by `value`."""
    if not path:
        return value
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return obj


def json_target(obj: Any, rng: random.Random) -> tuple[Any, ...]:
    """A path to mutate in a decoded dump: into its entries mostly (where the scanner's checks are)."""
    entry_paths = _entry_paths(obj) if rng.random() < 0.7 else []
    if entry_paths:
        return rng.choice(entry_paths)
    paths: list[tuple[Any, ...]] = []
    _paths(obj, (), paths)
    return rng.choice(paths)


def _dumps(obj: Any, rng: random.Random) -> bytes:
    # (an indent makes json use its Python encoder: ten times slower, so seldom)
    kw: dict[str, Any] = rng.choice(({}, {}, {"separators": (",", ":")}, {"ensure_ascii": False}))
    if rng.random() < 0.05:
        kw = {"indent": 1}
    return json.dumps(obj, **kw).encode("utf-8", "surrogatepass")


def _load_json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def json_value(data: bytes, rng: random.Random, _others: list[bytes]) -> bytes:
    """A value of the tree (an entry's field, mostly) replaced by raw hostile JSON text."""
    obj = _load_json(data)
    if obj is None:
        return flip(data, rng, _others)
    path = json_target(obj, rng)
    raw = rng.choice((rng.choice(HOSTILE_NUMBERS), rng.choice(HOSTILE_STRINGS), rng.choice(HOSTILE_JSON),
                      deep_json(rng) if rng.random() < 0.1 else b"null"))
    obj = set_path(obj, path, _HOLE)
    return _dumps(obj, rng).replace(_HOLE_TEXT, raw, 1)


def json_type(data: bytes, rng: random.Random, _others: list[bytes]) -> bytes:
    """A value replaced by one of another type (a string for an int, a list for a dict, null), as Python."""
    obj = _load_json(data)
    if obj is None:
        return cut(data, rng, _others)
    path = json_target(obj, rng)
    old: Any = obj
    for key in path:
        old = old[key]
    swaps: list[Any] = [None, True, 0, -1, 2**63, 2**64, -(2**63) - 1, 1.5, -0.0, 1e308, "", "7", str(old), [], {},
                        [old], {"v": old}, list(old.values()) if isinstance(old, dict) else old]
    if isinstance(old, list):
        swaps += [old * rng.choice((2, 50)), old[:1], old[::-1], tuple(old)]
    if isinstance(old, dict):
        swaps += [dict(reversed(list(old.items()))), {k: None for k in old}, {k: str(v) for k, v in old.items()}]
    return _dumps(set_path(obj, path, rng.choice(swaps)), rng)


def json_dup_key(data: bytes, rng: random.Random, _others: list[bytes]) -> bytes:
    """A dict's key repeated (before or after the original, another value or the same)."""
    obj = _load_json(data)
    if obj is None:
        return chop(data, rng, _others)
    dicts: list[tuple[Any, ...]] = []
    paths = _entry_paths(obj) if rng.random() < 0.6 else []
    if not paths:
        _paths(obj, (), paths)
    node_of: dict[tuple[Any, ...], Any] = {}
    for path in paths:
        node: Any = obj
        for key in path:
            node = node[key]
        if isinstance(node, dict) and node:
            dicts.append(path)
            node_of[path] = node
    if not dicts:
        return json_value(data, rng, _others)
    path = rng.choice(dicts)
    target = node_of[path]
    key = rng.choice(list(target))
    value: Any = rng.choice((target[key], None, "x", 7, [], rng.choice(list(target.values()))))
    items = list(target.items())
    items.insert(rng.randrange(len(items) + 1), (_DUP, value))
    set_path(obj, path, dict(items))
    return _dumps(obj, rng).replace(_DUP_TEXT, json.dumps(key).encode(), 1)


def json_deep(data: bytes, rng: random.Random, _others: list[bytes]) -> bytes:
    obj = _load_json(data)
    if obj is None:
        return deep_json(rng)
    path = json_target(obj, rng)
    return _dumps(set_path(obj, path, _HOLE), rng).replace(_HOLE_TEXT, deep_json(rng), 1)


def json_long(data: bytes, rng: random.Random, _others: list[bytes]) -> bytes:
    """The entries repeated many times (a very long list), or one entry's list field made very long."""
    obj = _load_json(data)
    holder = obj.get("trace", obj) if isinstance(obj, dict) else None
    if not isinstance(holder, dict) or not isinstance(holder.get("entries"), list) or not holder["entries"]:
        return json_value(data, rng, _others)
    entries = holder["entries"]
    if rng.random() < 0.5:
        holder["entries"] = entries * max(1, rng.choice((200, 1000)) // len(entries))
    else:
        entry = rng.choice(entries)
        if isinstance(entry, dict):
            entry[rng.choice(("input_sizes", "frames", "output_dtypes", "process_group"))] = [[1, 2]] * 20_000
    return _dumps(obj, rng)


JSON_MUTATORS: list[tuple[Mutator, int]] = [
    (flip, 4), (cut, 2), (chop, 2), (splice, 1), (json_value, 6), (json_type, 4), (json_dup_key, 2), (json_deep, 1),
    (json_long, 1),
]
def mutate(data: bytes, rng: random.Random, others: list[bytes], mutators: list[tuple[Mutator, int]]
           ) -> tuple[bytes, str]:
    """One to three mutations of `data` in a row; (the bytes, the mutators' names)."""
    names = []
    funcs, weights = zip(*mutators, strict=True)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        func = rng.choices(funcs, weights)[0]
        data = func(data, rng, others)
        names.append(func.__name__)
        if len(data) > 4 << 20:  # the fuzz stays on inputs of a few MiB at most
            data = data[: 4 << 20]
    return data, "+".join(names)
