"""The sidecar's offline check of the operator's token: real RS256/ES256 signatures made here with
fresh keys (the e2e test checks tokens of a real API server, tests/e2e/test_auth_e2e.py)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from frscope.operator import names
from frscope.sidecar.auth import (
    AUDIENCE_SIDECAR,
    IssuerKeys,
    OperatorVerifier,
    PublicKey,
    TokenRejected,
    key_from_jwk,
    parse_jwt,
    verify,
)

ISSUER = "https://kubernetes.default.svc"
OPERATOR = "system:serviceaccount:frscope:frscope"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64int(n: int) -> str:
    return b64(n.to_bytes((n.bit_length() + 7) // 8, "big"))


def sign(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, claims: dict[str, Any], kid: str = "k1",
         alg: str | None = None) -> str:
    alg = alg or ("RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256")
    signing = f"{b64(json.dumps({'alg': alg, 'kid': kid}).encode())}.{b64(json.dumps(claims).encode())}"
    if isinstance(key, rsa.RSAPrivateKey):
        sig = key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
    else:
        r, s = decode_dss_signature(key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
        sig = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return f"{signing}.{b64(sig)}"


def claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    base: dict[str, Any] = {"iss": ISSUER, "aud": [AUDIENCE_SIDECAR], "sub": OPERATOR, "iat": now, "nbf": now,
                            "exp": now + 600}
    base.update(changes)
    return base


def check(token: str, keys: dict[str, PublicKey]) -> None:
    verify(parse_jwt(token), keys, issuer=ISSUER, audience=AUDIENCE_SIDECAR, subject=OPERATOR, now=time.time())


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def jwks(rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey) -> dict[str, PublicKey]:
    r = rsa_key.public_key().public_numbers()
    e = ec_key.public_key().public_numbers()
    docs = [{"kty": "RSA", "kid": "rsa", "n": b64int(r.n), "e": b64int(r.e)},
            {"kty": "EC", "crv": "P-256", "kid": "ec", "x": b64int(e.x), "y": b64int(e.y)},
            {"kty": "OKP", "kid": "ignored"}]
    keys = {str(d["kid"]): key_from_jwk(d) for d in docs}
    return {k: v for k, v in keys.items() if v is not None}


def test_the_operators_token_is_accepted_rs256_and_es256(rsa_key: rsa.RSAPrivateKey,
                                                         ec_key: ec.EllipticCurvePrivateKey) -> None:
    keys = jwks(rsa_key, ec_key)
    assert set(keys) == {"rsa", "ec"}
    check(sign(rsa_key, claims(), kid="rsa"), keys)
    check(sign(ec_key, claims(), kid="ec"), keys)
    check(sign(ec_key, claims(aud=AUDIENCE_SIDECAR), kid="unknown-kid"), keys)  # any key when kid is unknown
    assert AUDIENCE_SIDECAR == names.AUDIENCE_SIDECAR


@pytest.mark.parametrize(("change", "status", "reason"), [
    ({"aud": [names.AUDIENCE_OPERATOR]}, 401, "audience"),
    ({"aud": "https://kubernetes.default.svc"}, 401, "audience"),
    ({"exp": int(time.time()) - 120}, 401, "expired"),
    ({"exp": None}, 401, "expired"),
    ({"nbf": int(time.time()) + 3600}, 401, "not valid yet"),
    ({"iss": "https://evil.example"}, 401, "issuer"),
    ({"sub": "system:serviceaccount:ml:trainer"}, 403, "not of the operator"),
])
def test_wrong_claims_are_refused(ec_key: ec.EllipticCurvePrivateKey, rsa_key: rsa.RSAPrivateKey,
                                  change: dict[str, Any], status: int, reason: str) -> None:
    with pytest.raises(TokenRejected) as refused:
        check(sign(ec_key, claims(**change), kid="ec"), jwks(rsa_key, ec_key))
    assert refused.value.status == status and reason in refused.value.reason


def test_forged_and_malformed_tokens_are_refused(ec_key: ec.EllipticCurvePrivateKey,
                                                 rsa_key: rsa.RSAPrivateKey) -> None:
    keys = jwks(rsa_key, ec_key)
    other = ec.generate_private_key(ec.SECP256R1())
    for token in (
        sign(other, claims(), kid="ec"),  # signed by a key the cluster does not have
        sign(ec_key, claims(), kid="ec", alg="RS256"),  # algorithm confusion
        sign(rsa_key, claims(), kid="rsa", alg="ES256"),
        ".".join(sign(ec_key, claims(), kid="ec").split(".")[:2] + [""]),  # no signature
        b64(b'{"alg":"none"}') + "." + b64(json.dumps(claims()).encode()) + ".",
        "not-a-jwt", "a.b.c", "x" * 20000,
    ):
        with pytest.raises(TokenRejected) as refused:
            check(token, keys)
        assert refused.value.status == 401, token[:40]
    # A valid token with its claims edited keeps its old signature: refused.
    header, _, sig = sign(ec_key, claims(), kid="ec").split(".")
    edited = f"{header}.{b64(json.dumps(claims(sub='system:serviceaccount:x:y')).encode())}.{sig}"
    with pytest.raises(TokenRejected):
        check(edited, keys)


async def test_the_verifier_remembers_a_passed_token_until_it_expires(
        ec_key: ec.EllipticCurvePrivateKey, rsa_key: rsa.RSAPrivateKey, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    keys = IssuerKeys("https://127.0.0.1:1", tmp_path)  # nothing listens: keys are set below
    verifier = OperatorVerifier(keys, OPERATOR)
    with pytest.raises(TokenRejected) as unavailable:
        await verifier.check("Bearer " + sign(ec_key, claims(), kid="ec"))
    assert unavailable.value.status == 503
    keys.issuer, keys.keys = ISSUER, jwks(rsa_key, ec_key)
    token = sign(ec_key, claims(exp=int(time.time()) + 60), kid="ec")
    await verifier.check(f"Bearer {token}")
    calls: list[int] = []
    monkeypatch.setattr("frscope.sidecar.auth.verify", lambda *a, **k: calls.append(1))
    await verifier.check(f"Bearer {token}")  # remembered: no second signature check
    assert calls == []
    monkeypatch.undo()  # the real signature check again
    later = time.time() + 600
    monkeypatch.setattr("frscope.sidecar.auth.time.time", lambda: later)
    with pytest.raises(TokenRejected, match="expired"):
        await verifier.check(f"Bearer {token}")  # past its expiry it is checked again, and refused
    with pytest.raises(TokenRejected) as missing:
        await verifier.check("")
    assert missing.value.status == 401
