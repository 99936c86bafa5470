"""The extender's real-HTTP fixtures (fake API server, running apps), shared with these tests."""

from tests.extender.conftest import front_via, kube_api, start_extender

__all__ = ["front_via", "kube_api", "start_extender"]
