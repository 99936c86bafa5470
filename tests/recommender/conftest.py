"""The extender's real-HTTP fixtures (fake API server, running apps), shared with these tests."""

from tests.extender.conftest import kube_api, start_extender

__all__ = ["kube_api", "start_extender"]
