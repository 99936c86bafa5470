"""cloud-hypervisor's contract as data: error bodies, status mapping, ch-remote stderr, vm.info."""

from __future__ import annotations

import pytest

from autoscaler_agent.hypervisor import ch_api
from autoscaler_agent.hypervisor.base import VcpuState
from autoscaler_agent.hypervisor.errors import (
    ResizeInProgress,
    ResizeRejected,
    UnexpectedResponse,
    VmNotFound,
)


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (
            b'["Error from API","The VM could not be resized","bad"]',
            "Error from API: The VM could not be resized: bad",
        ),
        (b"Error from API: plain text\n", "Error from API: plain text"),
        (b"", "(empty body)"),
        (b"[]", "(empty body)"),
        (b'{"not": "a list"}', '{"not": "a list"}'),
        ('["ünïcode"]', "ünïcode"),
    ],
    ids=["v47-array", "plain-text", "empty", "empty-array", "json-object-as-text", "str-input"],
)
def test_error_text(body, text):
    assert ch_api.error_text(body) == text


@pytest.mark.parametrize(
    ("status", "operation", "error", "retryable"),
    [
        (404, "vm.resize", VmNotFound, False),
        (404, "vm.info", VmNotFound, False),
        (429, "vm.resize", ResizeInProgress, True),
        (400, "vm.resize", ResizeRejected, False),
        (500, "vm.resize", ResizeRejected, False),
        (500, "vm.info", UnexpectedResponse, False),
        (503, "vm.resize", UnexpectedResponse, False),
    ],
    ids=["404", "404-info", "429", "400", "500", "500-info", "503-unknown"],
)
def test_error_for_status(status, operation, error, retryable):
    e = ch_api.error_for_status(status, b'["outer","inner"]', operation=operation)
    assert type(e) is error
    assert e.is_retryable is retryable
    assert (
        str(e)
        == f"cloud-hypervisor {operation} answered {status}"
        + {404: " (no VM created)", 429: " (a vCPU removal is still pending)"}.get(status, "")
        + ": outer: inner"
    )
    assert e.detail == "outer: inner"


@pytest.mark.parametrize(
    ("stderr", "parsed"),
    [
        ('Server responded with error 429: ["a","b"]\n', (429, '["a","b"]')),
        ("Server responded with error 500: plain text\n", (500, "plain text")),
        ("Error: ch-remote: Server responded with error 404: \n", (404, "")),
        # cloud-hypervisor's api_client formats with {:?}: a status name and Option<String>.
        (
            "Error running command\n\nCaused by:\n  Server responded with error TooManyRequests: "
            'Some("[\\"Error from API\\",\\"pending\\"]")\n',
            (429, '["Error from API","pending"]'),
        ),
        ("Server responded with error NotFound: None\n", (404, "")),
        ('Server responded with an error: InternalServerError: Some("x\\ny")', (500, "x\ny")),
        ("Error opening HTTP socket: No such file or directory (os error 2)\n", None),
        ("Server responded with error Unknown: None", None),
    ],
    ids=[
        "numeric-json",
        "numeric-text",
        "prefixed-empty",
        "rust-debug",
        "rust-none",
        "old-wording",
        "no-answer",
        "unknown-status",
    ],
)
def test_parse_server_response(stderr, parsed):
    assert ch_api.parse_server_response(stderr) == parsed


def test_vm_info_tolerates_unknown_fields_and_follows_schema_defaults():
    info = ch_api.decode_vm_info(
        b'{"config": {"payload": {}, "cpus": {"boot_vcpus": 2, "max_vcpus": 8, "new": 1},'
        b' "future_field": []}, "state": "Running", "device_tree": {}}'
    )
    assert info.vcpus == VcpuState(current=2, max=8)
    # cpus is optional in VmConfig; cloud-hypervisor then boots 1 of at most 1.
    no_cpus = ch_api.decode_vm_info(b'{"config": {"payload": {}}, "state": "Created"}')
    assert no_cpus.vcpus == VcpuState(current=1, max=1)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"state": "Running"}',
        b'{"config": {"cpus": {"boot_vcpus": 1}}, "state": "x"}',
        b'{"config": {"payload": {}, "cpus": {"boot_vcpus": 0, "max_vcpus": 1}}, "state": "x"}',
    ],
    ids=["garbage", "no-config", "no-payload-no-max", "zero-vcpus"],
)
def test_vm_info_rejects_what_the_schema_forbids(body):
    with pytest.raises(UnexpectedResponse, match=r"vm\.info answer is not a VmInfo"):
        ch_api.decode_vm_info(body)
