"""A push's body, streamed to a file as it arrives (never held whole in the operator's memory).

`POST /v1/push` bodies reach `--max-push-bytes` (256 MiB by default). Read with `request.read()`, one
such body sat in the operator's memory, and then again as the decoder's input, and its kept copy
(issue 34: 53 -> 1,054 MiB). Here it goes to a file in the spool directory in chunks of CHUNK bytes,
refused past the cap as soon as it goes over (or at once, when its Content-Length says so); the decoder
processes read the file (`evidence.push_decode`) and an accepted body is kept by moving its file into
the evidence directory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from aiohttp import web

CHUNK = 1024 * 1024


class TooLarge(Exception):
    pass


def spool_dir(evidence_dir: Path | None) -> Path:
    """Where bodies are streamed: beside the kept pushes (one file system: keeping one is a rename), else
    a private directory under the system's temporary one (the chart mounts an emptyDir at /tmp)."""
    if evidence_dir is not None:
        path = evidence_dir / ".incoming"
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob(".push-*"):  # what an operator that died left half written
            stale.unlink(missing_ok=True)
        return path
    return Path(tempfile.mkdtemp(prefix="frscope-push-"))


async def receive(request: web.Request, spool: Path, limit: int) -> Path:
    """The body in a new file of `spool` (the caller removes it); TooLarge past `limit` bytes."""
    if request.content_length is not None and request.content_length > limit:
        raise TooLarge
    fd, name = tempfile.mkstemp(dir=spool, prefix=".push-", suffix=".part")
    path = Path(name)
    written = 0
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in request.content.iter_chunked(CHUNK):
                written += len(chunk)
                if written > limit:
                    raise TooLarge
                out.write(chunk)  # into the page cache: no wait worth a thread
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path
