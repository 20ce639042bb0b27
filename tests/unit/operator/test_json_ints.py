"""A sidecar's snapshot body is decoded with Python's own int parsing where no int literal can be past 20
characters (no run of 20 digits in the body), and with the per-int hook (longer: 'not recorded') where one
may be: the two read every body alike (`pod_evidence.loads_json`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from frscope.operator.evidence.pod_evidence import _HOOKED, _PLAIN, json_decoder, loads_json


def hooked(raw: bytes | str) -> Any:
    return json.loads(raw, parse_int=lambda d: int(d) if len(d) <= 20 else None, parse_constant=lambda _: None)


@pytest.mark.parametrize("number", ["0", "-7", "1234567890123456789", "-1234567890123456789",
                                    "12345678901234567890", "-12345678901234567890",
                                    "123456789012345678901234567890", "9" * 5000, "1e400", "NaN", "-Infinity"])
def test_every_int_reads_as_the_hook_reads_it(number: str) -> None:
    raw = f'{{"schema": "s", "ranks": [{{"rank": 3, "seq": {number}, "ids": [1, {number}, 2]}}]}}'.encode()
    assert loads_json(raw) == hooked(raw)


def test_the_plain_decoder_only_where_no_run_of_20_digits_is() -> None:
    assert json_decoder(b'{"a": 1234567890123456789, "b": "x"}') is _PLAIN
    assert json_decoder(b'{"a": 1, "b": "12345678901234567890 in a string"}') is _HOOKED  # a string: still safe
    assert json_decoder('{"a": 1}') is _HOOKED  # text (a snapshot's small envelope): the hook


def test_bytes_and_bom_as_json_loads_reads_them() -> None:
    raw = '{"pod": "trainer-\u00e9", "ranks": []}'
    assert loads_json(raw.encode("utf-16")) == json.loads(raw.encode("utf-16"))
    assert loads_json(b"\xef\xbb\xbf" + raw.encode()) == json.loads(b"\xef\xbb\xbf" + raw.encode())
    with pytest.raises(json.JSONDecodeError):
        loads_json("\ufeff" + raw)
