"""An allow-list unpickler for Flight Recorder dumps.

torch's own `torchfrtrace` calls `pickle.load` on dump files, which runs whatever callable a crafted
file names. A real dump is plain containers and scalars, except that dumps written by the JIT pickler
wrap containers in a handful of `torch.jit._pickle` helpers. Those are the only globals resolved here,
to local pure functions (torch is never imported); everything else is refused before it can run.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from frscope.records.errors import DumpTooLarge, TruncatedDump, UnsafePickle
from frscope.records.limits import MEMORY_MULTIPLE, address_space_cap, memory_budget, printable, rss_bytes


def _identity(data: Any) -> Any:
    return data


def _restore_type_tag(value: Any, type_str: str) -> Any:
    # The JIT pickler tags typed containers (e.g. 'Dict[str, Any]'); the value itself is plain.
    return value


def _tensor_from_id(data: Any) -> None:
    # Tensors never appear in FR dumps; if a newer format adds a tensor reference, read it as None.
    return None


def _ordered_dict(*args: Any) -> dict[Any, Any]:
    # A plain dict (ordered too), not the OrderedDict class: a BUILD opcode could set instance
    # attributes on an OrderedDict that shadow its methods (`get`), which readers then call.
    return dict(*args)


_ALLOWED: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch.jit._pickle", "restore_type_tag"): _restore_type_tag,
    ("torch.jit._pickle", "build_intlist"): _identity,
    ("torch.jit._pickle", "build_doublelist"): _identity,
    ("torch.jit._pickle", "build_boollist"): _identity,
    ("torch.jit._pickle", "build_tensorlist"): _identity,
    ("torch.jit._pickle", "build_tensor_from_id"): _tensor_from_id,
    ("collections", "OrderedDict"): _ordered_dict,
}

# The C unpickler asks its reader for more input every PREFETCH bytes (128 KiB) when the reader has
# peek(); that is where the memory check runs.
_CHUNK = 128 * 1024


class _MeteredReader:
    """Hands the unpickler its input in 128 KiB pieces and, at each piece, checks how much memory the
    decoding has taken so far: a pickle of 1-byte opcodes (DUP, EMPTY_DICT...) can build ~90 bytes of
    objects per byte of input. Past `limits.memory_budget(size)` the decode stops with DumpTooLarge."""

    __slots__ = ("_budget", "_data", "_pos", "_source", "_start")

    def __init__(self, data: bytes, source: str) -> None:
        self._data = memoryview(data)
        self._pos = 0
        self._source = source
        self._start = rss_bytes()
        self._budget = memory_budget(len(data))

    def _check(self) -> None:
        if self._start is None:
            return
        now = rss_bytes()
        if now is not None and now - self._start > self._budget:
            raise DumpTooLarge(
                self._source,
                f"decoding took more than {MEMORY_MULTIPLE}x the file's size in memory "
                f"({(now - self._start) >> 20} MiB so far): not a Flight Recorder dump",
            )

    def peek(self, n: int = 0) -> memoryview:
        self._check()
        return self._data[self._pos : self._pos + _CHUNK]

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n is None or n < 0 else min(len(self._data), self._pos + n)
        out = self._data[self._pos : end].tobytes()
        self._pos = end
        return out

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        got = self._data[self._pos : self._pos + len(view)]
        view[: len(got)] = got
        self._pos += len(got)
        return len(got)

    def readline(self) -> bytes:
        end = bytes(self._data[self._pos : self._pos + 4096]).find(b"\n")
        stop = self._pos + end + 1 if end >= 0 else min(len(self._data), self._pos + 4096)
        out = self._data[self._pos : stop].tobytes()
        self._pos = stop
        return out


class _AllowListUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, source: str) -> None:
        # A reader with peek(): the C unpickler then prefetches large chunks. On a bare BytesIO it calls
        # read() once per opcode, since torch writes protocol 2, which has no frames (~3x slower).
        super().__init__(_MeteredReader(data, source))
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise UnsafePickle(
                self._source,
                f"refused to load global {printable(module, 60)}.{printable(name, 60)}: "
                "not part of a Flight Recorder dump (nothing was executed)",
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickle(self._source, "refused a persistent id: not part of a Flight Recorder dump")


def safe_loads(data: bytes, source: str) -> Any:
    """Decode pickle bytes with the allow-list. Raises UnsafePickle or TruncatedDump, never runs code."""
    try:
        with address_space_cap(memory_budget(len(data))):
            return _AllowListUnpickler(data, source).load()
    except (UnsafePickle, DumpTooLarge):
        raise
    except EOFError as exc:
        raise TruncatedDump(source, "pickle ends early: truncated or still being written") from exc
    except AttributeError as exc:
        # BUILD on a container: the allowed globals return plain lists and dicts, which take no attributes.
        raise UnsafePickle(source, "refused to set attributes on a container (BUILD): not part of a Flight "
                           "Recorder dump (nothing was executed)") from exc
    except RecursionError as exc:
        raise UnsafePickle(source, "nested too deeply to decode: not a Flight Recorder dump") from exc
    except (pickle.UnpicklingError, ValueError, IndexError, KeyError, TypeError, OverflowError) as exc:
        # The C unpickler reports cut-off frames and garbage as any of these. Its messages name opcodes
        # and sizes, never the file's bytes; capped all the same.
        raise TruncatedDump(
            source, f"corrupt or truncated pickle ({exc.__class__.__name__}: {str(exc)[:160]})"
        ) from exc
    except MemoryError as exc:
        raise DumpTooLarge(
            source, f"decoding needs more memory than {MEMORY_MULTIPLE}x the file's size: not a Flight Recorder dump"
        ) from exc
