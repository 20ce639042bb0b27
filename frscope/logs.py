"""Logging for the long-running commands (`frscope operator`, `frscope sidecar`): one `--log-level`
(lower case, any case accepted) and `--log-format text|json`, each with its FRSCOPE_* variable.

JSON lines carry `time`, `level`, `logger`, `message` and, where known, `job`, `namespace`, `pod` and
`incident` as fields of their own, so a log pipeline can select one job's or one incident's lines.
Those come from the record's `extra` (`log.info(..., extra=fields(job=...))`), from kopf's per-object
records (`k8s_ref`), and from the process' own identity (a sidecar knows its pod and namespace).
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
DEFAULT_LEVEL = "info"
DEFAULT_FORMAT = "text"
# The fields a JSON line lifts out of a record, in this order.
FIELDS = ("job", "namespace", "pod", "incident")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def fields(**values: object) -> dict[str, object]:
    """`extra=` for a log call: the given FIELDS that are not None."""
    return {k: v for k, v in values.items() if k in FIELDS and v is not None}


def _choice(allowed: tuple[str, ...]) -> Any:
    def convert(text: str) -> str:
        value = text.strip().lower()
        if value not in allowed:
            raise argparse.ArgumentTypeError(f"{text!r}: one of {', '.join(allowed)}")
        return value

    return convert


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    env = os.environ if env is None else env
    parser.add_argument(
        "--log-level", type=_choice(LEVELS), default=(env.get("FRSCOPE_LOG_LEVEL") or DEFAULT_LEVEL).lower(),
        metavar="LEVEL",
        help=f"{', '.join(LEVELS)} [env FRSCOPE_LOG_LEVEL; default {DEFAULT_LEVEL}]",
    )
    parser.add_argument(
        "--log-format", type=_choice(FORMATS), default=(env.get("FRSCOPE_LOG_FORMAT") or DEFAULT_FORMAT).lower(),
        metavar="FORMAT",
        help="text, or json: one JSON object per line with job, namespace, pod and incident as fields "
             f"[env FRSCOPE_LOG_FORMAT; default {DEFAULT_FORMAT}]",
    )


class JsonFormatter(logging.Formatter):
    def __init__(self, static: Mapping[str, object] | None = None) -> None:
        super().__init__()
        self.static = {k: v for k, v in (static or {}).items() if v}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        ref = getattr(record, "k8s_ref", None)  # kopf's per-object loggers
        if isinstance(ref, dict):
            if ref.get("namespace"):
                out["namespace"] = ref["namespace"]
            kind = str(ref.get("kind") or "").lower()
            if ref.get("name") and kind == "pod":
                out["pod"] = ref["name"]
            elif ref.get("name") and kind:
                out["job"] = ref["name"]
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = str(value)
        for key, value in self.static.items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup(level: str, fmt: str, static: Mapping[str, object] | None = None) -> None:
    """Configure the root logger (stderr). `static`: fields of every JSON line (a sidecar's pod)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(static) if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
