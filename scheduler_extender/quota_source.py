"""Where the quotas come from when ``quota.file`` is set: a file, re-read while serving.

Shell. Mount the quota ConfigMap as a volume at ``quota.file``: the kubelet rewrites the file
when the ConfigMap changes (within its sync period, about a minute), and this loop notices the
new bytes within ``reload_interval_seconds``. Polling the bytes rather than watching inotify
events: the kubelet swaps a symlink (``..data``), which inotify reports on the directory, not
on the file, and polling costs one small read every few seconds.

The first load happens before the extender serves and is fatal when it fails (``ConfigError``,
exit 3): a quota that silently fails to load would leave every pod waiting. A later bad edit
is logged and the previous quotas stay.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from scheduler_extender.admission.quota import QuotaConfig, QuotaConfigError, load_quota_config
from scheduler_extender.config import ConfigError
from scheduler_extender.service import Extender

log = structlog.get_logger(__name__)


def read_quota_file(path: Path) -> tuple[bytes, QuotaConfig]:
    """The file's bytes and quotas, or ConfigError naming the file and the ``$.path``."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"quota.file {path}: cannot read: {e.strerror}") from e
    try:
        return raw, load_quota_config(raw)
    except QuotaConfigError as e:
        raise ConfigError(f"quota.file {path}: {e}") from e


async def follow_quota_file(
    path: Path, extender: Extender, *, loaded: bytes, interval_seconds: float
) -> None:
    """Re-read ``path`` every ``interval_seconds``; adopt changed, valid quotas. Forever."""
    last = loaded
    while True:
        await asyncio.sleep(interval_seconds)
        try:
            raw = await asyncio.to_thread(path.read_bytes)
        except OSError as e:
            log.warning("quota_file_unreadable", path=str(path), error=e.strerror)
            continue
        if raw == last:
            continue
        last = raw
        try:
            quotas = load_quota_config(raw)
        except QuotaConfigError as e:
            log.error("quota_reload_failed", path=str(path), error=str(e))
            continue
        extender.quotas_loaded(quotas)
