"""``protocol.strict_yaml``: the C loader reads what the pure-Python one reads, and both refuse
duplicate keys however they are spelled; syntax errors are one line without stand-in names."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.strict_yaml import PyStrictLoader, StrictLoader, describe_yaml_error, load_strict

LOADERS = [StrictLoader, PyStrictLoader]
_keys = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)
_scalars = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.text(max_size=8))
_documents = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=4)),
    max_leaves=20,
)


def test_the_fast_loader_is_libyamls():
    assert yaml.__with_libyaml__, "PyYAML without libyaml: pip install a wheel that has it"
    assert issubclass(StrictLoader, yaml.CSafeLoader)


@settings(max_examples=200, deadline=None)
@given(_documents)
def test_both_loaders_read_the_same(document):
    text = yaml.safe_dump(document)
    assert yaml.load(text, Loader=StrictLoader) == yaml.load(text, Loader=PyStrictLoader)
    assert load_strict(text) == yaml.safe_load(text)


@pytest.mark.parametrize("loader", LOADERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("a: 1\nb: 2\na: 3\n", "'a'"),
        ("outer:\n  x: 1\n  x: 1\n", "'x'"),
        ("1: one\n01: also one\n", "1"),  # spelled differently, the same int key
        ("- {k: 1, k: 2}\n", "'k'"),
    ],
)
def test_duplicate_keys_are_refused(loader, text, key):
    with pytest.raises(yaml.constructor.ConstructorError, match=f"duplicate key {key}"):
        yaml.load(text, Loader=loader)


@pytest.mark.parametrize("source", ["text", b"bytes"])
def test_syntax_errors_are_one_line_without_stand_in_names(source):
    broken = "a: [1, 2\nb: 3\n"
    data = broken if source == "text" else broken.encode()
    with pytest.raises(yaml.YAMLError) as caught:
        load_strict(data)
    line = describe_yaml_error(caught.value)
    assert "\n" not in line
    assert line.startswith("line ")
    assert "<unicode string>" not in line and "<byte string>" not in line
