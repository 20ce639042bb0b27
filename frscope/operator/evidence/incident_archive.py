"""Each job's latest incident view (report + timeline) kept on disk, so that the web UI still shows it
after an operator restart (`--evidence-dir`: `<dir>/incidents/`).

One file per job, `<namespace>_<name>.json.gz`: the job's reference (its uid tells a later job of the
same name apart) and the `LatestDiagnosis` the web UI draws (the report as JSON and the timeline; no
recorders: the timeline is already bounded, docs/timeline.md "Scale"). Written atomically (temp file +
rename) off the event loop. Bounded: at most `max_jobs` files (the oldest go first), each read back only
up to `max_bytes` and only when younger than `ttl_s`; a file that does not read back as one is logged
and removed, never trusted.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from frscope.operator.evidence.spill import replace_file
from frscope.operator.model.objects import JobRef
from frscope.operator.model.store import LatestDiagnosis
from frscope.report.timeline import TIMELINE_SCHEMA

log = logging.getLogger("frscope.operator")

SCHEMA = "frscope.incident-view/v1"
SUFFIX = ".json.gz"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
DEFAULT_MAX_JOBS = 500
DEFAULT_MAX_BYTES = 64 * 1024 * 1024  # decompressed, per file
DEFAULT_TTL_S = 14 * 24 * 3600.0


class IncidentArchive:
    def __init__(self, path: Path, *, max_jobs: int = DEFAULT_MAX_JOBS, max_bytes: int = DEFAULT_MAX_BYTES,
                 ttl_s: float = DEFAULT_TTL_S) -> None:
        self.path = path
        self.max_jobs = max_jobs
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        path.mkdir(parents=True, exist_ok=True)
        # one writer thread: the event loop never waits for the disk, and writes of one job stay in order
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="frscope-incident-archive")

    def save_soon(self, ref: JobRef, latest: LatestDiagnosis) -> None:
        """`save` on the archive's writer thread (JobStore's `on_latest`)."""
        self._writer.submit(self.save, ref, latest)

    def close(self) -> None:
        """Finish the pending writes."""
        self._writer.shutdown(wait=True)

    def _file(self, namespace: str, name: str) -> Path | None:
        if not (_NAME.match(namespace) and _NAME.match(name)) or "_" in namespace + name:
            return None
        return self.path / f"{namespace}_{name}{SUFFIX}"

    def save(self, ref: JobRef, latest: LatestDiagnosis) -> None:
        """Keep the job's latest incident view (replacing the one before); then drop the oldest files
        beyond `max_jobs`."""
        target = self._file(ref.namespace, ref.name)
        if target is None:
            return
        doc = {
            "schema": SCHEMA,
            "saved_at": time.time(),
            "ref": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid, "api_version": ref.api_version,
                    "kind": ref.kind},
            "latest": {
                "incident": latest.incident, "category": latest.category, "verdict": latest.verdict,
                "culprit_ranks": list(latest.culprit_ranks), "report_name": latest.report_name, "at": latest.at,
                "report": latest.report, "timeline": latest.timeline,
            },
        }
        body = gzip.compress(json.dumps(doc, separators=(",", ":"), allow_nan=False).encode(), compresslevel=3)
        error = replace_file(target, body)
        if error is not None:
            log.error("incident archive: could not keep %s/%s: %s", ref.namespace, ref.name, error)
            return
        self._prune()

    def remove(self, namespace: str, name: str) -> None:
        target = self._file(namespace, name)
        if target is not None:
            target.unlink(missing_ok=True)

    def _files(self) -> list[Path]:
        return [p for p in self.path.glob(f"*{SUFFIX}") if not p.name.startswith(".")]

    def _prune(self) -> None:
        files = self._files()
        if len(files) <= self.max_jobs:
            return
        by_age = sorted(files, key=lambda p: p.stat().st_mtime)
        for path in by_age[: len(files) - self.max_jobs]:
            path.unlink(missing_ok=True)

    def _read(self, path: Path) -> tuple[JobRef, LatestDiagnosis]:
        with gzip.open(path, "rb") as handle:
            raw = handle.read(self.max_bytes + 1)
        if len(raw) > self.max_bytes:
            raise ValueError(f"more than {self.max_bytes} bytes")
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise ValueError("not an incident view")
        ref, latest = doc.get("ref"), doc.get("latest")
        if not isinstance(ref, dict) or not isinstance(latest, dict):
            raise ValueError("no ref or latest")
        text = {k: v for k in ("namespace", "name", "uid", "api_version", "kind") if isinstance(v := ref.get(k), str)}
        if len(text) < 5 or self._file(text["namespace"], text["name"]) != path:
            raise ValueError("ref does not name this file's job")
        fields = {k: latest.get(k) for k in ("incident", "category", "verdict", "report_name", "at")}
        if not all(isinstance(v, str) for v in fields.values()):
            raise ValueError("latest: a text field is missing")
        culprits = latest.get("culprit_ranks")
        if not isinstance(culprits, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in culprits):
            raise ValueError("latest.culprit_ranks")
        report, timeline = latest.get("report"), latest.get("timeline")
        if not isinstance(report, dict):
            raise ValueError("latest.report")
        if timeline is not None and (not isinstance(timeline, dict) or timeline.get("schema") != TIMELINE_SCHEMA):
            raise ValueError("latest.timeline")
        job = JobRef(text["namespace"], text["name"], text["uid"], text["api_version"], text["kind"])
        return job, LatestDiagnosis(incident=str(fields["incident"]), category=str(fields["category"]),
                                    verdict=str(fields["verdict"]), culprit_ranks=tuple(culprits),
                                    report_name=str(fields["report_name"]), at=str(fields["at"]), report=report,
                                    timeline=timeline)

    def load(self) -> Iterator[tuple[JobRef, LatestDiagnosis]]:
        """Every kept view younger than `ttl_s`; older or unreadable files are removed."""
        now = time.time()
        for path in sorted(self._files()):
            try:
                if now - path.stat().st_mtime > self.ttl_s:
                    path.unlink(missing_ok=True)
                    continue
                yield self._read(path)
            except (OSError, ValueError, EOFError) as exc:
                log.warning("incident archive: %s dropped: %s", path.name, exc)
                path.unlink(missing_ok=True)
