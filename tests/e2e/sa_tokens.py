"""Service-account tokens for the auth tests, from the testenv API server itself.

`request_token()` is the real thing: a TokenRequest (`kubectl create token`), optionally bound to a
pod and for an audience. The API server refuses lifetimes under 10 minutes, so a token that expires
*during* a test is made by `mint()`: signed with the test cluster's own service-account signing key
(testenv made it; a real cluster keeps it to itself), with the claims the API server's TokenRequest
would put in. The API server then validates it exactly as one of its own (signature, issuer,
audience, expiry, the service account's and the bound pod's uid); the tests check that an unexpired
minted token IS accepted, so its refusal after expiry is the expiry.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

ISSUER = "https://kubernetes.default.svc.cluster.local"  # testenv/cluster.py SERVICE_ACCOUNT_ISSUER


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def request_token(kube: ControlPlane, namespace: str, account: str, *, audience: str | None = None,
                  pod: str | None = None, duration: str = "1h") -> str:
    args = ["create", "token", account, "-n", namespace, f"--duration={duration}"]
    if audience:
        args.append(f"--audience={audience}")
    if pod:
        args += ["--bound-object-kind=Pod", f"--bound-object-name={pod}"]
    return str(kube.kubectl(*args).stdout.strip())


def mint(kube: ControlPlane, namespace: str, account: str, *, lifetime_s: float, audience: str = ISSUER,
         pod: str | None = None, issued_ago_s: float = 0.0) -> str:
    """A token like TokenRequest's, but living `lifetime_s` seconds (ES256 with testenv's key)."""
    key_pem = Path(kube.pki.path("sa.key")).read_bytes()
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    sa = kube.kubectl_json("get", "serviceaccount", account, "-n", namespace)
    now = int(time.time() - issued_ago_s)
    private: dict[str, Any] = {"namespace": namespace,
                               "serviceaccount": {"name": account, "uid": sa["metadata"]["uid"]}}
    if pod:
        obj = kube.kubectl_json("get", "pod", pod, "-n", namespace)
        private["pod"] = {"name": pod, "uid": obj["metadata"]["uid"]}
    claims = {"iss": ISSUER, "aud": [audience], "sub": f"system:serviceaccount:{namespace}:{account}",
              "iat": now, "nbf": now, "exp": int(now + lifetime_s), "jti": str(uuid.uuid4()),
              "kubernetes.io": private}
    header = {"alg": "ES256", "kid": _b64(hashlib.sha256(der).digest()), "typ": "JWT"}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}".encode()
    r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
    return f"{signing_input.decode()}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def authenticated(kube: ControlPlane, token: str) -> int:
    """What the API server answers a request made with `token` (200, or 401 when it refuses it)."""
    status, _, _ = kube.request("GET", "/version", token=token)
    return status
