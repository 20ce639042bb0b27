"""The recorder's entry fields in one table, with the bounds and checks every reader applies.

Three readers turn an entry list into the model: the reference (`rowwise.normalize_rows`: any entry,
row by row, tolerant), the column reader (`fastcols`: regular entries only, straight into columns) and
the optional C scanner (`_frscan.c`, via `scan`: regular pickle dumps, without a Python object per
value). They agree because they read the same table: the field names and which a torch 2.x entry
always has (`REQUIRED`: the regular shape; the scanner's field enum and names are generated from here
into `_frscan_fields.h` by scripts/gen_frscan_fields.py, and tests/unit/test_fields.py checks that file
is current), the lowest regular value of each int field, and the caps on strings, shapes and durations.
A value the reference would change (a missing field, a bool or float where an int belongs, a string
past its cap, a malformed shape) is not regular: the column reader and the scanner decline the rank,
and the reference reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from frscope.records.limits import MAX_INT64

# Caps (the reference cuts or replaces past them; the fast readers decline).
MAX_NAME: Final = 200  # group key, name and description; thread id and name
MAX_STATE: Final = 40
MAX_DTYPE: Final = 40
MAX_SHAPES: Final = 1024  # shapes (or dtypes) per entry side
MAX_DIMS: Final = 64  # dims per shape
MAX_DIM: Final = MAX_INT64
# A duration is >= 0 and below ~30 years: sums of larger finite floats overflow to inf.
MAX_DURATION_MS: Final = 1e12

# Stacks a rank's table keeps: distinct stacks, and frame references over its entries (past either,
# the frames stay in the file and are read again for the entries a report shows).
MAX_STACKS: Final = 256
MAX_FRAME_REFS: Final = 1 << 20

# Lowest regular values of the int fields: ids are >= 0; sequence numbers may be -1 (torch's "none
# yet"); times are >= 0, where 0 (or None) means "not recorded".
ID_MIN: Final = 0
SEQ_MIN: Final = -1
TIME_MIN: Final = 0


@dataclass(frozen=True, slots=True)
class Field:
    name: str  # the key in a recorder entry
    c_name: str  # the scanner's enum constant
    required: bool  # every torch 2.x entry has it: the regular shape
    warn_missing: bool  # the reference warns once per dump when entries lack it
    lowest: int | None = None  # int fields: the lowest regular value


FIELDS: Final = (
    Field("record_id", "F_RECORD_ID", True, True, ID_MIN),
    Field("process_group", "F_PG", True, True),
    Field("collective_seq_id", "F_SEQ", True, True, SEQ_MIN),
    Field("p2p_seq_id", "F_P2P_SEQ", True, False, SEQ_MIN),
    Field("is_p2p", "F_IS_P2P", True, False),
    Field("profiling_name", "F_NAME", True, True),
    Field("time_created_ns", "F_CREATED", True, True, TIME_MIN),
    Field("input_sizes", "F_IN_SIZES", True, True),
    Field("input_dtypes", "F_IN_DTYPES", True, False),
    Field("output_sizes", "F_OUT_SIZES", True, True),
    Field("output_dtypes", "F_OUT_DTYPES", True, False),
    Field("state", "F_STATE", True, True),
    Field("time_discovered_started_ns", "F_STARTED", True, False, TIME_MIN),
    Field("time_discovered_completed_ns", "F_COMPLETED", True, False, TIME_MIN),
    Field("retired", "F_RETIRED", True, False),
    Field("timeout_ms", "F_TIMEOUT", True, False),
    Field("thread_id", "F_THREAD_ID", True, False),
    Field("thread_name", "F_THREAD_NAME", True, False),
    # Absent in some entries, and still regular: NCCL without timing has no duration; frames may be off.
    Field("duration_ms", "F_DURATION", False, False),
    Field("frames", "F_FRAMES", False, False),
)

# The fields of a regular entry, in table order: the readers take them with one itemgetter call.
REQUIRED: Final = tuple(f.name for f in FIELDS if f.required)
# Fields whose absence is worth one warning per dump.
EXPECTED: Final = tuple(f.name for f in FIELDS if f.warn_missing)
assert all(f.required for f in FIELDS[: len(REQUIRED)]), "required fields come first (the scanner's F_REQUIRED)"


# Peers have at most 9 digits: int() of a 5,000-digit peer raises (Python's 4,300-digit limit).
_P2P_NAME = re.compile(r"^(?P<op>\w+)\s+(?P<a>-?\d{1,9})\s*(?P<arrow>->|<-)\s*(?P<b>-?\d{1,9})$")


def parse_profiling_name(profiling_name: str) -> tuple[str | None, str, int | None]:
    """'nccl:send 0->1' -> ('nccl', 'send', 1); 'gloo:all_reduce' -> ('gloo', 'all_reduce', None).

    For p2p the peer is the group-local rank on the other side: 'send a->b' is sent by a to b,
    'recv a<-b' is received by a from b.
    """
    backend, sep, rest = profiling_name.partition(":")
    if not sep:
        backend, rest = "", profiling_name
    rest = rest.strip()
    match = _P2P_NAME.match(rest)
    if match:
        return backend or None, match.group("op"), int(match.group("b"))
    op = rest.split(" ", 1)[0] if rest else "unknown"
    return backend or None, op, None


# -- what the reference keeps unchanged (the fast readers accept only this) ----------------------------

def short_text(value: Any, limit: int) -> bool:
    return type(value) is str and len(value) <= limit


def regular_sizes(value: Any) -> bool:
    """A list of at most MAX_SHAPES shapes, each a list of at most MAX_DIMS int64 dims >= -1."""
    if type(value) is not list or len(value) > MAX_SHAPES:
        return False
    for shape in value:
        if type(shape) is not list or len(shape) > MAX_DIMS:
            return False
        for dim in shape:
            if type(dim) is not int or not -1 <= dim <= MAX_DIM:
                return False
    return True


def regular_dtypes(value: Any) -> bool:
    if type(value) is not list or len(value) > MAX_SHAPES:
        return False
    return all(type(d) is str and 0 < len(d) <= MAX_DTYPE for d in value)


def regular_group(pg: tuple[Any, ...]) -> bool:
    """A (name, description) pair of short strings."""
    return len(pg) == 2 and short_text(pg[0], MAX_NAME) and short_text(pg[1], MAX_NAME)


def regular_thread(pair: tuple[Any, Any]) -> bool:
    """(thread id, thread name), each None or a short string."""
    return all(value is None or short_text(value, MAX_NAME) for value in pair)


def c_header() -> str:
    """The scanner's field enum, names and lowest values (`_frscan_fields.h`), from the table."""
    required = [f for f in FIELDS if f.required]
    optional = [f for f in FIELDS if not f.required]
    enum = [f.c_name for f in required] + ["F_REQUIRED", f"{optional[0].c_name} = F_REQUIRED"]
    enum += [f.c_name for f in optional[1:]] + ["F_COUNT"]
    lines = [
        "/* Generated from frscope/records/fields.py by scripts/gen_frscan_fields.py: do not edit. */",
        "",
        "enum {",
        *(f"    {name}," for name in enum),
        "};",
        "static const char *FIELD_NAMES[F_COUNT] = {",
        *(f'    "{f.name}",' for f in FIELDS),
        "};",
        "/* the lowest regular value of each int field (0 for the others) */",
        "static const int64_t FIELD_MIN[F_COUNT] = {",
        *(f"    {f.lowest or 0},  /* {f.name} */" for f in FIELDS),
        "};",
        f"#define MAX_DURATION_MS {MAX_DURATION_MS!r}",
        f"#define MAX_FRAME_REFS {MAX_FRAME_REFS}",
        "",
    ]
    return "\n".join(lines)
