"""The extender's HTTP-facing errors; each class knows its status.

Pure: declarations only. Handlers raise these; the error middleware turns them into a JSON
``ErrorBody`` (``{"error", "reason", "message"}``) with the class's status. Anything that is not
an ``ExtenderError`` is a bug: 500 with a generic body, and the traceback logged with the
request id. The pure core raises none of these: it returns typed refusals
(``core.refusals``), which the permit port's edge maps to these classes, once
(``http.permit_port.ERRORS``).

::

    ExtenderError                 500
     ├── ProtocolError            400  body is not JSON or not the expected type
     │    └── UnsupportedVersion  400  no protocol version in common (names both ranges)
     ├── Unauthenticated          401  no bearer token, or one that does not verify
     ├── WrongNode                403  the batch speaks for another node than the token's
     ├── NotTheAgent              403  a valid token, but not the agent's, or its pod is not
     │                                 a running agent pod on that node
     ├── NotTheController         403  a valid token, but not the vm-controller's (moves)
     ├── Forbidden                403  a valid token whose user may not read /metrics
     ├── UnknownNode              404
     ├── UnknownPod               404
     ├── BodyTimeout              408  the body did not arrive in time
     ├── StaleRequest             409  the request refers to a pod that changed meanwhile
     ├── MoveRefused              409  a move the ledger refuses (reason: NoRoom, Conflict)
     ├── BodyTooLarge             413  (also when it would be, decompressed)
     ├── UnsupportedEncoding      415  a Content-Encoding this endpoint does not take
     └── Unavailable              503  + Retry-After: retrying later will help
          ├── TooManyRequests     429  + Retry-After: this caller's own budget is spent
          ├── NotSynced           503  the first node and pod lists are not in yet
          └── NotLeader           503  a standby: the other replica decides (or will soon);
                                       + Connection: close, so the retry reaches it

For kube-scheduler's verbs a node that does not fit is *data* (``FailedNodes``), and a failed
bind is an ``Error`` string in a 200: kube-scheduler treats any other status as a failure of
the whole call. These classes are for malformed requests and for the permit port.
"""

from __future__ import annotations

from typing import ClassVar


class ExtenderError(Exception):
    status: ClassVar[int] = 500
    # A stable CamelCase word for machines; the message is for humans.
    default_reason: ClassVar[str] = "InternalError"
    # The connection is closed after the answer (``Connection: close``): the caller's retry
    # must open a new one, through the Service, to reach another replica.
    closes_connection: ClassVar[bool] = False

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason

    @property
    def headers(self) -> dict[str, str]:
        return {}


class ProtocolError(ExtenderError):
    status = 400
    default_reason = "BadRequest"


class UnsupportedVersion(ProtocolError):
    default_reason = "UnsupportedVersion"


class Unauthenticated(ExtenderError):
    status = 401
    default_reason = "Unauthenticated"

    @property
    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="vm-autoscaling-extender"'}


class WrongNode(ExtenderError):
    status = 403
    default_reason = "WrongNode"


class NotTheAgent(ExtenderError):
    status = 403
    default_reason = "NotTheAgent"


class Forbidden(ExtenderError):
    status = 403
    default_reason = "Forbidden"


class NotTheController(ExtenderError):
    """``POST /v1/moves``: a valid token, but not the vm-controller's ServiceAccount."""

    status = 403
    default_reason = "NotTheController"


class UnknownNode(ExtenderError):
    status = 404
    default_reason = "UnknownNode"


class UnknownPod(ExtenderError):
    status = 404
    default_reason = "UnknownPod"


class StaleRequest(ExtenderError):
    status = 409
    default_reason = "StaleRequest"


class MoveRefused(ExtenderError):
    """``POST /v1/moves``: the ledger refuses the reservation (its ``reason``: ``NoRoom`` on the
    target node, or ``Conflict``: not a bound VM of ours, already moving, the node it is on)."""

    status = 409
    default_reason = "MoveRefused"


class BodyTooLarge(ExtenderError):
    status = 413
    default_reason = "BodyTooLarge"


class BodyTimeout(ExtenderError):
    status = 408
    default_reason = "BodyTimeout"


class UnsupportedEncoding(ExtenderError):
    status = 415
    default_reason = "UnsupportedEncoding"


class Unavailable(ExtenderError):
    status = 503
    default_reason = "Unavailable"

    def __init__(
        self, message: str, *, retry_after_seconds: int = 1, reason: str | None = None
    ) -> None:
        super().__init__(message, reason=reason)
        self.retry_after_seconds = retry_after_seconds

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_seconds)}


class TooManyRequests(Unavailable):
    """429: this caller's own budget is spent (everyone else's is not); retry after."""

    status = 429
    default_reason = "TooManyRequests"


class NotSynced(Unavailable):
    default_reason = "NotSynced"


class NotLeader(Unavailable):
    """This replica does not hold the extender's Lease: it decides nothing. Retrying helps:
    the Service sends the next request to the leader, or this one leads by then.

    Only on a new connection: kube-proxy picks a Service's endpoint when a connection opens,
    and keeps an established one on its pod after the pod leaves the endpoints (a conntrack
    entry, for TCP). An agent whose kept-alive connection reached the old leader would get
    this answer for as long as both lived (seen in the node tier after the cut-off drill:
    an agent refused every 5 s for minutes), so the answer closes the connection."""

    default_reason = "NotLeader"
    closes_connection = True
