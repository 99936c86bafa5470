"""Before a service starts: can it reach the API server with the credentials it was given?

Shell, run once at start-up, before any port is bound: a missing kubeconfig, one that does not
load, a process outside a cluster without ``--kubeconfig`` and an API server that does not
answer each become a ``StartupProblem`` with one line for the operator and the exit code of its
class (``observability.exits``), instead of a traceback from deep inside the client or a
watch that retries forever behind a port that looks healthy.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes_asyncio.config import ConfigException

from kube_io.client import KubeClient
from kube_io.errors import KubeError, Unauthorized
from observability.exits import ExitCode, Problem

__all__ = ["StartupProblem", "check_api_server"]


class StartupProblem(Problem):
    """The service cannot start; ``str(self)`` is the line to print, ``code`` the exit code."""


async def connect(kubeconfig: str | None) -> KubeClient:
    """``KubeClient.connect``, with every way it can fail turned into a ``StartupProblem``."""
    if kubeconfig is not None:
        try:
            # Blocking, once, before anything else runs: a small file, read to say why not.
            Path(kubeconfig).read_bytes()  # noqa: ASYNC240
        except OSError as e:
            raise StartupProblem(
                f"kubeconfig {kubeconfig}: cannot read: {e.strerror}", ExitCode.KUBECONFIG
            ) from e
    try:
        return await KubeClient.connect(kubeconfig)
    except ConfigException as e:
        if kubeconfig is None:
            raise StartupProblem(
                f"no --kubeconfig and no in-cluster service account ({e}): pass --kubeconfig"
                " PATH when running outside a pod",
                ExitCode.NOT_IN_CLUSTER,
            ) from e
        raise StartupProblem(f"kubeconfig {kubeconfig}: {e}", ExitCode.KUBECONFIG) from e
    except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as e:
        # kubernetes-asyncio reads the file with PyYAML and walks it without checking shapes.
        reason = " ".join(str(e).split()) or type(e).__name__
        raise StartupProblem(
            f"kubeconfig {kubeconfig}: not a valid kubeconfig: {reason}", ExitCode.KUBECONFIG
        ) from e


async def check_api_server(kubeconfig: str | None, *, timeout_seconds: float) -> str:
    """Connect and ask the API server for its version; its ``gitVersion`` or a StartupProblem."""
    client = await connect(kubeconfig)
    async with client:
        try:
            return await client.server_version(timeout_seconds=timeout_seconds)
        except Unauthorized as e:
            source = f"kubeconfig {kubeconfig}" if kubeconfig else "the service account token"
            raise StartupProblem(
                f"the API server at {client.server_url} refused the credentials of {source}"
                f" (401 {e.message})",
                ExitCode.KUBECONFIG,
            ) from e
        except KubeError as e:
            if e.status:
                return ""  # it answered (403, 404, 5xx): reachable, which is what we ask here
            raise StartupProblem(
                f"cannot reach the API server at {client.server_url} (waited up to"
                f" {timeout_seconds:g}s): {_reason(e) or 'no answer'}",
                ExitCode.API_UNREACHABLE,
            ) from e


def _reason(error: KubeError) -> str:
    cause = error.__cause__
    while cause is not None and cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(cause) if cause is not None and str(cause) else error.message
    return " ".join(text.split())
