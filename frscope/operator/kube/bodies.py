"""Reading HTTP bodies with a size cap (API server and sidecar answers)."""

from __future__ import annotations

from pathlib import Path

import aiohttp


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, or limit + 1 bytes when it is longer (a single read() may return one chunk)."""
    chunks: list[bytes] = []
    total = 0
    while total <= limit:
        chunk = await resp.content.read(min(1 << 20, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


async def write_capped(resp: aiohttp.ClientResponse, path: Path, limit: int) -> int:
    """The body written to `path` in chunks (never whole in memory); its size, or limit + 1 when longer."""
    total = 0
    with path.open("wb") as out:
        while total <= limit:
            chunk = await resp.content.read(min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            out.write(chunk)
            total += len(chunk)
    return total
