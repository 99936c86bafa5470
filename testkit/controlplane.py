"""A real Kubernetes control plane for tests: etcd, kube-apiserver, kube-scheduler, and the
extender as the real ``scheduler-extender`` process between them.

Envtest's way: no kubelet and no container engine. Nodes are objects a test creates, pods stay
where the scheduler binds them, and a test plays the kubelet by patching pod status. The
binaries come from one directory named by ``$VMA_KUBE_BIN`` (``scripts/kube-bin`` unpacks
``../shared/kube-bin`` into a cache and prints it); ``KUBE_BIN_HINT`` says how to provide them.

What the harness does *not* do is imitate anything: every answer a test sees came from
kube-apiserver v1.36, every scheduling decision from kube-scheduler calling the extender over
HTTP, with the scheduler config of ``manifests/config/kube-scheduler.yaml`` and the extender
config of ``manifests/config/extender.yaml`` (only ports and file paths changed), both running
under the ServiceAccount and RBAC that ``manifests/`` deploy.

Synchronous on purpose: the tests drive separate processes, so blocking calls block nobody.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import resource
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, urlencode

import yaml

from testkit.manifests import MANIFESTS, find, render
from testkit.ports import free_port

ROOT: Final = Path(__file__).resolve().parents[1]
KUBE_BIN_ENV: Final = "VMA_KUBE_BIN"
BINARIES: Final = ("etcd", "kube-apiserver", "kube-scheduler")
KUBE_BIN_HINT: Final = (
    f"real control plane: set ${KUBE_BIN_ENV} to a directory with {', '.join(BINARIES)} "
    "v1.36 (`export VMA_KUBE_BIN=$(scripts/kube-bin ../shared/kube-bin)`)"
)
SCHEDULER_NAME: Final = "vm-scheduler"
AUDIENCE: Final = "vm-autoscaling-extender"
EXTENDER_NS: Final = "vm-autoscaling"
EXTENDER_SA: Final = "vm-scheduler"

Obj = dict[str, Any]


# The manifests as ``kubectl apply -k manifests/`` would apply them, and what of them the
# control plane runs: the RBAC objects, the extender's and kube-scheduler's configs.
DOCS = render(MANIFESTS)
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
              "RoleBinding"}  # fmt: skip
MANIFEST_EXTENDER_CONFIG: Obj = yaml.safe_load(
    find(DOCS, "ConfigMap", "scheduler-extender-config")["data"]["extender.yaml"]
)
MANIFEST_SCHEDULER_CONFIG: Obj = yaml.safe_load(
    find(DOCS, "ConfigMap", "vm-scheduler-config")["data"]["kube-scheduler.yaml"]
)


def kube_bin_dir() -> Path | None:
    """The binaries' directory, or None when not configured or incomplete."""
    value = os.environ.get(KUBE_BIN_ENV)
    if not value:
        return None
    path = Path(value)
    if all(os.access(path / name, os.X_OK) for name in BINARIES):
        return path
    return None


def find_binaries(command: str) -> Path:
    """For a benchmark's command line: ``$VMA_KUBE_BIN``, else the binaries of
    ``../shared/kube-bin`` beside the checkout (unpacked once by ``scripts/kube-bin``), else
    one line naming what to set, and exit."""
    found = kube_bin_dir()
    if found is not None:
        return found
    repo = Path(__file__).resolve().parents[1]
    shared = repo.parent / "shared" / "kube-bin"
    if (shared / "SHA256SUMS").is_file():
        out = subprocess.run(
            [str(repo / "scripts" / "kube-bin"), str(shared)],
            check=True,
            capture_output=True,
            text=True,
        )
        return Path(out.stdout.strip())
    sys.exit(f"{command}: set ${KUBE_BIN_ENV} to a folder with {', '.join(BINARIES)}")


def wait_for(
    predicate: Callable[[], Any], *, timeout_seconds: float, what: str, interval: float = 0.05
) -> Any:
    """Poll until ``predicate()`` is truthy and return it; fail naming ``what``."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds:.0f}s waiting for {what}")
        time.sleep(interval)


class ApiError(Exception):
    def __init__(self, status: int, body: Obj | str) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


class Api:
    """A minimal synchronous client of one API server (admin or a bearer token)."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, token: str | None) -> None:
        self.host, self.port, self._context, self._token = host, port, context, token
        self._conn: http.client.HTTPSConnection | None = None

    def request(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        *,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (200, 201),
    ) -> Obj:
        if query:
            path = f"{path}?{urlencode(query)}"
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(2):
            if self._conn is None:
                self._conn = http.client.HTTPSConnection(
                    self.host, self.port, context=self._context, timeout=30
                )
            try:
                self._conn.request(method, path, body=data, headers=headers)
                response = self._conn.getresponse()
                raw = response.read()
                break
            except (http.client.HTTPException, OSError):
                self._conn.close()
                self._conn = None
                if attempt:
                    raise
        try:
            decoded: Obj = json.loads(raw) if raw else {}
        except ValueError:  # /readyz and friends answer plain text
            decoded = {"text": raw.decode(errors="replace")}
        if response.status not in ok:
            raise ApiError(response.status, decoded)
        return decoded

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def get(self, path: str, **query: str) -> Obj:
        return self.request("GET", path, query=query or None)

    def create(self, path: str, body: Obj, *, dry_run: bool = False) -> Obj:
        return self.request("POST", path, body, query={"dryRun": "All"} if dry_run else None)

    def merge_patch(self, path: str, body: Obj) -> Obj:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, *, grace_seconds: int | None = 0) -> Obj:
        query = {"gracePeriodSeconds": str(grace_seconds)} if grace_seconds is not None else None
        return self.request("DELETE", path, query=query, ok=(200, 202, 404))

    # --- convenience ------------------------------------------------------------------

    def pod(self, namespace: str, name: str) -> Obj:
        return self.get(pod_path(namespace, name))

    def events_for(self, namespace: str, name: str) -> list[Obj]:
        items: list[Obj] = self.get(
            f"/api/v1/namespaces/{quote(namespace)}/events",
            fieldSelector=f"involvedObject.name={name}",
        )["items"]
        return items

    def set_pod_phase(
        self, namespace: str, name: str, phase: str, *, pod_ip: str | None = None
    ) -> Obj:
        """The kubelet's part: report the pod's phase (and Ready for Running), and its IP."""
        status: Obj = {"phase": phase}
        if phase == "Running":
            status["conditions"] = [{"type": "Ready", "status": "True"}]
        if pod_ip is not None:
            status["podIP"] = pod_ip
            status["podIPs"] = [{"ip": pod_ip}]
        return self.request(
            "PATCH",
            pod_path(namespace, name) + "/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )

    def request_token(
        self,
        namespace: str,
        account: str,
        *,
        pod: Obj | None = None,
        audience: str | None = AUDIENCE,
    ) -> str:
        """A TokenRequest for ``account``, bound to ``pod``: for the extender's audience, or
        (``audience=None``) for the API server itself."""
        spec: Obj = {"expirationSeconds": 3600}
        if audience is not None:
            spec["audiences"] = [audience]
        if pod is not None:
            spec["boundObjectRef"] = {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            }
        answer = self.create(
            f"/api/v1/namespaces/{quote(namespace)}/serviceaccounts/{quote(account)}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        token: str = answer["status"]["token"]
        return token


def pod_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{quote(namespace)}/pods"
    return f"{base}/{quote(name)}" if name else base


# --- manifests: create the objects a Deployment would need ---------------------------------

_PLURALS: Final = {
    "Ingress": "ingresses",
    "NetworkPolicy": "networkpolicies",
    "PriorityClass": "priorityclasses",
}
_CLUSTER_SCOPED: Final = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "Node",
    "CustomResourceDefinition",
}


def install_crds(api: Api, docs: list[Obj]) -> None:
    """Create the CustomResourceDefinitions among ``docs`` (409: there already, from another
    module of the session) and wait until the API server serves their kinds."""
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    for crd in crds:
        try:
            api.create(object_path(crd), crd)
        except ApiError as e:
            if e.status != 409:
                raise

    def established() -> bool:
        for crd in crds:
            path = (
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
            )
            # Both null until the API server's CRD controllers have looked at it.
            conditions = (api.get(path).get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    wait_for(established, timeout_seconds=30, what="the CRDs established")


def object_path(doc: Obj) -> str:
    """The collection URL a manifest document is POSTed to."""
    api_version: str = doc["apiVersion"]
    kind: str = doc["kind"]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    plural = _PLURALS.get(kind, kind.lower() + "s")
    if kind in _CLUSTER_SCOPED:
        return f"{prefix}/{plural}"
    namespace = doc["metadata"].get("namespace", "default")
    return f"{prefix}/namespaces/{quote(namespace)}/{plural}"


# --- a slow link ---------------------------------------------------------------------------


class LaggingLink:
    """A TCP relay on loopback that delivers what the server sends ``delay_seconds`` late.

    Put between the extender and kube-apiserver, it makes the extender's watch lag
    kube-scheduler's informers by a known amount, which in a cluster happens by accident (a
    busy extender, a slow watch fan-out). TLS passes through untouched: the serving
    certificate names 127.0.0.1, whatever the port. Latency only: each chunk is delivered at
    its arrival time plus the delay, not one delay after the previous chunk.
    """

    def __init__(self, target_port: int, *, delay_seconds: float) -> None:
        self._target = target_port
        self._delay = delay_seconds
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        # Set: nothing is delivered either way (a partition); cleared, the backlog flows.
        self._open = threading.Event()
        self._open.set()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        """Hold everything back, both ways, until ``release`` (the connections stay open,
        as in a partition: requests hang rather than fail)."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._target))
            self._sockets += [client, server]
            self._pump(client, server, delay=0.0)
            self._pump(server, client, delay=self._delay)

    def _pump(self, source: socket.socket, sink: socket.socket, *, delay: float) -> None:
        chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def read() -> None:
            while True:
                try:
                    data = source.recv(65536)
                except OSError:
                    data = b""
                chunks.put((time.monotonic() + delay, data))
                if not data:
                    return

        def write() -> None:
            while True:
                due, data = chunks.get()
                time.sleep(max(0.0, due - time.monotonic()))
                self._open.wait()
                try:
                    if not data:
                        sink.shutdown(socket.SHUT_WR)
                        return
                    sink.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets:
            sock.close()


# --- processes ------------------------------------------------------------------------------


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, *, sig: int = signal.SIGTERM, timeout_seconds: float = 10) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}"
            )


def _spawn(
    name: str,
    args: list[str],
    work: Path,
    env: Mapping[str, str] | None = None,
    *,
    cwd: Path | None = None,
) -> Process:
    log_path = work / f"{name}.log"
    with log_path.open("ab") as log:
        popen = subprocess.Popen(  # the binaries and paths are ours
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
    return Process(name, popen, log_path)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


# What the API server's audit log keeps (``--audit-policy-file``): the requests of the
# manifests' ServiceAccount (kube-scheduler's and the extender's) that change something, one
# line each, when answered (who, which user agent, what, the answer's code). Reads are left
# out: they are most of the traffic and change nothing.
AUDIT_POLICY: Final[Obj] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "Metadata", "users": [f"system:serviceaccount:{EXTENDER_NS}:{EXTENDER_SA}"]},
        {"level": "None"},
    ],
}
WRITE_VERBS: Final = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def make_certificates(pki: Path) -> None:
    """CA, serving cert for 127.0.0.1, admin client cert, service-account key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=vma-test-ca", cwd=pki)  # fmt: skip
    for name, subject, extra in (
        ("serving", "/CN=127.0.0.1", ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]),
        ("admin", "/O=system:masters/CN=vma-admin", []),
    ):
        _openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, *extra, cwd=pki)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
                 "-copy_extensions", "copy", cwd=pki)  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


@dataclass
class ControlPlane:
    """etcd + kube-apiserver on loopback; ``start()`` returns when ``/readyz`` says ok."""

    bin_dir: Path
    work: Path
    port: int = field(default_factory=free_port)
    processes: list[Process] = field(default_factory=list)

    @property
    def pki(self) -> Path:
        return self.work / "pki"

    @property
    def audit_log(self) -> Path:
        return self.work / "audit.log"

    def audit_events(self, *, user_agent_prefix: str = "") -> list[Obj]:
        """The audit log's events so far (``AUDIT_POLICY``), in the order the API server
        answered them; only those whose user agent starts with ``user_agent_prefix``."""
        try:
            lines = self.audit_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        events = (json.loads(line) for line in lines if line.strip())
        return [e for e in events if e.get("userAgent", "").startswith(user_agent_prefix)]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def ssl_context(self, *, client_cert: bool) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        if client_cert:
            context.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        return context

    def admin(self) -> Api:
        return Api("127.0.0.1", self.port, self.ssl_context(client_cert=True), None)

    def as_token(self, token: str) -> Api:
        return Api("127.0.0.1", self.port, self.ssl_context(client_cert=False), token)

    def start(self) -> None:
        make_certificates(self.pki)
        client, peer = free_port(), free_port()
        etcd = _spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--data-dir", str(self.work / "etcd"),
                "--listen-client-urls", f"http://127.0.0.1:{client}",
                "--advertise-client-urls", f"http://127.0.0.1:{client}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
            ],
            self.work,
        )  # fmt: skip
        self.processes.append(etcd)
        pki = self.pki
        policy = self.work / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        apiserver = _spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{client}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--tls-cert-file={pki / 'serving.crt'}",
                f"--tls-private-key-file={pki / 'serving.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--authorization-mode=Node,RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
                f"--cert-dir={self.work / 'apiserver-certs'}",
                # No kubelet and no controller manager: see ../shared/kube-bin/README.md.
                "--disable-admission-plugins=TaintNodesByCondition,ServiceAccount",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
            ],
            self.work,
        )
        self.processes.append(apiserver)
        api = self.admin()

        def ready() -> bool:
            apiserver.check_alive()
            etcd.check_alive()
            try:
                api.request("GET", "/readyz", ok=(200,))
            except ApiError:
                return False
            except (OSError, http.client.HTTPException):
                return False
            return True

        try:
            wait_for(ready, timeout_seconds=60, what="kube-apiserver /readyz")
        except AssertionError:
            self.stop()
            raise
        finally:
            api.close()
        self.write_kubeconfig(self.work / "admin.kubeconfig", token=None)

    def write_kubeconfig(self, path: Path, *, token: str | None, port: int | None = None) -> Path:
        user: Obj = (
            {"token": token}
            if token
            else {
                "client-certificate": str(self.pki / "admin.crt"),
                "client-key": str(self.pki / "admin.key"),
            }
        )
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {
                        "server": f"https://127.0.0.1:{port or self.port}",
                        "certificate-authority": str(self.pki / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()


def extender_identity(cp: ControlPlane, rbac_docs: list[Obj]) -> Path:
    """Create the ServiceAccount and RBAC of ``manifests/`` and a kubeconfig with its token.

    The extender and kube-scheduler then run with exactly the rights a deployment gives them,
    so a missing RBAC rule fails here as it would in a cluster.
    """
    api = cp.admin()
    for doc in rbac_docs:
        try:
            api.create(object_path(doc), doc)
        except ApiError as e:
            if e.status != 409:  # already there (another module of the same session)
                raise
    token = api.request_token(EXTENDER_NS, EXTENDER_SA, audience=None)
    api.close()
    return cp.write_kubeconfig(cp.work / "extender.kubeconfig", token=token)


def extender_token(kubeconfig: Path) -> str:
    token: str = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    return token


def extender_command(
    config: Path,
    *,
    kubeconfig: Path | None = None,
    standalone: Path | None = None,
    log_level: str = "info",
    python_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The command line of the real extender process, ``scheduler-extender serve`` (as
    ``python -m scheduler_extender`` on ``python``, after ``python_args``): against the API
    server of ``kubeconfig``, or ``standalone`` from a cluster file. ``Extender`` below and the
    local stack (``testkit.local_stack``) both start it so."""
    if standalone is not None:
        source = ["--standalone", str(standalone)]
    else:
        assert kubeconfig is not None, "an API server's kubeconfig, or standalone"
        source = ["--kubeconfig", str(kubeconfig)]
    return [
        python, *python_args, "-m", "scheduler_extender", "serve", *source,
        "--config", str(config), "--log-level", log_level,
    ]  # fmt: skip


@dataclass
class Extender:
    """The real ``scheduler-extender serve`` process: the one way the tests and the benchmarks
    (``testkit.bench``) start it. Against an API server with ``kubeconfig``, or with
    ``kubeconfig=None`` and ``standalone`` from a cluster file (auth mode static)."""

    work: Path
    kubeconfig: Path | None
    config: Obj
    process: Process | None = None
    # Before ``-m scheduler_extender`` (e.g. ``-m cProfile -o FILE`` in a benchmark).
    python_args: list[str] = field(default_factory=list)
    # Tests read every request's line (debug); a benchmark runs as deployed (info).
    log_level: str = "debug"
    # Where the extender's code comes from (a benchmark compares another checkout's).
    source: Path = ROOT
    # The interpreter it runs on (a benchmark compares another build's: the image's is not
    # necessarily the one this process runs on).
    python: str = sys.executable
    # More environment (``POD_NAME``/``POD_NAMESPACE``: which pod a replica stands for).
    env: dict[str, str] = field(default_factory=dict)
    # No API server: nodes and pods from this cluster file (``serve --standalone FILE``).
    standalone: Path | None = None
    # The process's limit on open files (RLIMIT_NOFILE), as a container's may be.
    fd_limit: int | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.popen.pid

    @property
    def verbs_port(self) -> int:
        port: int = self.config["listen"]["verbs"]["port"]
        return port

    @property
    def permits_port(self) -> int:
        port: int = self.config["listen"]["permits"]["port"]
        return port

    @property
    def metrics_port(self) -> int:
        port: int = self.config["listen"]["metrics"]["port"]
        return port

    def start(self, *, wait_ready: bool = True) -> None:
        config_path = self.work / "extender.yaml"
        config_path.write_text(yaml.safe_dump(self.config))
        self.process = _spawn(
            "extender",
            extender_command(
                config_path,
                kubeconfig=self.kubeconfig,
                standalone=self.standalone,
                log_level=self.log_level,
                python_args=self.python_args,
                python=self.python,
            ),
            self.work,
            env={"PYTHONPATH": str(self.source), **self.env},
            # Not the caller's directory: ``python -m`` puts it before PYTHONPATH, so a
            # benchmark run from a checkout would import that checkout's extender, not
            # ``source``'s.
            cwd=self.work,
        )
        if self.fd_limit is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            limit = (self.fd_limit, min(hard, self.fd_limit))
            resource.prlimit(self.process.popen.pid, resource.RLIMIT_NOFILE, limit)
        if wait_ready:
            self.wait_ready()

    def wait_ready(self) -> None:
        wait_for(
            lambda: self.get("/readyz")[0] == 200,
            timeout_seconds=30,
            what="the extender's /readyz",
        )

    def get(
        self, path: str, *, port: int | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        """One GET on the permit port (or ``port``); (0, b"") while nothing listens."""
        if self.process is not None:
            self.process.check_alive()
        conn = http.client.HTTPConnection("127.0.0.1", port or self.permits_port, timeout=10)
        try:
            conn.request("GET", path, headers=dict(headers or {}))
            response = conn.getresponse()
            return response.status, response.read()
        except OSError:
            return 0, b""
        finally:
            conn.close()

    def post(self, path: str, body: Obj, *, headers: Mapping[str, str]) -> tuple[int, Obj]:
        conn = http.client.HTTPConnection("127.0.0.1", self.permits_port, timeout=10)
        try:
            conn.request(
                "POST",
                path,
                body=json.dumps(body),
                headers={"Content-Type": "application/json", **headers},
            )
            response = conn.getresponse()
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
        finally:
            conn.close()

    def state(self) -> Obj:
        # The verbs listener: the permit port, open to every pod, does not show the ledger.
        status, body = self.get("/state", port=self.verbs_port)
        assert status == 200, (status, body)
        decoded: Obj = json.loads(body)
        return decoded

    def stop(self, *, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            self.process.stop(sig=sig)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """SIGSTOP..SIGCONT: the process stalls, its sockets keep queueing what arrives."""
        assert self.process is not None
        self.process.popen.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.popen.send_signal(signal.SIGCONT)


def extender_config(
    manifest_config: Obj, *, verbs_port: int, permits_port: int, metrics_port: int | None = None
) -> Obj:
    """The deployed config with loopback ports of our own (no metrics listener without
    ``metrics_port``; otherwise the deployed one, auth included)."""
    config: Obj = json.loads(json.dumps(manifest_config))
    # One replica per test module, as ``scheduler_config`` runs one kube-scheduler without
    # leader election: it always decides (testkit/pairs.py runs two).
    config.pop("leader_election", None)
    listen = config["listen"]
    config["listen"] = {
        "verbs": {"host": "127.0.0.1", "port": verbs_port},
        "permits": {"host": "127.0.0.1", "port": permits_port},
    }
    if metrics_port is not None:
        config["listen"]["metrics"] = {
            **listen["metrics"],
            "host": "127.0.0.1",
            "port": metrics_port,
        }
    return config


def scheduler_config(manifest_config: Obj, *, kubeconfig: Path, verbs_port: int) -> Obj:
    """The deployed KubeSchedulerConfiguration, pointed at our kubeconfig and extender port."""
    config: Obj = json.loads(json.dumps(manifest_config))
    config["clientConnection"] = {"kubeconfig": str(kubeconfig), "qps": 2000, "burst": 4000}
    # One scheduler per test module and no Lease to wait for at start.
    config["leaderElection"] = {"leaderElect": False}
    for extender in config["extenders"]:
        extender["urlPrefix"] = f"http://127.0.0.1:{verbs_port}"
    return config


@dataclass
class Scheduler:
    """The real kube-scheduler."""

    bin_dir: Path
    work: Path
    cp: ControlPlane
    config: Obj
    name: str = "kube-scheduler"
    process: Process | None = None
    # Run under this host name (its own UTS namespace): kube-scheduler names itself in its
    # Lease after the host, as in a pod, and two of them on this machine must differ.
    hostname: str | None = None

    def start(self) -> None:
        config_path = self.work / f"{self.name}.yaml"
        config_path.write_text(yaml.safe_dump(self.config))
        port = free_port()
        admin_kubeconfig = self.cp.work / "admin.kubeconfig"
        prefix = _own_hostname(self.hostname) if self.hostname is not None else []
        self.process = _spawn(
            self.name,
            [
                *prefix,
                str(self.bin_dir / "kube-scheduler"),
                f"--config={config_path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--authentication-kubeconfig={admin_kubeconfig}",
                f"--authorization-kubeconfig={admin_kubeconfig}",
                "--v=2",
            ],
            self.work,
        )
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        process = self.process

        def healthy() -> bool:
            process.check_alive()
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
            try:
                conn.request("GET", "/healthz")
                return conn.getresponse().status == 200
            except OSError:
                return False
            finally:
                conn.close()

        wait_for(healthy, timeout_seconds=60, what="kube-scheduler /healthz")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def _own_hostname(hostname: str) -> list[str]:
    """A command prefix: run in a new UTS namespace named ``hostname`` (as root, or as a user
    allowed user namespaces)."""
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    return ["unshare", "--uts", *user, "sh", "-c", 'hostname "$0" && exec "$@"', hostname]


@contextlib.contextmanager
def running(*parts: Extender | Scheduler) -> Iterator[None]:
    try:
        yield
    finally:
        for part in reversed(parts):
            part.stop()
