"""Which schema a served CRD has: the hash of the CRD's `spec` as the chart ships it.

Helm installs a chart's `crds/` once and never upgrades them, so after `helm upgrade` the API server may
still serve an older schema and silently prune the fields a newer operator writes. Each CRD file in
charts/frscope/crds/ carries `frscope.io/schema-hash` (the hash below of its own `spec`), applying the file
puts it on the served CRD, and this frscope knows the hashes of the schemas it writes (SHIPPED):
a served CRD with another hash, or none, is stale. tests/unit/test_doctor_crd_schema.py keeps the three
(file, annotation, SHIPPED) equal.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

ANNOTATION = "frscope.io/schema-hash"

# name -> the schema hash of charts/frscope/crds/ as this frscope ships it
SHIPPED: Mapping[str, str] = {
    "flightrecorderreports.frscope.io": "6a9cc1c6f5143a55",
    "flightrecordernodes.frscope.io": "e3ccecb6848e50e1",
}


def schema_hash(spec: Any) -> str:
    """The first 16 hex digits of the SHA-256 of the spec as canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def stale_schema(crd: Mapping[str, Any]) -> str | None:
    """Why the served CRD's schema is not the one this frscope ships, or None when it is."""
    found = crd.get("metadata")
    metadata: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    name = str(metadata.get("name", ""))
    expected = SHIPPED.get(name)
    if expected is None:
        return None
    listed = metadata.get("annotations")
    annotations: Mapping[str, Any] = listed if isinstance(listed, Mapping) else {}
    served = annotations.get(ANNOTATION)
    if served == expected:
        return None
    if not served:
        return f"CRD {name} has no {ANNOTATION} annotation: its schema predates this frscope's ({expected})"
    return f"CRD {name} serves schema {str(served)[:64]!r}, this frscope ships {expected}: fields may be pruned"
