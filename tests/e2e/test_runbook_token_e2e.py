"""docs/runbooks.md's way to read a sidecar with the default auth works: the `TOKEN=$(kubectl create
token ...)` lines, run as written by bash against the real API server, give a token that a real
`frscope sidecar` (checking it offline against the server's issuer keys) answers `/v1/status` with;
without it the sidecar answers 401, as the runbook says."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e.sa_tokens import request_token
    from tests.e2e.test_operator_e2e import ROOT, wait_for
except ModuleNotFoundError:
    from sa_tokens import request_token
    from test_operator_e2e import ROOT, wait_for

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

RUNBOOKS = ROOT / "docs" / "runbooks.md"
OPERATOR_AUDIENCE = "frscope.io/operator"


def runbook_token_command() -> str:
    """The runbook's `TOKEN=$(kubectl create token ...)` assignment, continuation lines joined."""
    text = RUNBOOKS.read_text()
    match = re.search(r"^ *(TOKEN=\$\(kubectl create token .*?\))$", text, re.M | re.S)
    assert match, f"{RUNBOOKS} shows no TOKEN=$(kubectl create token ...)"
    return re.sub(r"\\\n\s*", "", match.group(1))


@pytest.fixture
def namespaces(kube: ControlPlane) -> Iterator[tuple[str, str]]:
    suffix = secrets.token_hex(3)
    training, system = f"rb-train-{suffix}", f"rb-system-{suffix}"
    for name in (training, system):
        kube.kubectl("create", "namespace", name)
    try:
        yield training, system
    finally:
        for name in (training, system):
            kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def _status(port: int, token: str | None) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/status")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        e.close()
        return int(e.code)


def test_the_runbooks_token_opens_the_pods_sidecar(kube: ControlPlane, namespaces: tuple[str, str],
                                                    tmp_path: Path) -> None:
    training, system = namespaces
    command = runbook_token_command()
    assert "--audience" in command and "frscope.io/sidecar/$NS/$POD" in command
    # The chart's account (`frscope` in `frscope-system`), here in a namespace of this test's own.
    kube.kubectl("create", "serviceaccount", "frscope", "-n", system)
    kube.kubectl("create", "serviceaccount", "trainer", "-n", training)
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "api-token").write_text(request_token(kube, training, "trainer"))
    (tokens / "operator-token").write_text(request_token(kube, training, "trainer", audience=OPERATOR_AUDIENCE))
    (tokens / "ca.crt").write_bytes(kube.ca_file.read_bytes())
    (tmp_path / "sockets").mkdir()
    port_file = tmp_path / "port"
    pod = "llm-pretrain-worker-0"
    with open(tmp_path / "sidecar.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(tmp_path / "sockets"),
             "--evidence-dir", "none", "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
             "--pod", pod, "--namespace", training,
             "--operator-identity", f"system:serviceaccount:{system}:frscope",
             "--kube-token-dir", str(tokens), "--api-server", kube.server],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
        try:
            port = int(wait_for("the sidecar's port", lambda: port_file.exists() and port_file.read_text().strip(),
                                60))
            script = f"NS={training} POD={pod}\n{command.replace('-n frscope-system', f'-n {system}')}\n" \
                     'printf %s "$TOKEN"'
            token = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=kube.env(), check=True,
                                   capture_output=True, text=True, timeout=60).stdout
            assert token.count(".") == 2, token
            assert _status(port, None) == 401  # what the runbook's reader got before
            assert _status(port, token) == 200
            other = subprocess.run(["bash", "-euo", "pipefail", "-c", script.replace(f"POD={pod}", "POD=another")],
                                   env=kube.env(), check=True, capture_output=True, text=True, timeout=60).stdout
            assert _status(port, other) == 401  # one pod's token opens that pod's sidecar only
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
