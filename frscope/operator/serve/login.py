"""Where the operator's own API credentials come from, read again at every kopf login.

In a pod: the service account's projected token (`/var/run/secrets/kubernetes.io/serviceaccount`),
which the kubelet rotates. Elsewhere: $KUBECONFIG / ~/.kube/config, whose current user may name a
`tokenFile` (re-read the same way, as client-go does). kopf calls its login handler again when the
API server answers 401; returning the credentials read at start would make kopf give up ("ran out
of valid credentials") once a rotated token expires, so `login()` reads them again every time, and
`Login.auth()` gives the operator's own client a token source that follows the file.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
import yaml  # type: ignore[import-untyped]  # kopf depends on PyYAML; its stubs are not installed

from frscope.operator.kube import BearerAuth, StaticToken, TokenFile

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


@dataclass(frozen=True, slots=True)
class Login:
    info: kopf.ConnectionInfo
    token_file: Path | None  # where the token is re-read from; None: a fixed token or certificates

    def auth(self) -> BearerAuth:
        return TokenFile(self.token_file) if self.token_file is not None else StaticToken(self.info.token)


def _kubeconfig_token_file() -> Path | None:
    """The current user's `tokenFile` in the first kubeconfig that names a current context."""
    paths = [p for p in (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep) if p.strip()]
    docs: list[dict[str, Any]] = []
    for path in paths:
        full = Path(os.path.expanduser(path.strip()))
        if full.is_file():
            loaded = yaml.safe_load(full.read_text()) or {}
            if isinstance(loaded, dict):
                docs.append(loaded)
    current = next((d.get("current-context") for d in docs if d.get("current-context")), None)
    contexts = {c.get("name"): c.get("context") or {} for d in docs for c in d.get("contexts") or []}
    users = {u.get("name"): u.get("user") or {} for d in docs for u in d.get("users") or []}
    user = users.get(contexts.get(current, {}).get("user"), {})
    token_file = user.get("tokenFile") if isinstance(user, dict) else None
    return Path(os.path.expanduser(token_file)) if isinstance(token_file, str) and token_file else None


def login(settings: kopf.OperatorSettings) -> Login:
    """In-cluster service account first, then $KUBECONFIG / ~/.kube/config. Reads the files now."""
    info = kopf.login_with_service_account(settings=settings)
    if info is not None:
        return Login(info, SERVICE_ACCOUNT_TOKEN)
    info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError("no service account token and no kubeconfig ($KUBECONFIG or ~/.kube/config)")
    token_file = _kubeconfig_token_file()
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise kopf.LoginError(f"kubeconfig tokenFile {token_file}: {exc.strerror or exc}") from exc
        info = dataclasses.replace(info, token=token or None)
    return Login(info, token_file)
