"""Kubernetes Events about a job: Warning, CamelCase reason, one line of at most 1,024 bytes.

Names are deterministic per (job, incident, reason): posting again after an operator restart finds
the Event already there (409 AlreadyExists) instead of adding a duplicate.
"""

from __future__ import annotations

import re
from typing import Any

from frscope.operator import names
from frscope.operator.model.objects import JobRef, dns_name

MESSAGE_LIMIT = 1024
_CAMEL = re.compile(r"^[A-Z][A-Za-z0-9]*$")


def clip_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    line = " ".join(text.split())
    encoded = line.encode()
    if len(encoded) <= limit:
        return line
    return encoded[: limit - 3].decode(errors="ignore") + "..."


def event_name(job: JobRef, incident: str, reason: str) -> str:
    # Like the kubelet's '<object>.<suffix>', within the 253-character limit of object names.
    suffix = dns_name(incident, reason.lower(), limit=40)
    return f"{dns_name(job.name, limit=200)}.{suffix}"


def build_event(job: JobRef, *, reason: str, message: str, incident: str, now: str, instance: str,
                event_type: str = "Warning") -> dict[str, Any]:
    if not _CAMEL.match(reason):
        raise ValueError(f"Event reason must be CamelCase: {reason!r}")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(job, incident, reason), "namespace": job.namespace,
                     "labels": {names.LABEL_REPORT_INCIDENT: incident}},
        "involvedObject": {"apiVersion": job.api_version, "kind": job.kind, "name": job.name,
                           "namespace": job.namespace, "uid": job.uid},
        "reason": reason,
        "message": clip_line(message),
        "type": event_type,
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": names.COMPONENT},
        "reportingComponent": names.COMPONENT,
        "reportingInstance": instance,
    }
