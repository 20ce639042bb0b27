"""The timeline's interned tables: strings and cells shared by every group (frscope.report.timeline)."""

from __future__ import annotations

from typing import Any

from frscope.analysis.stacks import user_frame
from frscope.records import Entry

# Raw cell key: compared with == only (sizes are lists: unhashable, cheap to compare).
RawKey = tuple[Any, ...]


class Tables:
    """Interned strings and cells shared by every group."""

    def __init__(self) -> None:
        self.strings: list[str] = [""]
        self._string_ids: dict[str, int] = {"": 0}
        self.op_names: list[str] = []
        self._op_ids: dict[str, int] = {}
        self.cells: list[list[int]] = []
        self._cell_ids: dict[tuple[Any, ...], int] = {}
        self._reps: list[tuple[int, Entry] | None] = []  # the entry each cell was first seen in

    def string(self, text: str) -> int:
        found = self._string_ids.get(text)
        if found is None:
            found = self._string_ids[text] = len(self.strings)
            self.strings.append(text)
        return found

    def op(self, name: str) -> int:
        found = self._op_ids.get(name)
        if found is None:
            found = self._op_ids[name] = len(self.op_names)
            self.op_names.append(name)
        return found

    def absent(self, state: int) -> int:
        key = ("", state)
        found = self._cell_ids.get(key)
        if found is None:
            found = self._cell_ids[key] = len(self.cells)
            self.cells.append([-1, state, 0, 0, 0, 0, 0, 1])
            self._reps.append(None)
        return found

    def cell(self, raw: RawKey, bucket: list[Entry], rank: int) -> int:
        op, state, in_sizes, in_dtypes, out_sizes, out_dtypes = raw
        key = (op, state, repr(in_sizes), repr(in_dtypes), repr(out_sizes), repr(out_dtypes))
        found = self._cell_ids.get(key)
        if found is not None:
            return found
        found = self._cell_ids[key] = len(self.cells)
        self._reps.append((rank, bucket[0]))
        self.cells.append(
            [
                self.op(op),
                state,
                self.string(_shapes(in_sizes)),
                self.string(", ".join(in_dtypes)),
                self.string(_shapes(out_sizes)),
                self.string(", ".join(out_dtypes)),
                0,  # call site: resolve_sites()
                len(bucket),
            ]
        )
        return found

    def resolve_sites(self, preferred: set[int], max_ranks: int) -> None:
        """Call sites from the recorder's frames. Frames may be lazy (re-read from the rank's file on
        first use), so only the ranks in `preferred` plus up to `max_ranks` others are asked."""
        allowed = set(preferred)
        budget = max_ranks
        for i, rep in enumerate(self._reps):
            if rep is None:
                continue
            rank, entry = rep
            if rank not in allowed:
                if budget <= 0:
                    continue
                budget -= 1
                allowed.add(rank)
            site = user_frame(entry.frames)
            if site is not None:
                self.cells[i][6] = self.string(f"{site.filename}:{site.line} ({site.name})")


def _shapes(sizes: list[Any]) -> str:
    return " ".join(
        "[" + ", ".join(str(d) for d in shape) + "]" if isinstance(shape, list) else str(shape) for shape in sizes
    )
