"""Accepted pushes, kept on disk (`--evidence-dir`) so that an operator restart does not lose them.

One file per pod, `<namespace>_<pod>.json.gz` (`<namespace>_<pod>_<uid>.json.gz` when the pusher's
token named its pod's uid), holding the body as the sidecar pushed it (gzip), written atomically (temp
file + rename) and removed when the push store lets the push go. The names come from the caller's
token or headers, so they are checked (DNS-1123 names, a uid of hex digits and dashes) before they
become paths; at start, every file is decoded again like a fresh push (`reload`: in the decoder
processes, one rank at a time, never in the operator's own process), with its uid (a job's pods keep
their names across a restart: the uid tells a gone pod's push from its successor's), and one that
does not decode is logged and removed. A push arrives as a file (streamed to disk by the HTTP server)
and is kept by moving that file (`keep_file`): the operator never holds the body in memory.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from frscope.operator.evidence.pod_evidence import PodEvidence
from frscope.operator.evidence.push_decode import decode_file
from frscope.operator.evidence.sidecars import SidecarError

if TYPE_CHECKING:
    from frscope.operator.evidence.gather import Decoder

log = logging.getLogger("frscope.operator")

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # what Kubernetes allows for both
_UID = re.compile(r"^[0-9a-f][-0-9a-f]{0,63}$")  # a pod uid (a UUID)
SUFFIX = ".json.gz"



def replace_file(target: Path, body: bytes) -> OSError | None:
    """Write `body` to `target` in one step (a hidden temporary file, then a rename), so a reader never sees
    half a file; the error, with the temporary file removed, when it cannot be written."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(body)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        return exc
    return None

class EvidenceDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def _file(self, namespace: str, pod: str, uid: str = "") -> Path | None:
        if not (_NAME.match(namespace) and _NAME.match(pod)) or "_" in namespace + pod:
            return None
        if uid and not _UID.match(uid):
            return None
        return self.path / f"{namespace}_{pod}{'_' + uid if uid else ''}{SUFFIX}"

    def _kept(self, namespace: str, pod: str) -> list[Path]:
        """The pod's files, whichever uid they carry."""
        if self._file(namespace, pod) is None:
            return []
        return [*self.path.glob(f"{namespace}_{pod}{SUFFIX}"), *self.path.glob(f"{namespace}_{pod}_*{SUFFIX}")]

    def save(self, namespace: str, pod: str, raw: bytes, uid: str = "") -> None:
        """Keep one pod's pushed body (plain or gzip), replacing what the pod of that name pushed before;
        a name that is no Kubernetes name, or a uid that is none, is not kept."""
        target = self._file(namespace, pod, uid)
        if target is None:
            log.warning("evidence dir: push from %r/%r (uid %r) not kept on disk (not a Kubernetes name)",
                        namespace, pod, uid)
            return
        body = raw if raw[:2] == b"\x1f\x8b" else gzip.compress(raw, compresslevel=1)
        error = replace_file(target, body)
        if error is not None:
            log.warning("evidence dir: could not keep the push of %s/%s: %s", namespace, pod, error)
            return
        for other in self._kept(namespace, pod):
            if other != target:
                other.unlink(missing_ok=True)

    def keep_file(self, namespace: str, pod: str, body: Path, uid: str = "") -> None:
        """`save`, for a body streamed into the file `body` (gzip kept as it is, plain compressed on the
        way, in chunks); `body` itself is left to the caller."""
        target = self._file(namespace, pod, uid)
        if target is None:
            log.warning("evidence dir: push from %r/%r (uid %r) not kept on disk (not a Kubernetes name)",
                        namespace, pod, uid)
            return
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            with body.open("rb") as src:
                gzipped = src.read(2) == b"\x1f\x8b"
                src.seek(0)
                with tmp.open("wb") as raw_out:
                    if gzipped:
                        shutil.copyfileobj(src, raw_out, 1 << 20)
                    else:
                        with gzip.GzipFile(fileobj=raw_out, mode="wb", compresslevel=1) as out:
                            shutil.copyfileobj(src, out, 1 << 20)
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            log.warning("evidence dir: could not keep the push of %s/%s: %s", namespace, pod, exc)
            return
        for other in self._kept(namespace, pod):
            if other != target:
                other.unlink(missing_ok=True)

    def remove(self, namespace: str, pod: str) -> None:
        for file in self._kept(namespace, pod):
            file.unlink(missing_ok=True)

    def files(self, *, ttl_s: float) -> list[tuple[Path, str, str, str]]:
        """The kept pushes' files, oldest first, as (file, namespace, pod, uid); files older than `ttl_s`
        or not named by this directory are removed."""
        out: list[tuple[Path, str, str, str]] = []
        for file in sorted(self.path.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime):
            namespace, _, rest = file.name[: -len(SUFFIX)].partition("_")
            pod, _, uid = rest.partition("_")
            if self._file(namespace, pod, uid) != file or time.time() - file.stat().st_mtime > ttl_s:
                file.unlink(missing_ok=True)
                continue
            out.append((file, namespace, pod, uid))
        return out

    def _dropped(self, file: Path, exc: Exception) -> None:
        log.warning("evidence dir: %s dropped: %s", file, exc)
        file.unlink(missing_ok=True)

    def load(self, *, max_entries: int, ttl_s: float, plain_bytes: int = 0) -> Iterator[PodEvidence]:
        """The kept pushes decoded in this process (tests, tools), oldest first; `reload` is the operator's."""
        for file, namespace, pod, uid in self.files(ttl_s=ttl_s):
            try:
                evidence = decode_file(str(file), str(file), origin="push", max_entries=max_entries, pod=pod,
                                       namespace=namespace, plain_bytes=plain_bytes)
            except SidecarError as exc:
                self._dropped(file, exc)
                continue
            evidence.pod_uid = uid
            yield evidence

    async def reload(self, decoder: Decoder, *, max_entries: int, ttl_s: float,
                     plain_bytes: int = 0) -> AsyncIterator[PodEvidence]:
        """The kept pushes, oldest first, each decoded in the decoder processes (one at a time: a restart
        costs the operator's process only the decoded evidence it keeps). `plain_bytes`: the largest
        push accepted (`--max-push-bytes`): a plain one was compressed here, maybe past 64x."""
        for file, namespace, pod, uid in await asyncio.to_thread(self.files, ttl_s=ttl_s):
            try:
                evidence = await decoder.decode_file(str(file), str(file), origin="push", max_entries=max_entries,
                                                     pod=pod, namespace=namespace, plain_bytes=plain_bytes)
            except SidecarError as exc:
                self._dropped(file, exc)
                continue
            evidence.pod_uid = uid
            yield evidence
