"""Each incident's evidence kept as one bundle file (`--evidence-dir`: `<dir>/bundles/`), for
`frscope analyze BUNDLE` anywhere and for download from the web UI (records.bundle has the format).

One file per job, `<namespace>_<name>.json.gz`, replaced by the job's next incident (the same retention
as the incident views beside it, `incident_archive`): the ranks the diagnosis loaded, written back as one
snapshot envelope per pod, with their stacks, the trainer exits, the report and the timeline. Built and
written off the event loop (one writer thread, atomic temp file + rename). Bounded: a bundle whose gzip
is over `max_bytes` is not kept (logged), at most `max_jobs` files and `max_total_bytes` in all (the
oldest go first), and files older than `ttl_s` are removed at start and never served.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from frscope.operator.evidence.diagnosis import Diagnosis
from frscope.operator.model.objects import JobRef
from frscope.operator.model.store import LatestDiagnosis
from frscope.records.bundle import make_bundle, window

log = logging.getLogger("frscope.operator")

SUFFIX = ".json.gz"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
DEFAULT_MAX_JOBS = 500
DEFAULT_MAX_BYTES = 64 * 1024 * 1024  # gzip, per bundle
# All bundles together: a quarter of the chart's default evidence volume (an emptyDir of 1 GiB: a pod
# that writes past its sizeLimit is evicted), the rest left to the kept pushes and incident views.
DEFAULT_MAX_TOTAL_BYTES = 256 * 1024 * 1024
DEFAULT_TTL_S = 14 * 24 * 3600.0


class IncidentBundles:
    def __init__(self, path: Path, *, max_jobs: int = DEFAULT_MAX_JOBS, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.path = path
        self.max_jobs = max_jobs
        self.max_bytes = max_bytes
        self.max_total_bytes = max_total_bytes
        self.ttl_s = ttl_s
        path.mkdir(parents=True, exist_ok=True)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="frscope-incident-bundles")

    def file(self, namespace: str, name: str) -> Path | None:
        """Where the job's bundle lives (whether or not there is one); None for a name that is no
        Kubernetes name (it never becomes a path)."""
        if not (_NAME.match(namespace) and _NAME.match(name)) or "_" in namespace + name:
            return None
        return self.path / f"{namespace}_{name}{SUFFIX}"

    def kept(self, namespace: str, name: str, incident: str) -> Path | None:
        """The job's bundle when it is of `incident` and younger than `ttl_s` (what the UI serves)."""
        target = self.file(namespace, name)
        try:
            if target is None or time.time() - target.stat().st_mtime > self.ttl_s:
                return None
            with gzip.open(target, "rb") as handle:
                head = handle.read(4096)
        except (OSError, EOFError):
            return None
        return target if f'"id": {json.dumps(incident)}'.encode() in head else None

    def save_soon(self, ref: JobRef, latest: LatestDiagnosis, diagnosis: Diagnosis,
                  rank_pods: Mapping[int, str]) -> None:
        """`save` on the writer thread (the diagnosis's ranks are not changed after it is made)."""
        self._writer.submit(self.save, ref, latest, diagnosis, dict(rank_pods))

    def close(self) -> None:
        self._writer.shutdown(wait=True)

    def save(self, ref: JobRef, latest: LatestDiagnosis, diagnosis: Diagnosis, rank_pods: Mapping[int, str]) -> None:
        target = self.file(ref.namespace, ref.name)
        if target is None:
            return
        try:
            body = self._body(ref, latest, diagnosis, rank_pods)
        except (ValueError, TypeError, RecursionError) as exc:
            log.error("incident bundle: %s/%s could not be built: %s", ref.namespace, ref.name, exc)
            return
        if len(body) > self.max_bytes:
            log.warning("incident bundle: %s/%s not kept: %d bytes gzip, over the cap of %d", ref.namespace,
                        ref.name, len(body), self.max_bytes)
            target.unlink(missing_ok=True)  # an older incident's bundle would be taken for this one's
            return
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(body)
            os.replace(tmp, target)
        except OSError as exc:
            log.error("incident bundle: could not keep %s/%s: %s", ref.namespace, ref.name, exc)
            tmp.unlink(missing_ok=True)
            return
        self._prune()

    def _body(self, ref: JobRef, latest: LatestDiagnosis, diagnosis: Diagnosis, rank_pods: Mapping[int, str]) -> bytes:
        by_pod: dict[str, list[int]] = {}
        for rank in sorted(diagnosis.dumpset.dumps):
            by_pod.setdefault(rank_pods.get(rank, ""), []).append(rank)
        windows = [window(namespace=ref.namespace, pod=pod,
                          dumps=[diagnosis.dumpset.dumps[r] for r in ranks]) for pod, ranks in sorted(by_pod.items())]
        bundle = make_bundle(
            job={"namespace": ref.namespace, "name": ref.name, "uid": ref.uid, "kind": ref.kind},
            incident={"id": latest.incident, "category": latest.category, "verdict": latest.verdict, "at": latest.at,
                      "report_name": latest.report_name},
            windows=windows, exits=diagnosis.exits, report=latest.report, timeline=latest.timeline)
        # the incident goes before the windows (`kept` finds its id in the first KiB)
        text = json.dumps({"schema": bundle.pop("schema"), "job": bundle.pop("job"),
                           "incident": bundle.pop("incident"), **bundle}, allow_nan=False)
        return gzip.compress(text.encode(), compresslevel=3)

    def remove(self, namespace: str, name: str) -> None:
        target = self.file(namespace, name)
        if target is not None:
            target.unlink(missing_ok=True)

    def _files(self) -> list[Path]:
        return [p for p in self.path.glob(f"*{SUFFIX}") if not p.name.startswith(".")]

    def _prune(self) -> None:
        """Keep the newest bundles within `max_jobs` and `max_total_bytes`; remove the others."""
        sized = []
        for path in self._files():
            try:
                info = path.stat()
            except OSError:
                continue
            sized.append((info.st_mtime, info.st_size, path))
        total = 0
        for kept, (_, size, path) in enumerate(sorted(sized, key=lambda item: item[0], reverse=True)):
            total += size
            if kept >= self.max_jobs or total > self.max_total_bytes:
                path.unlink(missing_ok=True)

    def expire(self) -> int:
        """Remove the bundles older than `ttl_s` and left-over temp files; how many are kept."""
        now = time.time()
        kept = 0
        for path in self.path.iterdir():
            try:
                if path.name.startswith(".") or now - path.stat().st_mtime > self.ttl_s:
                    path.unlink(missing_ok=True)
                elif path.name.endswith(SUFFIX):
                    kept += 1
            except OSError:
                continue
        return kept
