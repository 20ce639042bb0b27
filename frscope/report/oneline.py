"""One line for a Kubernetes condition message or Event (<= 1,024 bytes, no newlines). `kubectl describe` prints
it to a terminal: it goes through the same printable filter as the text report (no escape from a dump acts)."""

from __future__ import annotations

from frscope.analysis import Finding
from frscope.report.printable import printable

LIMIT = 1024


def one_line(finding: Finding, limit: int = LIMIT) -> str:
    text = printable(" ".join(finding.summary.split()))
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    return encoded[: limit - 3].decode(errors="ignore") + "..."
