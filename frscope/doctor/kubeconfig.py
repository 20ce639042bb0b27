"""The current kubeconfig -> where the API server is and how to authenticate (what kubectl would use).

Supported: `server`, `certificate-authority(-data)`, `insecure-skip-tls-verify`, `client-certificate(-data)`
+ `client-key(-data)`, `token`, `tokenFile`. Exec and auth-provider plugins are not run.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # kopf depends on PyYAML; its stubs are not installed


class KubeconfigError(Exception):
    """The kubeconfig is missing or names no usable cluster."""


@dataclass(frozen=True)
class ClusterAccess:
    server: str
    ssl_context: ssl.SSLContext | bool
    token: str | None
    context: str


def default_path() -> Path:
    first = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    return Path(first) if first else Path.home() / ".kube" / "config"


def _named(items: Any, name: str, what: str) -> dict[str, Any]:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(what), dict):
            found: dict[str, Any] = item[what]
            return found
    raise KubeconfigError(f"no {what} named {name!r}")


def _resolve(base: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _pem(entry: dict[str, Any], key: str, base: Path, scratch: Path) -> Path | None:
    if entry.get(f"{key}-data"):
        path = scratch / key
        path.write_bytes(base64.b64decode(entry[f"{key}-data"]))
        return path
    if entry.get(key):
        return _resolve(base, str(entry[key]))
    return None


def load(path: Path | None = None, context: str | None = None) -> ClusterAccess:
    path = path or default_path()
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as e:
        raise KubeconfigError(f"cannot read the kubeconfig {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise KubeconfigError(f"the kubeconfig {path} is not YAML: {e}") from e
    if not isinstance(config, dict):
        raise KubeconfigError(f"the kubeconfig {path} is empty")
    name = context or config.get("current-context")
    if not name:
        raise KubeconfigError(f"the kubeconfig {path} has no current-context")
    ctx = _named(config.get("contexts"), name, "context")
    cluster = _named(config.get("clusters"), ctx.get("cluster", ""), "cluster")
    user = _named(config.get("users"), ctx.get("user", ""), "user") if ctx.get("user") else {}
    base = path.parent
    with tempfile.TemporaryDirectory(prefix="frscope-doctor-") as tmp:
        scratch = Path(tmp)
        ssl_context: ssl.SSLContext | bool
        if cluster.get("insecure-skip-tls-verify"):
            ssl_context = False
        else:
            ca = _pem(cluster, "certificate-authority", base, scratch)
            ssl_context = ssl.create_default_context(cafile=str(ca) if ca else None)
            cert = _pem(user, "client-certificate", base, scratch)
            key = _pem(user, "client-key", base, scratch)
            if cert and key:
                ssl_context.load_cert_chain(str(cert), str(key))
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = _resolve(base, str(user["tokenFile"])).read_text().strip()
    if user.get("exec") or user.get("auth-provider"):
        raise KubeconfigError(f"context {name!r} authenticates with a plugin (exec/auth-provider), which "
                              "frscope doctor does not run: use a token or client-certificate kubeconfig")
    if not cluster.get("server"):
        raise KubeconfigError(f"cluster of context {name!r} has no server")
    return ClusterAccess(str(cluster["server"]), ssl_context, token, name)
