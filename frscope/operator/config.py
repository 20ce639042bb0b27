"""`frscope operator` options: flags, with environment variables for what the Helm chart sets.

The chart (charts/frscope/templates/deployment.yaml) passes `--namespace`, `--http-port`,
`--webhook-port`, `--webhook-cert-dir` (tls.crt, tls.key, ca.crt), `--peering`, `--log-level`,
`--sidecar-auth`, `--sidecar-token-file`, `--ui-auth` as flags, and the sidecar injection settings
as FRSCOPE_* environment variables (listed in docs/operator.md).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from frscope.analysis.context import DEFAULT_CLOCK_SKEW_MS, DEFAULT_STALL_AFTER_S
from frscope.operator import names
from frscope.operator.actions import ActionOptions, CordonOptions, Policy, parse_allowed, parse_policy
from frscope.operator.evidence import DEFAULT_MAX_ENTRIES
from frscope.operator.gather import GatherOptions
from frscope.operator.webhook import InjectionConfig


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    port: int = 9443
    host: str = "0.0.0.0"
    cert_dir: Path | None = None  # tls.crt, tls.key (and ca.crt, only used for a managed configuration)
    # Create/patch a MutatingWebhookConfiguration of this name (kopf-managed); None: the chart owns it.
    managed: str | None = None
    # Hostname the API server uses to reach the webhook, for a managed configuration.
    public_host: str | None = None
    # 'auto' (from the server version), 'native' or 'container'.
    sidecar_mode: str = "auto"
    injection: InjectionConfig = field(default_factory=InjectionConfig)


SIDECAR_AUTH_MODES = ("kubernetes", "token", "none")
UI_AUTH_MODES = ("kubernetes", "port-forward", "none")


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    http_host: str = "0.0.0.0"
    http_port: int = 8080
    # Bounded-rate status polling of every watched pod's sidecar.
    poll_interval_s: float = 15.0
    poll_timeout_s: float = 5.0
    poll_max_rps: float = 200.0
    poll_concurrency: int = 64
    gather: GatherOptions = field(default_factory=GatherOptions)
    stall_after_s: float = DEFAULT_STALL_AFTER_S
    clock_skew_ms: float = DEFAULT_CLOCK_SKEW_MS
    # After a gather that found nothing to report, the same job attempt is not gathered again for this long.
    cooldown_s: float = 30.0
    decode_processes: int = 0  # the CLI's default is 2
    # How the sidecars and the operator prove who they are (docs/operator.md, "Authentication"):
    # 'kubernetes' (service-account tokens, audience-bound), 'token' (one shared secret), 'none'.
    sidecar_auth: str = "kubernetes"
    # The token shown to the sidecars: the projected token (audience frscope.io/sidecar) with
    # 'kubernetes', the shared secret with 'token'. Re-read whenever the file changes.
    sidecar_token_file: Path | None = None
    # Who may use the web UI: 'kubernetes' (a bearer token, TokenReview + SubjectAccessReview `get
    # pytorchjobs` in the job's namespace), 'port-forward' (that, or a loopback connection, which in a
    # pod only `kubectl port-forward` can make), 'none'.
    ui_auth: str = "port-forward"
    max_push_bytes: int = 256 * 1024 * 1024
    report_limit_bytes: int = 512 * 1024
    peering: str | None = None  # kopf peering name; None: standalone (one replica)
    webhook: WebhookConfig | None = None
    # Acting on a diagnosis (docs/actions.md): what is allowed, the default policy, limits.
    actions: ActionOptions = field(default_factory=ActionOptions)
    # The watchdog timeout assumed when neither the recorder nor the pods' env states it (None: torch's).
    default_watchdog_timeout_s: float | None = None
    instance: str = field(default_factory=socket.gethostname)
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if self.poll_interval_s <= 0 or self.poll_timeout_s <= 0 or self.poll_max_rps <= 0:
            raise ValueError("poll interval, timeout and rate must be > 0")
        if self.cooldown_s < 0 or self.stall_after_s < 0:
            raise ValueError("--cooldown and --stall-after must be >= 0")
        if self.sidecar_auth not in SIDECAR_AUTH_MODES:
            raise ValueError(f"--sidecar-auth must be one of {', '.join(SIDECAR_AUTH_MODES)}")
        if self.ui_auth not in UI_AUTH_MODES:
            raise ValueError(f"--ui-auth must be one of {', '.join(UI_AUTH_MODES)}")
        if self.sidecar_auth == "token" and self.sidecar_token_file is None:
            raise ValueError("--sidecar-auth token needs --sidecar-token-file (the shared secret)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", action="append", default=[], dest="namespaces",
                        help="watch this namespace (repeat for more; default: every namespace)")
    parser.add_argument("--http-host", default="0.0.0.0", help="address of /healthz, /readyz, /metrics, /v1/push")
    parser.add_argument("--http-port", type=int, default=8080)
    parser.add_argument("--poll-interval", type=float, default=15.0, help="seconds between sidecar status sweeps")
    parser.add_argument("--poll-timeout", type=float, default=5.0, help="seconds for one /v1/status request")
    parser.add_argument("--poll-max-rps", type=float, default=200.0, help="status requests per second, at most")
    parser.add_argument("--poll-concurrency", type=int, default=64, help="status requests in flight, at most")
    parser.add_argument("--gather-timeout", type=float, default=120.0, help="seconds for a whole gather (all pods)")
    parser.add_argument("--gather-pod-timeout", type=float, default=30.0, help="seconds for one pod's snapshot")
    parser.add_argument("--decode-processes", type=int, default=2,
                        help="worker processes that decode snapshots in parallel (0: threads in the operator)")
    parser.add_argument("--gather-attempts", type=int, default=3, help="tries per pod")
    parser.add_argument("--gather-concurrency", type=int, default=32,
                        help="snapshots fetched (and held until decoded) at once")
    parser.add_argument("--max-entries-per-rank", type=int, default=DEFAULT_MAX_ENTRIES,
                        help="newest recorder entries kept per rank (bounds memory at 1,000s of ranks; 0: all)")
    parser.add_argument("--stall-after", type=float, default=DEFAULT_STALL_AFTER_S,
                        help="analysis: seconds in flight before a collective counts as stuck")
    parser.add_argument("--cooldown", type=float, default=30.0,
                        help="seconds before a job attempt with nothing to report is gathered again")
    parser.add_argument("--sidecar-auth", choices=SIDECAR_AUTH_MODES, default="kubernetes",
                        help="pushes: the pod's service-account token, reviewed by the API server (kubernetes), "
                             "the shared secret of --sidecar-token-file (token), or nothing (none)")
    parser.add_argument("--sidecar-token-file", type=Path,
                        help="bearer token shown to the sidecars: the projected token (audience "
                             f"{names.AUDIENCE_SIDECAR}) or the shared secret; re-read when it changes")
    parser.add_argument("--ui-auth", choices=UI_AUTH_MODES, default="port-forward",
                        help="web UI: a bearer token with `get pytorchjobs` in the job's namespace (kubernetes), "
                             "that or kubectl port-forward (port-forward), or nothing (none)")
    parser.add_argument("--report-limit", type=int, default=512 * 1024, help="bytes per FlightRecorderReport")
    parser.add_argument("--peering", help="kopf peering name (several replicas, one active); default standalone")
    parser.add_argument("--webhook-port", type=int, help="serve the sidecar-injection webhook on this port")
    parser.add_argument("--webhook-host", default="0.0.0.0", help="address the webhook listens on")
    parser.add_argument("--webhook-cert-dir", type=Path, help="tls.crt, tls.key (and ca.crt) of the webhook")
    parser.add_argument("--webhook-managed", help="create/patch a MutatingWebhookConfiguration of this name")
    parser.add_argument("--webhook-public-host", help="host name the API server uses (managed configuration)")
    parser.add_argument("--sidecar-mode", choices=("auto", "native", "container"), default="auto",
                        help="native sidecar (init container, restartPolicy Always) or a plain container")
    parser.add_argument("--allow-actions", default="",
                        help="what the operator may do on a diagnosis: any of restart,stop,cordon (default: none; "
                             "anything else a job asks for is a dry run)")
    parser.add_argument("--default-policy", default="none", choices=[p.value for p in Policy],
                        help=f"policy of jobs whose {names.ANN_ON_DIAGNOSIS} annotation (and namespace's) is unset")
    parser.add_argument("--action-rate", type=int, default=3,
                        help="actions (restart, stop, cordon) per namespace in any hour, at most")
    parser.add_argument("--cordon-min-jobs", type=int, default=2,
                        help="cordon a node only when this many jobs' reports blame it within --cordon-window")
    parser.add_argument("--cordon-window", type=float, default=3600.0, help="seconds (see --cordon-min-jobs)")
    parser.add_argument("--cordon-max-nodes", type=int, default=1,
                        help="nodes carrying frscope's taint at once, at most (cluster-wide)")
    parser.add_argument("--default-watchdog-timeout", type=float,
                        help="seconds, for the GPU time saved when the recorder and the pods' env say nothing "
                             "(default: torch's, 600 for NCCL, 1800 otherwise)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def _env_float(env: Mapping[str, str], key: str) -> float | None:
    value = env.get(key)
    return float(value) if value else None


def injection_from_env(env: Mapping[str, str]) -> InjectionConfig:
    label = env.get("FRSCOPE_INJECT_LABEL") or f"{names.INJECT_KEY}=true"
    key, _, value = label.partition("=")
    resources_text = env.get("FRSCOPE_SIDECAR_RESOURCES")
    resources = json.loads(resources_text) if resources_text else {}
    return InjectionConfig(
        image=env.get("FRSCOPE_SIDECAR_IMAGE") or "frscope:latest",
        image_pull_policy=env.get("FRSCOPE_SIDECAR_IMAGE_PULL_POLICY") or "IfNotPresent",
        port=int(env.get("FRSCOPE_SIDECAR_PORT") or 9402),
        buffer_size=int(env.get("FRSCOPE_RECORDER_BUFFER_SIZE") or 2000),
        poll_interval_s=_env_float(env, "FRSCOPE_SIDECAR_POLL_INTERVAL"),
        stall_after_s=_env_float(env, "FRSCOPE_SIDECAR_STALL_AFTER"),
        operator_url=env.get("FRSCOPE_SIDECAR_OPERATOR_URL") or None,
        resources=resources if isinstance(resources, dict) else {},
        inject_label=(key.strip() or names.INJECT_KEY, value.strip() or "true"),
        operator_identity=env.get("FRSCOPE_OPERATOR_IDENTITY") or None,
        token_expiration_s=int(env.get("FRSCOPE_TOKEN_EXPIRATION_SECONDS") or 3600),
    )


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> OperatorConfig:
    env = os.environ if env is None else env
    webhook = None
    if args.webhook_port:
        webhook = WebhookConfig(
            port=args.webhook_port, host=args.webhook_host, cert_dir=args.webhook_cert_dir,
            managed=args.webhook_managed, public_host=args.webhook_public_host,
            sidecar_mode=args.sidecar_mode, injection=injection_from_env(env),
        )
    return OperatorConfig(
        namespaces=tuple(args.namespaces),
        http_host=args.http_host,
        http_port=args.http_port,
        poll_interval_s=args.poll_interval,
        poll_timeout_s=args.poll_timeout,
        poll_max_rps=args.poll_max_rps,
        poll_concurrency=args.poll_concurrency,
        gather=GatherOptions(per_pod_timeout_s=args.gather_pod_timeout, overall_timeout_s=args.gather_timeout,
                             attempts=args.gather_attempts, concurrency=args.gather_concurrency,
                             max_entries=args.max_entries_per_rank),
        stall_after_s=args.stall_after,
        cooldown_s=args.cooldown,
        decode_processes=args.decode_processes,
        sidecar_auth=args.sidecar_auth,
        sidecar_token_file=args.sidecar_token_file,
        ui_auth=args.ui_auth,
        report_limit_bytes=args.report_limit,
        peering=args.peering,
        webhook=webhook,
        actions=ActionOptions(
            allowed=parse_allowed(args.allow_actions), default_policy=parse_policy(args.default_policy) or Policy.NONE,
            rate_per_hour=args.action_rate, namespaces=tuple(args.namespaces),
            cordon=CordonOptions(min_jobs=args.cordon_min_jobs, window_s=args.cordon_window,
                                 max_nodes=args.cordon_max_nodes)),
        default_watchdog_timeout_s=args.default_watchdog_timeout,
        instance=env.get("POD_NAME") or socket.gethostname(),
        log_level=args.log_level,
    )
