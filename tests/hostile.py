"""A generator of hostile dump files, one or more per class of attack (issue 12).

Each case is bytes that a file named `<prefix><rank>` holds; a test writes them beside good ranks and
checks that the good ranks are analyzed and each bad file is a named problem. Pickles are assembled
from opcodes where pickle.dumps cannot express the attack (BUILD on an allowed class, DUP bombs,
memo-index bombs, deep nesting); nothing here is ever unpickled with plain pickle.
"""

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tests.unit import builders as b

DEEP = 1_000_000  # nesting depth for the RecursionError / C-stack classes


@dataclass(frozen=True)
class Case:
    name: str  # the class of attack, e.g. 'nan-times-json'
    data: bytes
    rank: int | None  # the rank its file name carries (None: the name has none)
    refused: bool  # True: the file must be a problem; False: it may load with warnings


def _base(rank: int, world: int) -> dict[str, Any]:
    return b.dump([b.entry(s) for s in range(1, 4)], world=world)


def _pickle_body(obj: Any) -> bytes:
    """Protocol-2 opcodes of `obj` without PROTO and STOP, to splice into a crafted pickle."""
    raw = pickle.dumps(obj, protocol=2)
    return raw[2:-1]


def _build_shadow(rank: int, world: int) -> bytes:
    # OrderedDict(items) then BUILD {'get': 1}: an attribute that shadows dict.get on the dump itself.
    items = list(_base(rank, world).items())
    return (b"\x80\x02ccollections\nOrderedDict\n" + _pickle_body((items,)) + b"R"
            + _pickle_body({"get": 1, "items": "x"}) + b"b.")


def _nan_times_pickle(rank: int, world: int) -> bytes:
    dump = _base(rank, world)
    for e in dump["entries"]:
        e.update(time_created_ns=float("nan"), duration_ms=float("inf"), collective_seq_id=float("nan"),
                 record_id=float("-inf"), timeout_ms=float("nan"), time_discovered_started_ns=float("inf"))
    dump["pg_status"] = {"0": {"last_enqueued_collective": float("nan"), "last_completed_collective": float("inf")}}
    return pickle.dumps(dump, protocol=2)


def _nan_times_json(rank: int, world: int) -> bytes:
    dump = _base(rank, world)
    for e in dump["entries"]:
        e.update(time_created_ns=float("nan"), duration_ms=float("nan"), p2p_seq_id=float("inf"))
    return json.dumps(dump).encode()  # bare NaN / Infinity, as json.dumps writes them


def _nan_duration_only(rank: int, world: int) -> bytes:
    # A rank that is otherwise fine: it must load, with NaN read as 'not recorded' (HTML, JSON report).
    dump = _base(rank, world)
    for e in dump["entries"]:
        e["duration_ms"] = float("nan")
    return json.dumps(dump).encode()


def _big_ints(rank: int, world: int) -> Iterator[tuple[str, bytes, bool]]:
    huge = 10**5000
    dump = _base(rank, world)
    dump["version"] = huge
    dump["entries"][0]["profiling_name"] = "nccl:send 0->" + "9" * 5000
    dump["entries"][1]["collective_seq_id"] = huge
    dump["entries"][1]["input_sizes"] = [[huge]]
    dump["pg_config"]["0"]["ranks"] = "[" + "9" * 5000 + "]"
    yield "bigint-fields-pickle", pickle.dumps(dump, protocol=2), False
    text = json.dumps(_base(rank, world))
    yield "bigint-rank-json", (text[:-1] + ', "rank": ' + "7" * 5000 + "}").encode(), True
    yield "bigint-version-json", text.replace('"version": "2.10"', '"version": ' + "1" * 5000).encode(), False


def _nested_sizes(rank: int, world: int) -> bytes:
    dump = _base(rank, world)
    for e in dump["entries"]:
        e["input_sizes"] = [[[4, 8]]]
        e["output_sizes"] = [[4, [8]]]
        e["input_dtypes"] = [["Float"]]
        e["output_dtypes"] = [{"a": 1}]
    return pickle.dumps(dump, protocol=2)


def _deep(rank: int, world: int) -> Iterator[tuple[str, bytes, bool]]:
    text = json.dumps(_base(rank, world))
    yield "deep-json", (text[:-1] + ', "extra": ' + "[" * DEEP + "]" * DEEP + "}").encode(), True
    dump = _base(rank, world)
    dump["pg_config"]["0"]["ranks"] = "[" * DEEP + "]" * DEEP
    yield "deep-pg-ranks-text", pickle.dumps(dump, protocol=2), False
    # A list nested DEEP levels as the version: ']' * DEEP then APPEND * (DEEP - 1), set last.
    deep_list = b"]" * DEEP + b"a" * (DEEP - 1)
    body = _pickle_body(_base(rank, world))
    yield "deep-list-version-pickle", b"\x80\x02" + body + b"X\x07\x00\x00\x00version" + deep_list + b"s.", False
    # A tuple nested DEEP levels as a dict key: hashing it recurses in C (a segfault in-process).
    yield "deep-tuple-key-pickle", b"\x80\x02}" + b")" + b"\x85" * DEEP + b"Ns.", True


def _exponential_repr(rank: int, world: int) -> bytes:
    node: Any = "x"
    for _ in range(100):
        node = [node, node]  # pickled with memo references: a few hundred bytes, repr of 2**100
    dump = _base(rank, world)
    dump["version"] = node
    dump["comm_lib_version"] = node
    dump["entries"][0]["process_group"] = (node, node)
    dump["entries"][0]["thread_id"] = node
    dump["entries"][0]["frames"] = [{"name": node, "filename": node, "line": node}]
    dump["pg_config"] = {"0": {"name": node, "desc": node, "ranks": node}}
    return pickle.dumps(dump, protocol=2)


def _huge_ranks(rank: int, world: int) -> Iterator[tuple[str, bytes, bool]]:
    dump = _base(rank, world)
    dump["pg_config"]["0"]["ranks"] = f"[0, 1, {10**12}]"
    dump["pg_config"]["5"] = {"name": "5", "desc": "x", "ranks": [-1, 3]}
    yield "huge-group-ranks", pickle.dumps(dump, protocol=2), False
    dump = _base(rank, world)
    dump["rank"] = 10**12
    yield "huge-rank-contents", pickle.dumps(dump, protocol=2), True
    dump = _base(rank, world)
    dump["rank"] = -3
    yield "negative-rank-contents", json.dumps(dump).encode(), True


def _seq_gap(rank: int, world: int) -> bytes:
    dump = _base(rank, world)
    dump["entries"][-1]["collective_seq_id"] = 10**15  # the analysis must not walk every seq between
    return pickle.dumps(dump, protocol=2)


def _bombs(rank: int, world: int) -> Iterator[tuple[str, bytes, bool]]:
    yield "dup-appends-bomb", b"\x80\x02]q\x00(N" + b"2" * (24 << 20) + b"e.", True
    yield "empty-dict-bomb", b"\x80\x02]q\x00(" + b"}" * (8 << 20) + b"e.", True
    yield "memo-index-bomb", b"\x80\x02Nr" + struct.pack("<I", 1 << 30) + b".", True
    yield "json-container-bomb", b"[" + b"[]," * (4 << 20) + b"[]]", True


def _garbage(rank: int, world: int) -> bytes:
    return b"\x1b]0;pwned\x07\x1b[2J SECRET-BYTES " * 10


_SINGLE: dict[str, tuple[Callable[[int, int], bytes], bool]] = {
    "build-shadows-get": (_build_shadow, True),
    "nan-times-pickle": (_nan_times_pickle, False),
    "nan-times-json": (_nan_times_json, False),
    "nan-duration": (_nan_duration_only, False),
    "nested-sizes": (_nested_sizes, False),
    "exponential-repr": (_exponential_repr, False),
    "seq-gap": (_seq_gap, False),
    "garbage-with-escapes": (_garbage, True),
}
_MULTI: list[Callable[[int, int], Iterator[tuple[str, bytes, bool]]]] = [_big_ints, _deep, _huge_ranks, _bombs]


def cases(first_rank: int, world: int, *, bombs: bool = True) -> Iterator[Case]:
    """Every class, each with its own rank from `first_rank` on (`world` is the good job's size)."""
    rank = first_rank
    for name, (make, refused) in _SINGLE.items():
        yield Case(name, make(rank, world), rank, refused)
        rank += 1
    for make_many in _MULTI:
        if make_many is _bombs and not bombs:
            continue
        for name, data, refused in make_many(rank, world):
            yield Case(name, data, rank, refused)
            rank += 1
