"""The extender's configuration: one YAML file -> one frozen, typed tree.

Pure apart from ``load_config`` reading the file. Every section forbids unknown keys, so a typo
is an error rather than a silently ignored setting; every error names its ``$.path`` (msgspec
derives the paths from the decoder, so they cannot drift from the field names). Cross-field
rules live in ``__post_init__``: msgspec reports their ``ValueError`` with the path of the
section that raised it. ``__main__`` exits with status 3 on ``ConfigError``.

Units are in the key names (``_seconds``, ``_bytes``, ``_fraction``).
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Final

import msgspec
import yaml

from protocol.bounds import INT32_MAX, INT64_MAX, PositiveSeconds, Rate, Seconds
from protocol.strict_yaml import describe_yaml_error
from scheduler_extender.admission.quota import QuotaConfig, QuotaConfigError, parse_quota_config
from scheduler_extender.core.ledger import SystemReserve
from scheduler_extender.core.placement import Strategy
from scheduler_extender.core.relief import ReliefConfig
from scheduler_extender.recommender.config import DiagnosticsLevel, RecommenderConfig, Scorer
from scheduler_extender.recommender.scale_down import ScaleDownConfig
from scheduler_extender.recommender.snapshot import POOL_LABEL, NodePool

Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
Fraction = Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]

DEFAULT_AUDIENCE: Final = "vm-autoscaling-extender"
# manifests/agent.yaml: the agent DaemonSet's namespace and serviceAccountName.
DEFAULT_AGENT_SERVICE_ACCOUNT: Final = "vm-autoscaling/autoscaler-agent"
DEFAULT_CONTROLLER_SERVICE_ACCOUNT: Final = "vm-autoscaling/vm-controller"


class ConfigError(Exception):
    """The file is missing, not YAML, or does not match the schema; the message names where."""


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class Listen(_Section, frozen=True):
    """One listener, and aiohttp's guards on it (``http.connections.server_options``).

    ``idle_timeout_seconds``: a connection that has not sent a complete request head within
    this time (after it opened, or after its last answer) is closed (aiohttp's
    ``keepalive_timeout``); it bounds idle keep-alive connections. Keep it above the clients'
    own idle timeout (Go's 90 s for kube-scheduler, aiohttp's 15 s for the agents) so the
    server rarely closes a connection a client is about to reuse.

    ``header_timeout_seconds``: a new connection's first request head, and every later head
    from its first byte, must arrive whole within this; a connection that opens and says
    nothing is closed then (``http.connections.GuardedSite``), on every listener.
    """

    port: Port
    host: NonEmpty = "127.0.0.1"
    idle_timeout_seconds: PositiveSeconds = 120.0
    header_timeout_seconds: PositiveSeconds = 10.0
    # The kernel's queue of connections not yet accepted.
    accept_backlog: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 128


class VerbsListen(Listen, frozen=True):
    """kube-scheduler's listener: loopback by default (``/bind`` is unauthenticated and writes
    Bindings with the extender's credentials; kube-scheduler runs in the same pod). Its only
    client is kube-scheduler, so it has aiohttp's guards only: a per-client limit here could
    only ever limit kube-scheduler (docs/DEPLOY.md, "Who reaches which listener")."""

    host: NonEmpty = "127.0.0.1"


class GuardedListen(Listen, frozen=True):
    """A listener other pods reach (permits, metrics): aiohttp's guards, and the connection
    guards of ``http.connections.GuardedSite``.

    ``max_connections``: above it, a new connection first evicts the one that has
    been quiet longest among those with no request in progress (so a flood of idle connections
    cannot lock out the agents or the kubelet's probes); when every connection is busy it is
    refused. Each listener has its own cap, so one listener's flood never takes another's file
    descriptors.
    """

    max_connections: Annotated[int, msgspec.Meta(ge=2, le=INT32_MAX)] = 256
    # New connections accepted per second *from one client address* on average, in bursts of
    # up to the burst; above it a connection is closed at once (503) before aiohttp sees it.
    # Per address, so that a flooder spends its own allowance and not the kubelet's probes'
    # or another node's agent's. The agents keep their connections alive and open few.
    new_connections_per_second: Rate = 20.0
    new_connections_burst: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 40
    # asyncio's server accepts at most the backlog's worth of connections per turn of the
    # event loop: a small one bounds what a connect flood adds to each turn, between the
    # other listeners' requests.
    accept_backlog: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 8
    # Offences, per client address: what no well-behaved client does (a connection over the
    # rate above; a head that times out). Beyond this allowance (a token bucket, as the rate
    # above) the address is penalized: for ``penalty_seconds`` the kernel drops its new
    # connections at the listener (a socket filter: its SYNs never become connections, so
    # its flood costs the event loop nothing), while its connections already open go on
    # (``http.penalties``). ``penalty_seconds: 0`` turns penalties off.
    offences_per_second: Rate = 10.0
    offence_burst: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 20
    penalty_seconds: Annotated[float, msgspec.Meta(ge=0.0, le=86_400.0)] = 10.0


class PermitsListen(GuardedListen, frozen=True):
    """The agents' listener: every node's agent (and the kubelet's probes) must reach it."""

    host: NonEmpty = "0.0.0.0"
    max_connections: Annotated[int, msgspec.Meta(ge=2, le=INT32_MAX)] = 512
    idle_timeout_seconds: PositiveSeconds = 30.0


class MetricsAuth(enum.StrEnum):
    KUBERNETES = "kubernetes"
    NONE = "none"


class MetricsListen(GuardedListen, frozen=True):
    """Prometheus's listener: ``/metrics`` and the probes, nothing else.

    ``auth: kubernetes`` (the default) lets a caller read ``/metrics`` only if its bearer token
    passes a TokenReview and a SubjectAccessReview for ``get`` on the non-resource URL
    ``/metrics`` (the ClusterRole ``vm-autoscaling-metrics-reader`` grants it), as
    kube-scheduler guards its own metrics. ``none`` serves them to anyone who reaches the
    port (local runs, or a network policy that admits only Prometheus).
    """

    host: NonEmpty = "0.0.0.0"
    max_connections: Annotated[int, msgspec.Meta(ge=2, le=INT32_MAX)] = 32
    new_connections_per_second: Rate = 10.0
    new_connections_burst: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 20
    auth: MetricsAuth = MetricsAuth.KUBERNETES
    # How long a scraper's allowed token is trusted without reviewing it again, and a refused
    # one refused; reviews of new tokens are limited like the agents' (with a budget of their
    # own, so a flood here never spends the agents').
    allowed_cache_ttl_seconds: PositiveSeconds = 300.0
    refused_cache_ttl_seconds: PositiveSeconds = 10.0
    cache_max_entries: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 1_000
    review_rate_per_second: Rate = 5.0
    review_burst: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 10


class ListenConfig(_Section, frozen=True):
    """Listeners exposed differently: kube-scheduler reaches ``verbs`` over loopback; every
    node's agent reaches ``permits``; Prometheus reaches ``metrics`` (off unless configured)."""

    verbs: VerbsListen = VerbsListen(port=10298)
    permits: PermitsListen = PermitsListen(port=10299)
    metrics: MetricsListen | None = None

    def __post_init__(self) -> None:
        named = [("verbs", self.verbs), ("permits", self.permits)]
        if self.metrics is not None:
            named.append(("metrics", self.metrics))
        seen: dict[tuple[str, int], str] = {}
        for name, listen in named:
            other = seen.setdefault((listen.host, listen.port), name)
            if other != name:
                raise ValueError(f"{other} and {name} must listen on different addresses")


class SystemReserveConfig(_Section, frozen=True):
    """Fractions of each node's allocatable kept back for the host (never given to pods)."""

    cpu_fraction: Fraction = 0.2
    memory_fraction: Fraction = 0.0

    def to_reserve(self) -> SystemReserve:
        return SystemReserve(cpu_fraction=self.cpu_fraction, memory_fraction=self.memory_fraction)


class ScoringConfig(_Section, frozen=True):
    strategy: Strategy = Strategy.SPREAD


class AuthMode(enum.StrEnum):
    TOKENREVIEW = "tokenreview"
    STATIC = "static"


class AuthConfig(_Section, frozen=True):
    """How agents prove which node they speak for on the permit port.

    ``tokenreview`` (production): the agent sends a pod-bound ServiceAccount token for
    ``audience``; the API server's TokenReview names the node the agent's pod runs on.
    ``static``: one shared token authenticates *any* node. Only for local runs and tests.
    """

    mode: AuthMode = AuthMode.TOKENREVIEW
    audience: NonEmpty = DEFAULT_AUDIENCE
    static_token: str | None = None
    # How long a verified token is trusted without asking the API server again. Pod-bound
    # tokens live an hour and are refreshed at 80%; five minutes bounds how long a revoked token
    # keeps working, while keeping TokenReviews to one per agent per five minutes.
    identity_cache_ttl_seconds: PositiveSeconds = 300.0
    # Rejected tokens are remembered briefly so that a misconfigured agent cannot turn every
    # one of its requests into a TokenReview.
    negative_cache_ttl_seconds: PositiveSeconds = 10.0
    identity_cache_max_entries: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 10_000
    # Rejected tokens are kept apart, in their own bounded cache: a flood of garbage tokens
    # evicts only other garbage, never an agent's verified identity.
    negative_cache_max_entries: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 10_000
    # TokenReviews of tokens not in either cache, across all callers: at most this many a
    # second on average, in bursts of up to ``review_burst``. Above it a new token gets 503
    # with Retry-After, and the API server never sees the flood. Tokens whose own claims rule
    # them out (not a JWT, another audience, expired) are refused without a review and spend
    # none of it. Agents' tokens are reviewed once per ``identity_cache_ttl_seconds`` each
    # (5,000 nodes: ~17 a second); after an extender restart all of them at once: the burst
    # and the rate take 5,000 agents in ~20 s (at 50 a second it was 100 s of 503s).
    review_rate_per_second: Rate = 200.0
    review_burst: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 1000
    # The only ServiceAccount whose tokens get permits, as ``namespace/name``: what
    # manifests/agent.yaml runs the agent as.
    agent_service_account: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9.-]+/[a-z0-9.-]+$")] = (
        DEFAULT_AGENT_SERVICE_ACCOUNT
    )
    # The pod a token is bound to must be a running agent pod on the node it speaks for; that
    # is checked against the API server and trusted this long (a deleted agent's token stops
    # working within it).
    agent_pod_cache_ttl_seconds: PositiveSeconds = 10.0
    # The only ServiceAccount whose tokens may reserve and cancel moves (``POST /v1/moves``),
    # as ``namespace/name``: what manifests/vm-controller/ runs the vm-controller as.
    controller_service_account: Annotated[
        str, msgspec.Meta(pattern=r"^[a-z0-9.-]+/[a-z0-9.-]+$")
    ] = DEFAULT_CONTROLLER_SERVICE_ACCOUNT

    def __post_init__(self) -> None:
        if self.mode is AuthMode.STATIC and not self.static_token:
            raise ValueError("auth.static_token is required when auth.mode is static")
        if self.mode is AuthMode.TOKENREVIEW and self.static_token is not None:
            raise ValueError("auth.static_token is only used with auth.mode static")


class DurabilityConfig(_Section, frozen=True):
    """Where permits are recorded so that a restarted extender rebuilds them.

    Writes happen off the request path, coalesced per pod (latest wins), retried with backoff.
    """

    write_annotations: bool = True
    # Patch the VM container's CPU request/limit through ``pods/resize`` so that the kubelet
    # and kube-scheduler see the VM's real size. Switched off for good on the first 404 from a
    # cluster without in-place resize.
    resize_pods: bool = True
    retry_initial_seconds: PositiveSeconds = 0.5
    retry_max_seconds: PositiveSeconds = 30.0
    # Writes in flight at once (each is one PATCH); bounds the load on the API server.
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4

    def __post_init__(self) -> None:
        if self.retry_max_seconds < self.retry_initial_seconds:
            raise ValueError("retry_max_seconds must be >= retry_initial_seconds")


class LimitsConfig(_Section, frozen=True):
    """Request bodies: largest accepted per endpoint (413 above), compressed or not.

    Sized from real use: a non-cache filter call carries every Node object (kind's nodes are
    ~1.3 KiB each, real ones with images and many labels up to ~10 KiB: 5,000 nodes fit in
    64 MiB); bind is four short strings; a 1,024-VM permit batch is ~0.3 MiB. A body is
    refused from its Content-Length before any of it is read. Compressed bodies: the verbs
    refuse them (415; kube-scheduler never compresses), the permit port inflates them only
    after authentication and only up to ``permits_max_body_bytes`` *decompressed*.
    ``bodies_in_flight_bytes`` bounds all bodies being read at once across both listeners
    (503 with Retry-After above it), so concurrent large bodies cannot exhaust the pod's
    memory limit. ``body_timeout_seconds``: a body must arrive within this (408 after).
    """

    verbs_max_body_bytes: Annotated[int, msgspec.Meta(ge=1024, le=INT64_MAX)] = 64 * 2**20
    bind_max_body_bytes: Annotated[int, msgspec.Meta(ge=1024, le=INT64_MAX)] = 64 * 2**10
    permits_max_body_bytes: Annotated[int, msgspec.Meta(ge=1024, le=INT64_MAX)] = 2 * 2**20
    bodies_in_flight_bytes: Annotated[int, msgspec.Meta(ge=1024, le=INT64_MAX)] = 160 * 2**20
    body_timeout_seconds: PositiveSeconds = 10.0
    # Permit requests per authenticated caller (one node's agent): this many a second on
    # average, in bursts of up to the burst; above it 429 with Retry-After, checked before the
    # body is read. An agent sends about one batch per scrape interval (1 s) plus retries; a
    # compromised node flooding valid 1,024-VM batches would otherwise take the event loop
    # from kube-scheduler's calls and every other agent.
    permit_requests_per_second: Rate = 10.0
    permit_requests_burst: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 30

    def __post_init__(self) -> None:
        largest = max(self.verbs_max_body_bytes, self.permits_max_body_bytes)
        if self.bodies_in_flight_bytes < largest:
            raise ValueError("bodies_in_flight_bytes must hold at least the largest body")


class KubeConfig(_Section, frozen=True):
    """The API connection. The kubeconfig path comes from ``--kubeconfig`` (in-cluster when
    absent), not from here, so that one config file serves every environment."""

    request_timeout_seconds: PositiveSeconds = 30.0
    watch_timeout_seconds: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 300
    # Post a Kubernetes Event (reason NODE_ALLOC) when one of our pods gets or loses its place.
    post_events: bool = True


class LeaderElectionConfig(_Section, frozen=True):
    """Two replicas, one decider (``core/leadership.py``): the extender's own Lease.

    ``lease_name`` in ``lease_namespace`` is the extender's; ``scheduler_lease_name`` is
    kube-scheduler's (its ``leaderElection.resourceName``): the extender stands for its own
    Lease only while the kube-scheduler of its pod holds that one (its holderIdentity starts
    with the pod's hostname and "_"), because kube-scheduler calls only its own pod's
    extender. Durations as in kube-scheduler's ``leaderElection``: a holder renews every
    ``renew_seconds`` and decides until its last accepted renewal's send time plus
    ``lease_duration_seconds / (1 + clock_drift_fraction)**2``; a standby takes an abandoned
    Lease after it has seen it unchanged for ``lease_duration_seconds``, and reads it (and
    kube-scheduler's) every ``retry_seconds``. ``leader_label``: the leader sets it to
    "leader" on its own pod and back to "standby" on the previous leader's (pods start as
    "standby"), and the permit Service selects it; needs ``$POD_NAME`` and ``$POD_NAMESPACE``
    (the Downward API).
    """

    lease_name: NonEmpty = "vm-scheduler-extender"
    lease_namespace: NonEmpty = "vm-autoscaling"
    scheduler_lease_name: str | None = "vm-scheduler"
    # Whole seconds: the Lease's leaseDurationSeconds is an integer.
    lease_duration_seconds: Annotated[int, msgspec.Meta(ge=1, le=3600)] = 15
    renew_seconds: PositiveSeconds = 2.0
    retry_seconds: PositiveSeconds = 2.0
    clock_drift_fraction: Annotated[float, msgspec.Meta(ge=0.0, le=0.2)] = 0.01
    leader_label: str | None = "vm-autoscaling.io/extender-role"

    def __post_init__(self) -> None:
        if self.renew_seconds >= self.lease_duration_seconds / (1 + self.clock_drift_fraction) ** 2:
            raise ValueError("renew_seconds must be well below lease_duration_seconds")


class FrontMode(enum.StrEnum):
    """Where the permit port is served (``http/front.py``)."""

    # A child process (the default): floods of the permit port cost kube-scheduler's event
    # loop nothing but the permits that got through.
    PROCESS = "process"
    # On the main process's event loop, next to kube-scheduler's verbs. For debugging.
    INLINE = "inline"


class FrontScheduling(enum.StrEnum):
    """How the permit front's CPU time is ranked against the main process's."""

    # SCHED_IDLE (the default): it runs only when nothing else in the container wants the
    # core, and a woken main process takes the core from it at once. With ``nice`` a woken
    # main process may wait out the front's time slice (about a millisecond), which is what
    # kube-scheduler's filter calls saw under floods of the permit port.
    IDLE = "idle"
    # The normal policy at ``niceness``: a smaller share, but no immediate preemption.
    NICE = "nice"


class PermitFrontConfig(_Section, frozen=True):
    """The permit front: the process that serves the permit port (see docs/DEPLOY.md)."""

    mode: FrontMode = FrontMode.PROCESS
    scheduling: FrontScheduling = FrontScheduling.IDLE
    # With ``scheduling: nice``, how much lower its CPU priority is than the main process's.
    niceness: Annotated[int, msgspec.Meta(ge=0, le=19)] = 10


class RecommendWorkerMode(enum.StrEnum):
    """Where recommendations run (``http/recommend_worker.py``)."""

    # A worker process (the default): the event loop only awaits, so filter, bind and permit
    # calls are not held up while a large recommendation runs.
    PROCESS = "process"
    # On the event loop: every other request waits while it runs. For debugging.
    INLINE = "inline"


class RecommenderSection(_Section, frozen=True):
    """The scale-up recommender (``POST /v1/recommend``, ``GET /v1/recommendation``).

    ``node_pools`` are what the cluster could add, written exactly like a ClusterSnapshot's
    ``nodePools`` entries (camelCase: ``maxCount``, ``template.allocatable``...); live mode
    (an empty ``POST /v1/recommend``, and auto-publish) has no other source for them. Without
    pools a live recommendation can only place pods on existing nodes.
    """

    node_pools: list[NodePool] = []
    # The node label naming a node's pool.
    pool_label: NonEmpty = POOL_LABEL
    # The ranking chain; each link only breaks the ties of the links before it.
    scorers: Annotated[tuple[Scorer, ...], msgspec.Meta(min_length=1)] = RecommenderConfig().scorers
    # What ``diagnostics.rounds`` of ``POST /v1/recommend`` and the CLI records: ``summary``
    # (the default: one line per round, and the candidates' records never built; the
    # benchmark's answer is 60 KB instead of 1 MB) or ``full`` (every candidate of every
    # round, its score and pods). A request's ``?diagnostics=`` and the CLI's
    # ``--diagnostics`` override it. Auto-publish always uses ``summary``.
    diagnostics: DiagnosticsLevel = DiagnosticsLevel.SUMMARY
    # Step budget of the search for the cheapest plan (``RecommenderConfig``): steps, not
    # seconds, so that the answer does not depend on the machine.
    plan_search_steps: Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)] = (
        RecommenderConfig().plan_search_steps
    )
    # Plan for growth: above 0, size the scale-up for this share of every VM's room to grow
    # (pending and running VMs; running ones their node cannot give it are planned to move).
    growth_headroom: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    # Where recommendations run: ``process`` (one worker process, started on first use) or
    # ``inline`` (on the event loop, delaying every other request while it runs).
    worker: RecommendWorkerMode = RecommendWorkerMode.PROCESS
    # The scale-down check (``POST /v1/scale-down``, ``recommend --scale-down``): the share of
    # each VM's room to grow kept free where it would move, and at most how many nodes at once.
    scale_down: ScaleDownConfig = ScaleDownConfig()
    # Compute and publish a recommendation by itself (gauge, Event, GET /v1/recommendation)
    # once a pod has been refused for capacity by filter, or an agent denied capacity, for
    # longer than ``pending_threshold_seconds``. Short waits are normal (a pod being deleted
    # frees room), so the threshold keeps the extender from chasing them.
    auto_publish: bool = True
    pending_threshold_seconds: PositiveSeconds = 60.0
    # How often the auto-publish task looks; also the least time between two publications.
    check_interval_seconds: PositiveSeconds = 15.0

    def __post_init__(self) -> None:
        names = [p.name for p in self.node_pools]
        if len(set(names)) != len(names):
            raise ValueError("node pool names must be unique")
        if len(set(self.scorers)) != len(self.scorers):
            raise ValueError("a scorer may appear only once in the chain")

    def to_recommender(self, *, scheduler_name: str, reserve: SystemReserve) -> RecommenderConfig:
        return RecommenderConfig(
            scorers=self.scorers,
            scheduler_name=scheduler_name,
            reserve=reserve,
            diagnostics=self.diagnostics,
            plan_search_steps=self.plan_search_steps,
            growth_headroom=self.growth_headroom,
        )


class QuotaSection(QuotaConfig, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-namespace quotas for VM pods and the admission queue (``admission.quota``).

    Either written here, in ``quota``'s own format (``admission_ttl_seconds``, ``namespaces``),
    or kept in a separate ``file`` that is read at start and re-read every
    ``reload_interval_seconds`` (mount a ConfigMap there: the kubelet updates the file when the
    ConfigMap changes). A file that fails to load at start stops the extender (exit 3); a bad
    edit later is logged and the previous quotas stay, so a typo never lifts every limit.
    Without a ``quota`` section every namespace is unlimited (pods are still queued, in order).
    """

    file: NonEmpty | None = None
    reload_interval_seconds: PositiveSeconds = 10.0

    def __post_init__(self) -> None:
        if self.file is not None and self.namespaces:
            raise ValueError("quota.file and quota.namespaces are exclusive: keep one source")

    def inline(self) -> QuotaConfig:
        """The quotas written in this section itself (meaningless when ``file`` is set)."""
        return QuotaConfig(
            admission_ttl_seconds=self.admission_ttl_seconds, namespaces=self.namespaces
        )


class ReliefSection(ReliefConfig, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Relief (``core.relief``, its rule in the module docstring): off unless ``enabled``.

    The leader runs a pass every ``interval_seconds``: the grows its permits cut short since
    the last pass, then ``plan_moves``; each planned move becomes a VirtualMachineMigration
    (``scheduler_extender.relief``) that the vm-controller carries out; with ``drain.enabled``,
    the nodes it drains are tainted and their other pods evicted there too.
    """

    interval_seconds: Annotated[float, msgspec.Meta(ge=1.0, le=3600.0)] = 15.0


class Config(_Section, frozen=True):
    scheduler_name: NonEmpty = "vm-scheduler"
    listen: ListenConfig = ListenConfig()
    system_reserve: SystemReserveConfig = SystemReserveConfig()
    scoring: ScoringConfig = ScoringConfig()
    auth: AuthConfig = AuthConfig()
    durability: DurabilityConfig = DurabilityConfig()
    limits: LimitsConfig = LimitsConfig()
    kube: KubeConfig = KubeConfig()
    recommender: RecommenderSection = RecommenderSection()
    quota: QuotaSection | None = None
    permit_front: PermitFrontConfig = PermitFrontConfig()
    relief: ReliefSection = ReliefSection()
    # None: one replica, which always decides (standalone mode too).
    leader_election: LeaderElectionConfig | None = None
    # Keep below the pod's terminationGracePeriodSeconds (30 by default) so in-flight requests
    # finish before the kubelet kills the process.
    shutdown_timeout_seconds: Seconds = 20.0
    # Retry-After sent with 503 while the first lists are loading.
    not_synced_retry_after_seconds: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 1

    def recommender_config(self) -> RecommenderConfig:
        """The recommender's settings, with the extender's own scheduler name and reserve (the
        simulation must count exactly what ``filter`` and ``bind`` count)."""
        return self.recommender.to_recommender(
            scheduler_name=self.scheduler_name, reserve=self.system_reserve.to_reserve()
        )


def parse_config(data: object) -> Config:
    """A YAML document (already parsed) -> Config, or ConfigError naming ``$.path``."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"Expected `object`, got `{type(data).__name__}` - at `$`")
    quota = data.get("quota")
    if isinstance(quota, dict):
        # Checked by the quota module first: its errors name the namespace (msgspec's own
        # path for a dict entry is ``[...]``, useless with fifty namespaces).
        inline = {k: v for k, v in quota.items() if k not in ("file", "reload_interval_seconds")}
        try:
            parse_quota_config(inline)
        except QuotaConfigError as e:
            raise ConfigError(str(e).replace(" - at `$", " - at `$.quota", 1)) from e
    try:
        return msgspec.convert(data, Config)
    except msgspec.ValidationError as e:
        message = str(e)
        # msgspec leaves the path out for errors at the top level; every error names one.
        raise ConfigError(message if " - at `$" in message else f"{message} - at `$`") from e


def load_config(path: Path | None) -> Config:
    """Read ``path`` (None: all defaults)."""
    if path is None:
        return Config()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {describe_yaml_error(e)}") from e
    try:
        return parse_config(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
