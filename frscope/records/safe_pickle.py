"""An allow-list unpickler for Flight Recorder dumps.

torch's own `torchfrtrace` calls `pickle.load` on dump files, which runs whatever callable a crafted
file names. A real dump is plain containers and scalars, except that dumps written by the JIT pickler
wrap containers in a handful of `torch.jit._pickle` helpers. Those are the only globals resolved here,
to local pure functions (torch is never imported); everything else is refused before it can run.
"""

from __future__ import annotations

import io
import pickle
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from frscope.records.errors import TruncatedDump, UnsafePickle


def _identity(data: Any) -> Any:
    return data


def _restore_type_tag(value: Any, type_str: str) -> Any:
    # The JIT pickler tags typed containers (e.g. 'Dict[str, Any]'); the value itself is plain.
    return value


def _tensor_from_id(data: Any) -> None:
    # Tensors never appear in FR dumps; if a newer format adds a tensor reference, read it as None.
    return None


_ALLOWED: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch.jit._pickle", "restore_type_tag"): _restore_type_tag,
    ("torch.jit._pickle", "build_intlist"): _identity,
    ("torch.jit._pickle", "build_doublelist"): _identity,
    ("torch.jit._pickle", "build_boollist"): _identity,
    ("torch.jit._pickle", "build_tensorlist"): _identity,
    ("torch.jit._pickle", "build_tensor_from_id"): _tensor_from_id,
    ("collections", "OrderedDict"): OrderedDict,
}


class _AllowListUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, source: str) -> None:
        # A reader with peek(): the C unpickler then prefetches large chunks. On a bare BytesIO it calls
        # read() once per opcode, since torch writes protocol 2, which has no frames (~3x slower).
        super().__init__(io.BufferedReader(io.BytesIO(data), buffer_size=1 << 20))
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise UnsafePickle(
                self._source,
                f"refused to load global {module}.{name}: not part of a Flight Recorder dump (nothing was executed)",
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickle(self._source, "refused a persistent id: not part of a Flight Recorder dump")


def safe_loads(data: bytes, source: str) -> Any:
    """Decode pickle bytes with the allow-list. Raises UnsafePickle or TruncatedDump, never runs code."""
    try:
        return _AllowListUnpickler(data, source).load()
    except UnsafePickle:
        raise
    except EOFError as exc:
        raise TruncatedDump(source, "pickle ends early: truncated or still being written") from exc
    except (pickle.UnpicklingError, ValueError, IndexError, KeyError, TypeError, AttributeError) as exc:
        # The C unpickler reports cut-off frames and garbage as any of these.
        raise TruncatedDump(source, f"corrupt or truncated pickle ({exc.__class__.__name__}: {exc})") from exc
    except MemoryError as exc:
        raise TruncatedDump(source, "pickle declares more memory than it contains") from exc
