"""How many Prometheus series one sidecar exports for one pod of a large job (issue 35: an 8,192-rank job
made about 908 series per pod before, 240 of them `_created`).

The pod: 8 ranks (one node) of an 8,192-rank 3-D parallel job, tensor parallel 8 inside the node, then
pipeline and data parallel (frscope.testing.synthetic's topology: every rank is in the default group, its
tp group (the pod's own), its pp group and its dp group, the last two different for each rank of the pod,
named as `new_group` hands names out). Each rank's recorder is the 2,000-entry `_dump_fr_trace_json`
document that synthetic job's rank would serve, with the job hung (one rank elsewhere never joined a
data-parallel reduce-scatter: collectives in flight, groups stalled).

What runs is the real sidecar (`frscope.sidecar.app.Sidecar`, its poll rounds, its registry, its aiohttp
/metrics): only the ranks' worker servers are stand-ins (aiohttp on unix sockets answering
`fr_trace_json` with those documents), because the other 8,184 ranks of such a job cannot run here. The
series are counted in the /metrics exposition the sidecar serves, one line per sample, per family; no
formula.

Three configurations in one run:
  before        --metrics-detail rank-group with `_created` series (the sidecar as issue 35 measured it)
  rank-group    --metrics-detail rank-group, no `_created` (what `frscope sidecar` does now when asked)
  pod           --metrics-detail pod, no `_created` (the default now)
and, to show what the count depends on, the same three for the job without pipeline parallelism (3 groups
per rank) and for a pod of 4 ranks.

    .venv/bin/python bench/metrics_series.py [--world 8192] [--tp 8] [--pp 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import prometheus_client
from aiohttp import web
from prometheus_client import CollectorRegistry

from frscope.sidecar.app import Sidecar
from frscope.sidecar.config import SidecarConfig
from frscope.testing.synthetic.hung_step import make_plan

RANKS_PER_POD = 8


class StandInRank:
    """One rank's worker server on `rank-<r>.sock`: `fr_trace_json` answers the rank's recorder."""

    def __init__(self, path: Path, body: bytes) -> None:
        self.path, self.body = path, body
        self.runner: web.AppRunner | None = None

    async def fr_trace_json(self, request: web.Request) -> web.Response:
        return web.Response(body=self.body, content_type="application/json")

    async def dump_traceback(self, request: web.Request) -> web.Response:
        return web.Response(text='Thread 0x1 (most recent call first):\n  File "train.py", line 1 in step\n')

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/handler/fr_trace_json", self.fr_trace_json)
        app.router.add_post("/handler/dump_traceback", self.dump_traceback)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.UnixSite(self.runner, str(self.path)).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@contextmanager
def created_series(on: bool) -> Iterator[None]:
    """prometheus_client's `_created` series on or off (a process-wide switch, read at exposition)."""
    if on:
        prometheus_client.enable_created_metrics()  # type: ignore[no-untyped-call]
    else:
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


def count(exposition: str) -> tuple[int, Counter[str]]:
    """(series, series per family): one sample line is one series."""
    families: Counter[str] = Counter()
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        families[name] += 1
    return sum(families.values()), families


async def measure(bodies: dict[int, bytes], detail: str, created: bool, work: Path) -> tuple[int, Counter[str]]:
    sockets = work / f"{detail}-{int(created)}"
    sockets.mkdir(parents=True)
    ranks = [StandInRank(sockets / f"rank-{rank}.sock", body) for rank, body in bodies.items()]
    for rank in ranks:
        await rank.start()
    config = SidecarConfig(socket_dir=sockets, evidence_dir=None, host="127.0.0.1", port=0, metrics_detail=detail,
                           stall_after_s=0.5, suspect_min_s=0.1, suspect_after_s=0.2, pod="bench", namespace="bench")
    sidecar = Sidecar(config, CollectorRegistry())
    await sidecar.start()
    try:
        # Rounds until the pod's hung groups are stalled (the series a hung job shows; a healthy pod has the
        # same families with other values).
        deadline = time.monotonic() + 30
        while True:
            await sidecar.poll_once(full=True)
            if sidecar.tracker.stalled or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
        with created_series(created):
            async with aiohttp.ClientSession() as session, \
                    session.get(f"http://127.0.0.1:{sidecar.port}/metrics") as resp:
                resp.raise_for_status()
                text = await resp.text()
        return count(text)
    finally:
        await sidecar.stop()
        for rank in ranks:
            await rank.stop()


def recorders(world: int, tp: int, pp: int, ranks_per_pod: int) -> dict[int, bytes]:
    """The recorders of the job's second pod (ranks_per_pod..2 x ranks_per_pod - 1), hung."""
    plan = make_plan(world, tp=tp, pp=pp, scenario="not_joined", culprit=world - 1, entries=2000)
    first = ranks_per_pod
    return {rank: json.dumps(plan.dump(rank, json_shape=True)).encode() for rank in range(first, first + ranks_per_pod)}


def groups_per_rank(body: bytes) -> int:
    return len({e["process_group"][0] for e in json.loads(body)["entries"]})


CONFIGS = (("before", "rank-group", True), ("rank-group", "rank-group", False), ("pod", "pod", False))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    shapes = [("3-D (tp x pp x dp)", args.tp, args.pp, RANKS_PER_POD), ("2-D (tp x dp)", args.tp, 1, RANKS_PER_POD),
              ("3-D, a pod of 4 ranks", args.tp, args.pp, 4)]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="frscope-series-") as tmp:
        for title, tp, pp, per_pod in shapes:
            bodies = recorders(args.world, tp, pp, per_pod)
            first = next(iter(bodies.values()))
            row: dict[str, Any] = {"ranks_in_pod": per_pod, "groups_per_rank": groups_per_rank(first)}
            for name, detail, created in CONFIGS:
                total, families = await measure(bodies, detail, created, Path(tmp) / f"{len(results)}")
                row[name] = {"series": total, "created": sum(n for f, n in families.items() if f.endswith("_created")),
                             "families": dict(families.most_common())}
            results[f"{title}, tp={tp} pp={pp} dp={args.world // (tp * pp)}"] = row
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=8192)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--pp", type=int, default=2, help="1 or 2 (the synthetic job's pipeline)")
    parser.add_argument("--json", action="store_true", help="print every family's count too, as JSON")
    args = parser.parse_args()
    logging.getLogger("frscope").setLevel(logging.ERROR)  # the stalls it finds are the point, not news
    results = asyncio.run(run(args))
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
        return 0
    print(f"series per pod, job of {args.world} ranks (real sidecar, real /metrics exposition)")
    print(f"{'job':44} {'ranks':>5} {'groups':>6} {'before':>14} {'rank-group':>10} {'pod (default)':>13}")
    for title, row in results.items():
        before = row["before"]
        print(f"{title:44} {row['ranks_in_pod']:>5} {row['groups_per_rank']:>6} "
              f"{before['series']:>5} ({before['created']:>3} _created) {row['rank-group']['series']:>10} "
              f"{row['pod']['series']:>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
