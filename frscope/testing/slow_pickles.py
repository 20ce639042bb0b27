"""Pickles that decode in time quadratic in their size (tests and bench/decode_time.py).

A dict whose int keys all hash alike: CPython hashes an int modulo 2**61 - 1, so every multiple of
that prime hashes to 0 and each insertion compares against every key before it. The pickle is written
opcode by opcode (no dict of colliding keys is ever built here): PROTO 2, EMPTY_DICT, MARK, then
LONG1 key / BININT1 0 pairs, SETITEMS, STOP. 150,000 keys are ~2 MiB and take minutes to decode.
"""

from __future__ import annotations

_PRIME = (1 << 61) - 1


def colliding_int_keys(count: int) -> bytes:
    out = bytearray(b"\x80\x02}(")
    for i in range(1, count + 1):
        key = _PRIME * i
        raw = key.to_bytes((key.bit_length() + 8) // 8, "little", signed=True)
        out += b"\x8a" + bytes([len(raw)]) + raw + b"K\x00"
    out += b"u."
    return bytes(out)
