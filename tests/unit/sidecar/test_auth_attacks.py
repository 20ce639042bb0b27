"""Attacks on the sidecar's token check (issue 26), each through a real sidecar's HTTP server:

- a token the operator minted for one pod's sidecar opens no other pod's (audience per pod), and a
  token for the shared audience (what the operator showed every sidecar before) opens none;
- a token whose header or claims nest 1,500 deep is a 401, not a 500;
- a storm of refused tokens costs one check per distinct token, and tokens naming unknown keys make
  the sidecar fetch the issuer keys at most once per REFETCH_MIN_S.

The issuer keys come from a loopback aiohttp server that serves the two discovery documents the way
the API server does (the real API server is in tests/e2e/test_auth_e2e.py; here the test must sign
tokens with keys of its own, which only a stand-in issuer can publish)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from frscope.sidecar import auth
from frscope.sidecar.app import Sidecar
from tests.unit.sidecar.test_api import cfg

ISSUER = "https://kubernetes.default.svc"
OPERATOR = "system:serviceaccount:frscope:frscope-operator"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign(key: ec.EllipticCurvePrivateKey, header: str, claims: str) -> str:
    signing = f"{b64(header.encode())}.{b64(claims.encode())}"
    r, s = decode_dss_signature(key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def token(key: ec.EllipticCurvePrivateKey, audience: str, kid: str = "k1", **changes: Any) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": [audience], "sub": OPERATOR, "iat": now, "nbf": now, "exp": now + 600, **changes}
    return sign(key, json.dumps({"alg": "ES256", "kid": kid}), json.dumps(claims))


@pytest.fixture(scope="module")
def key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


class Issuer:
    """Serves /.well-known/openid-configuration and /openid/v1/jwks; counts the key fetches."""

    def __init__(self, key: ec.EllipticCurvePrivateKey) -> None:
        numbers = key.public_key().public_numbers()
        self.jwks = {"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig",
                               "x": b64(numbers.x.to_bytes(32, "big")), "y": b64(numbers.y.to_bytes(32, "big"))}]}
        self.key_fetches = 0
        self.url = ""

    async def config(self, request: web.Request) -> web.Response:
        return web.json_response({"issuer": ISSUER, "jwks_uri": f"{self.url}/openid/v1/jwks"})

    async def keys(self, request: web.Request) -> web.Response:
        self.key_fetches += 1
        return web.json_response(self.jwks)


@pytest.fixture
async def issuer(key: ec.EllipticCurvePrivateKey) -> AsyncIterator[Issuer]:
    served = Issuer(key)
    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", served.config)
    app.router.add_get("/openid/v1/jwks", served.keys)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    served.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield served
    finally:
        await runner.cleanup()


async def sidecar_of(tmp_path: Path, issuer: Issuer, pod: str) -> Sidecar:
    tokens = tmp_path / f"tokens-{pod}"
    tokens.mkdir()
    (tokens / "api-token").write_text("api-token")
    sidecar = Sidecar(cfg(tmp_path, poll_interval_s=3600, pod=pod, namespace="team-a", operator_identity=OPERATOR,
                          kube_token_dir=tokens, api_server=issuer.url))
    await sidecar.start()
    return sidecar


async def status(sidecar: Sidecar, bearer: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{sidecar.port}/v1/status",
                               headers={"Authorization": f"Bearer {bearer}"}) as resp:
            body = await resp.text()
    try:
        return resp.status, json.loads(body)
    except ValueError:
        return resp.status, body


async def test_a_token_minted_for_one_pod_opens_no_other_pods_sidecar(
        tmp_path: Path, issuer: Issuer, key: ec.EllipticCurvePrivateKey) -> None:
    a, b = await sidecar_of(tmp_path, issuer, "train-worker-0"), await sidecar_of(tmp_path, issuer, "train-worker-1")
    try:
        for_a = token(key, auth.pod_audience("team-a", "train-worker-0"))
        code, answer = await status(a, for_a)
        assert code == 200 and answer["pod"] == "train-worker-0", answer
        code, answer = await status(b, for_a)
        assert code == 401 and "audience" in answer["error"], answer
        # The same pod name in another namespace is another pod.
        code, _ = await status(a, token(key, auth.pod_audience("team-b", "train-worker-0")))
        assert code == 401
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.parametrize("where", ["header", "claims"])
async def test_a_deeply_nested_token_is_refused_with_401(
        tmp_path: Path, issuer: Issuer, key: ec.EllipticCurvePrivateKey, where: str) -> None:
    sidecar = await sidecar_of(tmp_path, issuer, "train-worker-0")
    deep = "[" * 1500 + "]" * 1500
    header = json.dumps({"alg": "ES256", "kid": "k1"})
    claims = json.dumps({"iss": ISSUER, "aud": [auth.pod_audience("team-a", "train-worker-0")], "sub": OPERATOR,
                         "exp": int(time.time()) + 600})
    if where == "header":
        header = header[:-1] + f', "x": {deep}}}'
    else:
        claims = claims[:-1] + f', "x": {deep}}}'
    try:
        code, answer = await status(sidecar, sign(key, header, claims))
        assert code == 401, answer
    finally:
        await sidecar.stop()


async def test_a_storm_of_bad_tokens_costs_one_check_per_distinct_token(
        tmp_path: Path, issuer: Issuer, key: ec.EllipticCurvePrivateKey, monkeypatch: pytest.MonkeyPatch) -> None:
    sidecar = await sidecar_of(tmp_path, issuer, "train-worker-0")
    checks: list[str] = []
    real_verify = auth.verify

    def counted(jwt: auth.Jwt, *args: Any, **kwargs: Any) -> dict[str, Any]:
        checks.append(jwt.token)
        return real_verify(jwt, *args, **kwargs)

    monkeypatch.setattr(auth, "verify", counted)
    try:
        good = token(key, auth.pod_audience("team-a", "train-worker-0"))
        assert (await status(sidecar, good))[0] == 200
        fetches = issuer.key_fetches
        forged = token(ec.generate_private_key(ec.SECP256R1()), auth.pod_audience("team-a", "train-worker-0"))
        for _ in range(50):
            assert (await status(sidecar, forged))[0] == 401
        assert checks.count(forged) == 1
        # Distinct tokens naming keys the issuer never had: each is checked, the keys fetched once at most.
        for i in range(50):
            other = token(ec.generate_private_key(ec.SECP256R1()), auth.pod_audience("team-a", "train-worker-0"),
                          kid=f"unknown-{i}")
            assert (await status(sidecar, other))[0] == 401
        assert issuer.key_fetches - fetches <= 1
        assert (await status(sidecar, good))[0] == 200  # the operator's own token still passes
    finally:
        await sidecar.stop()
