"""The sidecar's side of Kubernetes identity (docs/sidecar-api.md, "Authentication").

Inbound: the operator calls with a token of its own service account that it minted for this pod
(TokenRequest), audience `frscope.io/sidecar/<namespace>/<pod>` (`pod_audience`): a token shown to
one sidecar, or captured by a pod posing as one, opens no other pod's sidecar. The sidecar checks it
OFFLINE, against the cluster's service-account issuer
keys: `/.well-known/openid-configuration` (the issuer) and `/openid/v1/jwks` (the public keys),
which every service account may read by default (ClusterRole system:service-account-issuer-
discovery). No TokenReview, so the training pods' service account needs no permission at all.
Checked (PyJWT: the JWS, signature, issuer and audience; here: the times against the caller's clock
and the subject): the signature (RS256 or ES256), the issuer, the audience, the expiry (and nbf), and
that the subject is the operator's service account. Any malformed token is a 401 (never a 500); a
refused token is remembered (bounded, `REFUSED_MAX`, for `REFUSED_TTL_S`) and refused again at the
cost of a dict lookup. The keys are fetched once, again when a token names
a key not yet seen (key rotation; at most every `REFETCH_MIN_S`), and every `KEYS_TTL_S`.

Outbound: pushes carry the pod's own projected token for the operator's audience, read from its file
before every push (the kubelet renews it).

The token directory (`--kube-token-dir`, a projected volume the webhook adds):
    operator-token   audience frscope.io/operator: what pushes carry
    api-token        the API server's own audience: reads the issuer keys
    ca.crt           the cluster's CA (ConfigMap kube-root-ca.crt)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import jwt as pyjwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from frscope import wire

log = logging.getLogger("frscope.sidecar")

PROBES = frozenset({"/healthz", "/readyz"})  # the kubelet has no token
TOKEN_RELOAD_S = 30.0

AUDIENCE_SIDECAR = wire.SIDECAR_AUDIENCE  # = frscope.operator.names.AUDIENCE_SIDECAR
OPERATOR_TOKEN = "operator-token"
API_TOKEN = "api-token"
CA_FILE = "ca.crt"
LEEWAY_S = 30.0  # clock skew allowed on exp/nbf
MAX_TOKEN_BYTES = 16 * 1024
KEYS_TTL_S = 3600.0
REFETCH_MIN_S = 30.0
MAX_DOC_BYTES = 1024 * 1024
PASSED_MAX = 8  # tokens remembered as checked (the operator's current one, and a few renewed ones)
REFUSED_MAX = 1024  # tokens remembered as refused
REFUSED_TTL_S = REFETCH_MIN_S


class TokenRejected(Exception):
    """A token that does not prove the caller is the operator; `status` is 401 or 403."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


# The audience of the tokens the operator mints for one pod's sidecar (TokenRequest): a token shown to
# one sidecar opens no other pod's.
pod_audience = wire.sidecar_audience


def accepted_audiences(namespace: str, pod: str) -> tuple[str, ...]:
    """What this sidecar accepts: its own pod's audience only."""
    return (pod_audience(namespace, pod),)


def _b64int(text: Any) -> int:
    if not isinstance(text, str):
        raise ValueError("not a base64url integer")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not a base64url integer") from exc
    return int.from_bytes(raw, "big")


@dataclass(frozen=True, slots=True)
class Jwt:
    """A token whose header was read (not yet verified)."""

    token: str
    header: dict[str, Any]


def parse_jwt(token: str) -> Jwt:
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenRejected(401, "token too long")
    try:
        header = pyjwt.get_unverified_header(token)
    except (pyjwt.PyJWTError, ValueError, TypeError, RecursionError) as exc:
        raise TokenRejected(401, "malformed token") from exc
    return Jwt(token, header)


PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey


def key_from_jwk(jwk: dict[str, Any]) -> PublicKey | None:
    """An RSA or P-256 public key from a JWK; None for any other kind (ignored)."""
    try:
        if jwk.get("kty") == "RSA":
            return rsa.RSAPublicNumbers(_b64int(jwk.get("e")), _b64int(jwk.get("n"))).public_key()
        if jwk.get("kty") == "EC" and jwk.get("crv") == "P-256":
            return ec.EllipticCurvePublicNumbers(_b64int(jwk.get("x")), _b64int(jwk.get("y")),
                                                 ec.SECP256R1()).public_key()
    except ValueError:
        return None
    return None


def _fits(alg: str, key: PublicKey) -> bool:
    """The key can check this algorithm (no RSA key for ES256, no other curve than P-256)."""
    if alg == "RS256":
        return isinstance(key, rsa.RSAPublicKey)
    return isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1)


def verify(jwt: Jwt, keys: dict[str, PublicKey], *, issuer: str, audience: str | tuple[str, ...], subject: str,
           now: float) -> dict[str, Any]:
    """The token's claims; TokenRejected unless `jwt` is signed by one of `keys` (by kid, else any) and its
    claims say: this issuer, one of these audiences, not expired, and this subject. The signature, the
    issuer and the audience are PyJWT's checks; the times are checked against `now` here."""
    alg = jwt.header.get("alg")
    if alg not in ("RS256", "ES256"):
        raise TokenRejected(401, f"signature algorithm {str(alg)[:20]!r} not accepted")
    audiences = (audience,) if isinstance(audience, str) else audience
    kid = jwt.header.get("kid")
    candidates = [keys[kid]] if isinstance(kid, str) and kid in keys else list(keys.values())
    claims: dict[str, Any] | None = None
    for key in candidates:
        if not _fits(alg, key):
            continue
        try:
            claims = pyjwt.decode(jwt.token, key, algorithms=[alg], audience=list(audiences), issuer=issuer,
                                  options={"require": ["iss", "aud"], "verify_exp": False, "verify_nbf": False,
                                           "verify_iat": False, "verify_sub": False, "verify_jti": False})
            break
        except pyjwt.InvalidSignatureError:
            continue
        except (pyjwt.InvalidAudienceError, pyjwt.MissingRequiredClaimError) as exc:
            if isinstance(exc, pyjwt.MissingRequiredClaimError) and exc.claim == "iss":
                raise TokenRejected(401, "token from another issuer") from exc
            raise TokenRejected(401, f"token not for audience {audiences[0]}") from exc
        except pyjwt.InvalidIssuerError as exc:
            raise TokenRejected(401, "token from another issuer") from exc
        except (pyjwt.PyJWTError, ValueError, TypeError, RecursionError) as exc:
            raise TokenRejected(401, "malformed token") from exc
    if claims is None:
        raise TokenRejected(401, "bad signature (not signed by this cluster's service-account issuer)")
    exp, nbf = claims.get("exp"), claims.get("nbf")
    if not isinstance(exp, (int, float)) or isinstance(exp, bool) or now > exp + LEEWAY_S:
        raise TokenRejected(401, "token expired")
    if isinstance(nbf, (int, float)) and not isinstance(nbf, bool) and now + LEEWAY_S < nbf:
        raise TokenRejected(401, "token not valid yet")
    if claims.get("sub") != subject:
        raise TokenRejected(403, f"token of {str(claims.get('sub'))[:200]}, not of the operator ({subject})")
    return claims


def default_api_server() -> str:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if host:
        return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return "https://kubernetes.default.svc"


class IssuerKeys:
    """The cluster's service-account issuer and public keys, fetched from the API server."""

    def __init__(self, api_server: str, token_dir: Path, *, timeout_s: float = 10.0) -> None:
        self.api_server = api_server.rstrip("/")
        self.token_dir = token_dir
        self.timeout_s = timeout_s
        self.issuer: str | None = None
        self.keys: dict[str, PublicKey] = {}
        self._fetched_at = 0.0
        self._lock = asyncio.Lock()

    def _ssl(self) -> ssl.SSLContext:
        ca = self.token_dir / CA_FILE
        return ssl.create_default_context(cafile=str(ca)) if ca.is_file() else ssl.create_default_context()

    async def _get(self, session: aiohttp.ClientSession, path: str) -> Any:
        token = (self.token_dir / API_TOKEN).read_text().strip()
        async with session.get(self.api_server + path, headers={"Authorization": f"Bearer {token}"},
                               timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
            raw = await resp.content.read(MAX_DOC_BYTES + 1)
            if resp.status != 200 or len(raw) > MAX_DOC_BYTES:
                raise OSError(f"GET {path}: HTTP {resp.status}")
            return json.loads(raw)

    async def refresh(self, *, force: bool = False) -> None:
        async with self._lock:
            age = time.monotonic() - self._fetched_at
            if self._fetched_at and age < REFETCH_MIN_S:
                return  # at most one fetch per REFETCH_MIN_S, whatever the callers send
            if self.keys and not force and age < KEYS_TTL_S:
                return
            try:
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl())) as session:
                    config = await self._get(session, "/.well-known/openid-configuration")
                    jwks = await self._get(session, "/openid/v1/jwks")
            except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self._fetched_at = time.monotonic()  # do not hammer the API server
                log.warning("could not read the service-account issuer keys from %s: %s", self.api_server, exc)
                return
            keys: dict[str, PublicKey] = {}
            for i, jwk in enumerate(jwks.get("keys") or [] if isinstance(jwks, dict) else []):
                key = key_from_jwk(jwk) if isinstance(jwk, dict) else None
                if key is not None:
                    keys[str(jwk.get("kid") or f"#{i}")] = key
            issuer = config.get("issuer") if isinstance(config, dict) else None
            if isinstance(issuer, str) and keys:
                self.issuer, self.keys = issuer, keys
            self._fetched_at = time.monotonic()
            log.info("service-account issuer %s: %d key(s)", self.issuer, len(self.keys))


class OperatorVerifier:
    """Checks that a request comes from the operator (its service account, for this sidecar's audience)."""

    def __init__(self, keys: IssuerKeys, operator: str, audience: str | tuple[str, ...] = AUDIENCE_SIDECAR) -> None:
        self.keys = keys
        self.operator = operator
        self.audience = audience
        # The operator shows the same token at every poll until it renews it: a token that passed is
        # remembered (by digest, with its expiry) so the signature is checked once per token.
        self._passed: dict[bytes, float] = {}
        # A token that was refused is refused again without parsing or signature checks, for a while (a
        # key that rotated in is fetched at most every REFETCH_MIN_S): a storm of bad tokens costs one
        # dict lookup each once seen. Bounded: the oldest are forgotten first.
        self._refused: OrderedDict[bytes, tuple[float, TokenRejected]] = OrderedDict()

    async def check(self, authorization: str) -> None:
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise TokenRejected(401, "a bearer token is required (the operator's service-account token)")
        digest = hashlib.sha256(token.encode()).digest()
        expiry = self._passed.get(digest)
        if expiry is not None:
            if time.time() <= expiry + LEEWAY_S:
                return
            del self._passed[digest]
        refused = self._refused.get(digest)
        if refused is not None:
            if time.monotonic() < refused[0]:
                raise refused[1]
            del self._refused[digest]
        try:
            claims = await self._verify(token)
        except TokenRejected as exc:
            if exc.status in (401, 403):
                if len(self._refused) >= REFUSED_MAX:
                    self._refused.popitem(last=False)
                self._refused[digest] = (time.monotonic() + REFUSED_TTL_S, exc)
            raise
        if len(self._passed) >= PASSED_MAX:
            self._passed.clear()
        self._passed[digest] = float(claims["exp"])

    async def _verify(self, token: str) -> dict[str, Any]:
        jwt = parse_jwt(token)
        kid = jwt.header.get("kid")
        await self.keys.refresh(force=isinstance(kid, str) and kid not in self.keys.keys)
        if self.keys.issuer is None:
            raise TokenRejected(503, "the cluster's service-account issuer keys are not available yet")
        return verify(jwt, self.keys.keys, issuer=self.keys.issuer, audience=self.audience, subject=self.operator,
                      now=time.time())


def push_token(token_dir: Path) -> str | None:
    """The pod's token for the operator's audience, as the kubelet last wrote it."""
    try:
        return (token_dir / OPERATOR_TOKEN).read_text().strip() or None
    except OSError as exc:
        log.warning("push token %s cannot be read: %s", token_dir / OPERATOR_TOKEN, exc.strerror or exc)
        return None


class BearerToken:
    """Who may read the sidecar: the operator's service-account token (`verifier`), else a shared bearer
    token from --token-file (reloaded when the file changes), else nobody is asked (no auth configured)."""

    def __init__(self, path: Path | None, verifier: OperatorVerifier | None = None) -> None:
        self.path = path
        self.verifier = verifier
        self._token: str | None = None
        self._mtime: int | None = None

    def load(self) -> None:
        """Read the token file (sync: at startup, before the loop serves). ValueError if unusable."""
        path = self.path
        if path is None:
            return
        try:
            token = path.read_text().strip()
            self._mtime = path.stat().st_mtime_ns
        except OSError as exc:
            raise ValueError(f"--token-file {path}: {exc.strerror or exc}") from exc
        if not token:
            raise ValueError(f"--token-file {path} is empty")
        self._token = token

    def token(self) -> str | None:
        return self._token

    @property
    def loaded(self) -> bool:
        return self._token is not None

    async def reload_loop(self) -> None:
        """Pick up a rotated token file; a file that cannot be read keeps the previous token."""
        path = self.path
        if path is None:
            return
        while True:
            await asyncio.sleep(TOKEN_RELOAD_S)
            try:
                mtime = (await asyncio.to_thread(path.stat)).st_mtime_ns
                if mtime != self._mtime:
                    token = (await asyncio.to_thread(path.read_text)).strip()
                    if token:
                        self._token, self._mtime = token, mtime
                        log.info("token file %s reloaded", path)
            except OSError as exc:
                log.warning("token file %s cannot be read (%s); keeping the previous token", path,
                            exc.strerror or exc)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        # With Kubernetes identity /metrics stays open too (Prometheus has no operator token; the chart's
        # NetworkPolicy says who may reach the port); with a shared token it is protected as before.
        if request.path in PROBES or (self.verifier is not None and request.path == "/metrics"):
            return await handler(request)
        if self.verifier is not None:
            try:
                await self.verifier.check(request.headers.get("Authorization", ""))
            except TokenRejected as exc:
                headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
                return web.json_response({"error": exc.reason}, status=exc.status, headers=headers)
            except Exception:  # a token nobody foresaw: refused, never a 500 with a trace
                log.exception("token check failed")
                return web.json_response({"error": "malformed token"}, status=401,
                                         headers={"WWW-Authenticate": "Bearer"})
            return await handler(request)
        if self._token is None:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token.encode()):
            return web.json_response(
                {"error": "missing or wrong bearer token"}, status=401, headers={"WWW-Authenticate": "Bearer"}
            )
        return await handler(request)
