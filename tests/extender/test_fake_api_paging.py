"""The fake API server's list paging, which the extender's startup tests lean on.

Regression: page snapshots were keyed by resourceVersion alone, so a node list and a pod list
started at the same version overwrote each other's snapshot, and the next page of the first one
failed with a KeyError (HTTP 500) instead of continuing.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from testkit.kube_api import FakeKubeApi, node_object, pod_object


async def _get(session: aiohttp.ClientSession, url: str, **query: str) -> dict[str, Any]:
    async with session.get(url, params=query) as response:
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return body


def _names(page: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in page["items"]]


async def test_pages_of_lists_started_at_the_same_version_do_not_mix(
    kube_api: FakeKubeApi,
) -> None:
    for i in range(3):
        kube_api.add_node(node_object(f"node-{i}"))
        kube_api.add_pod(pod_object(f"pod-{i}", namespace="vms", labels={"app": "vm"}))
    kube_api.add_pod(pod_object("other", namespace="vms"))
    nodes_url, pods_url = f"{kube_api.url}/api/v1/nodes", f"{kube_api.url}/api/v1/pods"
    async with aiohttp.ClientSession() as session:
        nodes = await _get(session, nodes_url, limit="2")
        pods = await _get(session, pods_url, limit="2")
        labelled = await _get(session, pods_url, limit="1", labelSelector="app=vm")
        versions = {p["metadata"]["resourceVersion"] for p in (nodes, pods, labelled)}
        assert len(versions) == 1  # all three lists started at the same version

        more_nodes = await _get(session, nodes_url, limit="2", **{"continue": _token(nodes)})
        more_pods = await _get(session, pods_url, limit="2", **{"continue": _token(pods)})
        more_labelled = await _get(
            session,
            pods_url,
            limit="5",
            labelSelector="app=vm",
            **{"continue": _token(labelled)},
        )
    assert _names(nodes) + _names(more_nodes) == ["node-0", "node-1", "node-2"]
    assert _names(pods) + _names(more_pods) == ["other", "pod-0", "pod-1", "pod-2"]
    assert _names(labelled) + _names(more_labelled) == ["pod-0", "pod-1", "pod-2"]
    assert "continue" not in more_nodes["metadata"]


def _token(page: dict[str, Any]) -> str:
    token: str = page["metadata"]["continue"]
    return token
