"""Wire structs for the API calls ``kube_io`` makes that ``protocol.kube`` does not model.

Pure: declarations only. ``protocol.kube`` holds the objects both services *read* (Pod, Node,
lists, watch events); this module holds what only the I/O layer sends or receives: Binding,
Event, TokenReview, SubjectAccessReview, Lease. Keys are the API's camelCase; readers are tolerant
(unknown fields ignored) because every Kubernetes release adds fields.
"""

from __future__ import annotations

import msgspec

from protocol.kube import Node, Pod


class _Wire(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True, frozen=True):
    """camelCase keys; defaults left out so that the bodies we send stay minimal.

    Hence ``apiVersion`` and ``kind`` have no defaults where we send them: a default would be
    omitted from the body, and the API needs them.
    """


# --- Binding ------------------------------------------------------------------------------


class BindingMeta(_Wire, frozen=True, kw_only=True):
    name: str
    namespace: str
    # A precondition: the API refuses (409) to bind a pod whose UID differs, so a pod deleted
    # and recreated under the same name is never bound by a decision made for its predecessor.
    uid: str
    # A second one (``BindingREST.setPodNodeAndMetadata``): 409 unless the pod still has this
    # version, so a decision made on a pod that changed since, e.g. fenced by a new extender
    # leader (``Extender.fence``), is never applied.
    resource_version: str | None = None


class ObjectReference(_Wire, frozen=True, kw_only=True):
    """``core/v1 ObjectReference``: a Binding's target and an Event's involvedObject."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None

    @classmethod
    def to_pod(cls, pod: Pod) -> ObjectReference:
        meta = pod.metadata
        return cls(
            api_version="v1",
            kind="Pod",
            name=meta.name,
            namespace=meta.namespace,
            uid=meta.uid or None,
        )

    @classmethod
    def to_node(cls, node: Node) -> ObjectReference:
        return cls(
            api_version="v1", kind="Node", name=node.metadata.name, uid=node.metadata.uid or None
        )


class Binding(_Wire, frozen=True, kw_only=True):
    api_version: str
    kind: str
    metadata: BindingMeta
    target: ObjectReference


# --- Event --------------------------------------------------------------------------------


class EventMeta(_Wire, frozen=True, kw_only=True):
    namespace: str
    # The server appends a random suffix: two events in the same second never collide.
    generate_name: str


class EventSource(_Wire, frozen=True, kw_only=True):
    component: str
    host: str | None = None


class Event(_Wire, frozen=True, kw_only=True):
    """``core/v1 Event`` (what ``kubectl describe`` shows)."""

    api_version: str
    kind: str
    metadata: EventMeta
    involved_object: ObjectReference
    reason: str
    message: str
    type: str
    source: EventSource
    # Wall-clock RFC 3339 instants: the API defines them so; they are only shown to humans.
    first_timestamp: str
    last_timestamp: str
    count: int
    reporting_component: str | None = None
    reporting_instance: str | None = None


# --- TokenReview --------------------------------------------------------------------------


class TokenReviewSpec(_Wire, frozen=True, kw_only=True):
    token: str
    # Empty: the API server's own audiences (and a real one then echoes no ``audiences``).
    audiences: list[str] = []


class TokenReviewRequest(_Wire, frozen=True, kw_only=True):
    api_version: str
    kind: str
    spec: TokenReviewSpec


class UserInfo(_Wire, frozen=True, kw_only=True):
    username: str | None = None
    uid: str | None = None
    groups: list[str] | None = None
    # e.g. ``authentication.kubernetes.io/node-name: ["node-a"]`` for a pod-bound token.
    extra: dict[str, list[str]] | None = None


class TokenReviewStatus(_Wire, frozen=True, kw_only=True):
    authenticated: bool = False
    user: UserInfo | None = None
    audiences: list[str] | None = None
    error: str | None = None


class TokenReview(_Wire, frozen=True, kw_only=True):
    """What ``POST /apis/authentication.k8s.io/v1/tokenreviews`` answers (spec echoed back)."""

    api_version: str | None = None
    kind: str | None = None
    spec: TokenReviewSpec | None = None
    status: TokenReviewStatus = msgspec.field(default_factory=TokenReviewStatus)


NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


class TokenReviewResult(msgspec.Struct, kw_only=True, frozen=True):
    """The parts of a TokenReview an authorizer needs, flattened.

    ``node_name`` and ``pod_name`` are set only for tokens bound to a pod: they name the pod the
    token was issued for and the node that pod runs on, which is what lets the extender check
    that an agent speaks only for its own node.
    """

    authenticated: bool
    username: str | None = None
    node_name: str | None = None
    pod_name: str | None = None
    # The bound pod's uid: a pod recreated under the same name is another pod.
    pod_uid: str | None = None
    groups: tuple[str, ...] = ()
    uid: str | None = None
    error: str | None = None

    @classmethod
    def from_review(cls, review: TokenReview) -> TokenReviewResult:
        status = review.status
        user = status.user or UserInfo()
        extra = user.extra or {}
        return cls(
            authenticated=status.authenticated,
            username=user.username or None,
            node_name=_first(extra.get(NODE_NAME_EXTRA)),
            pod_name=_first(extra.get(POD_NAME_EXTRA)),
            pod_uid=_first(extra.get(POD_UID_EXTRA)),
            groups=tuple(user.groups or ()),
            uid=user.uid or None,
            error=status.error or None,
        )


# --- SubjectAccessReview ------------------------------------------------------------------


class NonResourceAttributes(_Wire, frozen=True, kw_only=True):
    path: str
    verb: str


class SubjectAccessReviewSpec(_Wire, frozen=True, kw_only=True):
    non_resource_attributes: NonResourceAttributes
    user: str
    groups: list[str] | None = None
    uid: str | None = None


class SubjectAccessReviewRequest(_Wire, frozen=True, kw_only=True):
    api_version: str
    kind: str
    spec: SubjectAccessReviewSpec


class SubjectAccessReviewStatus(_Wire, frozen=True, kw_only=True):
    allowed: bool = False
    denied: bool = False
    reason: str | None = None
    evaluation_error: str | None = None


class SubjectAccessReview(_Wire, frozen=True, kw_only=True):
    """What ``POST /apis/authorization.k8s.io/v1/subjectaccessreviews`` answers."""

    status: SubjectAccessReviewStatus = msgspec.field(default_factory=SubjectAccessReviewStatus)


def _first(values: list[str] | None) -> str | None:
    return values[0] if values else None


# --- Lease (coordination.k8s.io/v1) -------------------------------------------------------


class LeaseMeta(_Wire, frozen=True, kw_only=True):
    name: str
    namespace: str
    # Sent back on update: the API refuses (409) a write to a Lease that changed since.
    resource_version: str | None = None


class LeaseSpec(_Wire, frozen=True, kw_only=True):
    """What client-go's leader election writes (``resourcelock.LeaseLock``); times are
    MicroTime (RFC 3339 with microseconds), for humans only: electors time a Lease by when
    they saw it change, never by these stamps."""

    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = None
    renew_time: str | None = None
    lease_transitions: int | None = None


class Lease(_Wire, frozen=True, kw_only=True):
    api_version: str
    kind: str
    metadata: LeaseMeta
    spec: LeaseSpec = LeaseSpec()
