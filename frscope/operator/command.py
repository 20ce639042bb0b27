"""`frscope operator`: the CLI's entry into this package (frscope/cli.py calls `add_parser`), and its
options: flags, with environment variables for what the Helm chart sets.

Every flag also reads an environment variable, FRSCOPE_<FLAG> (a flag wins); `--help` lists them
with their defaults, which are the dataclasses' of `engine.settings`. The chart (charts/frscope/templates/
deployment.yaml) passes `--namespace`, `--http-port`, `--webhook-port`, `--webhook-cert-dir`,
`--leader-election-lease` and the lease timing (with several replicas), `--log-level`, `--log-format`,
`--sidecar-auth`, `--sidecar-ca-dir`, `--ui-auth`, `--metrics-auth` as flags, and the sidecar injection
settings as FRSCOPE_* environment variables (listed in docs/operator.md).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from frscope import logs
from frscope.analysis.suspicion import LedgerPolicy
from frscope.operator import names
from frscope.operator.actions import ActionOptions, CordonOptions, Policy, parse_allowed, parse_policy
from frscope.operator.engine.settings import (
    SIDECAR_AUTH_MODES,
    UI_AUTH_MODES,
    LeaderElection,
    OperatorConfig,
    WebhookConfig,
)
from frscope.operator.evidence.gather import GatherOptions
from frscope.operator.injection import InjectionConfig
from frscope.operator.ledger import FencingOptions, NodeLedgerOptions, SignalOptions
from frscope.operator.ledger.fencing import MODES as FENCING_MODES
from frscope.operator.model import jobkinds


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser: argparse.ArgumentParser = sub.add_parser(
        "operator",
        help="watch PyTorchJobs, diagnose hangs from the sidecars, write the diagnosis into the job (kopf)",
        description="See docs/operator.md. Credentials: the pod's service account, else $KUBECONFIG.",
    )
    add_arguments(parser)
    parser.set_defaults(func=cmd_operator)
    return parser


def cmd_operator(args: argparse.Namespace) -> int:
    import kopf
    import prometheus_client

    from frscope.operator.runner import run_operator

    # No `<counter>_created` series: one more per labelled child that no rule or panel reads (Prometheus keeps
    # the start time itself), a quarter of a large job's series.
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    try:
        config = from_args(args)
    except ValueError as exc:
        print(f"frscope operator: {exc}", file=sys.stderr)
        return 2
    try:
        return run_operator(config)
    except (kopf.LoginError, ValueError, OSError) as exc:
        print(f"frscope operator: {exc}", file=sys.stderr)
        return 1


_DEFAULTS = OperatorConfig(instance="-")
_GATHER = GatherOptions()
_WEBHOOK = WebhookConfig()
_ACTIONS = ActionOptions()
_LEDGER = NodeLedgerOptions()
_ELECTION = LeaderElection(lease="-", namespace="-", identity="-")


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    """Every flag with its FRSCOPE_* variable (a flag wins) and its default, which is the config
    dataclasses' (declared there once)."""
    env = os.environ if env is None else env

    def add(flag: str, default: object, text: str, kind: Callable[[str], Any] = str, **more: Any) -> None:
        var = "FRSCOPE_" + flag.lstrip("-").upper().replace("-", "_")
        raw = env.get(var)
        value = default
        if raw:
            try:
                value = kind(raw)
            except ValueError as exc:
                parser.error(f"{var}={raw!r}: {exc}")
        shown = "unset" if default is None else default
        parser.add_argument(flag, type=kind, default=value, help=f"{text} [env {var}; default {shown}]", **more)

    raw_namespaces = env.get("FRSCOPE_WATCH_NAMESPACES", "")
    parser.add_argument(
        "--namespace", action="append", dest="namespaces", metavar="NAMESPACE",
        default=[n.strip() for n in raw_namespaces.split(",") if n.strip()],
        help="watch this namespace (repeat for more) [env FRSCOPE_WATCH_NAMESPACES, comma-separated; "
             "default: every namespace]")
    raw_kinds = env.get("FRSCOPE_JOB_KINDS", "")
    parser.add_argument(
        "--job-kind", action="append", dest="job_kinds", metavar="KIND",
        default=[k.strip() for k in raw_kinds.split(",") if k.strip()],
        help=f"watch this job kind (repeat, or comma-separated: {', '.join(jobkinds.KEYS)}) "
             "[env FRSCOPE_JOB_KINDS, comma-separated; default: every kind]")
    add("--http-host", _DEFAULTS.http_host, "address of /healthz, /readyz, /metrics, /v1/push and the web UI")
    add("--http-port", _DEFAULTS.http_port, "port of the same", int)
    add("--https-port", _DEFAULTS.https_port,
        "with --sidecar-ca-dir: the same over HTTPS on this port too (a certificate of the sidecar CA), where the "
        "sidecars push and ask for their certificates; unset: no HTTPS", int)
    add("--https-name", _DEFAULTS.https_name,
        "the name in that certificate (default: the host of FRSCOPE_SIDECAR_CERTIFICATE_URL)")
    add("--poll-interval", _DEFAULTS.poll_interval_s, "seconds between sweeps over every sidecar's /v1/status", float)
    add("--poll-timeout", _DEFAULTS.poll_timeout_s, "seconds for one /v1/status request", float)
    add("--poll-max-rps", _DEFAULTS.poll_max_rps, "status requests per second, at most", float)
    add("--poll-concurrency", _DEFAULTS.poll_concurrency, "status requests in flight, at most", int)
    add("--gather-timeout", _GATHER.overall_timeout_s,
        "seconds a gather (every pod of a job) goes on with no pod's answer arriving", float)
    add("--gather-limit", _GATHER.limit_s,
        "seconds a gather goes on at most, while answers still arrive (a job of 10,000s of pods)", float)
    add("--gather-pod-timeout", _GATHER.per_pod_timeout_s, "seconds for one pod's snapshot", float)
    add("--gather-attempts", _GATHER.attempts, "tries per pod", int)
    add("--gather-concurrency", _GATHER.concurrency, "snapshots fetched (and held until decoded) at once", int)
    add("--decode-processes", _DEFAULTS.decode_processes,
        "worker processes that decode snapshots in parallel (0: threads in the operator)", int)
    add("--max-entries-per-rank", _GATHER.max_entries,
        "newest recorder entries kept per rank (bounds memory at 1,000s of ranks; 0: all)", int)
    add("--stuck-after", _DEFAULTS.stuck_after_s,
        "analysis: a collective in flight at least this many seconds (at the capture) counts as stuck "
        "(the sidecar's --stall-after is another threshold: no progress for that long)", float)
    # The name this flag had until the two thresholds got a name each.
    parser.add_argument("--stall-after", dest="stuck_after", type=float, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
    add("--clock-skew-ms", _DEFAULTS.clock_skew_ms,
        "analysis: clock skew allowed between hosts before lateness counts", float)
    add("--straggler-min-share", _DEFAULTS.straggler_min_share,
        "stragglers across pods: a pod is one when the others spend at least this share of the job's time "
        "waiting for it (and it is late far more often than chance)", float)
    add("--cooldown", _DEFAULTS.cooldown_s,
        "seconds before a job attempt with nothing to report is gathered again", float)
    add("--exit-settle", _DEFAULTS.exit_settle_s,
        "seconds a gather waits for the kubelet to report the end of a trainer whose sidecar pushed its "
        "exit (or, during a crash, that delivered no live rank), so that the report has every pod's exit "
        "code and message; a pod whose trainer restarts meanwhile is not waited for", float)
    add("--sidecar-auth", _DEFAULTS.sidecar_auth,
        "pushes: the pod's service-account token, reviewed by the API server (kubernetes), the shared "
        "secret of --sidecar-token-file (token), or nothing (none)", choices=SIDECAR_AUTH_MODES)
    add("--sidecar-token-file", _DEFAULTS.sidecar_token_file,
        "with --sidecar-auth token: the shared secret, shown to the sidecars and expected on pushes; re-read "
        "when it changes", Path)
    add("--sidecar-ca-dir", _DEFAULTS.sidecar_ca_dir,
        "TLS to the sidecars: the CA (tls.crt, tls.key) with which the operator issues each sidecar's certificate "
        "(POST /v1/certificate, for the pod its token proves) and reads sidecars over HTTPS only, expecting each "
        "pod's own name; unset: plain HTTP", Path)
    add("--evidence-dir", _DEFAULTS.evidence_dir,
        "directory where accepted pushes are also kept, so that a restart keeps them; unset: in memory only", Path)
    add("--ui-auth", _DEFAULTS.ui_auth,
        "web UI: a bearer token with `get pytorchjobs` in the job's namespace (kubernetes), that or "
        "kubectl port-forward (port-forward), or nothing (none)", choices=UI_AUTH_MODES)
    add("--metrics-auth", _DEFAULTS.metrics_auth,
        "/metrics: a bearer token allowed `get` on the URL /metrics (kubernetes), that or kubectl port-forward "
        "(port-forward), or nothing (none)", choices=UI_AUTH_MODES)
    add("--report-limit", _DEFAULTS.report_limit_bytes, "bytes per FlightRecorderReport object", int)
    add("--live-entries", _DEFAULTS.live_entries,
        "web UI: newest collectives per rank in a watched job's live window (0: no live window)", int)
    add("--live-interval", _DEFAULTS.live_interval_s, "web UI: seconds between live window refreshes", float)
    add("--live-ranks-per-pod", _DEFAULTS.live_ranks_per_pod,
        "web UI: ranks of one pod's answer a live window keeps (a pod hosts a node's ranks)", int)
    add("--leader-election-lease", None,
        "several replicas, one active: the coordination.k8s.io Lease that elects it (in --leader-election-namespace); "
        "unset: this replica runs alone")
    add("--leader-election-namespace", None, "the Lease's namespace (default: $POD_NAMESPACE), where the replicas' "
        "pods are labelled frscope.io/operator-role=leader|standby")
    add("--lease-duration", _ELECTION.duration_s,
        "seconds after the leader's last renewal before a standby takes over", float)
    add("--lease-renew-deadline", _ELECTION.renew_deadline_s,
        "seconds the leader tries to renew before it stops (less than --lease-duration)", float)
    add("--lease-retry-period", _ELECTION.retry_period_s, "seconds between renewals, and between a standby's tries",
        float)
    add("--webhook-port", None, "serve the sidecar-injection webhook on this port; unset: no webhook", int)
    add("--webhook-host", _WEBHOOK.host, "address the webhook listens on")
    add("--webhook-cert-dir", _WEBHOOK.cert_dir, "directory with tls.crt, tls.key (and ca.crt) of the webhook", Path)
    add("--webhook-managed", _WEBHOOK.managed, "create/patch a MutatingWebhookConfiguration of this name")
    add("--webhook-public-host", _WEBHOOK.public_host, "host name the API server uses (managed configuration)")
    add("--sidecar-mode", _WEBHOOK.sidecar_mode,
        "native sidecar (init container, restartPolicy Always), a plain container, or auto (from the "
        "server version)", choices=("auto", "native", "container"))
    add("--allow-actions", "", "what the operator may do on a diagnosis: any of restart,stop,cordon (empty: "
        "nothing; anything else a job asks for is a dry run)")
    add("--default-policy", _ACTIONS.default_policy.value,
        f"policy of jobs whose {names.ANN_ON_DIAGNOSIS} annotation (and namespace's) is unset",
        choices=[p.value for p in Policy])
    add("--action-rate", _ACTIONS.rate_per_hour, "actions (restart, stop, cordon) per namespace in any hour, at most",
        int)
    add("--cordon-min-jobs", _ACTIONS.cordon.min_jobs,
        "cordon a node only when this many jobs' reports blame it within --cordon-window", int)
    add("--cordon-window", _ACTIONS.cordon.window_s, "seconds (see --cordon-min-jobs)", float)
    add("--cordon-max-nodes", _ACTIONS.cordon.max_nodes, "nodes carrying frscope's taint at once, at most", int)
    policy, fence = _LEDGER.policy, _LEDGER.fencing
    add("--node-ledger", "on", "the node ledger: FlightRecorderNode objects, node suspicion, fencing "
        "(docs/actions.md)", choices=("on", "off"))
    add("--node-ledger-half-life", policy.half_life_s, "seconds after which an incident's weight on a node halves",
        float)
    add("--node-suspect-score", policy.suspect_score, "a node is suspected from this score ...", float)
    add("--node-suspect-namespaces", policy.suspect_namespaces,
        "... with evidence from at least this many namespaces (tenants; one namespace's jobs count once)", int)
    add("--node-suspect-jobs", None, "deprecated name of --node-suspect-namespaces (counts namespaces)", int)
    add("--node-ledger-memory", policy.memory_s, "seconds after which an incident is forgotten", float)
    add("--node-ledger-refresh", _LEDGER.refresh_s, "seconds between two refreshes of the ledger's scores", float)
    add("--node-fencing", fence.mode, "what the ledger does with a node ready to fence (dry-run: says what it "
        "would do)", choices=FENCING_MODES)
    add("--node-fence-taint", "off", "also taint a fenced node frscope.io/suspect-node:NoSchedule",
        choices=("on", "off"))
    add("--node-fence-incidents", policy.fence_incidents,
        "fence a suspected node implicated in at least this many weighing incidents ...", int)
    add("--node-fence-namespaces", policy.fence_namespaces, "... of at least this many namespaces ...", int)
    add("--node-fence-jobs", None, "deprecated name of --node-fence-namespaces (counts namespaces)", int)
    add("--node-fence-namespace-share", fence.namespace_share,
        "share of --cordon-max-nodes that fences set off by one namespace's incidents may hold (at least 1 node)",
        float)
    add("--node-hardware-conditions", ",".join(_LEDGER.signals.hardware_conditions),
        "Node condition types that, True, are hardware evidence (node-problem-detector, a GPU health agent); "
        "*: any but the kubelet's own")
    add("--node-oom-window", _LEDGER.signals.oom_window_s,
        "seconds around an incident in which the kubelet's SystemOOM Event on its node is node-OOM evidence", float)
    add("--node-ledger-key-file", None, "file (>= 32 bytes) keying the seal on published reports that the "
        "ledger checks; unset: the sidecar CA's key, else random per process", Path)
    add("--node-fence-window", policy.fence_window_s, "... within this many seconds", float)
    add("--node-fence-keep-healthy", fence.keep_healthy,
        "never fence a node when fewer other healthy nodes of its pool would remain", int)
    add("--node-pool-labels", ",".join(fence.pool_labels), "node labels naming a node's pool, the first present wins")
    add("--default-watchdog-timeout", _DEFAULTS.default_watchdog_timeout_s,
        "seconds, for the GPU time saved when the recorder and the pods' env say nothing (unset: torch's, "
        "600 for NCCL, 1800 otherwise)", float)
    logs.add_arguments(parser, env)


def _env_float(env: Mapping[str, str], key: str) -> float | None:
    value = env.get(key)
    return float(value) if value else None


def inject_label_from_env(env: Mapping[str, str]) -> tuple[str, str]:
    """FRSCOPE_INJECT_LABEL `key=value` (default `frscope.io/inject=true`)."""
    key, _, value = (env.get("FRSCOPE_INJECT_LABEL") or "").partition("=")
    return key.strip() or names.INJECT_KEY, value.strip() or "true"


def injection_from_env(env: Mapping[str, str]) -> InjectionConfig:
    resources_text = env.get("FRSCOPE_SIDECAR_RESOURCES")
    resources = json.loads(resources_text) if resources_text else {}
    return InjectionConfig(
        image=env.get("FRSCOPE_SIDECAR_IMAGE") or "frscope:latest",
        image_pull_policy=env.get("FRSCOPE_SIDECAR_IMAGE_PULL_POLICY") or "IfNotPresent",
        port=int(env.get("FRSCOPE_SIDECAR_PORT") or 9402),
        buffer_size=int(env.get("FRSCOPE_RECORDER_BUFFER_SIZE") or 2000),
        poll_interval_s=_env_float(env, "FRSCOPE_SIDECAR_POLL_INTERVAL"),
        stall_after_s=_env_float(env, "FRSCOPE_SIDECAR_STALL_AFTER"),
        suspect_after_s=_env_float(env, "FRSCOPE_SIDECAR_SUSPECT_AFTER"),
        suspect_min_s=_env_float(env, "FRSCOPE_SIDECAR_SUSPECT_MIN"),
        straggler_min_share=_env_float(env, "FRSCOPE_SIDECAR_STRAGGLER_MIN_SHARE"),
        metrics_detail=(env.get("FRSCOPE_SIDECAR_METRICS_DETAIL") or "").strip() or None,
        operator_url=env.get("FRSCOPE_SIDECAR_OPERATOR_URL") or None,
        certificate_url=env.get("FRSCOPE_SIDECAR_CERTIFICATE_URL") or None,
        resources=resources if isinstance(resources, dict) else {},
        inject_label=inject_label_from_env(env),
        operator_identity=env.get("FRSCOPE_OPERATOR_IDENTITY") or None,
        token_expiration_s=int(env.get("FRSCOPE_TOKEN_EXPIRATION_SECONDS") or 3600),
        log_format=(env.get("FRSCOPE_SIDECAR_LOG_FORMAT") or "text").strip().lower(),
        run_as_user=int(env.get("FRSCOPE_SIDECAR_RUN_AS_USER") or 65532),
        run_as_group=int(env.get("FRSCOPE_SIDECAR_RUN_AS_GROUP") or 65532),
        nccl_timing=(env.get("FRSCOPE_NCCL_TIMING") or "true").strip().lower() not in ("0", "false", "no", "off"),
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
        job_kinds=jobkinds.parse_keys(args.job_kinds) if args.job_kinds else jobkinds.ALL,
        inject_label=inject_label_from_env(env),
        http_host=args.http_host,
        http_port=args.http_port,
        https_port=args.https_port,
        https_name=args.https_name,
        poll_interval_s=args.poll_interval,
        poll_timeout_s=args.poll_timeout,
        poll_max_rps=args.poll_max_rps,
        poll_concurrency=args.poll_concurrency,
        gather=GatherOptions(per_pod_timeout_s=args.gather_pod_timeout, overall_timeout_s=args.gather_timeout,
                             limit_s=args.gather_limit,
                             attempts=args.gather_attempts, concurrency=args.gather_concurrency,
                             max_entries=args.max_entries_per_rank),
        stuck_after_s=args.stuck_after,
        clock_skew_ms=args.clock_skew_ms,
        straggler_min_share=args.straggler_min_share,
        cooldown_s=args.cooldown,
        exit_settle_s=args.exit_settle,
        decode_processes=args.decode_processes,
        sidecar_auth=args.sidecar_auth,
        sidecar_token_file=args.sidecar_token_file,
        sidecar_ca_dir=args.sidecar_ca_dir,
        operator_identity=env.get("FRSCOPE_OPERATOR_IDENTITY") or None,
        sidecar_network_policy=env.get("FRSCOPE_SIDECAR_NETWORK_POLICY") or None,
        evidence_dir=args.evidence_dir,
        ui_auth=args.ui_auth,
        metrics_auth=args.metrics_auth,
        report_limit_bytes=args.report_limit,
        live_entries=args.live_entries,
        live_interval_s=args.live_interval,
        live_ranks_per_pod=args.live_ranks_per_pod,
        leader_election=_leader_election(args, env),
        webhook=webhook,
        actions=ActionOptions(
            allowed=parse_allowed(args.allow_actions), default_policy=parse_policy(args.default_policy) or Policy.NONE,
            rate_per_hour=args.action_rate, namespaces=tuple(args.namespaces),
            cordon=CordonOptions(min_jobs=args.cordon_min_jobs, window_s=args.cordon_window,
                                 max_nodes=args.cordon_max_nodes)),
        node_ledger=_node_ledger(args),
        default_watchdog_timeout_s=args.default_watchdog_timeout,
        instance=env.get("POD_NAME") or socket.gethostname(),
        log_level=args.log_level,
        log_format=args.log_format,
    )


def _leader_election(args: argparse.Namespace, env: Mapping[str, str]) -> LeaderElection | None:
    if not args.leader_election_lease:
        return None
    namespace = args.leader_election_namespace or env.get("POD_NAMESPACE")
    if not namespace:
        raise ValueError("--leader-election-lease needs --leader-election-namespace (or $POD_NAMESPACE)")
    pod = env.get("POD_NAME") or None
    # Unique per process: a container restarted in the leader's pod is a new candidate, not the old holder.
    identity = f"{pod or socket.gethostname()}_{secrets.token_hex(4)}"
    return LeaderElection(args.leader_election_lease, namespace, identity, pod, args.lease_duration,
                          args.lease_renew_deadline, args.lease_retry_period)


def _node_ledger(args: argparse.Namespace) -> NodeLedgerOptions | None:
    if args.node_ledger == "off":
        return None
    policy = LedgerPolicy(half_life_s=args.node_ledger_half_life, suspect_score=args.node_suspect_score,
                          suspect_namespaces=_either(args.node_suspect_jobs, args.node_suspect_namespaces),
                          fence_incidents=args.node_fence_incidents,
                          fence_namespaces=_either(args.node_fence_jobs, args.node_fence_namespaces),
                          fence_window_s=args.node_fence_window,
                          memory_s=args.node_ledger_memory)
    labels = tuple(label.strip() for label in args.node_pool_labels.split(",") if label.strip())
    fencing = FencingOptions(mode=args.node_fencing, taint=args.node_fence_taint == "on",
                             keep_healthy=args.node_fence_keep_healthy, pool_labels=labels,
                             namespace_share=args.node_fence_namespace_share)
    conditions = tuple(c.strip() for c in args.node_hardware_conditions.split(",") if c.strip())
    signals = SignalOptions(hardware_conditions=conditions or SignalOptions().hardware_conditions,
                            oom_window_s=args.node_oom_window)
    return NodeLedgerOptions(policy=policy, fencing=fencing, signals=signals, refresh_s=args.node_ledger_refresh,
                             key_file=args.node_ledger_key_file)


def _either(deprecated: int | None, current: int) -> int:
    """A deprecated flag's value where it was given (the chart's older templates pass it), else the new one's."""
    return deprecated if deprecated is not None else current
