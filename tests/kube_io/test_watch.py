"""watch_objects against the fake API server: list, stream, bookmarks, resume, relist, backoff."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest
from structlog.testing import capture_logs

from kube_io import Changed, Forbidden, Gone, KubeClient, Listed, ServerError, WatchSettings
from kube_io.watch import Backoff, interpret_event, watch_objects
from protocol.kube import Pod, WatchEvent
from testkit.kube_api import FakeKubeApi, node_object, pod_object

# Real-time tests: backoffs short enough not to slow the suite.
FAST = WatchSettings(backoff_initial_seconds=0.001, backoff_max_seconds=0.01, jitter_ratio=0)


class PodView:
    """What a consumer does: replace on Listed, apply on Changed."""

    def __init__(self) -> None:
        self.pods: dict[str, Pod] = {}
        self.listed = 0

    def apply(self, item):
        if isinstance(item, Listed):
            self.listed += 1
            self.pods = {p.metadata.name: p for p in item.objects}
        elif item.type == "DELETED":
            self.pods.pop(item.object.metadata.name, None)
        else:
            self.pods[item.object.metadata.name] = item.object
        return item


class Consumer:
    """A background task iterating the watch, as a real consumer would: the generator only
    opens its next stream when asked for an item, so the test must not be the one asking."""

    def __init__(self, items, view=None):
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.view = view
        self.task = asyncio.create_task(self._pump(items))
        self.has_raised = False

    async def _pump(self, items):
        async with contextlib.aclosing(items):
            async for item in items:
                self.queue.put_nowait(item)

    async def take(self):
        getter = asyncio.ensure_future(self.queue.get())
        done, _ = await asyncio.wait({getter, self.task}, timeout=10, return_when="FIRST_COMPLETED")
        if getter not in done:
            getter.cancel()
            if self.task in done:
                self.has_raised = True
                error = self.task.exception()
                assert error is not None
                raise error
            raise AssertionError("no watch item within 10 seconds")
        item = getter.result()
        return self.view.apply(item) if self.view is not None else item

    async def stop(self):
        if self.has_raised:
            return  # take() already raised the task's exception into the test
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def consuming(client, kind="pods", *, view=None, settings=FAST, **kwargs):
    consumer = Consumer(watch_objects(client, kind, settings=settings, **kwargs), view)
    try:
        yield consumer
    finally:
        await consumer.stop()


def watch_requests(api):
    return [r for r in api.requests if r.query.get("watch") == "1"]


def change(item):
    assert isinstance(item, Changed)
    return item.type, item.object.metadata.name


async def test_lists_then_streams_changes(kube_api, client):
    kube_api.add_pod(pod_object("a", namespace="vms"))
    async with consuming(client) as items:
        listed = await items.take()
        assert isinstance(listed, Listed)
        assert [p.metadata.name for p in listed.objects] == ["a"]
        assert listed.resource_version == str(kube_api.resource_version)
        await kube_api.wait_for_watches()
        kube_api.add_pod(pod_object("b", namespace="vms"))
        kube_api.update_pod("vms", "a", {"metadata": {"labels": {"x": "y"}}})
        kube_api.delete_pod("vms", "b")
        assert change(await items.take()) == ("ADDED", "b")
        modified = await items.take()
        assert change(modified) == ("MODIFIED", "a")
        assert modified.object.metadata.labels == {"x": "y"}
        assert change(await items.take()) == ("DELETED", "b")
    [request] = watch_requests(kube_api)
    assert request.query["resourceVersion"] == listed.resource_version
    assert request.query["allowWatchBookmarks"] == "true"


async def test_nodes_are_watched_too(kube_api, client):
    kube_api.add_node(node_object("node-a"))
    async with consuming(client, "nodes") as items:
        listed = await items.take()
        assert [n.metadata.name for n in listed.objects] == ["node-a"]
        await kube_api.wait_for_watches()
        kube_api.update_node("node-a", {"spec": {"unschedulable": True}})
        modified = await items.take()
        assert modified.object.spec.unschedulable is True


async def test_bookmarks_advance_the_version_and_are_not_yielded(kube_api, client):
    async with consuming(client) as items:
        await items.take()
        await kube_api.wait_for_watches()
        kube_api.add_node(node_object("node-a"))  # moves the version; the pod stream sees nothing
        kube_api.send_bookmarks()
        bookmarked = str(kube_api.resource_version)
        kube_api.add_pod(pod_object("a"))
        assert change(await items.take()) == ("ADDED", "a")
        with capture_logs() as logs:
            kube_api.close_watches()  # a clean end, as the server's timeoutSeconds
            kube_api.add_pod(pod_object("b"))
            assert change(await items.take()) == ("ADDED", "b")
    first, second = watch_requests(kube_api)
    assert (
        int(second.query["resourceVersion"]) > int(bookmarked) > int(first.query["resourceVersion"])
    )
    assert [e["event"] for e in logs] == ["watch_resumed"]


async def test_bookmark_alone_moves_the_resume_point(kube_api, client):
    async with consuming(client) as items:
        await items.take()
        await kube_api.wait_for_watches()
        kube_api.add_node(node_object("node-a"))
        kube_api.send_bookmarks()
        bookmarked = str(kube_api.resource_version)
        kube_api.close_watches()
        kube_api.add_pod(pod_object("a"))
        assert change(await items.take()) == ("ADDED", "a")
    assert watch_requests(kube_api)[1].query["resourceVersion"] == bookmarked


async def test_resumes_from_the_last_version_after_a_dropped_connection(kube_api, client):
    view = PodView()
    async with consuming(client, view=view) as items:
        await items.take()
        await kube_api.wait_for_watches()
        kube_api.add_pod(pod_object("a"))
        seen = await items.take()
        with capture_logs() as logs:
            kube_api.close_watches(abort=True)
            kube_api.add_pod(pod_object("b"))  # happens while nobody is watching
            assert change(await items.take()) == ("ADDED", "b")
    assert view.listed == 1  # resumed, not relisted
    assert set(view.pods) == {"a", "b"}
    resumed = watch_requests(kube_api)[-1]
    assert resumed.query["resourceVersion"] == seen.object.metadata.resource_version
    [failed] = [e for e in logs if e["event"] == "watch_failed"]
    assert "Unavailable" in failed["error"]
    assert failed["log_level"] == "warning"


@pytest.mark.parametrize("is_http_410", [False, True], ids=["error-event-410", "http-410"])
async def test_expired_version_relists_and_reconciles_a_missed_delete(is_http_410):
    async with FakeKubeApi(is_expired_http_410=is_http_410) as api:
        api.add_pod(pod_object("a"))
        api.add_pod(pod_object("b"))
        view = PodView()
        async with (
            KubeClient.for_url(api.url) as client,
            consuming(client, view=view) as items,
        ):
            await items.take()
            assert set(view.pods) == {"a", "b"}
            await api.wait_for_watches()
            with capture_logs() as logs:
                # While disconnected: b goes away and the history that said so is compacted.
                api.close_watches(abort=True)
                api.delete_pod("default", "b")
                api.compact()
                relisted = await items.take()
            assert isinstance(relisted, Listed)
            assert set(view.pods) == {"a"}
            api.add_pod(pod_object("c"))
            assert change(await items.take()) == ("ADDED", "c")
        assert view.listed == 2
        assert "watch_relisted" in [e["event"] for e in logs]


async def test_expired_version_right_after_a_list_backs_off(kube_api, client):
    # Compacting right after every list: must not become a tight list/watch loop.
    original = kube_api._list

    def list_then_compact(request, kind, namespace):
        response = original(request, kind, namespace)
        kube_api.add_node(node_object(f"n{kube_api.resource_version}"))
        kube_api.compact()
        return response

    kube_api._list = list_then_compact
    with capture_logs() as logs:
        async with consuming(client) as items:
            for _ in range(3):
                assert isinstance(await items.take(), Listed)
    delays = [e["delay_seconds"] for e in logs if e["event"] == "watch_relisted"]
    assert delays == [0.001, 0.002]


@pytest.mark.looptime
async def test_backoff_is_exponential_and_capped_in_loop_time(kube_api, client):
    settings = WatchSettings(
        backoff_initial_seconds=0.5, backoff_factor=2, backoff_max_seconds=2, jitter_ratio=0
    )
    loop = asyncio.get_running_loop()
    async with consuming(client, settings=settings) as items:
        await items.take()
        await kube_api.wait_for_watches()
        kube_api.add_pod(pod_object("a"))
        await items.take()
        kube_api.fail_next(503, path="/api/v1/pods", times=4)
        start = loop.time()
        kube_api.close_watches()
        kube_api.add_pod(pod_object("b"))
        assert change(await items.take()) == ("ADDED", "b")
        assert loop.time() - start == pytest.approx(0.5 + 1 + 2 + 2)


@pytest.mark.looptime
async def test_retry_after_is_honoured(kube_api, client):
    settings = WatchSettings(backoff_initial_seconds=0.1, jitter_ratio=0)
    loop = asyncio.get_running_loop()
    async with consuming(client, settings=settings) as items:
        await items.take()
        await kube_api.wait_for_watches()
        kube_api.add_pod(pod_object("a"))
        await items.take()
        kube_api.fail_next(429, path="/api/v1/pods")  # Retry-After: 1
        start = loop.time()
        kube_api.close_watches()
        kube_api.add_pod(pod_object("b"))
        await items.take()
        assert loop.time() - start == pytest.approx(1)


async def test_errors_that_retrying_cannot_fix_are_raised(kube_api, client):
    async with consuming(client) as items:
        await items.take()
        await kube_api.wait_for_watches()
        kube_api.fail_next(403, path="/api/v1/pods", message="pods is forbidden")
        kube_api.close_watches()
        with pytest.raises(Forbidden, match="pods is forbidden"):
            await items.take()


async def test_selectors_apply_to_list_and_watch(kube_api, client):
    kube_api.add_pod(pod_object("elsewhere", node_name="node-b"))
    kube_api.add_pod(pod_object("pending", labels={"app": "pg"}))
    watch = consuming(client, field_selector="spec.nodeName=node-a", label_selector="app=pg")
    async with watch as items:
        assert (await items.take()).objects == []
        await kube_api.wait_for_watches()
        await client.bind_pod(
            "default",
            "pending",
            uid=kube_api.get_pod("default", "pending")["metadata"]["uid"],
            node="node-a",
        )
        # It starts matching when bound: the server says ADDED for this watch.
        assert change(await items.take()) == ("ADDED", "pending")
    request = watch_requests(kube_api)[0]
    assert request.query["fieldSelector"] == "spec.nodeName=node-a"
    assert request.query["labelSelector"] == "app=pg"


# --- the pure parts -----------------------------------------------------------------------


def test_backoff_delays():
    settings = WatchSettings(backoff_initial_seconds=1, backoff_max_seconds=5, jitter_ratio=0)
    backoff = Backoff(settings, random.Random(0))
    assert [backoff.next_delay() for _ in range(5)] == [1, 2, 4, 5, 5]
    backoff.reset()
    assert backoff.next_delay() == 1


def test_backoff_jitter_stays_below_the_cap():
    settings = WatchSettings(backoff_initial_seconds=1, backoff_max_seconds=8, jitter_ratio=0.2)
    backoff = Backoff(settings, random.Random(42))
    delays = [backoff.next_delay() for _ in range(6)]
    for delay, nominal in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert nominal * 0.8 <= delay <= nominal


@pytest.mark.parametrize(
    ("line", "error_type"),
    [
        (b'{"type":"ERROR","object":{"kind":"Status","code":500,"message":"x"}}', ServerError),
        (b'{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Gone"}}', Gone),
        (b'{"type":"ERROR","object":{"kind":"Status","message":"no code"}}', ServerError),
        (b'{"type":"SURPRISE","object":{}}', ServerError),
        (b'{"type":"ADDED","object":{"metadata":[]}}', ServerError),
    ],
    ids=["500", "410", "no-code", "unknown-type", "undecodable"],
)
def test_interpret_event_errors(line, error_type):
    from protocol.codec import decode

    with pytest.raises(error_type):
        interpret_event(decode(WatchEvent, line), Pod)
