"""A pushed body decoded from the file it was streamed into, one rank at a time (in a decoder process).

`POST /v1/push` takes up to `--max-push-bytes` (256 MiB by default). Read whole and decoded whole, one
such body took the operator from 53 to 1,054 MiB (issue 34): the raw body, its text and every rank's
decoded objects at once. Here the operator's process streams the body to a file and never holds it; a
decoder process reads the file piece by piece with `os.pread` (no mapping, nothing kept resident):

- a gzip body is first inflated to a sibling file, streamed and capped (pod_evidence.MAX_EXPANSION);
- each rank's piece of the envelope's `ranks` array is read (at most MAX_PIECE_BYTES: a recorder
  window is a few MiB; a larger piece refuses the body, naming it), checked like any piece (too deep,
  made of tiny containers: that rank's problem), decoded, cut to `max_entries`, normalized into
  columns, and dropped before the next one is read;
- the envelope's other fields (at most MAX_REST_BYTES) are decoded last.

So a decoder process holds one piece and its decoded objects at a time, whatever the body's size.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from frscope.operator.evidence.pod_evidence import (
    DEFAULT_MAX_ENTRIES,
    DIGIT_MARKS,
    EXPANSION_FLOOR,
    LONG_DIGITS,
    MAX_EXPANSION,
    MAX_PIECE_DEPTH,
    MAX_PIECES,
    PodEvidence,
    Unreadable,
    add_piece,
    dense,
    loads_json,
    measure,
    value_span,
)
from frscope.operator.evidence.sidecars import DEFAULT_MAX_SNAPSHOT_BYTES, SidecarError, parse_snapshot
from frscope.records import LoadProblem, scan
from frscope.records.envelope import envelope_problems
from frscope.records.limits import describe
from frscope.records.normalize import parse_profiling_name

MAX_PIECE_BYTES = 16 * 1024 * 1024
MAX_REST_BYTES = 4 * 1024 * 1024
FIRST_READ = 64 * 1024
CHUNK = 1024 * 1024
_WS = b" \t\n\r"


def inflate_file(source: Path, target: Path, limit: int, endpoint: str) -> None:
    """Gunzip `source` into `target`, streamed, refusing more than `limit` bytes out."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    written = 0
    with source.open("rb") as src, target.open("wb") as out:
        while chunk := src.read(CHUNK):
            try:
                while chunk:  # at most CHUNK bytes out at a time: 1 MiB of gzip may hold 1 GiB
                    data = inflater.decompress(chunk, CHUNK)
                    written += len(data)
                    if written > limit:
                        raise SidecarError(endpoint, f"answer larger than {limit} bytes once decompressed",
                                           retryable=False)
                    out.write(data)
                    chunk = inflater.unconsumed_tail
                    if inflater.eof:
                        break
            except zlib.error as exc:
                raise SidecarError(endpoint, f"corrupt gzip: {exc}", retryable=False) from exc
            if inflater.eof:
                break
    if not inflater.eof:
        raise SidecarError(endpoint, "gzip stream ends early", retryable=False)


class _Body:
    """Reads of one file by offset."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, max(0, min(length, self.size - offset)), offset)

    def skip_ws(self, offset: int) -> int:
        while offset < self.size:
            block = self.read(offset, 4096)
            stripped = len(block) - len(block.lstrip(_WS + b","))
            offset += stripped
            if stripped < len(block):
                break
        return offset

    def find(self, needle: bytes, start: int, limit: int) -> int:
        """The offset of `needle` at or after `start` within `limit` bytes, else -1."""
        block = self.read(start, limit)
        at = block.find(needle)
        return start + at if at >= 0 else -1


def _text(window: bytes, endpoint: str) -> str:
    """`window` as text; an incomplete character at its very end (a cut window) is left out."""
    try:
        return window.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(window) - 3 and exc.reason == "unexpected end of data":
            return window[: exc.start].decode("utf-8")
        raise SidecarError(endpoint, f"answer is not UTF-8 JSON: {describe(str(exc))}", retryable=False) from exc


def _piece(body: _Body, at: int, index: int, endpoint: str, expect: int = 0, max_entries: int = 0
           ) -> tuple[Any, int]:
    """The rank piece starting at `at`: (its decoded value or an `Unreadable`, the offset after it).
    `expect`: the size of the piece before it (a pod's ranks are alike): read at once, the piece is not
    decoded twice (a window that ends inside it is decoded up to there before more is read). A regular
    piece is read by the C scanner straight into columns cut to `max_entries` (`scan.ScannedPiece`), the
    same evidence as decoding it here and cutting it in `add_piece`."""
    hooked = json.JSONDecoder(parse_int=lambda d: int(d) if len(d) <= 20 else None, parse_constant=lambda _: None)
    plain = json.JSONDecoder(parse_constant=lambda _: None)
    size = min(max(FIRST_READ, expect + expect // 8), MAX_PIECE_BYTES)
    while True:
        window = body.read(at, size + 1)
        whole = at + len(window) >= body.size
        text = _text(window, endpoint)
        scanned = scan.scan_piece(window, max_entries, parse_profiling_name)
        if scanned is not None:
            return scanned[0], at + scanned[1]
        # An int literal of more than 20 characters is 'not recorded' (the hook; int() of 5,000 digits would
        # fail the body); a window with no run of 20 digits has none, and Python's own int parsing, without a
        # call per int, reads it the same (a quarter of the decoding; the scan costs a tenth of it).
        decoder = hooked if window.translate(DIGIT_MARKS).find(LONG_DIGITS) >= 0 else plain
        if text[:1] in ("{", "[") and dense(window):
            try:  # the window is dense: decide by this piece's own span (the next ones may be the dense ones)
                end, deepest = value_span(text, 0)
            except ValueError:
                end, deepest = -1, 0
            if end >= 0:
                raw = text[:end].encode("utf-8")
                why = ("is nested too deeply to decode" if deepest > MAX_PIECE_DEPTH
                       else "is made of tiny JSON objects and arrays: not a recorder" if dense(raw) else None)
                if why is not None:
                    return Unreadable(f"a rank's snapshot ({len(raw)} bytes) {why}"), at + len(raw)
        try:
            value, end = decoder.raw_decode(text, 0)
            return value, at + (end if text.isascii() else len(text[:end].encode("utf-8")))
        except RecursionError:
            try:
                end, _ = value_span(text, 0)
            except ValueError as exc:  # the window ends inside the piece: read more of it, as below
                if whole or size >= MAX_PIECE_BYTES:
                    raise SidecarError(endpoint, f"answer is not JSON: rank piece #{index} is nested too deeply "
                                       "and never ends", retryable=False) from exc
                size = min(size * 4, MAX_PIECE_BYTES)
                continue
            raw = text[:end].encode("utf-8")  # `end` counts characters; offsets in the body are bytes
            return Unreadable(f"a rank's snapshot ({len(raw)} bytes) is nested too deeply to decode"), at + len(raw)
        except ValueError as exc:
            if whole or not _cut_short(exc, text):
                raise SidecarError(endpoint, f"answer is not JSON: {describe(str(exc))}", retryable=False) from exc
            if size >= MAX_PIECE_BYTES:
                raise SidecarError(endpoint, f"rank piece #{index} is over {MAX_PIECE_BYTES} bytes: not a "
                                   "recorder window", retryable=False) from exc
            size = min(size * 4, MAX_PIECE_BYTES)  # the piece goes on past the window: read more of it


def _cut_short(exc: ValueError, text: str) -> bool:
    """Whether the decoder failed because the window ends inside the piece (read more), not at bad JSON."""
    if not isinstance(exc, json.JSONDecodeError):
        return False
    return exc.msg.startswith("Unterminated string") or exc.pos >= len(text) - 1


def decode_file(path: str, endpoint: str, *, origin: str, max_entries: int = DEFAULT_MAX_ENTRIES,
                pod: str | None = None, namespace: str | None = None, plain_bytes: int = 0,
                max_ranks: int = MAX_PIECES, unchanged_if: bytes = b"", with_digest: bool = False) -> PodEvidence:
    """Decode the snapshot body in the file `path` (gzip or plain; in a decoder process). A gzip body
    inflates to at most MAX_EXPANSION x its size (+ EXPANSION_FLOOR), or `plain_bytes` where larger: a
    push kept on disk was accepted plain up to that size, and compressed by the operator itself.

    With `with_digest`, the evidence's `digest` is that of the body's ranks and errors (everything from
    its `"ranks"` on: the envelope's head says when it was rendered, which changes with every answer; a
    `Checksum`). With `unchanged_if`, a
    body of that digest is not decoded: an empty evidence with `unchanged` set comes back, and the caller
    keeps what it decoded of the same body before (the live windows: a sidecar serves what it read at
    its last full poll, the same bytes for many refreshes)."""
    source = Path(path)
    inflated: Path | None = None
    try:
        size = source.stat().st_size
        with source.open("rb") as handle:
            magic = handle.read(2)
        digest = b""
        if magic == b"\x1f\x8b":
            limit = min(DEFAULT_MAX_SNAPSHOT_BYTES, max(MAX_EXPANSION * size + EXPANSION_FLOOR, plain_bytes))
            if unchanged_if:
                # Inflated and digested on the way, nothing written: most answers of a live window are
                # the ones decoded before.
                digest, plain = inflated_digest(source, limit, endpoint)
                if digest == unchanged_if:
                    return PodEvidence(namespace or "", pod or "", "", None, size_bytes=plain, digest=digest,
                                       unchanged=True)
            inflated = source.with_name(f".{source.name}.{os.getpid()}.inflated")
            inflate_file(source, inflated, limit, endpoint)
            source = inflated
        fd = os.open(source, os.O_RDONLY)
        try:
            body = _Body(fd, os.fstat(fd).st_size)
            if with_digest or unchanged_if:
                digest = digest or body_digest(body)
            if unchanged_if and digest == unchanged_if:
                return PodEvidence(namespace or "", pod or "", "", None, size_bytes=body.size, digest=digest,
                                   unchanged=True)
            with _collector_paused():
                out = _decode(body, endpoint, origin=origin, max_entries=max_entries, pod=pod, namespace=namespace,
                              max_ranks=max_ranks)
            out.digest = digest
            return out
        finally:
            os.close(fd)
    except OSError as exc:
        raise SidecarError(endpoint, f"the body could not be read: {exc}", retryable=False) from exc
    finally:
        if inflated is not None:
            inflated.unlink(missing_ok=True)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a body decodes: decoding a rank's piece makes ~40,000 objects
    (JSON makes no cycles; each piece's are freed by their counts before the next is read), and the
    collections they set off walked every one of them again, a third of the decoding's CPU
    (bench/RESULTS.md, "Live window of 1,024 ranks"). Back on after the body, whatever happened."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def inflated_digest(source: Path, limit: int, endpoint: str) -> tuple[bytes, int]:
    """(`body_digest` of the gzip body in `source`, its inflated size), inflated in memory a chunk at a
    time (at most `limit` bytes out), nothing written; b"" when no `"ranks"` key is near its start."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    hasher = Checksum()
    head = bytearray()  # what came before the "ranks" key, while it is not seen
    found = False
    written = 0
    try:
        with source.open("rb") as src:
            while (chunk := src.read(CHUNK)) and not inflater.eof:
                while chunk and not inflater.eof:
                    data = inflater.decompress(chunk, CHUNK)
                    written += len(data)
                    if written > limit:
                        raise SidecarError(endpoint, f"answer larger than {limit} bytes once decompressed",
                                           retryable=False)
                    chunk = inflater.unconsumed_tail
                    if found:
                        hasher.update(data)
                        continue
                    head += data
                    at = head.find(b'"ranks"')
                    if at >= 0:
                        hasher.update(head[at:])
                        found, head = True, bytearray()
                    elif len(head) > MAX_REST_BYTES:
                        return b"", written
    except zlib.error as exc:
        raise SidecarError(endpoint, f"corrupt gzip: {exc}", retryable=False) from exc
    if not inflater.eof:
        raise SidecarError(endpoint, "gzip stream ends early", retryable=False)
    return (hasher.digest() if found else b""), written


class Checksum:
    """CRC-32 and Adler-32 of the bytes and their count (16 bytes): a body is only ever compared with the
    same pod's last answer, which its sidecar makes whatever it is (a collision gains a sidecar nothing it
    could not send anyway), so a checksum at memory speed rather than a cryptographic digest, which cost
    a third of a refresh that decodes nothing (bench/RESULTS.md, "Live window of 1,024 ranks")."""

    def __init__(self) -> None:
        self.crc, self.adler, self.size = 0, 1, 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self.crc = zlib.crc32(data, self.crc)
        self.adler = zlib.adler32(data, self.adler)
        self.size += len(data)

    def digest(self) -> bytes:
        return struct.pack("<IIQ", self.crc, self.adler, self.size)


def body_digest(body: _Body) -> bytes:
    """`Checksum` of the body from its `"ranks"` key on (b"" when it has none near its start)."""
    head = body.find(b'"ranks"', 0, MAX_REST_BYTES)
    if head < 0:
        return b""
    hasher = Checksum()
    offset = head
    while offset < body.size:
        chunk = body.read(offset, CHUNK)
        hasher.update(chunk)
        offset += len(chunk)
    return hasher.digest()


def _decode(body: _Body, endpoint: str, *, origin: str, max_entries: int, pod: str | None,
            namespace: str | None, max_ranks: int = MAX_PIECES) -> PodEvidence:
    head = body.find(b'"ranks"', 0, MAX_REST_BYTES)
    start = body.find(b"[", head, 64) if head >= 0 else -1
    if start < 0:
        raise SidecarError(endpoint, "not a snapshot: no 'ranks' array near its start", retryable=False)
    where = f"pod {namespace or '?'}/{pod or '?'} ({origin})"
    out = PodEvidence(namespace or "", pod or "", "", None, size_bytes=body.size)
    offset, index, last = body.skip_ws(start + 1), 0, 0
    while offset < body.size and body.read(offset, 1) != b"]":
        if index >= MAX_PIECES:
            raise SidecarError(endpoint, f"more than {MAX_PIECES} rank pieces in one pod's snapshot", retryable=False)
        began = offset
        value, offset = _piece(body, offset, index, endpoint, last, max_entries)
        last = offset - began
        if isinstance(value, dict) and index < max_ranks:
            add_piece(out, value, index, where, max_entries)
        index += 1
        del value
        offset = body.skip_ws(offset)
    if offset >= body.size:
        raise SidecarError(endpoint, "answer is not JSON: the 'ranks' array never ends", retryable=False)
    tail = body.size - offset - 1
    if start + tail > MAX_REST_BYTES:
        raise SidecarError(endpoint, f"the snapshot's fields other than its ranks are over {MAX_REST_BYTES} bytes",
                           retryable=False)
    rest = body.read(0, start) + b"[]" + body.read(offset + 1, tail)
    try:
        if dense(rest):
            raise ValueError("the snapshot's other fields are made of tiny JSON objects and arrays")
        obj = loads_json(rest)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise SidecarError(endpoint, f"answer is not JSON: {describe(str(exc))}", retryable=False) from exc
    snapshot = parse_snapshot(obj, endpoint, size_bytes=body.size)
    if index + len(snapshot.errors) > MAX_PIECES:
        raise SidecarError(endpoint, f"{index} rank pieces and {len(snapshot.errors)} errors: more than "
                           f"{MAX_PIECES} in one pod's snapshot", retryable=False)
    out.namespace, out.pod = namespace or snapshot.namespace, pod or snapshot.pod
    out.reason, out.captured_at_ns = snapshot.reason, snapshot.captured_at_ns
    out.problems[:0] = envelope_problems(snapshot.errors, f"pod {out.namespace}/{out.pod} ({origin})")
    if index > max_ranks:
        out.problems.append(LoadProblem(where, f"{index} ranks in one pod's answer: only the first {max_ranks} are "
                                        "kept here", kind="warning"))
    measure(out, origin)
    return out
