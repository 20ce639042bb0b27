"""Who is calling the operator, as the API server says: TokenReview and SubjectAccessReview.

- Pushes (`POST /v1/push`): a sidecar presents its pod's projected service-account token with the
  audience `names.AUDIENCE_OPERATOR`. A TokenReview bound to that audience says which service
  account it is and, because the kubelet binds projected tokens to their pod, which pod: the pod
  and namespace of the evidence come from there, never from the request's headers or body. A
  token that is not bound to a pod is refused (a bare `kubectl create token` cannot speak for a pod).
- The web UI: a bearer token (any audience the API server accepts) reviewed the same way, then a
  SubjectAccessReview: may this user `get` PyTorchJobs in the namespace of the job asked for?

Answers are cached for a short while (bounded), so a page that polls every 2 s, or a flood of bad
tokens, does not become a flood of reviews: the same bad token is reviewed once per `CACHE_S`, and a
client (by address) whose tokens were refused `FAILURES_BURST` times gets `RateLimited` (429) without
a review until its budget refills (one a `FAILURE_REFILL_S`). A token longer than `MAX_TOKEN_BYTES` is
refused without one.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from frscope.operator import names
from frscope.operator.kube import SUBJECTACCESSREVIEWS, TOKENREVIEWS, BearerAuth, KubeClient, KubeError

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
CACHE_S = 30.0
CACHE_MAX = 4096
MAX_TOKEN_BYTES = 16 * 1024
FAILURES_BURST = 10  # refused tokens a client may show before it must wait
FAILURE_REFILL_S = 6.0  # ... one more every this many seconds (10 a minute)


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller (TokenReview's status.user)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def service_account(self) -> tuple[str, str] | None:
        """(namespace, name) when the caller is a service account."""
        if not self.username.startswith(SERVICE_ACCOUNT_PREFIX):
            return None
        namespace, _, name = self.username[len(SERVICE_ACCOUNT_PREFIX):].partition(":")
        return (namespace, name) if namespace and name else None

    @property
    def pod(self) -> str | None:
        """The pod the token is bound to (projected tokens), else None."""
        values = self.extra.get(POD_NAME_EXTRA) or ()
        return values[0] if len(values) == 1 and values[0] else None

    @property
    def pod_uid(self) -> str | None:
        """The uid of the pod the token is bound to: names repeat across a job's restarts, uids do not."""
        values = self.extra.get(POD_UID_EXTRA) or ()
        return values[0] if len(values) == 1 and values[0] else None


def bearer(header: str) -> str | None:
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class _Cache:
    def __init__(self, ttl_s: float, max_items: int) -> None:
        self._items: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._ttl_s = ttl_s
        self._max = max_items

    def get(self, key: str) -> tuple[bool, Any]:
        item = self._items.get(key)
        if item is None or item[0] < time.monotonic():
            self._items.pop(key, None)
            return False, None
        return True, item[1]

    def put(self, key: str, value: Any) -> None:
        self._items[key] = (time.monotonic() + self._ttl_s, value)
        self._items.move_to_end(key)
        while len(self._items) > self._max:
            self._items.popitem(last=False)


class RateLimited(Exception):
    """A client whose tokens were refused too often: answer 429 with Retry-After, review nothing."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"too many refused tokens from this client; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class FailureBudget:
    """Per client: how many refused tokens it may still show (a token bucket, bounded in clients)."""

    def __init__(self, burst: int = FAILURES_BURST, refill_s: float = FAILURE_REFILL_S,
                 max_clients: int = CACHE_MAX) -> None:
        self._burst = burst
        self._refill_s = refill_s
        self._max = max_clients
        self._clients: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)

    def _level(self, client: str, now: float) -> float:
        tokens, at = self._clients.get(client, (float(self._burst), now))
        return min(float(self._burst), tokens + (now - at) / self._refill_s)

    def check(self, client: str) -> None:
        """RateLimited when `client` has no refusals left."""
        now = time.monotonic()
        level = self._level(client, now)
        if level < 1.0:
            raise RateLimited(max(1, int((1.0 - level) * self._refill_s + 0.999)))

    def refused(self, client: str) -> None:
        now = time.monotonic()
        self._clients[client] = (max(0.0, self._level(client, now) - 1.0), now)
        self._clients.move_to_end(client)
        while len(self._clients) > self._max:
            self._clients.popitem(last=False)


class Reviewer:
    """TokenReview and SubjectAccessReview through the operator's client (RBAC: create on both)."""

    def __init__(self, kube: KubeClient, *, cache_s: float = CACHE_S, cache_max: int = CACHE_MAX) -> None:
        self._kube = kube
        self._tokens = _Cache(cache_s, cache_max)
        self._access = _Cache(cache_s, cache_max)
        self._failures = FailureBudget(max_clients=cache_max)
        self.reviews = 0  # TokenReviews asked of the API server

    async def authenticate(self, token: str, audience: str | None, client: str | None = None) -> Identity | None:
        """The token's user when the API server accepts it (for `audience`, if given), else None.
        `client` (the caller's address): RateLimited once its tokens were refused too often."""
        key = hashlib.sha256(f"{audience}\0{token}".encode()).hexdigest()
        hit, cached = self._tokens.get(key)
        if hit:
            return cached if isinstance(cached, Identity) else None
        if client is not None:
            self._failures.check(client)
        identity = await self._review(token, audience) if len(token) <= MAX_TOKEN_BYTES else None
        self._tokens.put(key, identity)
        if identity is None and client is not None:
            self._failures.refused(client)
        return identity

    async def _review(self, token: str, audience: str | None) -> Identity | None:
        self.reviews += 1
        spec: dict[str, Any] = {"token": token}
        if audience:
            spec["audiences"] = [audience]
        answer = await self._kube.create(TOKENREVIEWS, None, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec})
        return _identity(answer.get("status") or {}, audience)

    async def allowed(self, who: Identity, *, verb: str, namespace: str = "", group: str = names.JOB_GROUP,
                      resource: str = names.JOB_PLURAL, path: str | None = None) -> bool:
        """May `who` do `verb` on `resource` in `namespace` (or, with `path`, on that non-resource URL)?"""
        key = hashlib.sha256(_access_key(who, verb, namespace, group, resource, path or "").encode()).hexdigest()
        hit, cached = self._access.get(key)
        if hit:
            return bool(cached)
        spec: dict[str, Any] = {"user": who.username, "groups": list(who.groups)}
        if path is not None:
            spec["nonResourceAttributes"] = {"path": path, "verb": verb}
        else:
            spec["resourceAttributes"] = {"verb": verb, "group": group, "resource": resource, "namespace": namespace}
        if who.uid:
            spec["uid"] = who.uid
        if who.extra:
            spec["extra"] = {k: list(v) for k, v in who.extra.items()}
        answer = await self._kube.create(SUBJECTACCESSREVIEWS, None, {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
        ok = bool((answer.get("status") or {}).get("allowed"))
        self._access.put(key, ok)
        return ok


def _access_key(who: Identity, *parts: str) -> str:
    return "\0".join([who.username, who.uid, ",".join(who.groups), *parts])


def _identity(status: dict[str, Any], audience: str | None) -> Identity | None:
    if not status.get("authenticated"):
        return None
    if audience and audience not in (status.get("audiences") or []):
        return None  # an API server that ignores spec.audiences must not let any token through
    user = status.get("user") or {}
    username = user.get("username")
    if not isinstance(username, str) or not username:
        return None
    extra_raw = user.get("extra") or {}
    extra = {str(k): tuple(str(x) for x in v) for k, v in extra_raw.items() if isinstance(v, list)}
    groups = tuple(str(g) for g in user.get("groups") or [])
    return Identity(username, str(user.get("uid") or ""), groups, extra)


# -- who may push ----------------------------------------------------------------------------------
class Refused(Exception):
    """A request that is not let in: 401 (who are you?), 403 (not you), 429 (too many refused tokens)."""

    def __init__(self, status: int, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Caller:
    """Who pushed. `namespace`/`pod` None: authentication does not say (the push's headers then do)."""

    who: str
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None  # known with Kubernetes tokens only


class OpenPush:
    """`--sidecar-auth none`: anyone may push, for any pod (development only)."""

    async def caller(self, authorization: str, client: str | None = None) -> Caller:
        return Caller("anonymous")


class SharedTokenPush:
    """`--sidecar-auth token`: the shared secret; whoever holds it may push for any pod."""

    def __init__(self, auth: BearerAuth) -> None:
        self._auth = auth

    async def caller(self, authorization: str, client: str | None = None) -> Caller:
        expected = self._auth.token()
        given = bearer(authorization)
        if not expected or given is None or not hmac.compare_digest(given.encode(), expected.encode()):
            raise Refused(401, "missing or wrong bearer token")
        return Caller("shared-token")


class KubernetesPush:
    """`--sidecar-auth kubernetes`: the pod's own projected token, reviewed for the operator's audience."""

    def __init__(self, reviewer: Reviewer, audience: str = names.AUDIENCE_OPERATOR) -> None:
        self._reviewer = reviewer
        self._audience = audience

    async def caller(self, authorization: str, client: str | None = None) -> Caller:
        token = bearer(authorization)
        if token is None:
            raise Refused(401, "a bearer token is required (the pod's service-account token, "
                               f"audience {self._audience})")
        try:
            who = await self._reviewer.authenticate(token, self._audience, client)
        except RateLimited as exc:
            raise Refused(429, str(exc), retry_after_s=exc.retry_after_s) from exc
        except KubeError as exc:
            raise Refused(503, f"the token could not be reviewed: {exc}") from exc
        if who is None:
            raise Refused(401, f"token refused by the API server (expired, revoked, or not for audience "
                               f"{self._audience})")
        account = who.service_account
        if account is None or who.pod is None:
            raise Refused(403, f"{who.username} is not a pod's service account: push with the token the "
                               "kubelet projects into the pod")
        return Caller(who.username, namespace=account[0], pod=who.pod, pod_uid=who.pod_uid)


PushAuth = OpenPush | SharedTokenPush | KubernetesPush
