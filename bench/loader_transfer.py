#!/usr/bin/env python3
"""What one loader worker's result costs to send back to the parent, per form of the entries.

    .venv/bin/python bench/loader_transfer.py DIR [--files 64]

Decodes --files dumps from DIR in this process (as a worker does), then times pickle.dumps (worker side)
and pickle.loads plus building the Entry objects (parent side) of: the entries pickled through
`Entry.__reduce__`, and the rows `entry_rows` makes (what the loader ships). CPU seconds, one process.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import time

from frscope.records.loader import DEFAULT_MAX_BYTES, _load_one, expand_paths
from frscope.records.model import RankDump, entries_from_rows, entry_rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir")
    parser.add_argument("--files", type=int, default=64)
    args = parser.parse_args()
    files, _ = expand_paths([args.dir])
    gc.disable()
    dumps = [d for d in (_load_one(f, DEFAULT_MAX_BYTES) for f in files[: args.files]) if isinstance(d, RankDump)]
    entries = sum(len(d.entries) for d in dumps)

    t0 = time.process_time()
    blob = pickle.dumps(dumps, pickle.HIGHEST_PROTOCOL)
    t1 = time.process_time()
    pickle.loads(blob)  # noqa: S301 - bytes this process just pickled
    t2 = time.process_time()
    print(f"__reduce__: worker {t1 - t0:.3f} s, parent {t2 - t1:.3f} s, {len(blob) / 1e6:.1f} MB")

    t0 = time.process_time()
    shipped = []
    for dump in dumps:
        rows = entry_rows(dump.entries)
        dump.entries = []
        shipped.append((dump, rows))
    blob = pickle.dumps(shipped, pickle.HIGHEST_PROTOCOL)
    t1 = time.process_time()
    for dump, rows in pickle.loads(blob):  # noqa: S301 - bytes this process just pickled
        dump.entries = entries_from_rows(rows)
    t2 = time.process_time()
    print(f"rows:       worker {t1 - t0:.3f} s, parent {t2 - t1:.3f} s, {len(blob) / 1e6:.1f} MB ({entries} entries)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
