#!/usr/bin/env python3
"""The sidecar's token check per token (issue 28 item 6): PyJWT (frscope.sidecar.auth) against the
hand-written verifier it replaced (`--old FILE`: that module's source, e.g. from
`git show 61c1f94:frscope/sidecar/auth.py`). Each run verifies `--n` distinct ES256 and RS256 tokens
with the cluster-shaped claims; the verifier's own remember-what-passed cache is not involved.

    .venv/bin/python bench/jwt_verify.py --old /tmp/old_auth.py
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frscope.sidecar import auth

ISSUER, SUBJECT, AUDIENCE = "https://kubernetes.default.svc", "system:serviceaccount:frscope:op", "frscope.io/sidecar"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def tokens(key: Any, kid: str, n: int) -> list[str]:
    alg = "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"
    out = []
    for i in range(n):
        claims = {"iss": ISSUER, "aud": [AUDIENCE], "sub": SUBJECT, "exp": int(time.time()) + 600 + i}
        signing = f"{b64(json.dumps({'alg': alg, 'kid': kid}).encode())}.{b64(json.dumps(claims).encode())}"
        if alg == "RS256":
            sig = key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        else:
            r, s = decode_dss_signature(key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
            sig = r.to_bytes(32, "big") + s.to_bytes(32, "big")
        out.append(f"{signing}.{b64(sig)}")
    return out


def per_token_us(module: ModuleType, toks: list[str], keys: dict[str, Any]) -> float:
    started = time.perf_counter()
    for tok in toks:
        module.verify(module.parse_jwt(tok), keys, issuer=ISSUER, audience=AUDIENCE, subject=SUBJECT, now=time.time())
    return (time.perf_counter() - started) / len(toks) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--old", type=Path)
    args = parser.parse_args()
    rsa_key, ec_key = rsa.generate_private_key(public_exponent=65537, key_size=2048), ec.generate_private_key(
        ec.SECP256R1())
    keys = {"rsa": rsa_key.public_key(), "ec": ec_key.public_key()}
    modules = [("PyJWT (frscope.sidecar.auth)", auth)]
    if args.old:
        spec = importlib.util.spec_from_file_location("old_auth", args.old)
        assert spec and spec.loader
        old = importlib.util.module_from_spec(spec)
        sys.modules["old_auth"] = old
        spec.loader.exec_module(old)
        modules.append(("hand-written (--old)", old))
    for alg, key, kid in (("ES256", ec_key, "ec"), ("RS256", rsa_key, "rsa")):
        toks = tokens(key, kid, args.n)
        for name, module in modules:
            print(f"| {alg} | {name} | {per_token_us(module, toks, keys):.0f} µs |")


if __name__ == "__main__":
    main()
