"""A real Kubernetes control plane on loopback: etcd + kube-apiserver (+ kube-controller-manager).

Standard library only, so that `testenv/up` runs with any Python 3.11 and the e2e fixture
(tests/e2e/conftest.py) can load it without installing anything. The binaries come from
`testenv/build`, which prints their directory on its last stdout line.

What it sets up, in a fresh directory (on /dev/shm when present):
- a CA and certificates made with `openssl`: the API server's serving certificate for 127.0.0.1, a
  client certificate for the admin (group system:masters) and one for the controller manager
  (user system:kube-controller-manager, which the bootstrap RBAC policy knows), plus a static admin
  bearer token for clients that prefer a token;
- a service-account signing key pair (the API server issues tokens, the controller manager creates
  the token controller's secrets and signs with it);
- etcd with its data in that directory, kube-apiserver with RBAC (`Node,RBAC`) on a free port,
  waits for /readyz, applies the CRDs it is given and waits until they are Established, then starts
  kube-controller-manager (garbage collector, namespace controller, service accounts, ...) and waits
  for its /healthz;
- a kubeconfig with everything embedded (certificates as data), usable by kubectl, helm and the
  Python Kubernetes clients.

`stop()` ends exactly the processes it started, by PID (SIGTERM, then SIGKILL), and removes the
directory unless asked to keep the logs somewhere.

    python3 testenv/cluster.py up --bin-dir DIR [--crd FILE ...]     (what testenv/up runs)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ADMIN_USER = "frscope-admin"
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = frscope-testenv
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = ${ENV::FRSCOPE_SANS}
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
"""


def _parent_death_signal() -> Any:
    """On Linux, a function for the child (between fork and exec) that asks the kernel to SIGKILL it
    when the process that started it dies, so a killed pytest or testenv/up leaves nothing running
    (SIGTERM is not enough: kube-apiserver waits forever in its graceful shutdown once etcd is gone).
    Resolved here, in the parent: the child only makes the system call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def set_pdeathsig() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)

    return set_pdeathsig


_PREEXEC = _parent_death_signal()


class ControlPlaneError(RuntimeError):
    """A component did not start, or a command against the control plane failed."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _scratch_parent() -> str | None:
    """/dev/shm when it is a writable directory (etcd's fsyncs cost nothing there), else the default."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _openssl(*args: str, cwd: Path, sans: str = "IP:127.0.0.1,DNS:localhost") -> None:
    # The serving certificates' subjectAltName comes from the environment (openssl.cnf reads it), so
    # one config serves the API server on loopback and a node's kubelet on its own address.
    env = {**os.environ, "FRSCOPE_SANS": sans}
    proc = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60, env=env
    )
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


@dataclass(frozen=True)
class Pki:
    """Paths of the certificates and keys under one directory."""

    dir: Path

    def path(self, name: str) -> Path:
        return self.dir / name

    @classmethod
    def create(cls, directory: Path, apiserver_sans: Sequence[str] = ()) -> Pki:
        """A CA, the API server's serving certificate (loopback plus `apiserver_sans`, e.g. "IP:10.0.0.1"),
        the admin's and the controller manager's client certificates, a service-account key pair."""
        directory.mkdir(parents=True)
        cnf = directory / "openssl.cnf"
        cnf.write_text(_OPENSSL_CNF)
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl(
            "req",
            "-x509",
            "-config",
            "openssl.cnf",
            "-extensions",
            "ca",
            *ec,
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "30",
            "-subj",
            "/CN=frscope-testenv-ca",
            cwd=directory,
        )
        pki = cls(directory)
        pki.leaf("apiserver", "/CN=kube-apiserver", server_sans=("IP:127.0.0.1", "DNS:localhost", *apiserver_sans))
        pki.leaf("admin", f"/O=system:masters/CN={ADMIN_USER}")
        pki.leaf("controller-manager", f"/CN={CONTROLLER_MANAGER_USER}")
        _openssl(
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            "sa.key",
            cwd=directory,
        )
        _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
        token = secrets.token_hex(24)
        (directory / "admin.token").write_text(token + "\n")
        (directory / "tokens.csv").write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        return pki

    def admin_token(self) -> str:
        return self.path("admin.token").read_text().strip()

    def leaf(self, name: str, subject: str, server_sans: Sequence[str] = ()) -> None:
        """`name`.key + `name`.crt signed by the CA: a client certificate for `subject` (its O= is the
        group Kubernetes sees), or a serving certificate for `server_sans` when any are given."""
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        sans = ",".join(server_sans) or "DNS:localhost"
        directory = self.dir
        _openssl(
            "req", "-new", "-config", "openssl.cnf", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", subject, cwd=directory,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-set_serial", str(secrets.randbits(63)), "-days", "30", "-extfile", "openssl.cnf",
            "-extensions", "server" if server_sans else "client", "-out", f"{name}.crt",
            cwd=directory, sans=sans,
        )  # fmt: skip


def write_kubeconfig(path: Path, server: str, pki: Pki, user: str, cert: str, context: str) -> None:
    """A kubeconfig with the CA and the client certificate embedded (JSON is valid kubeconfig YAML)."""

    def b64(name: str) -> str:
        return base64.b64encode(pki.path(name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "frscope-testenv",
                "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")},
            },
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(f"{cert}.crt"),
                    "client-key-data": b64(f"{cert}.key"),
                },
            },
        ],
        "contexts": [{"name": context, "context": {"cluster": "frscope-testenv", "user": user}}],
        "current-context": context,
        "preferences": {},
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)


def write_token_kubeconfig(path: Path, server: str, ca_file: Path, token: str, user: str) -> None:
    """A kubeconfig that authenticates with a bearer token (e.g. a service account's)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "frscope-testenv",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_file.read_bytes()).decode(),
                },
            },
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "frscope-testenv", "user": user}}],
        "current-context": user,
        "preferences": {},
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]


@dataclass
class ControlPlane:
    """A running control plane. `kubeconfig` is the admin's; `kubectl()` runs the built kubectl."""

    bin_dir: Path
    workdir: Path
    server: str
    kubeconfig: Path
    pki: Pki
    etcd_url: str
    controller_manager_url: str | None = None
    _processes: list[_Process] = field(default_factory=list)

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def ca_file(self) -> Path:
        return self.pki.path("ca.crt")

    @property
    def admin_token(self) -> str:
        return self.pki.admin_token()

    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in self._processes}

    def env(self) -> dict[str, str]:
        """os.environ with KUBECONFIG set and the built binaries first on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `kubectl --kubeconfig=<admin, or the one given> ARGS`; raises ControlPlaneError on failure
        if check."""
        cmd = [str(self.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False, env=self.env()
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def kubectl_json(self, *args: str, input: str | None = None) -> Any:
        """`kubectl ARGS -o json`, parsed."""
        return json.loads(self.kubectl(*args, "-o", "json", input=input).stdout)

    def apply(self, manifest: Any) -> Any:
        """Create or update one object (a dict) with `kubectl apply`; returns the stored object."""
        return self.kubectl_json("apply", "-f", "-", input=json.dumps(manifest))

    def write_token_kubeconfig(self, path: Path, token: str, user: str) -> Path:
        """A kubeconfig for this server that authenticates with `token` (e.g. a service account's)."""
        write_token_kubeconfig(path, self.server, self.ca_file, token, user)
        return path

    def get_raw(self, path: str) -> Any:
        """GET a path on the API server with the admin token (urllib, no kubectl); parsed JSON."""
        return _https_json(self.server + path, ca_file=self.ca_file, token=self.admin_token)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        token: str | None = None,
    ) -> tuple[int, dict[str, list[str]], Any]:
        """One HTTP request the way a plain Python client makes it (admin token unless given).

        Returns (status, headers as name -> values, parsed JSON body); HTTP errors are returned, not raised.
        """
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.admin_token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        context = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(req, context=context, timeout=30) as response:
                status, raw_headers, payload = response.status, response.headers, response.read()
        except urllib.error.HTTPError as e:
            status, raw_headers, payload = e.code, e.headers, e.read()
            e.close()
        headers: dict[str, list[str]] = {}
        for name, value in raw_headers.items():
            headers.setdefault(name.lower(), []).append(value)
        return status, headers, json.loads(payload) if payload else None

    def check_alive(self) -> None:
        for p in self._processes:
            if p.popen.poll() is not None:
                raise ControlPlaneError(
                    f"{p.name} (pid {p.popen.pid}) exited with {p.popen.returncode}; "
                    f"last log lines:\n{_tail(p.log_path)}"
                )

    def _spawn(self, name: str, args: Sequence[str]) -> _Process:
        log_path = self.logs_dir / f"{name}.log"
        log_file = log_path.open("ab")
        log_file.write(f"$ {' '.join(args)}\n".encode())
        log_file.flush()
        popen = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            start_new_session=True,
            preexec_fn=_PREEXEC,
        )
        proc = _Process(name, popen, log_path, log_file)
        self._processes.append(proc)
        return proc

    def stop(self, keep_logs_in: Path | None = None) -> Path | None:
        """Stop every started process by PID, newest first; remove the work directory.

        With keep_logs_in, the logs (and kubeconfig) are copied there first; returns that copy.
        """
        for p in reversed(self._processes):
            _terminate(p.popen)
            p.log_file.close()
        self._processes.clear()
        kept: Path | None = None
        if keep_logs_in is not None and self.logs_dir.is_dir():
            keep_logs_in.mkdir(parents=True, exist_ok=True)
            kept = Path(tempfile.mkdtemp(prefix="testenv-", dir=keep_logs_in))
            shutil.copytree(self.logs_dir, kept, dirs_exist_ok=True)
            if self.kubeconfig.exists():
                shutil.copy2(self.kubeconfig, kept / "kubeconfig")
        shutil.rmtree(self.workdir, ignore_errors=True)
        return kept


def _terminate(popen: subprocess.Popen[bytes], grace: float = 15) -> None:
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(grace)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(grace)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


def _https_json(url: str, *, ca_file: Path | None, token: str | None = None, timeout: float = 5) -> Any:
    if ca_file is None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cafile=str(ca_file))
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, context=context, timeout=timeout) as response:
        body = response.read()
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


def _wait_until(what: str, proc: _Process | None, probe: Any, timeout: float) -> None:
    """Call probe() until it returns truthy; fail early if proc exits, late with its log tail."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise ControlPlaneError(
                f"{proc.name} exited with {proc.popen.returncode} while waiting for {what}; "
                f"last log lines:\n{_tail(proc.log_path)}"
            )
        try:
            if probe():
                return
        except (OSError, urllib.error.URLError, ssl.SSLError, ValueError) as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.25)
    tail = _tail(proc.log_path) if proc is not None else ""
    raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what} ({last})\n{tail}")


def start(
    bin_dir: Path,
    *,
    crds: Sequence[Path] = (),
    controller_manager: bool = True,
    workdir: Path | None = None,
    timeout: float = 90,
    address: str = "127.0.0.1",
    service_cidr: str = "10.0.0.0/24",
    apiserver_sans: Sequence[str] = (),
    apiserver_args: Sequence[str] = (),
    pki_leaves: Sequence[tuple[str, str, Sequence[str]]] = (),
) -> ControlPlane:
    """Start etcd, kube-apiserver and (by default) kube-controller-manager; returns when all are ready.

    `address`: where the API server listens and what it advertises (the `kubernetes` Service's
    endpoint, which may not be loopback once pods use it; testenv/node.py passes the node's address).
    `apiserver_sans` and `apiserver_args` add to its certificate and command line; `pki_leaves` are
    more certificates signed by the CA, (name, subject, serving SANs) as Pki.leaf takes them.

    On any failure everything started so far is stopped and the logs are left in the work
    directory, whose path is in the error.
    """
    bin_dir = Path(bin_dir)
    for exe in ("etcd", "kube-apiserver", "kubectl") + (("kube-controller-manager",) if controller_manager else ()):
        if not os.access(bin_dir / exe, os.X_OK):
            raise ControlPlaneError(f"{bin_dir / exe} is missing; run testenv/build")
    if shutil.which("openssl") is None:
        raise ControlPlaneError("openssl is needed to make the control plane's certificates")
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="frscope-testenv-", dir=_scratch_parent()))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "logs").mkdir(exist_ok=True)
    pki = Pki.create(workdir / "pki", apiserver_sans=apiserver_sans)
    for name, subject, sans in pki_leaves:
        pki.leaf(name, subject, server_sans=sans)

    etcd_client, etcd_peer, apiserver_port = free_port(), free_port(), free_port()
    server = f"https://{address}:{apiserver_port}"
    plane = ControlPlane(
        bin_dir=bin_dir,
        workdir=workdir,
        server=server,
        kubeconfig=workdir / "kubeconfig",
        pki=pki,
        etcd_url=f"http://127.0.0.1:{etcd_client}",
    )
    try:
        _start_etcd(plane, etcd_client, etcd_peer, timeout)
        _start_apiserver(plane, address, apiserver_port, service_cidr, apiserver_args, timeout)
        write_kubeconfig(plane.kubeconfig, server, pki, ADMIN_USER, "admin", "frscope-testenv")
        if crds:
            install_crds(plane, crds)
        if controller_manager:
            _start_controller_manager(plane, timeout)
    except BaseException as e:
        for p in reversed(plane._processes):
            _terminate(p.popen)
            p.log_file.close()
        plane._processes.clear()
        if isinstance(e, ControlPlaneError):
            raise ControlPlaneError(f"{e}\n(logs kept in {plane.logs_dir})") from e
        raise
    return plane


def _start_etcd(plane: ControlPlane, client_port: int, peer_port: int, timeout: float) -> None:
    peer = f"http://127.0.0.1:{peer_port}"
    proc = plane._spawn(
        "etcd",
        [
            str(plane.bin_dir / "etcd"),
            "--name=default",
            f"--data-dir={plane.workdir / 'etcd'}",
            f"--listen-client-urls={plane.etcd_url}",
            f"--advertise-client-urls={plane.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ],
    )

    def healthy() -> bool:
        with urllib.request.urlopen(plane.etcd_url + "/health", timeout=2) as r:
            return bool(json.loads(r.read()).get("health") == "true")

    _wait_until("etcd /health", proc, healthy, timeout)


def _start_apiserver(
    plane: ControlPlane, address: str, port: int, service_cidr: str, extra: Sequence[str], timeout: float
) -> None:
    pki = plane.pki
    proc = plane._spawn(
        "kube-apiserver",
        [
            str(plane.bin_dir / "kube-apiserver"),
            f"--etcd-servers={plane.etcd_url}",
            f"--bind-address={address}",
            f"--advertise-address={address}",
            f"--secure-port={port}",
            f"--cert-dir={pki.dir}",
            f"--tls-cert-file={pki.path('apiserver.crt')}",
            f"--tls-private-key-file={pki.path('apiserver.key')}",
            f"--client-ca-file={pki.path('ca.crt')}",
            f"--token-auth-file={pki.path('tokens.csv')}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.path('sa.pub')}",
            f"--service-account-signing-key-file={pki.path('sa.key')}",
            f"--service-cluster-ip-range={service_cidr}",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
            *extra,
        ],
    )

    def ready() -> bool:
        body = _https_json(plane.server + "/readyz", ca_file=pki.path("ca.crt"), token=pki.admin_token())
        return bool(body == "ok")

    _wait_until("kube-apiserver /readyz", proc, ready, timeout)


def _start_controller_manager(plane: ControlPlane, timeout: float) -> None:
    pki = plane.pki
    kubeconfig = plane.workdir / "controller-manager.kubeconfig"
    write_kubeconfig(kubeconfig, plane.server, pki, CONTROLLER_MANAGER_USER, "controller-manager", "kcm")
    port = free_port()
    (plane.workdir / "controller-manager-certs").mkdir(exist_ok=True)
    proc = plane._spawn(
        "kube-controller-manager",
        [
            str(plane.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={plane.workdir / 'controller-manager-certs'}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.path('sa.key')}",
            f"--root-ca-file={pki.path('ca.crt')}",
            f"--cluster-signing-cert-file={pki.path('ca.crt')}",
            f"--cluster-signing-key-file={pki.path('ca.key')}",
            "--profiling=false",
            "--v=1",
        ],
    )
    plane.controller_manager_url = f"https://127.0.0.1:{port}"

    def healthy() -> bool:
        return bool(_https_json(f"{plane.controller_manager_url}/healthz", ca_file=None) == "ok")

    _wait_until("kube-controller-manager /healthz", proc, healthy, timeout)


def install_crds(plane: ControlPlane, crds: Sequence[Path], timeout: float = 60) -> list[str]:
    """Apply CRD manifests (server-side, they are large) and wait until each is Established.

    Polls instead of `kubectl wait`, which errors out (instead of waiting) while a brand-new CRD has
    no status conditions yet.
    """
    names: list[str] = []
    for crd in crds:
        applied = plane.kubectl_json("apply", "--server-side", "--field-manager=frscope-testenv", "-f", str(crd))
        items = applied.get("items", [applied])
        names.extend(item["metadata"]["name"] for item in items)

    def established() -> bool:
        listed = plane.kubectl_json("get", "crd", *names)
        items = listed.get("items", [listed])
        ready = {
            item["metadata"]["name"]
            for item in items
            for c in item.get("status", {}).get("conditions") or []
            if c.get("type") == "Established" and c.get("status") == "True"
        }
        return ready >= set(names)

    if names:
        _wait_until(f"CRDs Established: {', '.join(names)}", None, established, timeout)
    return names


@contextlib.contextmanager
def running(bin_dir: Path, **kwargs: Any) -> Iterator[ControlPlane]:
    plane = start(bin_dir, **kwargs)
    try:
        yield plane
    finally:
        plane.stop()


def _up(args: argparse.Namespace) -> int:
    bin_dir = Path(args.bin_dir)
    crds = [Path(c) for c in args.crd]
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print("starting etcd, kube-apiserver and kube-controller-manager ...", file=sys.stderr, flush=True)
    plane = start(bin_dir, crds=crds, controller_manager=not args.no_controller_manager)
    try:
        version = plane.get_raw("/version").get("gitVersion")
        print(f"Kubernetes {version} at {plane.server}; work dir {plane.workdir}", file=sys.stderr)
        print(f"processes: {plane.pids()}; logs in {plane.logs_dir}", file=sys.stderr)
        print("In another shell:", file=sys.stderr)
        print(f"export KUBECONFIG={plane.kubeconfig}")
        print(f'export PATH="{plane.bin_dir}:$PATH"', flush=True)
        print("Ctrl-C stops it and removes the work dir.", file=sys.stderr, flush=True)
        while not stop:
            plane.check_alive()
            time.sleep(0.5)
    finally:
        print("stopping ...", file=sys.stderr, flush=True)
        plane.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testenv/cluster.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a control plane in the foreground until Ctrl-C")
    up.add_argument("--bin-dir", required=True, help="the directory testenv/build printed")
    up.add_argument("--crd", action="append", default=[], help="a CRD manifest to install (repeatable)")
    up.add_argument("--no-controller-manager", action="store_true")
    args = parser.parse_args(argv)
    try:
        return _up(args)
    except ControlPlaneError as e:
        print(f"testenv: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
