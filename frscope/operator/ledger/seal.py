"""The node ledger records only the reports the operator wrote (docs/install.md, "Threat model").

A FlightRecorderReport lives in the tenant's namespace, where whoever may write reports could make one
that blames any node. The operator seals each report it publishes: the annotation frscope.io/ledger-seal
is an HMAC-SHA256, under a key only the operator holds, of what the ledger reads from the report (its
namespace and name, and the incident `incident_input.incident_from_report` derives: job, time, verdict,
culprit ranks and nodes, their ends). The ledger records a report only when the seal matches: a report
made or edited by anyone else is ignored, whatever it says.

The key: `--node-ledger-key-file` (a file of at least 32 bytes), else derived from the sidecar CA's
private key (`--sidecar-ca-dir`: the same for every replica and across restarts), else random for this
process (reports published before a restart are then already recorded, or missed where the operator
stopped between publishing and recording).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

from frscope.operator import names
from frscope.operator.ledger.incident_input import incident_from_report, report_key

ANNOTATION = f"{names.REPORT_GROUP}/ledger-seal"
MIN_KEY_BYTES = 32
_CONTEXT = b"frscope node ledger seal v1\0"


def _digest_input(report: dict[str, Any]) -> bytes:
    """The canonical bytes of what the ledger takes from the report (normalised, so the API server's
    round trip of numbers and key order changes nothing)."""
    incident = incident_from_report(report)
    fields: Any = dataclasses.asdict(incident) if incident is not None else None
    if isinstance(fields, dict):
        fields["nodes"] = {n: list(r) for n, r in sorted(fields["nodes"].items())}
        fields["exits"] = {str(r): e for r, e in sorted(fields["exits"].items())}
        fields.pop("node_signals", None)  # read from the nodes by the ledger, never from the report
    return json.dumps({"report": report_key(report), "incident": fields}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True).encode("ascii")


class LedgerSeal:
    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the ledger's seal key needs at least {MIN_KEY_BYTES} bytes")
        self._key = hashlib.sha256(_CONTEXT + key).digest()

    @classmethod
    def from_sources(cls, key_file: Path | None, ca_key_file: Path | None) -> LedgerSeal:
        """The key file, else the sidecar CA's key file, else a random key (see the module's docstring)."""
        if key_file is not None:
            return cls(key_file.read_bytes())
        if ca_key_file is not None:
            return cls(ca_key_file.read_bytes())
        return cls(os.urandom(MIN_KEY_BYTES))

    def sign(self, report: dict[str, Any]) -> str:
        return hmac.new(self._key, _digest_input(report), hashlib.sha256).hexdigest()

    def sealed(self, report: dict[str, Any]) -> dict[str, Any]:
        """`report` with its seal annotation (a new dict; `report` is not changed)."""
        meta = dict(report.get("metadata") or {})
        meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION: self.sign(report)}
        return {**report, "metadata": meta}

    def verify(self, report: dict[str, Any]) -> bool:
        annotations = (report.get("metadata") or {}).get("annotations")
        given = annotations.get(ANNOTATION) if isinstance(annotations, dict) else None
        return isinstance(given, str) and hmac.compare_digest(given, self.sign(report))
