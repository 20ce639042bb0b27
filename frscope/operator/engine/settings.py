"""The operator's settings: one frozen dataclass for the whole operator (`OperatorConfig`) and one for its
webhook; the defaults live here once. `frscope.operator.command` fills them from flags and FRSCOPE_*
environment variables."""

from __future__ import annotations

import socket
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from frscope import logs
from frscope.analysis.context import DEFAULT_CLOCK_SKEW_MS, DEFAULT_STALL_AFTER_S
from frscope.analysis.lateness import MIN_SHARE
from frscope.operator import names
from frscope.operator.actions import ActionOptions
from frscope.operator.evidence.gather import GatherOptions
from frscope.operator.injection import InjectionConfig
from frscope.operator.kube.lease import ElectionOptions
from frscope.operator.ledger import NodeLedgerOptions
from frscope.operator.model import jobkinds


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


@dataclass(frozen=True, slots=True)
class LeaderElection:
    """`--leader-election-lease` and its timing: the coordination.k8s.io Lease that elects the active replica."""

    lease: str
    namespace: str
    identity: str  # this process, unique (a restarted container is a new candidate)
    pod: str | None = None  # this replica's pod, whose frscope.io/operator-role label routes the Service
    duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        self.options  # noqa: B018 -- checks the names and the timing (ValueError)

    @property
    def options(self) -> ElectionOptions:
        return ElectionOptions(self.lease, self.namespace, self.identity, self.duration_s, self.renew_deadline_s,
                               self.retry_period_s)


SIDECAR_AUTH_MODES = ("kubernetes", "token", "none")
UI_AUTH_MODES = ("kubernetes", "port-forward", "none")


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    # The job kinds watched (jobkinds.ALL: PyTorchJob, TrainJob, JobSet); the chart's RBAC follows them.
    job_kinds: tuple[jobkinds.JobKind, ...] = jobkinds.ALL
    # The opt-in label (FRSCOPE_INJECT_LABEL, the chart's webhook.injectLabel): every pod frscope serves
    # carries it (the webhook puts it on pods of opted-in namespaces too), so it is also the server-side
    # selector of the operator's pod watch, whatever the job kinds.
    inject_label: tuple[str, str] = (names.INJECT_KEY, "true")
    http_host: str = "0.0.0.0"
    http_port: int = 8080
    # TLS to the sidecars: the same server over HTTPS on this port too, with a certificate of the sidecar CA
    # for `https_name` (default: the host of the injection's certificate URL): where the sidecars push and
    # ask for their certificates, so their tokens never cross the pod network readable. None: no HTTPS.
    https_port: int | None = None
    https_name: str | None = None
    # Bounded-rate status polling of every watched pod's sidecar.
    poll_interval_s: float = 15.0
    poll_timeout_s: float = 5.0
    poll_max_rps: float = 200.0
    poll_concurrency: int = 64
    gather: GatherOptions = field(default_factory=GatherOptions)
    # Analysis: a collective in flight at least this long (at the capture) counts as stuck.
    stuck_after_s: float = DEFAULT_STALL_AFTER_S
    clock_skew_ms: float = DEFAULT_CLOCK_SKEW_MS
    # Stragglers across pods (engine/pod_stragglers): the least share of the job's time the other pods
    # spend waiting for one.
    straggler_min_share: float = MIN_SHARE
    # After a gather that found nothing to report, the same job attempt is not gathered again for this long.
    cooldown_s: float = 30.0
    # A gather that finds a pod's sidecar pushed at its trainer's exit (or, during a crash, a pod that
    # delivered no live rank) waits at most this long for the kubelet to report that container's end
    # (its exit code and message), so that a crash is diagnosed with every pod's exit rather than the
    # first one's. Under torchrun a container ends when its agent does, and the agent gives its
    # surviving workers 30 s after SIGTERM before it kills them: 45 s covers that and the kubelet's
    # report.
    exit_settle_s: float = 45.0
    # Worker processes that decode snapshot bodies (0: threads in the operator's process).
    decode_processes: int = 2
    # How the sidecars and the operator prove who they are (docs/operator.md, "Authentication"):
    # 'kubernetes' (service-account tokens, audience-bound), 'token' (one shared secret), 'none'.
    sidecar_auth: str = "kubernetes"
    # The shared secret of 'token' (shown to the sidecars and expected on pushes; re-read whenever the file
    # changes). Only with 'token': with 'kubernetes' each sidecar is shown a token minted for its pod
    # (`operator_identity`), never a file's.
    sidecar_token_file: Path | None = None
    # TLS to the sidecars (docs/install.md, "TLS to the sidecars"): the CA (tls.crt, tls.key) that issues
    # each sidecar's certificate at /v1/certificate; the operator then reads sidecars over HTTPS only.
    # Needs 'kubernetes' (the pod a certificate names comes from its pod-bound token). None: plain HTTP.
    sidecar_ca_dir: Path | None = None
    # The sidecars' NetworkPolicy as the chart renders it (JSON: `policy` and its `owner`), written by the
    # operator into every namespace where an opted-in pod appears (serve.sidecar_policy); None: not by the
    # operator (the chart wrote it into the namespaces it knows, or policies are off).
    sidecar_network_policy: str | None = None
    # system:serviceaccount:NS:NAME the operator runs as (FRSCOPE_OPERATOR_IDENTITY, set by the chart with
    # 'kubernetes'): it mints per-pod tokens of this account for the sidecars (kube.pod_tokens).
    operator_identity: str | None = None
    # Who may use the web UI: 'kubernetes' (a bearer token, TokenReview + SubjectAccessReview `get
    # pytorchjobs` in the job's namespace), 'port-forward' (that, or a loopback connection, which in a
    # pod only `kubectl port-forward` can make), 'none'.
    ui_auth: str = "port-forward"
    # Who may read /metrics (it names every watched namespace's jobs and diagnoses): the same modes, with
    # `get` on the non-resource URL /metrics for a token (the controller-runtime way).
    metrics_auth: str = "port-forward"
    max_push_bytes: int = 256 * 1024 * 1024
    # Where accepted pushes are also kept, so that a restart does not lose them (the chart mounts a
    # volume there); None: in memory only.
    evidence_dir: Path | None = None
    report_limit_bytes: int = 512 * 1024
    # The web UI's live window of a job someone looks at (docs/timeline.md, "Live window"): the newest
    # entries per rank asked of its sidecars every `live_interval_s`; 0 entries: no live window.
    live_entries: int = 256
    live_interval_s: float = 1.0
    live_ranks_per_pod: int = 64  # ranks kept of one pod's answer in a live window
    # Several replicas, one active (serve.leadership): the Lease and timing; None: this one runs alone.
    leader_election: LeaderElection | None = None
    webhook: WebhookConfig | None = None
    # Acting on a diagnosis (docs/actions.md): what is allowed, the default policy, limits.
    actions: ActionOptions = field(default_factory=ActionOptions)
    # The node ledger (docs/actions.md, "The node ledger"); None: off (--node-ledger off).
    node_ledger: NodeLedgerOptions | None = field(default_factory=NodeLedgerOptions)
    # The watchdog timeout assumed when neither the recorder nor the pods' env states it (None: torch's).
    default_watchdog_timeout_s: float | None = None
    instance: str = field(default_factory=socket.gethostname)
    log_level: str = logs.DEFAULT_LEVEL
    log_format: str = logs.DEFAULT_FORMAT

    def __post_init__(self) -> None:
        if self.poll_interval_s <= 0 or self.poll_timeout_s <= 0 or self.poll_max_rps <= 0:
            raise ValueError("poll interval, timeout and rate must be > 0")
        if self.cooldown_s < 0 or self.stuck_after_s < 0 or self.exit_settle_s < 0:
            raise ValueError("--cooldown, --stuck-after and --exit-settle must be >= 0")
        if not 0 < self.straggler_min_share <= 1:
            raise ValueError("--straggler-min-share must be in (0, 1]")
        if self.sidecar_auth not in SIDECAR_AUTH_MODES:
            raise ValueError(f"--sidecar-auth must be one of {', '.join(SIDECAR_AUTH_MODES)}")
        if self.live_ranks_per_pod < 1:
            raise ValueError("--live-ranks-per-pod must be >= 1")
        if self.ui_auth not in UI_AUTH_MODES:
            raise ValueError(f"--ui-auth must be one of {', '.join(UI_AUTH_MODES)}")
        if self.metrics_auth not in UI_AUTH_MODES:
            raise ValueError(f"--metrics-auth must be one of {', '.join(UI_AUTH_MODES)}")
        if self.sidecar_auth == "token" and self.sidecar_token_file is None:
            raise ValueError("--sidecar-auth token needs --sidecar-token-file (the shared secret)")
        if self.sidecar_auth != "token" and self.sidecar_token_file is not None:
            raise ValueError(f"--sidecar-token-file is the shared secret of --sidecar-auth token; with "
                             f"{self.sidecar_auth} no such token is shown (kubernetes: one minted per pod)")
        if self.https_port is not None and (self.sidecar_ca_dir is None or not self.operator_https_name):
            raise ValueError("--https-port needs --sidecar-ca-dir and a name for its certificate (--https-name, or "
                             "the host of FRSCOPE_SIDECAR_CERTIFICATE_URL)")
        if self.sidecar_ca_dir is not None and self.sidecar_auth != "kubernetes":
            raise ValueError("--sidecar-ca-dir needs --sidecar-auth kubernetes: a certificate names the pod its "
                             "pod-bound token proves")
        if (self.sidecar_ca_dir is not None and self.webhook is not None
                and not self.webhook.injection.certificate_url):
            raise ValueError("--sidecar-ca-dir with the webhook needs FRSCOPE_SIDECAR_CERTIFICATE_URL (where the "
                             "injected sidecars ask for their certificate)")

    @property
    def operator_https_name(self) -> str | None:
        """The name in the operator's HTTPS certificate: `https_name`, else the certificate URL's host."""
        if self.https_name:
            return self.https_name
        url = self.webhook.injection.certificate_url if self.webhook is not None else None
        return urllib.parse.urlsplit(url).hostname if url else None
