"""`frscope sidecar` options: every flag has an environment variable (flags win), see docs/sidecar.md."""

from __future__ import annotations

import argparse
import base64
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frscope import logs
from frscope.analysis.lateness import MIN_SHARE

# --metrics-detail (frscope.sidecar.metrics): "pod" aggregates the per-rank x per-group collective series over
# the pod; "rank-group" keeps one series per rank and process group.
METRICS_DETAILS = ("pod", "rank-group")
DEFAULT_METRICS_DETAIL = "pod"

DEFAULT_PORT = 9402
DEFAULT_SOCKET_DIR = "/run/frscope"
MiB = 1024 * 1024


def parse_size(text: str) -> int:
    """'64M', '512k', '1G', '1048576' -> bytes."""
    units = {"k": 1024, "m": MiB, "g": 1024 * MiB}
    cleaned = text.strip().lower().removesuffix("ib").removesuffix("b")
    if cleaned and cleaned[-1] in units:
        return int(float(cleaned[:-1]) * units[cleaned[-1]])
    return int(cleaned)


@dataclass(frozen=True)
class SidecarConfig:
    socket_dir: Path = Path(DEFAULT_SOCKET_DIR)
    dump_dir: Path | None = None
    # None: captures are kept in memory only.
    evidence_dir: Path | None = None
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    port_file: Path | None = None
    poll_interval_s: float = 2.0
    stall_after_s: float = 60.0
    # Suspected stalls (frscope.sidecar.rhythm): in flight with no progress for 3 x the group's usual
    # wait, never sooner than suspect_min_s, at the latest after suspect_after_s. 0: no suspicions.
    suspect_after_s: float = 15.0
    suspect_min_s: float = 4.0
    # A rank is a straggler when the others spend at least this share of the job's time waiting for it
    # (frscope.analysis.lateness), and it is late far more often than chance.
    straggler_min_share: float = MIN_SHARE
    # Full recorder (fr_trace_json) every this many polls; the polls between ask the cheap progress
    # probe only (and fetch the full recorder when it suggests a stall). 1: every poll.
    full_poll_every: int = 15
    # The job's identity (frscope.sidecar.schedule): every pod of a job polls on the same wall-clock
    # slots, at a phase drawn from it. "": the multiples of the interval since the epoch.
    schedule_key: str = ""
    # The stall threshold never exceeds this fraction of the in-flight entry's timeout_ms.
    stall_timeout_fraction: float = 0.5
    request_timeout_s: float = 5.0
    stacks_timeout_s: float = 10.0
    max_answer_bytes: int = 64 * MiB
    max_stacks_bytes: int = 1 * MiB
    max_dump_bytes: int = 256 * MiB
    max_snapshot_bytes: int = 128 * MiB
    dump_settle_s: float = 2.0
    dump_scan_interval_s: float = 2.0
    evidence_max_files: int = 8
    evidence_max_bytes: int = 256 * MiB
    memory_captures: int = 2
    max_concurrency: int = 8
    token_file: Path | None = None
    # Kubernetes identity (frscope.sidecar.auth): accept only this service account's tokens (offline
    # check against the cluster's issuer keys), and push with the pod's own projected token.
    operator_identity: str | None = None
    kube_token_dir: Path = Path("/var/run/secrets/frscope")
    api_server: str | None = None
    operator_url: str | None = None
    # HTTPS on the port (frscope.sidecar.tls): a certificate the operator issues at this URL's
    # /v1/certificate (asked with the pod's own token), or one from files.
    certificate_url: str | None = None
    # base64 of the PEM CA the operator's HTTPS certificate must chain to (pushes and certificate requests
    # to https:// URLs); None: the system's CAs.
    operator_ca: str | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    push_timeout_s: float = 10.0
    push_attempts: int = 5
    push_backoff_s: float = 1.0
    pod: str = ""
    namespace: str = ""
    node: str = ""
    install_bootstrap: Path | None = None
    # The collective series per rank and group ("rank-group"), or aggregated over the pod ("pod"): see
    # frscope.sidecar.metrics and docs/sidecar.md, "Metrics: how many series".
    metrics_detail: str = DEFAULT_METRICS_DETAIL

    def __post_init__(self) -> None:
        if self.poll_interval_s <= 0:
            raise ValueError("--poll-interval must be > 0")
        if self.full_poll_every < 1:
            raise ValueError("--full-poll-every must be >= 1")
        if self.stall_after_s <= 0:
            raise ValueError("--stall-after must be > 0")
        if self.suspect_after_s < 0 or self.suspect_min_s < 0:
            raise ValueError("--suspect-after and --suspect-min must be >= 0")
        if self.suspect_after_s and self.suspect_min_s > self.suspect_after_s:
            raise ValueError("--suspect-min must not exceed --suspect-after")
        if not 0 < self.straggler_min_share <= 1:
            raise ValueError("--straggler-min-share must be in (0, 1]")
        if not 0 < self.stall_timeout_fraction <= 1:
            raise ValueError("--stall-timeout-fraction must be in (0, 1]")
        if self.request_timeout_s <= 0 or self.stacks_timeout_s <= 0:
            raise ValueError("request timeouts must be > 0")
        if min(self.max_answer_bytes, self.max_stacks_bytes, self.max_dump_bytes, self.max_snapshot_bytes) <= 0:
            raise ValueError("size caps must be > 0")
        if self.evidence_max_files < 1 or self.memory_captures < 1:
            raise ValueError("--evidence-max-files and --memory-captures must be >= 1")
        if self.operator_identity and not (self.namespace and self.pod):
            raise ValueError("--operator-identity needs the pod's namespace and name (--namespace/--pod, or "
                             "POD_NAMESPACE/POD_NAME from the downward API): tokens are accepted per pod")
        if self.token_file is not None and self.operator_identity:
            raise ValueError("--token-file (a shared secret) and --operator-identity (Kubernetes identity) "
                             "exclude each other")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("--tls-cert-file and --tls-key-file go together")
        if self.certificate_url and self.tls_cert_file is not None:
            raise ValueError("--certificate-url and --tls-cert-file exclude each other")
        if self.operator_ca is not None:
            try:
                base64.b64decode(self.operator_ca, validate=True).decode("ascii")
            except (ValueError, UnicodeDecodeError):
                raise ValueError("--operator-ca is not base64 of a PEM certificate") from None
        if self.metrics_detail not in METRICS_DETAILS:
            raise ValueError(f"--metrics-detail {self.metrics_detail!r}: not one of {', '.join(METRICS_DETAILS)}")
        if self.certificate_url and not self.operator_identity:
            raise ValueError("--certificate-url needs --operator-identity: the certificate is asked for with the "
                             "pod's own token")

    @property
    def tls(self) -> bool:
        return bool(self.certificate_url) or self.tls_cert_file is not None

    @property
    def auth_mode(self) -> str:
        """'kubernetes' (--operator-identity), 'token' (--token-file) or 'none'."""
        if self.operator_identity:
            return "kubernetes"
        return "token" if self.token_file is not None else "none"


def _env(name: str, fallback: str | None = None, *more: str) -> str | None:
    for key in (name, *more):
        value = os.environ.get(key)
        if value:
            return value
    return fallback


# (flag, dest, env, type, default, help). The default is the value when neither the flag nor the
# environment variable is given.
_OPTIONS: list[tuple[str, str, str, str, object, str]] = [
    ("--socket-dir", "socket_dir", "FRSCOPE_SOCKET_DIR", "path", DEFAULT_SOCKET_DIR,
     "directory of the ranks' worker-server sockets, rank-<RANK>.sock (and rank-<RANK>.debug-server where a rank "
     "runs torch's own debug server)"),
    ("--dump-dir", "dump_dir", "FRSCOPE_DUMP_DIR", "path", None,
     "directory torch writes on-timeout dumps into (TORCH_FR_DUMP_TEMP_FILE=<dir>/<prefix>); unset: not watched"),
    ("--evidence-dir", "evidence_dir", "FRSCOPE_EVIDENCE_DIR", "path", None,
     "where captures taken at a stall are kept on disk (bounded); default <socket-dir>/evidence; 'none': memory only"),
    ("--host", "host", "FRSCOPE_HOST", "str", "0.0.0.0", "address to listen on"),
    ("--port", "port", "FRSCOPE_PORT", "int", DEFAULT_PORT, "TCP port of the API and /metrics (0: any free port)"),
    ("--port-file", "port_file", "FRSCOPE_PORT_FILE", "path", None, "write the bound port here once listening"),
    ("--poll-interval", "poll_interval_s", "FRSCOPE_POLL_INTERVAL", "float", 2.0,
     "seconds between polls (a cheap progress probe of every rank; see --full-poll-every)"),
    ("--full-poll-every", "full_poll_every", "FRSCOPE_FULL_POLL_EVERY", "int", 15,
     "fetch every rank's full recorder every N polls; between, a cheap progress probe (full recorder "
     "at once when progress stops with a collective in flight); 1: full recorder at every poll"),
    ("--schedule-key", "schedule_key", "FRSCOPE_SCHEDULE_KEY", "str", "",
     "the job's identity (the webhook sets <namespace>/<job name>): every pod of the job polls on the same "
     "wall-clock slots, at a phase drawn from it, so the job's periodic full reads fall into one step; "
     "unset: the multiples of --poll-interval since the epoch"),
    ("--stall-after", "stall_after_s", "FRSCOPE_STALL_AFTER", "float", 60.0,
     "seconds a collective may be in flight with no progress before it is a stall (confirmed)"),
    ("--suspect-after", "suspect_after_s", "FRSCOPE_SUSPECT_AFTER", "float", 15.0,
     "a collective in flight with no progress is suspected a stall after 3 x its group's usual wait, at the "
     "latest after this many seconds (never later than --stall-after); 0: no suspicions"),
    ("--suspect-min", "suspect_min_s", "FRSCOPE_SUSPECT_MIN", "float", 4.0,
     "never suspect a collective in flight with no progress sooner than this many seconds"),
    ("--straggler-min-share", "straggler_min_share", "FRSCOPE_STRAGGLER_MIN_SHARE", "float", MIN_SHARE,
     "a rank is a straggler when the others spend at least this share of the job's time waiting for it "
     "(and it is late far more often than chance): a rank f x as slow as the others costs (f - 1) / f, 1.2 x "
     "about 0.17"),
    ("--stall-timeout-fraction", "stall_timeout_fraction", "FRSCOPE_STALL_TIMEOUT_FRACTION", "float", 0.5,
     "--stall-after is capped at this fraction of the in-flight entry's timeout_ms"),
    ("--request-timeout", "request_timeout_s", "FRSCOPE_REQUEST_TIMEOUT", "float", 5.0,
     "seconds for one fr_trace_json / ping request"),
    ("--stacks-timeout", "stacks_timeout_s", "FRSCOPE_STACKS_TIMEOUT", "float", 10.0,
     "seconds for one dump_traceback request"),
    ("--max-answer-bytes", "max_answer_bytes", "FRSCOPE_MAX_ANSWER_BYTES", "size", 64 * MiB,
     "size cap of one worker-server answer"),
    ("--max-stacks-bytes", "max_stacks_bytes", "FRSCOPE_MAX_STACKS_BYTES", "size", 1 * MiB,
     "size cap of one rank's stacks (longer ones are cut)"),
    ("--max-dump-bytes", "max_dump_bytes", "FRSCOPE_MAX_DUMP_BYTES", "size", 256 * MiB,
     "size cap of one dump file"),
    ("--max-snapshot-bytes", "max_snapshot_bytes", "FRSCOPE_MAX_SNAPSHOT_BYTES", "size", 128 * MiB,
     "size cap of a /v1/snapshot body before compression; ranks past it are listed in errors"),
    ("--dump-settle", "dump_settle_s", "FRSCOPE_DUMP_SETTLE", "float", 2.0,
     "a dump file is parsed once its size and mtime have not changed for this long"),
    ("--dump-scan-interval", "dump_scan_interval_s", "FRSCOPE_DUMP_SCAN_INTERVAL", "float", 2.0,
     "seconds between scans of the dump dir"),
    ("--evidence-max-files", "evidence_max_files", "FRSCOPE_EVIDENCE_MAX_FILES", "int", 8,
     "captures kept on disk (oldest removed first)"),
    ("--evidence-max-bytes", "evidence_max_bytes", "FRSCOPE_EVIDENCE_MAX_BYTES", "size", 256 * MiB,
     "bytes of captures kept on disk"),
    ("--memory-captures", "memory_captures", "FRSCOPE_MEMORY_CAPTURES", "int", 2, "captures kept in memory"),
    ("--max-concurrency", "max_concurrency", "FRSCOPE_MAX_CONCURRENCY", "int", 8,
     "ranks polled at the same time"),
    ("--token-file", "token_file", "FRSCOPE_TOKEN_FILE", "path", None,
     "bearer token file (e.g. a mounted Secret); protects everything but /healthz and /readyz"),
    ("--operator-identity", "operator_identity", "FRSCOPE_OPERATOR_IDENTITY", "str", None,
     "accept only this service account's tokens (system:serviceaccount:NS:NAME) minted for this pod (audience "
     "frscope.io/sidecar/<namespace>/<pod>), checked offline against the cluster's issuer keys; push with the "
     "pod's own token"),
    ("--kube-token-dir", "kube_token_dir", "FRSCOPE_KUBE_TOKEN_DIR", "path", "/var/run/secrets/frscope",
     "with --operator-identity: the projected tokens (operator-token, api-token) and ca.crt"),
    ("--api-server", "api_server", "FRSCOPE_API_SERVER", "str", None,
     "with --operator-identity: where the issuer keys are read (default: $KUBERNETES_SERVICE_HOST)"),
    ("--operator-url", "operator_url", "FRSCOPE_OPERATOR_URL", "str", None,
     "push the snapshot to URL/v1/push on a stall, a new dump file and a trainer exit"),
    ("--certificate-url", "certificate_url", "FRSCOPE_CERTIFICATE_URL", "str", None,
     "serve HTTPS with a key made in memory and a certificate for this pod that the operator at URL issues "
     "(URL/v1/certificate, asked with the pod's own token; needs --operator-identity)"),
    ("--operator-ca", "operator_ca", "FRSCOPE_OPERATOR_CA", "str", None,
     "base64 of the PEM CA that the operator's HTTPS certificate must chain to, for https:// --operator-url and "
     "--certificate-url (default: the system's CAs)"),
    ("--tls-cert-file", "tls_cert_file", "FRSCOPE_TLS_CERT_FILE", "path", None,
     "serve HTTPS with this certificate (PEM chain; read again when it changes)"),
    ("--tls-key-file", "tls_key_file", "FRSCOPE_TLS_KEY_FILE", "path", None, "the key of --tls-cert-file"),
    ("--push-timeout", "push_timeout_s", "FRSCOPE_PUSH_TIMEOUT", "float", 10.0, "seconds for one push"),
    ("--push-attempts", "push_attempts", "FRSCOPE_PUSH_ATTEMPTS", "int", 5, "tries per push"),
    ("--push-backoff", "push_backoff_s", "FRSCOPE_PUSH_BACKOFF", "float", 1.0,
     "seconds before the second try; doubles each time"),
    ("--pod", "pod", "FRSCOPE_POD", "str", None, "pod name (default: $POD_NAME, else the host name)"),
    ("--namespace", "namespace", "FRSCOPE_NAMESPACE", "str", None, "namespace (default: $POD_NAMESPACE)"),
    ("--node", "node", "FRSCOPE_NODE", "str", None, "node name (default: $NODE_NAME)"),
    ("--metrics-detail", "metrics_detail", "FRSCOPE_METRICS_DETAIL", "str", DEFAULT_METRICS_DETAIL,
     "pod: the collective series aggregated over the pod (a bounded count per pod, whatever its ranks' process "
     "groups); rank-group: one series per rank and process group, with each group's sequence ids, thresholds "
     "and rhythm (docs/sidecar.md, 'Metrics: how many series')"),
    ("--install-bootstrap", "install_bootstrap", "FRSCOPE_INSTALL_BOOTSTRAP", "path", None,
     "copy the sitecustomize bootstrap into this directory before serving (a volume the trainer has on "
     "PYTHONPATH)"),
]

_METAVARS = {"path": "PATH", "str": "TEXT", "int": "N", "float": "SECONDS", "size": "BYTES"}
_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "path": Path, "str": str, "int": int, "float": float, "size": parse_size,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, dest, env, kind, default, text in _OPTIONS:
        shown = f"{default // MiB}M" if kind == "size" and isinstance(default, int) else str(default or "unset")
        parser.add_argument(
            flag,
            dest=dest,
            type=_CONVERTERS[kind],
            default=None,
            metavar=_METAVARS[kind],
            help=f"{text} [env {env}; default {shown}]",
        )
    logs.add_arguments(parser)


def config_from_args(args: argparse.Namespace) -> SidecarConfig:
    """Flags first, then FRSCOPE_* environment variables, then defaults. ValueError on a bad value."""
    values: dict[str, object] = {}
    for _flag, dest, env, kind, default, _text in _OPTIONS:
        value = getattr(args, dest, None)
        if value is None:
            raw = os.environ.get(env)
            if raw:
                try:
                    value = _CONVERTERS[kind](raw)
                except ValueError as exc:
                    raise ValueError(f"{env}={raw!r}: {exc}") from exc
        if value is None and default is not None:
            value = Path(str(default)) if kind == "path" else default
        values[dest] = value
    socket_dir = values["socket_dir"]
    assert isinstance(socket_dir, Path)
    evidence = values["evidence_dir"]
    if evidence is None:
        values["evidence_dir"] = socket_dir / "evidence"
    elif str(evidence).lower() in ("none", "off", "-"):
        values["evidence_dir"] = None
    values["pod"] = values["pod"] or _env("POD_NAME", None, "HOSTNAME") or socket.gethostname()
    values["namespace"] = values["namespace"] or _env("POD_NAMESPACE", "")
    values["node"] = values["node"] or _env("NODE_NAME", "")
    return SidecarConfig(**values)  # type: ignore[arg-type]
