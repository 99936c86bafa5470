"""The thin Kubernetes I/O layer shared by the scheduler extender and the autoscaler agent.

Shell: only these modules talk to the Kubernetes API. They send requests and decode answers
into ``protocol.kube`` structs, and turn every failure into a typed ``kube_io.errors``
exception. They hold no policy and no state about the objects they move.

Modules:
    client   ``KubeClient``: list, get, bind, patch annotations, resize, events, token reviews.
    watch    ``watch_objects``: list-then-watch as ``Listed`` / ``Changed`` items, with resume,
             bookmarks and relist on 410.
    errors   the typed error tree (drawn in its docstring) and what a retry can do.
    objects  wire structs for Binding, Event and TokenReview.
"""

from kube_io.client import KubeClient
from kube_io.errors import (
    BadResponse,
    Conflict,
    Expired,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    NotFound,
    NotSupported,
    ServerError,
    Unauthorized,
    Unavailable,
)
from kube_io.objects import ObjectReference, TokenReviewResult
from kube_io.watch import Changed, Listed, WatchItem, WatchSettings, watch_objects

__all__ = [
    "BadResponse",
    "Changed",
    "Conflict",
    "Expired",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeClient",
    "KubeError",
    "Listed",
    "NotFound",
    "NotSupported",
    "ObjectReference",
    "ServerError",
    "TokenReviewResult",
    "Unauthorized",
    "Unavailable",
    "WatchItem",
    "WatchSettings",
    "watch_objects",
]
