"""Is TLS to the sidecars set up (sidecar.tls; docs/install.md, "TLS to the sidecars")? The operator's
`--sidecar-ca-dir` volume names the CA's Secret; the CA must be one the operator can issue with."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from frscope.doctor import certs
from frscope.doctor.resources import DEPLOYMENTS, OPERATOR_SELECTOR, SECRETS
from frscope.doctor.result import CheckResult, failed, passed, skipped
from frscope.operator.kube.api_client import KubeClient
from frscope.operator.kube.api_errors import NotFound

CA_FLAG = "--sidecar-ca-dir="


def ca_secret(deployment: dict[str, Any]) -> str | None:
    """The Secret mounted where the operator's `--sidecar-ca-dir` points; None without TLS."""
    spec = deployment["spec"]["template"]["spec"]
    for container in spec.get("containers") or []:
        ca_dir = next((a[len(CA_FLAG):] for a in container.get("args") or [] if a.startswith(CA_FLAG)), None)
        if ca_dir is None:
            continue
        volume = next((m.get("name") for m in container.get("volumeMounts") or []
                       if m.get("mountPath", "").rstrip("/") == ca_dir.rstrip("/")), None)
        for v in spec.get("volumes") or []:
            if v.get("name") == volume and v.get("secret"):
                return str(v["secret"].get("secretName"))
        return ""
    return None


async def sidecar_tls(client: KubeClient) -> CheckResult:
    deployments = await client.list(DEPLOYMENTS, None, label_selector=OPERATOR_SELECTOR)
    found = [(d["metadata"]["namespace"], ca_secret(d)) for d in deployments]
    found = [(ns, name) for ns, name in found if name is not None]
    if not found:
        return skipped("sidecar-tls", "TLS to the sidecars is off (plain HTTP): sidecar.tls.enabled=false")
    namespace, name = found[0]
    if not name:
        return failed("sidecar-tls", f"the operator in {namespace} has --sidecar-ca-dir but no Secret mounted there",
                      "helm upgrade the release")
    try:
        data = (await client.get(SECRETS, namespace, name)).get("data") or {}
        problems = certs.sidecar_ca_problems(base64.b64decode(data.get("tls.crt", "")),
                                             base64.b64decode(data.get("tls.key", "")))
    except NotFound:
        return failed("sidecar-tls", f"no CA Secret {namespace}/{name}: the operator does not start",
                      "with sidecar.tls.certManager: kubectl -n " + f"{namespace} describe certificate; else helm "
                      "upgrade the release")
    except binascii.Error as e:
        problems = [f"unreadable base64 ({e})"]
    if problems:
        return failed("sidecar-tls", f"CA Secret {namespace}/{name}: " + "; ".join(problems),
                      "helm upgrade the release (or let cert-manager renew the Certificate), then restart the "
                      "operator; sidecars pick up certificates of the new CA within an hour")
    return passed("sidecar-tls", f"the operator issues the sidecars' certificates with CA {namespace}/{name}")
