#!/usr/bin/env python3
"""What hostile `/v1/status` documents cost the operator's arrivals (issue 34).

Two pods of one job answer 16 sweeps each with a document of one rank in 300 groups x 256
arrivals, each sweep new collectives (short numbers: just inside the 1 MiB a document may be). Each
document goes through the operator's own parse (`wire.parse_status`) and merge
(`engine.job_arrivals.JobArrivals`, what the lateness across pods compares). Printed: the arrivals a
parsed document holds, the arrivals the job keeps after the sweeps, the process's RSS growth, and the
time of one comparison (`pod_lateness`) over what is kept.

    .venv/bin/python bench/status_memory.py
    FRSCOPE_TREE=/tmp/before .venv/bin/python bench/status_memory.py     # another tree (git archive)
"""

from __future__ import annotations

import json
import os
import sys
import time

if os.environ.get("FRSCOPE_TREE"):  # another tree: ahead of the editable install's finder
    sys.path.insert(0, os.environ["FRSCOPE_TREE"])
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]

import frscope
from frscope.analysis.pod_lateness import pod_lateness
from frscope.operator.engine.job_arrivals import JobArrivals
from frscope.records.limits import rss_bytes
from frscope.wire import parse_status
from frscope.wire.common import STATUS_MAX_BYTES


def document(pod: str, sweep: int, ranks: int = 1, groups: int = 300, each: int = 256) -> bytes:
    rows = {str(g): {"arrivals": [[sweep * 300 + i, sweep * 300 + i + 1] for i in range(each)]}
            for g in range(groups)}
    return json.dumps({"schema": "frscope.sidecar.status/v1", "pod": pod, "namespace": "ml",
                       "ranks": {str(r): {"up": True, "groups": rows} for r in range(ranks)}},
                      separators=(",", ":")).encode()


def main() -> int:
    print(f"tree: {os.path.dirname(frscope.__file__)}")
    before = rss_bytes() or 0
    arrivals = JobArrivals()
    held = 0
    size = 0
    for sweep in range(16):
        parsed = {}
        for pod in ("a", "b"):
            raw = document(pod, sweep)
            size = len(raw)
            assert size <= STATUS_MAX_BYTES, size
            parsed[pod] = parse_status(json.loads(raw))
            del raw
        held = max(held, max(sum(len(r) for g in st.arrivals.values() for r in g.values()) for st in parsed.values()))
        arrivals.add(parsed, {"a", "b"})
        del parsed
    kept = sum(len(seqs) for groups in arrivals.arrivals().values() for seqs in groups.values())
    groups = max(len(g) for g in arrivals.arrivals().values())
    grown = ((rss_bytes() or 0) - before) / 2**20
    started = time.monotonic()
    pod_lateness(arrivals.arrivals(), arrivals.clocks(20 * 10**9))
    took = f"{time.monotonic() - started:.2f} s"
    print(f"document: {size / 2**20:.1f} MiB of JSON; arrivals read from one document: {held:,}")
    print(f"kept after 2 pods x 16 sweeps: {kept:,} arrivals in at most {groups} groups a pod; "
          f"RSS +{grown:.0f} MiB; one comparison {took}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
