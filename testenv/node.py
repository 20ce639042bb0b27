"""A real one-node Kubernetes cluster: testenv's control plane plus a kubelet that runs pods.

Standard library only, like cluster.py (which it extends). Needs root and cgroups; the binaries come
from `testenv/build`, the images from `testenv/images`, containerd, runc and the CNI plugins from
Debian (`make deps-apt`).

What runs (docs/testenv.md has the why of each setting):
- the network: a bridge `frscope0` with the node's own address 10.213.0.1/24, made before anything
  starts (the CNI bridge plugin reuses it; pods get 10.213.0.10-250). Services are 10.214.0.0/24,
  routed onto the bridge. IPv4 forwarding is switched on for the bridge's traffic only: a FORWARD
  rule drops anything that would leave or enter through another interface, and there is no
  masquerading, so nothing reaches or comes from outside the machine;
- etcd, kube-apiserver (on the node address, so the `kubernetes` Service has a usable endpoint and
  it can reach the kubelet), kube-controller-manager (cluster.py);
- containerd with its own config, socket, state (work dir) and root (a cache dir, so imported images
  survive between runs), `restrict_oom_score_adj = true` (this VM refuses a negative oom_score_adj),
  runc with cgroupfs; the images are imported with `ctr -n k8s.io images import`;
- kubelet (cgroupfs, cgroup v1 allowed, its cgroups under /frscope-node, its root and pod logs in
  the work dir), kube-scheduler, kube-proxy (iptables mode, rules only for the cluster's ranges),
  CoreDNS on the node address (the pods' nameserver), and the Kubeflow training operator deployed
  from its own kustomize manifests (its webhook certificate managed by itself, as upstream does).

`stop()` ends what it started by PID, kills what is left in its cgroups (the containers), unmounts
everything under its directories, deletes the bridge, restores iptables and the sysctls it or the
kubelet changed, and removes the work dir.

    python3 testenv/node.py up [--background]    (`make cluster-node`; prints `export KUBECONFIG=...` last)
    python3 testenv/node.py down                 (`make cluster-node-down`)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent

NODE_NAME = "frscope-node"
BRIDGE = "frscope0"
POD_CIDR = "10.213.0.0/24"
NODE_IP = "10.213.0.1"
SERVICE_CIDR = "10.214.0.0/24"
SERVICE_API_IP = "10.214.0.1"  # the `kubernetes` Service: the first address of the range
CLUSTER_DOMAIN = "cluster.local"
CGROUP_ROOT = "frscope-node"
CNI_NETWORK = "frscope-node"
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
FORWARD_CHAIN = "FRSCOPE-NODE-FWD"
# Sysctls this module or the kubelet (its kernel tunables) change; restored on stop.
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
    "net/ipv4/conf/all/route_localnet",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Image names as the kubelet asks for them (short names are docker.io/...).
PAUSE_IMAGE = "docker.io/frscope-testenv/pause:3.10.2"
INIT_IMAGE = "docker.io/frscope-testenv/init:dev"
TRAINING_OPERATOR_IMAGE = "docker.io/frscope-testenv/training-operator:v1.8.1"
STATE_FILE = "node-up.json"


def _load_sibling(name: str, file: str) -> ModuleType:
    # The same module object the e2e conftest loads, so ControlPlaneError is one class.
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


cluster = _load_sibling("frscope_testenv_cluster", "cluster.py")
oci = _load_sibling("frscope_testenv_registry", "registry.py")
CHART_DIR = HERE.parent / "charts" / "frscope"
NodeError = cluster.ControlPlaneError


def cache_root() -> Path:
    base = os.environ.get("FRSCOPE_TESTENV_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "frscope-testenv"
    )
    return Path(base)


def cannot_run_reason() -> str | None:
    """Why this machine cannot run a node at all (None when it can): what the tests skip on."""
    if not sys.platform.startswith("linux"):
        return "the node needs Linux"
    if os.geteuid() != 0:
        return "the node needs root (containerd, runc, network and cgroup setup)"
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "no cgroups mounted at /sys/fs/cgroup"
    return None


def _run(*args: str, check: bool = True, timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False, timeout=timeout, **kwargs)
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name


def _read_sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = _sysctl_path(name).read_text().strip()
    return values


def _write_sysctl(name: str, value: str) -> None:
    _sysctl_path(name).write_text(value + "\n")


def _cgroup_hierarchies() -> list[Path]:
    """Every cgroup v1 hierarchy the kubelet's cgroupfs driver creates pod cgroups in."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists())


def _make_cgroup_root() -> None:
    for hierarchy in _cgroup_hierarchies():
        path = hierarchy / CGROUP_ROOT
        path.mkdir(exist_ok=True)
        # cgroup v1 cpuset: a new group starts with no CPUs and no memory nodes; inherit the parent's.
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((hierarchy / knob).read_text())


def _cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for hierarchy in _cgroup_hierarchies():
        for procs in (hierarchy / CGROUP_ROOT).rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(line) for line in procs.read_text().split())
    return pids


def _remove_cgroup_root() -> None:
    for hierarchy in _cgroup_hierarchies():
        top = hierarchy / CGROUP_ROOT
        if not top.is_dir():
            continue
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _pids_with_arg(arg: str) -> set[int]:
    """PIDs whose command line contains exactly `arg` (e.g. our containerd socket: its shims)."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if arg.encode() in (entry / "cmdline").read_bytes().split(b"\0"):
                found.add(int(entry.name))
    return found


def _kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)


def _mounts_under(prefixes: Sequence[str]) -> list[str]:
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
            mounts.append(point)
    # Deepest first.
    return sorted(set(mounts), key=lambda p: -p.count("/"))


def _unmount_under(prefixes: Sequence[str]) -> None:
    for _ in range(3):
        points = _mounts_under(prefixes)
        if not points:
            return
        for point in points:
            if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _netns_files() -> set[str]:
    # Resolved: /var/run is a link to /run, and /proc/self/mountinfo names the real paths.
    netns = Path("/var/run/netns").resolve()
    return {str(p) for p in netns.iterdir()} if netns.is_dir() else set()


@dataclass
class Cleanup:
    """Everything stop() needs to undo, also written to disk so `down` can undo a crashed `up`."""

    workdir: str
    containerd_root: str
    containerd_socket: str
    sysctls: dict[str, str]
    iptables_save: dict[str, str]
    netns_before: list[str]
    pids: list[int] = field(default_factory=list)

    def undo(self, bin_dir: Path | None = None) -> list[str]:
        """Best effort, every step tried; returns what failed."""
        problems: list[str] = []
        _kill_all({p for p in self.pids if Path(f"/proc/{p}").exists()})
        # The containers and their shims outlive the kubelet and containerd.
        _kill_all(_cgroup_pids() | _pids_with_arg(self.containerd_socket))
        new_netns = sorted(_netns_files() - set(self.netns_before))
        _unmount_under([self.workdir, self.containerd_root, *new_netns])
        for ns in new_netns:
            with contextlib.suppress(OSError):
                os.unlink(ns)
        _remove_cgroup_root()
        for results in Path("/var/lib/cni/results").glob(f"{CNI_NETWORK}-*"):
            with contextlib.suppress(OSError):
                results.unlink()
        if Path(f"/sys/class/net/{BRIDGE}").exists():
            if _run("ip", "link", "delete", BRIDGE, check=False).returncode != 0:
                problems.append(f"could not delete the bridge {BRIDGE}")
        for tool, saved in self.iptables_save.items():
            # Tables that were empty before are not in the snapshot: emptied; the others restored.
            before = {line[1:].strip() for line in saved.splitlines() if line.startswith("*")}
            for table in ("filter", "nat", "mangle", "raw"):
                if table not in before:
                    _run(tool, "-t", table, "-F", check=False)
                    _run(tool, "-t", table, "-X", check=False)
            if saved and _run(f"{tool}-restore", input=saved, check=False).returncode != 0:
                problems.append(f"{tool}-restore failed")
        if _run("iptables-save", check=False).stdout.count(":KUBE-") > self.iptables_save["iptables"].count(":KUBE-"):
            problems.append("kube-proxy's or the kubelet's iptables chains are left")
        for name, value in self.sysctls.items():
            try:
                if _sysctl_path(name).read_text().strip() != value:
                    _write_sysctl(name, value)
            except OSError as e:
                problems.append(f"sysctl {name}: {e}")
        if _mounts_under([self.workdir, self.containerd_root]):
            problems.append(f"still mounted: {_mounts_under([self.workdir, self.containerd_root])}")
        return problems


@dataclass
class Node:
    """A running one-node cluster: `.plane` is the control plane (cluster.ControlPlane: kubectl(),
    kubeconfig, ...); `.images` the image names on the node."""

    plane: Any
    workdir: Path
    cleanup: Cleanup
    containerd_socket: Path
    images: list[str] = field(default_factory=list)
    # The OCI registry (testenv/registry.py) with the frscope image and chart pushed, when started with one.
    registry: Any = None
    _processes: list[Any] = field(default_factory=list)
    _root_lock: Any = None

    @property
    def kubeconfig(self) -> Path:
        return Path(self.plane.kubeconfig)

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.plane.kubectl(*args, **kwargs)  # type: ignore[no-any-return]

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return _run("ctr", f"--address={self.containerd_socket}", "--namespace=k8s.io", *args, timeout=timeout)

    def import_images(self, archives: Sequence[Path]) -> list[str]:
        """Import image archives made after the start (once per containerd root); returns the images."""
        self.images = _import_images(self, Path(self.cleanup.containerd_root), archives)
        return self.images

    def pids(self) -> dict[str, int]:
        return {**self.plane.pids(), **{p.name: p.popen.pid for p in self._processes}}

    def check_alive(self) -> None:
        self.plane.check_alive()
        for p in self._processes:
            if p.popen.poll() is not None:
                raise NodeError(f"{p.name} exited with {p.popen.returncode}:\n{cluster._tail(p.log_path)}")

    def _spawn(self, name: str, args: Sequence[str], env: dict[str, str] | None = None) -> Any:
        proc = self.plane._spawn(name, args) if env is None else _spawn_env(self.plane, name, args, env)
        # Node processes are stopped by Node.stop(), in their own order, not by the control plane's.
        self.plane._processes.remove(proc)
        self._processes.append(proc)
        self.cleanup.pids.append(proc.popen.pid)
        return proc

    def keep_logs(self, parent: Path) -> Path:
        """Copy the logs and configs (not the pod volumes) to a new directory under `parent`."""
        parent.mkdir(parents=True, exist_ok=True)
        kept = Path(tempfile.mkdtemp(prefix="node-", dir=parent))
        shutil.copytree(self.plane.logs_dir, kept / "logs", dirs_exist_ok=True)
        if (self.workdir / "pod-logs").is_dir():
            shutil.copytree(self.workdir / "pod-logs", kept / "pod-logs", dirs_exist_ok=True, symlinks=True)
        for conf in self.workdir.glob("*.json"):
            shutil.copy2(conf, kept)
        return kept

    def stop(self, keep_logs_in: Path | None = None) -> list[str]:
        """Stop everything; returns the cleanup steps that failed (empty when all was undone)."""
        for p in reversed(self._processes):
            cluster._terminate(p.popen, grace=10)
            p.log_file.close()
        self._processes.clear()
        problems = self.cleanup.undo()
        if self._root_lock is not None:
            self._root_lock.close()
        self.plane.stop(keep_logs_in=keep_logs_in)
        return problems


def _spawn_env(plane: Any, name: str, args: Sequence[str], env: dict[str, str]) -> Any:
    log_path = plane.logs_dir / f"{name}.log"
    log_file = log_path.open("ab")
    popen = subprocess.Popen(
        list(args),
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=plane.workdir,
        start_new_session=True,
        preexec_fn=cluster._PREEXEC,
        env=env,
    )
    proc = cluster._Process(name, popen, log_path, log_file)
    plane._processes.append(proc)
    return proc


def _free_port() -> int:
    port: int = cluster.free_port()
    return port


def _yaml(obj: Any) -> str:
    # JSON is YAML: every config file here is written as JSON.
    return json.dumps(obj, indent=2) + "\n"


def _containerd_root() -> tuple[Path, Any]:
    """The persistent containerd root (images survive between runs), locked for this run; a fresh one
    in the work dir when another node holds it."""
    root = cache_root() / "node" / "containerd-root"
    root.mkdir(parents=True, exist_ok=True)
    lock = (root.parent / "containerd-root.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return Path(tempfile.mkdtemp(prefix="containerd-root-", dir=cache_root() / "node")), None
    return root, lock


def _cni_bin_dir() -> str:
    for d in CNI_BIN_DIRS:
        if Path(d, "bridge").exists():
            return d
    raise NodeError(f"no CNI plugins in {' or '.join(CNI_BIN_DIRS)}: install containernetworking-plugins")


def start(
    bin_dir: Path,
    image_archives: Sequence[Path],
    *,
    crds: Sequence[Path] = (),
    timeout: float = 180,
    registry_bin: Path | None = None,
) -> Node:
    """Start the control plane and the node; returns when the node is Ready, CoreDNS answers and the
    training operator is Available. On failure everything is undone (logs kept in the error's dir).

    With `registry_bin` (testenv/build-registry's binary) an OCI registry runs on the node's address
    (`node.registry`): the frscope image archive is pushed to it instead of imported, and so is the chart;
    containerd trusts its CA. The other archives are imported."""
    reason = cannot_run_reason()
    if reason:
        raise NodeError(reason)
    for exe in ("containerd", "runc", "ctr", "iptables", "ip"):
        if shutil.which(exe) is None:
            raise NodeError(f"{exe} is not installed (make deps-apt)")
    cni_bin = _cni_bin_dir()
    for exe in ("kubelet", "kube-scheduler", "kube-proxy", "coredns", "training-operator"):
        if not os.access(bin_dir / exe, os.X_OK):
            raise NodeError(f"{bin_dir / exe} is missing; run testenv/build")
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        raise NodeError(f"{BRIDGE} exists: another node is running (or a crashed one: make cluster-node-down)")

    workdir = Path(tempfile.mkdtemp(prefix="frscope-node-", dir=cluster._scratch_parent()))
    containerd_root, root_lock = _containerd_root()
    socket_path = workdir / "containerd" / "containerd.sock"
    cleanup = Cleanup(
        workdir=str(workdir),
        containerd_root=str(containerd_root),
        containerd_socket=str(socket_path),
        sysctls=_read_sysctls(),
        iptables_save={t: _run(f"{t}-save", check=False).stdout for t in ("iptables", "ip6tables")},
        netns_before=sorted(_netns_files()),
    )
    (workdir / "cleanup.json").write_text(json.dumps(cleanup.__dict__))
    plane = None
    node = None
    try:
        _setup_network()
        plane = cluster.start(
            bin_dir,
            crds=crds,
            workdir=workdir,
            timeout=timeout,
            address=NODE_IP,
            service_cidr=SERVICE_CIDR,
            apiserver_sans=(
                f"IP:{NODE_IP}",
                f"IP:{SERVICE_API_IP}",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                f"DNS:kubernetes.default.svc.{CLUSTER_DOMAIN}",
            ),
            apiserver_args=(
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={workdir / 'pki' / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={workdir / 'pki' / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={workdir / 'pki' / 'ca.crt'}",
            ),
            pki_leaves=_node_leaves(),
        )
        node = Node(plane=plane, workdir=workdir, cleanup=cleanup, containerd_socket=socket_path, _root_lock=root_lock)
        registry, hosts_dir = oci.prepare(cluster, workdir, NODE_IP) if registry_bin is not None else (None, None)
        _start_containerd(node, containerd_root, cni_bin, timeout, hosts_dir)
        (workdir / "cleanup.json").write_text(json.dumps(cleanup.__dict__))
        pushed = [a for a in image_archives if a.name.startswith(oci.FRSCOPE_ARCHIVE_PREFIX)] if registry else []
        node.images = _import_images(node, containerd_root, [a for a in image_archives if a not in pushed])
        if registry is not None and registry_bin is not None:
            if len(pushed) != 1:
                raise NodeError(f"expected one {oci.FRSCOPE_ARCHIVE_PREFIX}*.tar archive to push, got {pushed}")
            try:
                oci.start(registry, cluster, node._spawn, registry_bin, timeout)
                oci.publish(registry, pushed[0], bin_dir / "helm", CHART_DIR)
            except oci.RegistryError as e:
                raise NodeError(str(e)) from e
            node.registry = registry
        _start_kubelet(node, bin_dir, timeout)
        _start_scheduler(node, bin_dir, timeout)
        _start_kube_proxy(node, bin_dir, timeout)
        _start_coredns(node, bin_dir, timeout)
        (workdir / "cleanup.json").write_text(json.dumps(cleanup.__dict__))
        _deploy_training_operator(node, bin_dir, timeout)
        return node
    except BaseException as e:
        kept = None
        failed_logs = cache_root() / "node" / "failed-logs"
        if node is not None:
            kept = node.keep_logs(failed_logs)
            node.stop()
        elif plane is not None:
            cleanup.undo()
            kept = plane.stop(keep_logs_in=failed_logs)
        else:
            cleanup.undo()
            shutil.rmtree(workdir, ignore_errors=True)
            if root_lock is not None:
                root_lock.close()
        if isinstance(e, NodeError):
            raise NodeError(f"{e}\n(logs kept in {kept})") from e
        raise


def _node_leaves() -> list[tuple[str, str, tuple[str, ...]]]:
    """(name, subject, serving SANs) of the node's certificates; the groups are those the bootstrap
    RBAC policy and the Node authorizer know."""
    return [
        ("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", ()),
        ("kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}", ()),
        ("kubelet-serving", f"/CN={NODE_NAME}", (f"IP:{NODE_IP}", f"DNS:{NODE_NAME}")),
        ("kube-scheduler", "/CN=system:kube-scheduler", ()),
        ("kube-proxy", "/CN=system:kube-proxy", ()),
        ("coredns", "/CN=frscope-testenv:coredns", ()),
    ]


def _kubeconfig_for(node: Node, name: str, user: str) -> Path:
    path = node.workdir / f"{name}.kubeconfig"
    cluster.write_kubeconfig(path, node.plane.server, node.plane.pki, user, name, name)
    return path


def _setup_network() -> None:
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    # Locally started clients (the API server calling a webhook) pick the node address as source.
    _run("ip", "route", "add", SERVICE_CIDR, "dev", BRIDGE, "src", NODE_IP)
    # Pod -> Service -> pod on the same bridge is routed (DNAT) and needs forwarding; bridged packets
    # must pass iptables for kube-proxy's rules. Only the bridge may forward: nothing leaves the machine.
    _run("iptables", "-N", FORWARD_CHAIN)
    _run("iptables", "-A", FORWARD_CHAIN, "-i", BRIDGE, "-o", BRIDGE, "-j", "RETURN")
    _run("iptables", "-A", FORWARD_CHAIN, "-i", BRIDGE, "-j", "DROP")
    _run("iptables", "-A", FORWARD_CHAIN, "-o", BRIDGE, "-j", "DROP")
    _run("iptables", "-I", "FORWARD", "1", "-j", FORWARD_CHAIN)
    _write_sysctl("net/bridge/bridge-nf-call-iptables", "1")
    _write_sysctl("net/ipv4/ip_forward", "1")
    _make_cgroup_root()


def _start_containerd(node: Node, root: Path, cni_bin: str, timeout: float, hosts_dir: Path | None = None) -> None:
    state = node.workdir / "containerd"
    conf_dir = node.workdir / "cni"
    conf_dir.mkdir()
    (conf_dir / "10-frscope-node.conflist").write_text(
        _yaml(
            {
                "cniVersion": "1.0.0",
                "name": CNI_NETWORK,
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": BRIDGE,
                        "isGateway": True,
                        "ipMasq": False,  # nothing is translated to leave the machine
                        "hairpinMode": True,  # a pod reaching itself through its Service
                        "ipam": {
                            "type": "host-local",
                            "dataDir": str(node.workdir / "cni-ipam"),
                            "ranges": [[{"subnet": POD_CIDR, "rangeStart": "10.213.0.10", "gateway": NODE_IP}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}},
                ],
            }
        )
    )
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    # The registries' hosts directory (<host>/hosts.toml: its address, the CA to trust), testenv/registry.py.
    registry = f'  [{cri}.registry]\n    config_path = "{hosts_dir}"\n' if hosts_dir is not None else ""
    config = f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{node.containerd_socket}"
[ttrpc]
  address = "{state}/containerd.sock.ttrpc"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # This VM refuses a negative oom_score_adj: without this every sandbox fails with runc's
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{conf_dir}"
{registry}[plugins."io.containerd.internal.v1.opt"]
  path = "{state}/opt"
"""
    config_path = node.workdir / "containerd.toml"
    config_path.write_text(config)
    proc = node._spawn("containerd", ["containerd", f"--config={config_path}", "--log-level=info"])

    def serving() -> bool:
        return node.containerd_socket.exists() and _run(
            "ctr", f"--address={node.containerd_socket}", "version", check=False, timeout=10
        ).returncode == 0

    cluster._wait_until("containerd's socket", proc, serving, timeout)


def _import_images(node: Node, root: Path, archives: Sequence[Path]) -> list[str]:
    """`ctr images import` each archive once per containerd root (a marker file per archive, whose
    name carries the hash of its inputs); returns the image names on the node."""
    marker_dir = root / "frscope-imported"
    marker_dir.mkdir(exist_ok=True)
    for archive in archives:
        marker = marker_dir / archive.name
        if marker.exists():
            continue
        node.ctr("images", "import", "--no-unpack=false", str(archive), timeout=900)
        marker.touch()
    listed = node.ctr("images", "list", "--quiet").stdout.split()
    return sorted(n for n in listed if not n.startswith("sha256:"))


def _start_kubelet(node: Node, bin_dir: Path, timeout: float) -> None:
    pki = node.plane.pki
    root_dir = node.workdir / "kubelet"
    root_dir.mkdir()
    resolv = node.workdir / "resolv.conf"
    resolv.write_text("")  # pods get only the cluster's nameserver and search path, not the host's
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": _free_port(),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": _free_port(),
        "tlsCertFile": str(pki.path("kubelet-serving.crt")),
        "tlsPrivateKeyFile": str(pki.path("kubelet-serving.key")),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.path("ca.crt"))},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "failCgroupV1": False,  # this machine has cgroup v1 only
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        "podLogsDir": str(node.workdir / "pod-logs"),
        "clusterDNS": [NODE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(resolv),
        "staticPodPath": "",
        "registerNode": True,
        "serializeImagePulls": False,
        # Imported images cannot be pulled again (only frscope's is in the registry): nothing may
        # garbage-collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "shutdownGracePeriod": "0s",
    }
    config_path = node.workdir / "kubelet-config.json"
    config_path.write_text(_yaml(config))
    kubeconfig = _kubeconfig_for(node, "kubelet", f"system:node:{NODE_NAME}")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = node._spawn(
        "kubelet",
        [
            str(bin_dir / "kubelet"),
            f"--config={config_path}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={root_dir}",
            f"--cert-dir={root_dir / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            "--v=1",
        ],
        env=env,
    )

    def ready() -> bool:
        got = node.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if got.returncode != 0:
            return False
        conditions = json.loads(got.stdout).get("status", {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    cluster._wait_until(f"node {NODE_NAME} Ready", proc, ready, timeout)


def _start_scheduler(node: Node, bin_dir: Path, timeout: float) -> None:
    kubeconfig = _kubeconfig_for(node, "kube-scheduler", "system:kube-scheduler")
    port = _free_port()
    proc = node._spawn(
        "kube-scheduler",
        [
            str(bin_dir / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--leader-elect=false",
            "--v=1",
        ],
    )
    cluster._wait_until(
        "kube-scheduler /healthz",
        proc,
        lambda: cluster._https_json(f"https://127.0.0.1:{port}/healthz", ca_file=None) == "ok",
        timeout,
    )


def _start_kube_proxy(node: Node, bin_dir: Path, timeout: float) -> None:
    kubeconfig = _kubeconfig_for(node, "kube-proxy", "system:kube-proxy")
    healthz = _free_port()
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "detectLocalMode": "ClusterCIDR",
        # NodePorts only on the node's own address, never on the machine's other interfaces.
        "nodePortAddresses": [f"{NODE_IP}/32"],
        "healthzBindAddress": f"127.0.0.1:{healthz}",
        "metricsBindAddress": f"127.0.0.1:{_free_port()}",
        # Leave the machine's conntrack table size alone.
        "conntrack": {"maxPerCore": 0, "min": 0},
        "iptables": {"syncPeriod": "10s", "minSyncPeriod": "0s"},
    }
    config_path = node.workdir / "kube-proxy-config.json"
    config_path.write_text(_yaml(config))
    proc = node._spawn("kube-proxy", [str(bin_dir / "kube-proxy"), f"--config={config_path}", "--v=1"])

    def healthy() -> bool:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{healthz}/healthz", timeout=2) as r:
            return bool(r.status == 200)

    cluster._wait_until("kube-proxy /healthz", proc, healthy, timeout)


_COREDNS_RBAC = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "frscope-testenv:coredns"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "frscope-testenv:coredns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "frscope-testenv:coredns"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "frscope-testenv:coredns"}],
    },
]


def _start_coredns(node: Node, bin_dir: Path, timeout: float) -> None:
    """CoreDNS on the node address: the nameserver the kubelet gives every pod (clusterDNS)."""
    for obj in _COREDNS_RBAC:
        node.plane.apply(obj)
    kubeconfig = _kubeconfig_for(node, "coredns", "frscope-testenv:coredns")
    ready_port = _free_port()
    corefile = node.workdir / "Corefile"
    corefile.write_text(
        f""".:53 {{
    bind {NODE_IP}
    errors
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} coredns
        pods insecure
        ttl 5
    }}
    cache 5
}}
"""
    )
    proc = node._spawn("coredns", [str(bin_dir / "coredns"), "-conf", str(corefile)])

    def ready() -> bool:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{ready_port}/ready", timeout=2) as r:
            return bool(r.status == 200)

    cluster._wait_until("CoreDNS /ready", proc, ready, timeout)


def _deploy_training_operator(node: Node, bin_dir: Path, timeout: float) -> None:
    """The Kubeflow training operator's own standalone kustomize overlay (from its Go module, copied
    into testenv's cache by testenv/build), with the image built here and the init container image
    (upstream: alpine) pointed at the init image built here."""
    manifests = bin_dir.parent / "manifests" / "training-operator"
    if not (manifests / "overlays" / "standalone").is_dir():
        raise NodeError(f"{manifests} has no overlays/standalone; testenv/build did not finish")
    overlay = node.workdir / "training-operator"
    shutil.copytree(manifests, overlay / "upstream")
    name, tag = TRAINING_OPERATOR_IMAGE.rsplit(":", 1)
    patch = [
        {"op": "add", "path": "/spec/template/spec/containers/0/imagePullPolicy", "value": "Never"},
        {
            "op": "add",
            "path": "/spec/template/spec/containers/0/args",
            "value": [f"--pytorch-init-container-image={INIT_IMAGE}"],
        },
    ]
    (overlay / "kustomization.yaml").write_text(
        _yaml(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["upstream/overlays/standalone"],
                "images": [{"name": "kubeflow/training-operator", "newName": name, "newTag": tag}],
                "patches": [
                    {"target": {"kind": "Deployment", "name": "training-operator"}, "patch": json.dumps(patch)}
                ],
            }
        )
    )
    rendered = node.kubectl("kustomize", str(overlay)).stdout
    node.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=rendered, timeout=120)
    node.kubectl(
        "-n", "kubeflow", "wait", "--for=condition=Available", "deployment/training-operator",
        f"--timeout={int(timeout)}s", timeout=timeout + 30,
    )  # fmt: skip


# Kubeflow Trainer v2 and JobSet: deployed only when asked for (deploy_trainer), each in a pod from its
# own kustomize manifests with the image built here, like the training operator above.
TRAINER_IMAGE = "docker.io/frscope-testenv/trainer-controller-manager"
JOBSET_IMAGE = "docker.io/frscope-testenv/jobset"
TRAINER_NAMESPACE = "kubeflow-system"
JOBSET_NAMESPACE = "jobset-system"
TORCH_RUNTIME = "torch-distributed"
TRAINER_POD_IMAGE = "frscope-test/trainer:dev"


def _versions(controllers_dir: Path) -> dict[str, str]:
    words = (controllers_dir / "VERSIONS").read_text().split()  # "jobset v0.12.0 trainer v2.3.0"
    return dict(zip(words[::2], words[1::2], strict=True))


def _never_pull(deployment: str) -> dict[str, Any]:
    # Images are imported, never pulled (nothing can be reached).
    patch = [{"op": "add", "path": "/spec/template/spec/containers/0/imagePullPolicy", "value": "Never"}]
    return {"target": {"kind": "Deployment", "name": deployment}, "patch": json.dumps(patch)}


def _apply_kustomization(node: Node, name: str, upstream: Path, kustomization: dict[str, Any],
                         drop_kinds: Sequence[str] = ()) -> str:
    """Renders and applies an overlay of `upstream` (the objects of `drop_kinds` left out); returns what
    was applied, for a later delete."""
    overlay = node.workdir / name
    shutil.copytree(upstream, overlay / "upstream")
    (overlay / "kustomization.yaml").write_text(_yaml(kustomization))
    rendered = node.kubectl("kustomize", str(overlay)).stdout
    if drop_kinds:
        rendered = "\n---\n".join(d for d in rendered.split("\n---\n")
                                  if not any(f"\nkind: {k}\n" in f"\n{d}\n" for k in drop_kinds))
    # The CRDs first, Established before the manager starts: applied together, Trainer's manager came up
    # before its TrainingRuntime kind was served and exited once ("no matches for kind").
    docs = [d for d in rendered.split("\n---\n") if d.strip()]
    crds = [d for d in docs if "\nkind: CustomResourceDefinition\n" in f"\n{d}\n"]
    rest = [d for d in docs if d not in crds]
    if crds:
        applied = node.kubectl("apply", "--server-side", "--force-conflicts", "-o", "name", "-f", "-",
                               input="\n---\n".join(crds), timeout=120).stdout.split()
        _wait_established(node, applied, 60)
    node.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input="\n---\n".join(rest), timeout=120)
    return rendered


def _wait_established(node: Node, crds: Sequence[str], timeout: float) -> None:
    # Polled: `kubectl wait --for=condition=Established` fails at once on a CRD so new that it has no
    # status.conditions yet (".status.conditions accessor error: <nil>").
    deadline = time.monotonic() + timeout
    for crd in crds:
        while True:
            got = node.kubectl("get", crd, "-o", 'jsonpath={.status.conditions[?(@.type=="Established")].status}',
                               check=False)
            if got.stdout.strip() == "True":
                break
            if time.monotonic() > deadline:
                raise NodeError(f"{crd} not Established after {timeout:.0f}s")
            time.sleep(0.5)


def _wait_available(node: Node, namespace: str, deployment: str, timeout: float) -> None:
    proc = node.kubectl("-n", namespace, "wait", "--for=condition=Available", f"deployment/{deployment}",
                        f"--timeout={int(timeout)}s", timeout=timeout + 30, check=False)
    if proc.returncode != 0:
        pods = node.kubectl("-n", namespace, "describe", "pods", check=False).stdout
        logs = node.kubectl("-n", namespace, "logs", f"deployment/{deployment}", "--tail=40", check=False).stdout
        raise NodeError(f"{namespace}/{deployment} not Available: {proc.stderr.strip()}\n{pods[-4000:]}\n{logs}")


def _with_trainer_image(runtime: str, image: str) -> str:
    """Trainer's torch runtime with the image of its `node` container (upstream: a pytorch/pytorch release,
    which this machine cannot pull) replaced by `image`; it names exactly one."""
    pattern = re.compile(r"^(\s+image:\s*)pytorch/pytorch:\S+$", flags=re.MULTILINE)
    found = len(pattern.findall(runtime))
    if found != 1:
        raise NodeError(f"Trainer's torch runtime names {found} pytorch/pytorch images, not 1: update testenv/node.py")
    return pattern.sub(lambda m: m.group(1) + image, runtime)


def deploy_trainer(node: Node, controllers_dir: Path, manifests_dir: Path, timeout: float = 300) -> dict[str, str]:
    """JobSet and the Kubeflow Trainer v2 controller, each in a pod deployed from its own manifests (CRDs,
    RBAC, Service, webhook configurations, a Deployment; each makes its own webhook certificate with its
    cert rotator and patches it into its webhook configurations), with the images testenv/build-images
    --controllers built (imported beforehand: Node.import_images); then Trainer's own `torch-distributed`
    ClusterTrainingRuntime with its image pointed at the trainer image built here. Returns the versions.

    JobSet comes from its module's config/default (what its release manifests are built from). Trainer's
    overlays/manager is its base with the namespace, the image and the webhook Secret, plus JobSet from a
    release URL: the overlay here is the same without that URL."""
    versions = _versions(controllers_dir)
    _apply_kustomization(node, "jobset", manifests_dir / "jobset", {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["upstream/default"],
        # config/components/manager names its image us-central1-docker.pkg.dev/.../jobset:main.
        "images": [{"name": "us-central1-docker.pkg.dev/k8s-staging-images/jobset/jobset",
                    "newName": JOBSET_IMAGE, "newTag": versions["jobset"]}],
        "patches": [_never_pull("jobset-controller-manager")],
    })
    trainer_upstream = manifests_dir / "trainer"
    _apply_kustomization(node, "trainer", trainer_upstream, {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": TRAINER_NAMESPACE,
        "resources": ["upstream/overlays/manager/namespace.yaml", "upstream/base/crds", "upstream/base/manager",
                      "upstream/base/rbac", "upstream/base/webhook"],
        "images": [{"name": "ghcr.io/kubeflow/trainer/trainer-controller-manager", "newName": TRAINER_IMAGE,
                    "newTag": versions["trainer"]}],
        "secretGenerator": [{"name": "kubeflow-trainer-webhook-cert", "namespace": TRAINER_NAMESPACE,
                             "options": {"disableNameSuffixHash": True}}],
        # The ConfigMap that its overlay makes for Trainer's SDK (its RBAC grants reading it).
        "configMapGenerator": [{"name": "kubeflow-trainer-public", "literals": [
            f"kubeflow_trainer_version={versions['trainer']}"], "options": {"disableNameSuffixHash": True}}],
        "patches": [_never_pull("kubeflow-trainer-controller-manager")],
    })
    _wait_available(node, JOBSET_NAMESPACE, "jobset-controller-manager", timeout)
    _wait_available(node, TRAINER_NAMESPACE, "kubeflow-trainer-controller-manager", timeout)
    runtime = _with_trainer_image(
        (trainer_upstream / "base" / "runtimes" / "torch_distributed.yaml").read_text(), TRAINER_POD_IMAGE)
    # Trainer's validating webhook checks the runtime: its configuration gets the CA bundle from the
    # rotator a moment after the Deployment is Available.
    deadline = time.monotonic() + 60
    while True:
        applied = node.kubectl("apply", "--server-side", "-f", "-", input=runtime, check=False)
        if applied.returncode == 0:
            break
        if time.monotonic() > deadline:
            raise NodeError(f"the {TORCH_RUNTIME} ClusterTrainingRuntime was refused: {applied.stderr.strip()}")
        time.sleep(2)
    return versions


# Kueue: deployed only for the tests that ask (tests/node/test_trainjob_kueue.py), from its module's
# config/default (CRDs, RBAC, webhook configurations, its internal cert rotator, the manager and its
# config), with the image built here.
KUEUE_IMAGE = "docker.io/frscope-testenv/kueue"
KUEUE_NAMESPACE = "kueue-system"
# The integrations the tests use, and batch/job: Kueue's Job webhook is registered for every Job whatever
# the list, and with that integration off it answers every Job creation (a JobSet's too) with a panic.
# The default list also turns on its pod, Deployment and StatefulSet integrations, left off here.
KUEUE_FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob")


def _kueue_config() -> dict[str, Any]:
    """Kueue's config/components/manager/controller_manager_config.yaml (v0.17.0), its integrations cut
    to KUEUE_FRAMEWORKS."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"}, "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
    }


def deploy_kueue(node: Node, kueue_dir: Path, manifests_dir: Path, timeout: float = 300) -> tuple[str, str]:
    """The Kueue controller manager in a pod from its own manifests; returns (its version, the applied
    objects for remove_kueue). Its visibility APIServices are left out: nothing here reads the pending
    workloads, and an aggregated API that is not up yet stalls discovery (and namespace deletion)."""
    version = (kueue_dir / "VERSIONS").read_text().split()[1]  # "kueue v0.17.0"
    config = _yaml(_kueue_config())
    patch_config = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "kueue-manager-config", "namespace": KUEUE_NAMESPACE},
                    "data": {"controller_manager_config.yaml": config}}
    applied = _apply_kustomization(node, "kueue", manifests_dir / "kueue", {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["upstream/default"],
        "images": [{"name": "us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue",
                    "newName": KUEUE_IMAGE, "newTag": version}],
        "patches": [_never_pull("kueue-controller-manager"), {"patch": json.dumps(patch_config)}],
    }, drop_kinds=("APIService",))
    _wait_available(node, KUEUE_NAMESPACE, "kueue-controller-manager", timeout)
    return version, applied


def remove_kueue(node: Node, applied: str, timeout: float = 120) -> None:
    """Deletes what deploy_kueue applied (its webhook configurations, CRDs and so every Kueue object)."""
    node.kubectl("delete", "--ignore-not-found", "--wait=true", f"--timeout={int(timeout)}s", "-f", "-",
                 input=applied, timeout=timeout + 30, check=False)


@contextlib.contextmanager
def running(bin_dir: Path, image_archives: Sequence[Path], **kwargs: Any) -> Iterator[Node]:
    node = start(bin_dir, image_archives, **kwargs)
    try:
        yield node
    finally:
        node.stop()


# ---- make cluster-node / make cluster-node-down -----------------------------------------------------


def _state_path() -> Path:
    return cache_root() / "node" / STATE_FILE


def _last_line(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise NodeError(f"{' '.join(cmd)} failed with exit status {proc.returncode}")
    return proc.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class TrainerBuild:
    """What deploy_trainer needs: testenv/build-controllers' output and manifests, the images' archives."""

    controllers: Path
    manifests: Path
    archives: list[Path]


def _trainer_outputs() -> TrainerBuild:
    controllers = Path(_last_line([str(HERE / "build-controllers")]))
    manifests = Path(_last_line([str(HERE / "build-controllers"), "--manifests"]))
    images = Path(_last_line([str(HERE / "build-images"), "--controllers", str(controllers)]))
    return TrainerBuild(controllers, manifests, sorted(images.glob("*.tar")))


@dataclass(frozen=True)
class Build:
    """What start() needs: testenv/build's bin dir and CRDs, testenv/build-images' archives, the registry."""

    bin_dir: Path
    archives: list[Path]
    crds: list[Path]
    registry_bin: Path


def _build_outputs() -> Build:
    """testenv/build, testenv/build-images and testenv/build-registry (each builds what is missing)."""
    last_line = _last_line
    bin_dir = Path(last_line([str(HERE / "build")]))
    images_dir = Path(last_line([str(HERE / "build-images"), str(bin_dir)]))
    registry_dir = Path(last_line([str(HERE / "build-registry")]))
    return Build(bin_dir, sorted(images_dir.glob("*.tar")), sorted((bin_dir.parent / "crds").glob("*.yaml")),
                 registry_dir / "bin" / "registry")


def _up(args: argparse.Namespace) -> int:
    build = _build_outputs()
    state = _state_path()
    if state.exists():
        print(f"testenv/node: {state} exists: a node is running (make cluster-node-down first)", file=sys.stderr)
        return 1
    with_trainer = _trainer_outputs() if args.trainer else None
    if not args.background:
        return _supervise(build, None, with_trainer)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        log = os.open(str(cache_root() / "node" / "supervisor.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        code = 1
        try:
            code = _supervise(build, write_fd, with_trainer)
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        message = pipe.read()
    lines = message.strip().splitlines()
    if not lines or not lines[-1].startswith("export KUBECONFIG="):
        where = message or f"see {cache_root() / 'node' / 'supervisor.log'}"
        print(f"testenv/node: the node did not start: {where}", file=sys.stderr)
        return 1
    print(message.strip(), flush=True)
    return 0


def _supervise(build: Build, notify_fd: int | None, with_trainer: TrainerBuild | None = None) -> int:
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print("testenv/node: starting the control plane and the node ...", file=sys.stderr, flush=True)
    try:
        node = start(build.bin_dir, build.archives, crds=build.crds, registry_bin=build.registry_bin)
        if with_trainer is not None:
            print("testenv/node: deploying JobSet and Kubeflow Trainer ...", file=sys.stderr, flush=True)
            try:
                node.import_images(with_trainer.archives)
                versions = deploy_trainer(node, with_trainer.controllers, with_trainer.manifests)
            except BaseException:
                node.stop(keep_logs_in=cache_root() / "node" / "failed-logs")
                raise
            print(f"testenv/node: {versions} running", file=sys.stderr, flush=True)
    except NodeError as e:
        if notify_fd is not None:
            os.write(notify_fd, str(e).encode())
            os.close(notify_fd)
        print(f"testenv/node: {e}", file=sys.stderr)
        return 1
    state = _state_path()
    state.write_text(json.dumps({"supervisor": os.getpid(), "workdir": str(node.workdir)}))
    try:
        print(f"node {NODE_NAME} Ready at {NODE_IP}; API server {node.plane.server}", file=sys.stderr)
        print(f"processes: {node.pids()}; logs in {node.plane.logs_dir}", file=sys.stderr)
        print(f"images: {' '.join(node.images)}", file=sys.stderr)
        registry = node.registry
        print(f"registry {registry.url}: pushed in {registry.timings}", file=sys.stderr, flush=True)
        # What a person installs from (comment lines: the output stays safe to eval); the export last.
        message = (f"# registry {registry.url} (CA {registry.ca_file}): image {registry.image}\n"
                   f"# helm install frscope {registry.chart_ref} --version {registry.chart_version} --ca-file "
                   f"{registry.ca_file} -n frscope-system --create-namespace --set image.repository="
                   f"{registry.image_repository} --set image.pullPolicy=Always\n"
                   f"export KUBECONFIG={node.kubeconfig}")
        if notify_fd is not None:
            os.write(notify_fd, message.encode())
            os.close(notify_fd)
        else:
            print(f'export PATH="{build.bin_dir}:$PATH"')
            print(message, flush=True)
        while not stop:
            node.check_alive()
            time.sleep(1)
    except NodeError as e:
        print(f"testenv/node: {e}", file=sys.stderr)
    finally:
        print("testenv/node: stopping ...", file=sys.stderr, flush=True)
        problems = node.stop()
        for p in problems:
            print(f"testenv/node: cleanup: {p}", file=sys.stderr)
        state.unlink(missing_ok=True)
    return 0


def _down(args: argparse.Namespace) -> int:
    state = _state_path()
    if not state.exists():
        print("testenv/node: no node is running", file=sys.stderr)
        return 0
    info = json.loads(state.read_text())
    pid = int(info["supervisor"])
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.5)
    workdir = Path(info["workdir"])
    leftover = workdir / "cleanup.json"
    if leftover.exists():
        # The supervisor died before it could clean up: undo from what it wrote down.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        problems = Cleanup(**json.loads(leftover.read_text())).undo()
        for p in problems:
            print(f"testenv/node: cleanup: {p}", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
    state.unlink(missing_ok=True)
    print("testenv/node: stopped", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testenv/node.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build what is missing, start the cluster with its node")
    up.add_argument("--background", action="store_true", help="return once it runs (make cluster-node)")
    up.add_argument("--trainer", action="store_true",
                    help="also Kubeflow Trainer v2 and JobSet, in pods (make cluster-node TRAINER=1)")
    sub.add_parser("down", help="stop the cluster `up --background` started")
    args = parser.parse_args(argv)
    (cache_root() / "node").mkdir(parents=True, exist_ok=True)
    try:
        return _up(args) if args.command == "up" else _down(args)
    except NodeError as e:
        print(f"testenv/node: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
