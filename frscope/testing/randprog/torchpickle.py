"""Pickles framed as torch's C++ pickler frames `_dump_fr_trace()`: protocol 2, every dict as EMPTY_DICT MARK
... SETITEMS and every list as EMPTY_LIST MARK ... APPENDS (empty ones too), strings memoized by value
(BINPUT on first use, BINGET after), a frame dict used more than once memoized on its first use,
tuples as TUPLE2 (process_group), ints in the smallest opcode, None, NEWTRUE/NEWFALSE, floats BINFLOAT."""

from __future__ import annotations

import struct
from collections import Counter
from typing import Any


class _Writer:
    def __init__(self, shared: set[tuple[Any, ...]]) -> None:
        self.out = bytearray(b"\x80\x02")
        self.memo: dict[Any, int] = {}
        self.shared = shared

    def _put(self, key: Any) -> None:
        n = len(self.memo)
        self.memo[key] = n
        self.out += b"q" + bytes([n]) if n < 256 else b"r" + struct.pack("<I", n)

    def _get(self, n: int) -> None:
        self.out += b"h" + bytes([n]) if n < 256 else b"j" + struct.pack("<I", n)

    def write(self, obj: Any) -> None:
        out = self.out
        if obj is None:
            out += b"N"
        elif obj is True:
            out += b"\x88"
        elif obj is False:
            out += b"\x89"
        elif isinstance(obj, int):
            if 0 <= obj < 256:
                out += b"K" + bytes([obj])
            elif 0 <= obj < 65536:
                out += b"M" + struct.pack("<H", obj)
            elif -(2**31) <= obj < 2**31:
                out += b"J" + struct.pack("<i", obj)
            else:
                raw = obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True)
                out += b"\x8a" + bytes([len(raw)]) + raw
        elif isinstance(obj, float):
            out += b"G" + struct.pack(">d", obj)
        elif isinstance(obj, str):
            skey: tuple[Any, ...] = ("s", obj)
            if skey in self.memo:
                self._get(self.memo[skey])
                return
            raw = obj.encode()
            out += b"X" + struct.pack("<I", len(raw)) + raw
            self._put(skey)
        elif isinstance(obj, tuple):
            if not obj:
                out += b")"
                return
            if len(obj) > 3:
                out += b"("
            for item in obj:
                self.write(item)
            self.out += {1: b"\x85", 2: b"\x86", 3: b"\x87"}.get(len(obj), b"t")
        elif isinstance(obj, list):
            out += b"]("
            for item in obj:
                self.write(item)
            self.out += b"e"
        elif isinstance(obj, dict):
            key = ("d", *sorted(obj.items())) if _is_frame(obj) else None
            if key is not None and key in self.memo:
                self._get(self.memo[key])
                return
            out += b"}("
            for k, v in obj.items():
                self.write(k)
                self.write(v)
            self.out += b"u"
            if key is not None and key in self.shared:
                self._put(key)
        else:
            raise TypeError(type(obj))


def _is_frame(obj: dict[str, Any]) -> bool:
    return obj.keys() == {"name", "filename", "line"}


def dumps(obj: dict[str, Any]) -> bytes:
    counts: Counter[tuple[Any, ...]] = Counter()
    for entry in obj.get("entries", []):
        for frame in entry.get("frames", []):
            counts[("d", *sorted(frame.items()))] += 1
    w = _Writer({k for k, n in counts.items() if n > 1})
    w.write(obj)
    w.out += b"."
    return bytes(w.out)
