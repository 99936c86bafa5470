"""Typed errors of the Kubernetes API, so that nobody above ``kube_io`` inspects a status code.

Pure: the mapping from an HTTP answer to an error class does no I/O. The clients raise these;
callers catch the class whose meaning they care about and ask ``is_retryable`` otherwise.

::

    KubeError                     status, reason, message (from the API's Status body)
     ├── NotFound                 404  the object (or the URL) does not exist        no retry
     │    └── NotSupported        404  on a subresource the server lacks (pods/resize
     │                                 before in-place resize): remember, don't retry
     ├── Conflict                 409  precondition or already-assigned: re-read     no retry
     ├── Gone (= Expired)         410  resourceVersion compacted: relist             no retry
     ├── Unauthorized             401  bad or expired credentials                    no retry
     ├── Forbidden                403  RBAC denies the verb                          no retry
     ├── Invalid                  400, 422, other 4xx: our request is wrong           no retry
     ├── BadResponse              2xx whose body we cannot decode                    no retry
     ├── ServerError              5xx and 429: the server may recover                retry
     │    └── TooManyRequests     429  throttled, or an eviction a PodDisruptionBudget
     │                                 refuses now: the same request later            retry
     └── Unavailable              no HTTP answer (refused, reset, timeout)          retry

"Retry" means: the *same* request may succeed later, after a backoff. The others need a
different request (relist, re-read, fix RBAC) and repeating them only adds load.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

__all__ = [
    "BadResponse",
    "Conflict",
    "Expired",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeError",
    "NotFound",
    "NotSupported",
    "ServerError",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
    "error_from_response",
    "error_from_status",
]


class StatusDetails(msgspec.Struct, kw_only=True):
    name: str | None = None
    kind: str | None = None


class StatusBody(msgspec.Struct, kw_only=True, rename="camel"):
    """``meta/v1 Status`` with its ``details``, which ``protocol.kube.Status`` does not carry.

    ``details`` tells a missing pod (``{"name": "vm-1", "kind": "pods"}``) from a missing route
    (``{}``), which is how ``NotSupported`` is recognised.
    """

    status: str | None = None
    message: str | None = None
    reason: str | None = None
    code: int | None = None
    details: StatusDetails | None = None


_STATUS_DECODER = msgspec.json.Decoder(StatusBody)


class KubeError(Exception):
    """An API call failed. ``status`` is the HTTP status (0 when there was no answer)."""

    is_retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        reason: str = "",
        retry_after_seconds: float | None = None,
        details: StatusDetails | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        # From ``Retry-After``: the server's own hint, preferred over our backoff when present.
        self.retry_after_seconds = retry_after_seconds
        # Which object the API was talking about; empty when the URL itself was unknown.
        self.details = details

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(status={self.status}, reason={self.reason!r}, message={self.message!r})"


class NotFound(KubeError):
    """404: the object is gone (or never existed); re-reading will not bring it back."""


class NotSupported(NotFound):
    """404 on a subresource route itself: this cluster lacks the feature. Remember it."""


class Conflict(KubeError):
    """409: a precondition failed or someone else got there first; re-read, then decide."""


class Gone(KubeError):
    """410: the resourceVersion was compacted away; only a fresh list can continue."""


Expired = Gone
"""The API's ``reason`` for a 410 is ``Expired``; both names mean the same class."""


class Unauthorized(KubeError):
    """401: the credentials are wrong or expired."""


class Forbidden(KubeError):
    """403: authenticated, but RBAC does not allow this verb on this resource."""


class Invalid(KubeError):
    """400, 422 and other 4xx: the request itself is wrong; sending it again won't help."""


class BadResponse(KubeError):
    """A success status with a body we cannot decode: a bug or an incompatible server."""


class ServerError(KubeError):
    """5xx, or 429 Too Many Requests: the server may recover; retry after a backoff."""

    is_retryable = True


class TooManyRequests(ServerError):
    """429: the server throttles, or (the Eviction API) a PodDisruptionBudget allows no
    disruption now; ``retry_after_seconds`` is the server's hint."""


class Unavailable(KubeError):
    """No HTTP answer at all (connection refused or reset, DNS, TLS, timeout): retry later."""

    is_retryable = True


_BY_STATUS: dict[int, type[KubeError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    429: TooManyRequests,
}


def error_class(status: int) -> type[KubeError]:
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status >= 500:
        return ServerError
    return Invalid


def decode_status(body: bytes) -> StatusBody | None:
    """The Status in an error body, or None when the body is not one (a proxy's HTML page)."""
    try:
        return _STATUS_DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def error_from_status(
    status_body: StatusBody,
    *,
    http_status: int,
    retry_after_seconds: float | None = None,
) -> KubeError:
    """The error for a Status, from an HTTP error or from a watch stream's ``ERROR`` event.

    A watch ERROR arrives with HTTP 200, so the Status's own ``code`` wins over the HTTP one.
    """
    code = status_body.code or http_status
    return error_class(code)(
        status_body.message or f"HTTP {code}",
        status=code,
        reason=status_body.reason or "",
        retry_after_seconds=retry_after_seconds,
        details=status_body.details,
    )


def error_from_response(
    http_status: int,
    body: bytes,
    *,
    retry_after: str | None = None,
) -> KubeError:
    """The error for a non-2xx answer. Non-Status bodies still give the right class."""
    retry_after_seconds = _parse_retry_after(retry_after)
    parsed = decode_status(body)
    if parsed is None:
        text = body[:200].decode("utf-8", "replace").strip()
        return error_class(http_status)(
            text or f"HTTP {http_status}",
            status=http_status,
            retry_after_seconds=retry_after_seconds,
        )
    # An HTTP error status is authoritative: a Status body's code may be absent or 0.
    parsed.code = http_status
    return error_from_status(
        parsed, http_status=http_status, retry_after_seconds=retry_after_seconds
    )


def _parse_retry_after(value: str | None) -> float | None:
    # Only the delta-seconds form: the API server never sends an HTTP date here.
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
