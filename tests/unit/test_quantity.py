import pytest

from protocol.quantity import (
    QuantityError,
    cpu_millis,
    format_cpu,
    format_memory,
    memory_bytes,
)


@pytest.mark.parametrize(
    ("text", "millis"),
    [
        ("250m", 250),
        ("1", 1000),
        ("0.1", 100),
        ("1.5", 1500),
        ("2k", 2_000_000),
        ("1e3", 1_000_000),
        ("0.0001", 1),
        ("100u", 1),
    ],
    ids=[
        "millis",
        "whole",
        "decimal",
        "fraction",
        "kilo",
        "exponent",
        "rounds-up",
        "micro-rounds-up",
    ],
)
def test_cpu_millis(text, millis):
    assert cpu_millis(text) == millis


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("128Mi", 128 * 2**20),
        ("1Gi", 2**30),
        ("1G", 10**9),
        ("1500m", 2),
        ("64", 64),
        ("1e3", 1000),
        (".5Ki", 512),
    ],
    ids=["mebi", "gibi", "giga", "milli-rounds-up", "plain", "exponent", "leading-dot"],
)
def test_memory_bytes(text, value):
    assert memory_bytes(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "-1", "1Zi", "Mi", "1e99", "9" * 30 + "Ei"])
def test_invalid_quantities_are_errors(text):
    with pytest.raises(QuantityError):
        memory_bytes(text)


def test_formatting_round_trips():
    assert format_cpu(2000) == "2"
    assert format_cpu(2500) == "2500m"
    assert format_memory(2**30) == "1Gi"
    assert format_memory(3 * 2**20) == "3Mi"
    assert format_memory(1000) == "1000"
    for millis in (1, 999, 1000, 123456):
        assert cpu_millis(format_cpu(millis)) == millis
