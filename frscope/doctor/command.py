"""`frscope doctor`: the CLI's entry. Runs every check against the current kubeconfig, prints a line
per check, exits 0 (all pass), 1 (some fail) or 2 (the cluster cannot be reached)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from frscope.doctor import cluster_checks, job_checks, operator_reach, ranks_served, sidecar_tls
from frscope.doctor.kubeconfig import KubeconfigError, load
from frscope.doctor.result import EXIT_UNREACHABLE, CheckResult, exit_code, failed, render_line
from frscope.operator.kube.api_client import KubeClient
from frscope.operator.kube.api_errors import Forbidden, KubeError, TransportError, Unauthorized
from frscope.operator.kube.backoff import Backoff

DESCRIPTION = ("Check frscope's installation on the cluster of the current kubeconfig context (exec plugins, auth "
               "providers and merged KUBECONFIG lists as kubectl takes them). Exit codes: 0 every check passed, 1 "
               "some check failed, 2 the cluster cannot be reached or refuses the credentials.")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="check the cluster's frscope setup: operator, webhook, CRD, opt-in, pods",
                       description=DESCRIPTION)
    p.add_argument("--kubeconfig", type=Path, default=None,
                   help="a kubeconfig file or a ':'-separated list, merged as kubectl does (default: $KUBECONFIG, "
                   "else ~/.kube/config; in a pod with neither, its service account)")
    p.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    p.add_argument("--namespace", "-n", default=None, help="a training namespace to check opt-in and pods of")
    p.add_argument("--job", default=None, help="a PyTorchJob or TrainJob in --namespace to check")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per API request")
    p.set_defaults(func=run)


Check = Callable[[KubeClient], Awaitable[CheckResult]]


def _checks(namespace: str | None, job: str | None) -> list[tuple[str, Check]]:
    checks: list[tuple[str, Check]] = [
        ("kubernetes-version", cluster_checks.kubernetes_version),
        ("operator", cluster_checks.operator_available),
        ("webhook", cluster_checks.webhook_service),
        ("webhook-ca", cluster_checks.webhook_ca_bundle),
        ("crd", cluster_checks.own_crds),
        ("network-policy", cluster_checks.network_policies),
        ("sidecar-tls", sidecar_tls.sidecar_tls),
    ]
    if namespace:
        checks += [
            ("opt-in", lambda c: job_checks.opted_in(c, namespace, job)),
            ("injected", lambda c: job_checks.pods_injected(c, namespace, job)),
            ("sidecars", lambda c: job_checks.sidecars_ready(c, namespace, job)),
            ("ranks-served", lambda c: ranks_served.ranks_served(c, namespace, job)),
            ("operator-reach", lambda c: operator_reach.operator_reaches_sidecars(c, namespace, job)),
        ]
    return checks


async def _run(args: argparse.Namespace) -> int:
    access = load(args.kubeconfig, args.context)
    for warning in access.warnings:
        print(f"frscope doctor: warning: {warning}", file=sys.stderr)
    connector = aiohttp.TCPConnector(ssl=access.ssl_context)
    async with aiohttp.ClientSession(connector=connector, proxy=access.proxy) as session:
        client = KubeClient(session, access.server, backoff=Backoff(attempts=1), timeout_s=args.timeout,
                            field_manager="frscope-doctor", auth=access.auth)
        try:
            await client.server_version()
        except TransportError as e:
            print(f"frscope doctor: cannot reach the API server {access.server} (context {access.context}): {e}",
                  file=sys.stderr)
            return EXIT_UNREACHABLE
        except (Unauthorized, Forbidden) as e:
            print(f"frscope doctor: the API server {access.server} refused the credentials of context "
                  f"{access.context}: {e}", file=sys.stderr)
            return EXIT_UNREACHABLE
        results = []
        for name, check in _checks(args.namespace, args.job):
            try:
                result = await check(client)
            except KubeError as e:
                result = failed(name, f"the API server refused or failed: {e}",
                                "check your permissions (kubectl auth can-i)")
            results.append(result)
            print(render_line(result), flush=True)
    code = exit_code(results)
    print("frscope doctor: all checks passed" if code == 0 else
          f"frscope doctor: {sum(r.failed for r in results)} of {len(results)} checks failed")
    return code


def run(args: argparse.Namespace) -> int:
    if args.job and not args.namespace:
        print("frscope doctor: --job needs --namespace", file=sys.stderr)
        return EXIT_UNREACHABLE
    try:
        return asyncio.run(_run(args))
    except KubeconfigError as e:
        print(f"frscope doctor: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
