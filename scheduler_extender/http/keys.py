"""Typed ``AppKey``s shared by the listeners (no string keys, no globals).

Shell: declarations only.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from scheduler_extender.kube.auth import Authenticator
from scheduler_extender.service import Extender

EXTENDER = web.AppKey("extender", Extender)
AUTHENTICATOR = web.AppKey("authenticator", Authenticator)
# Background tasks whose death makes /healthz fail (the kubelet then restarts the process).
TASKS = web.AppKey("tasks", list[asyncio.Task[None]])
