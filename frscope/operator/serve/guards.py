"""Who may read the operator's HTTP endpoints other than pushes: the web UI and `/metrics`.

- *port-forward*: a connection from 127.0.0.1 or ::1 is what `kubectl port-forward` makes inside the
  operator's pod, and the API server authorized it (`pods/portforward`). Only such a connection is let
  in without a token, and only when it is one: its `Host` names loopback (a page of another site whose
  name resolves to 127.0.0.1, DNS rebinding, sends its own name), and it carries no proxy headers (a
  mesh proxy in the pod relays other pods' requests from loopback: Istio from 127.0.0.6, which is not
  127.0.0.1 either).
- a bearer token the API server accepts (TokenReview, rate-limited per client on refusals), and a
  SubjectAccessReview: `get pytorchjobs` in the job's namespace (the UI), `get` on the non-resource URL
  `/metrics` (the way controller-runtime guards metrics; Prometheus' usual ClusterRole has it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from frscope.operator.kube import KubeError
from frscope.operator.serve.access import Identity, RateLimited, Reviewer, bearer

PORT_FORWARD_PEERS = frozenset({"127.0.0.1", "::1"})
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
# Headers a proxy adds and a browser behind `kubectl port-forward` does not send.
PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-IP",
                 "X-Envoy-Peer-Metadata", "X-Envoy-Attempt-Count", "X-Envoy-External-Address", "l5d-client-id",
                 "l5d-dst-canonical")

Check = Callable[[web.Request], Awaitable[web.Response | None]]


def host_name(host: str) -> str:
    """`Host` without its port: 'localhost:8080' -> 'localhost', '[::1]:80' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    name, _, port = host.rpartition(":")
    return name if name and port.isdigit() else host


def port_forwarded(request: web.Request) -> bool:
    """A `kubectl port-forward` connection (see the module's text), not a proxied or rebound one."""
    if request.remote not in PORT_FORWARD_PEERS:
        return False
    if host_name(request.headers.get("Host", "")) not in LOOPBACK_HOSTS:
        return False
    return not any(name in request.headers for name in PROXY_HEADERS)


def refuse(status: int, message: str, retry_after_s: int | None = None) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="frscope"'} if status == 401 else {}
    if retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    return web.json_response({"error": message}, status=status, headers=headers or None)


async def authenticated(request: web.Request, reviewer: Reviewer) -> Identity | web.Response:
    """The caller's identity from its bearer token, or the answer that refuses it."""
    token = bearer(request.headers.get("Authorization", ""))
    if token is None:
        return refuse(401, "a bearer token is required (or use kubectl port-forward)")
    try:
        who = await reviewer.authenticate(token, None, request.remote)
    except RateLimited as exc:
        return refuse(429, str(exc), exc.retry_after_s)
    except KubeError as exc:
        return refuse(503, f"the token could not be reviewed: {exc}")
    if who is None:
        return refuse(401, "token refused by the API server")
    return who


def metrics_guard(mode: str, reviewer: Reviewer | None) -> Check | None:
    """`--metrics-auth`: who may read `/metrics` (job names, diagnoses of every namespace)."""
    if mode == "none":
        return None
    if reviewer is None:
        raise ValueError(f"--metrics-auth {mode} needs the API server to review tokens")

    async def check(request: web.Request) -> web.Response | None:
        if mode == "port-forward" and port_forwarded(request):
            return None
        who = await authenticated(request, reviewer)
        if isinstance(who, web.Response):
            return who
        try:
            allowed = await reviewer.allowed(who, verb="get", path=request.path)
        except KubeError as exc:
            return refuse(503, f"access could not be reviewed: {exc}")
        return None if allowed else refuse(403, f"{who.username} may not get {request.path}")

    return check
