"""The one table of recorder fields (`frscope.records.fields`) that the three entry readers share.

The C scanner's field enum, names and lowest values are generated from the table: the committed header must
be what the table generates now, and the scanner's source must take its fields from it. At each int field's
lowest regular value and one below it, and at each cap and one past it, the column reader (`fastcols`) and
the scanner accept and decline the same entries, and accept only what the reference
(`rowwise.normalize_rows`) keeps unchanged."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import pytest

from frscope.records import fields, scan
from frscope.records.fastcols import table_from_entries
from frscope.records.model import LazyFrames
from frscope.records.rowwise import normalize_rows

RECORDS = Path(fields.__file__).resolve().parent


def test_the_scanner_header_is_generated_from_the_table() -> None:
    assert (RECORDS / "_frscan_fields.h").read_text() == fields.c_header(), (
        "frscope/records/_frscan_fields.h is out of date: run scripts/gen_frscan_fields.py")
    source = (RECORDS / "_frscan.c").read_text()
    assert '#include "_frscan_fields.h"' in source
    for field in fields.FIELDS:  # the field names are written once, in the header
        assert f'"{field.name}"' not in source, field.name


def test_required_fields_come_first_and_the_warned_ones_are_required() -> None:
    required = [f.name for f in fields.FIELDS if f.required]
    assert tuple(required) == fields.REQUIRED == tuple(f.name for f in fields.FIELDS[: len(required)])
    assert set(fields.EXPECTED) <= set(fields.REQUIRED)


def _entry(record_id: int) -> dict[str, Any]:
    return {
        "record_id": record_id, "process_group": ("0", "default_pg"), "collective_seq_id": record_id + 1,
        "p2p_seq_id": 0, "is_p2p": False, "profiling_name": "nccl:all_reduce", "time_created_ns": 1_000 + record_id,
        "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
        "state": "completed", "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
        "retired": True, "timeout_ms": 600_000, "thread_id": "1", "thread_name": "main", "duration_ms": 1.5,
        "frames": [{"name": "step", "filename": "train.py", "line": 3}],
    }


def _fast_readers_accept(entries: list[dict[str, Any]]) -> bool:
    """Whether the column reader accepts the entries; asserts the scanner agrees, and that what they accept
    the reference keeps unchanged (they may decline more: the reference then reads the rank)."""
    rows, _backend, warnings = normalize_rows(copy.deepcopy(entries), "x")
    kept = not warnings and all(
        row[0] == e["record_id"] and row[3] == e["collective_seq_id"] and row[4] == e["p2p_seq_id"]
        and row[13] == e["state"] and row[9] == e["input_sizes"] and row[10] == e["input_dtypes"]
        and (row[15] or 0) == (e["time_created_ns"] or 0) and row[20] == e["thread_id"]
        and (row[1], row[2]) == tuple(e["process_group"])
        for row, e in zip(rows, entries, strict=True))
    lazy = LazyFrames(lambda: entries)
    accepted = table_from_entries(copy.deepcopy(entries), lazy, fields.parse_profiling_name) is not None
    assert kept or not accepted, entries[1]
    if scan.available():
        data = pickle.dumps({"version": "2.10", "entries": entries}, protocol=4)
        assert (scan.scan_dump(data, lazy, fields.parse_profiling_name) is not None) == accepted, entries[1]
    return accepted


@pytest.mark.parametrize("field", [f for f in fields.FIELDS if f.lowest is not None], ids=lambda f: f.name)
def test_each_int_field_at_its_lowest_regular_value_and_below(field: fields.Field) -> None:
    at, below = [_entry(0), _entry(1)], [_entry(0), _entry(1)]
    at[1][field.name] = field.lowest
    below[1][field.name] = field.lowest - 1
    assert _fast_readers_accept(at)
    assert not _fast_readers_accept(below)


@pytest.mark.parametrize(("name", "cap"), [("state", fields.MAX_STATE), ("thread_id", fields.MAX_NAME),
                                           ("thread_name", fields.MAX_NAME)])
def test_each_text_field_at_its_cap_and_past_it(name: str, cap: int) -> None:
    at, past = [_entry(0), _entry(1)], [_entry(0), _entry(1)]
    at[1][name] = "s" * cap
    past[1][name] = "s" * (cap + 1)
    assert _fast_readers_accept(at)
    assert not _fast_readers_accept(past)


def test_group_names_and_shapes_at_their_caps_and_past_them() -> None:
    for entries_at, entries_past in (
        ("process_group", (("g" * fields.MAX_NAME, "d"), ("g" * (fields.MAX_NAME + 1), "d"))),
        ("input_sizes", ([[1] * fields.MAX_DIMS], [[1] * (fields.MAX_DIMS + 1)])),
        ("input_dtypes", (["d" * fields.MAX_DTYPE], ["d" * (fields.MAX_DTYPE + 1)])),
    ):
        name, (ok, too_big) = entries_at, entries_past
        at, past = [_entry(0), _entry(1)], [_entry(0), _entry(1)]
        at[1][name], past[1][name] = ok, too_big
        assert _fast_readers_accept(at), name
        assert not _fast_readers_accept(past), name
