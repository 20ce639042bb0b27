"""One line for a Kubernetes condition message or Event (<= 1,024 bytes, no newlines)."""

from __future__ import annotations

from frscope.analysis import Finding

LIMIT = 1024


def one_line(finding: Finding, limit: int = LIMIT) -> str:
    text = " ".join(finding.summary.split())
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    return encoded[: limit - 3].decode(errors="ignore") + "..."
