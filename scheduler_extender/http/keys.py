"""Typed ``AppKey``s shared by the listeners (no string keys, no globals).

Shell: declarations only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client.metrics_core import Metric

from scheduler_extender.kube.auth import Authenticator
from scheduler_extender.kube.metrics_auth import MetricsGuard
from scheduler_extender.service import Extender

EXTENDER = web.AppKey("extender", Extender)
AUTHENTICATOR = web.AppKey("authenticator", Authenticator)
# Who may read /metrics on the metrics listener (absent on the other listeners: loopback).
METRICS_GUARD = web.AppKey("metrics_guard", MetricsGuard)
# Background tasks whose death makes /healthz fail (the kubelet then restarts the process).
TASKS = web.AppKey("tasks", list[asyncio.Task[None]])
# More metric families for /metrics, from another process (the permit front's).
MoreMetrics = Callable[[], Awaitable[list[Metric]]]
EXTRA_METRICS: web.AppKey[MoreMetrics] = web.AppKey("extra_metrics")
