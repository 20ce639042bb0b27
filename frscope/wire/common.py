"""What every document of the wire format shares: the schema names, the per-pod token audience, the
error type, and the bounded readers of a document's values (ints, seconds, text)."""

from __future__ import annotations

import math
from typing import Any

STATUS_SCHEMA = "frscope.sidecar.status/v1"
SNAPSHOT_SCHEMA = "frscope.sidecar.snapshot/v1"
# The key that marks a snapshot piece, and its format number (its value).
SNAPSHOT_KEY = "frscope_snapshot"
SNAPSHOT_FORMAT = 1
SNAPSHOT_PIECE_KEYS = frozenset({SNAPSHOT_KEY, "rank", "captured_at_ns", "source", "stacks", "trace"})
# A piece cut to its newest entries (`/v1/snapshot?entries=N`) says how many older ones it left out.
ENTRIES_DROPPED_KEY = "entries_dropped"
# `/v1/snapshot?entries=N`: the window's bounds (a recorder holds 2,000 entries by default; no ring
# buffer is a million long, and a number past that is a typo or a probe).
SNAPSHOT_WINDOW_MIN = 1
SNAPSHOT_WINDOW_MAX = 1_000_000
# `/v1/snapshot`'s validator (an ETag, docs/sidecar-api.md "Conditional requests"): a sidecar's is 41
# characters; a reader keeps none longer than this, and a sidecar reads no If-None-Match longer than
# IF_NONE_MATCH_MAX_CHARS (nor more than IF_NONE_MATCH_MAX_TAGS tags) and answers such a request whole.
ETAG_MAX_CHARS = 96
IF_NONE_MATCH_MAX_CHARS = 1024
IF_NONE_MATCH_MAX_TAGS = 8


# A status document is a few KiB per rank; one past this is refused before it is parsed.
STATUS_MAX_BYTES = 1024 * 1024
# Ints in a status document: seqs, counts and ranks are int64 at most.
INT64 = (1 << 63) - 1
MAX_RANK = 1 << 20

# The audience of the tokens the operator mints for one pod's sidecar (TokenRequest); the sidecar
# accepts only its own pod's, so a token shown to one sidecar opens no other.
SIDECAR_AUDIENCE = "frscope.io/sidecar"


def sidecar_audience(namespace: str, pod: str) -> str:
    return f"{SIDECAR_AUDIENCE}/{namespace}/{pod}"


# With TLS between the operator and the sidecars (docs/install.md, "TLS to the sidecars"), the one DNS
# name in a sidecar's certificate: its pod and namespace under a suffix no resolver answers for. The
# operator issues it only to that pod (the pod comes from the pod-bound token the request carries) and
# expects exactly it when it connects to that pod's address, so a certificate opens no other pod.
# A namespace is one DNS label (no dots), so the name reads back unambiguously from the right.
SIDECAR_TLS_SUFFIX = "sidecar.frscope.internal"
# The issuing endpoint on the operator's HTTP port: a CSR (PEM) in, the certificate chain (PEM) out.
CERTIFICATE_PATH = "/v1/certificate"


def sidecar_tls_name(namespace: str, pod: str) -> str:
    return f"{pod}.{namespace}.{SIDECAR_TLS_SUFFIX}".lower()


class WireError(ValueError):
    """A document is not what this module's schema says (the message says which part)."""



def read_int(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and -INT64 <= value <= INT64
    return value if ok else None


def read_seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > 1 << 53:
        return None
    got = float(value)
    return got if math.isfinite(got) else None


def read_text(value: Any, limit: int = 200) -> str:
    """A string of the document (capped), never str() of a container (its repr may be enormous)."""
    if isinstance(value, str):
        return value[:limit]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and read_int(value) is not None:
        return str(value)
    return "?" if value is not None else ""
