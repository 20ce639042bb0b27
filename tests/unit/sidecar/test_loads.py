"""loads_in_pieces: json.loads's result, decoded element by element (the GIL is let go in between)."""

from __future__ import annotations

import json

import pytest

from frscope.sidecar.recorder import loads_in_pieces
from tests.unit.builders import dump, entry

GOOD = [
    b"{}",
    b' { "a" : [ ] , "b":[1, {"x":[2]}] ,"c": {"d": [1]}, "e": "s", "f": null, "g": 1.5e3 } \n',
    b'{"entries": [{"k": "\\u00e9\\n"}], "version": "2.10"}',
    json.dumps(dump([entry(s, backend="gloo") for s in range(1, 200)], world=2)).encode(),
]
BAD = [b'{"a":[1,2,]}', b'{"a":1,}', b'{"a":1} x', b'{"a" 1}', b"{1:2}", b'{"a":[1 2]}', b'{"a":', b"{", b"",
       b'{"a":[1,', b"\xff{}"]


@pytest.mark.parametrize("doc", GOOD)
def test_same_as_json_loads(doc: bytes) -> None:
    assert loads_in_pieces(doc) == json.loads(doc)


@pytest.mark.parametrize("doc", BAD)
def test_invalid_json_raises_value_error(doc: bytes) -> None:
    with pytest.raises(ValueError):
        loads_in_pieces(doc)
