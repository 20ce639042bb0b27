"""Write frscope/records/_frscan_fields.h (the C scanner's entry fields) from frscope/records/fields.py.

Run after changing the field table; tests/unit/test_fields.py fails while the header is out of date.
"""

from __future__ import annotations

from pathlib import Path

from frscope.records.fields import c_header

HEADER = Path(__file__).resolve().parent.parent / "frscope" / "records" / "_frscan_fields.h"

if __name__ == "__main__":
    HEADER.write_text(c_header())
    print(f"wrote {HEADER}")
