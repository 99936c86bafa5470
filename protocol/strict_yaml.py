"""YAML as this project reads it: strict about duplicate keys, fast, and one-line errors.

- ``StrictLoader``: PyYAML's safe loader on libyaml's C scanner and parser (``CSafeLoader``,
  the same results as ``SafeLoader``, several times faster: a 1,000-node scenario file no
  longer takes most of a minute; ``scripts/bench_scenario_load.py``), refusing duplicate keys,
  which PyYAML otherwise resolves silently to the last one. ``PyStrictLoader`` is the same in
  pure Python: the fallback without libyaml and the benchmark's baseline.
- ``describe_yaml_error``: one line for a syntax error, without PyYAML's stand-in names for
  the source (``"<unicode string>"``, ``"<byte string>"``) and its caret picture. Callers put
  the real file name in front of it.
"""

from __future__ import annotations

import yaml

__all__ = ["PyStrictLoader", "StrictLoader", "describe_yaml_error", "load_strict"]


def _mapping_without_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode) -> object:
    pairs = list(node.value)  # before construct_mapping flattens merge keys into it
    mapping = loader.construct_mapping(node)
    if len(mapping) == len(pairs):
        return mapping  # the common case: as many keys as entries, so none repeated
    # Fewer keys than entries: one repeated (perhaps spelled differently, 1 and 01). Find it.
    seen: set[object] = set()
    for key_node, _ in pairs:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return mapping


class PyStrictLoader(yaml.SafeLoader):
    """Pure Python: the fallback and the baseline."""


_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictLoader(_Base):  # type: ignore[valid-type,misc]
    """libyaml's parser (when PyYAML has it), SafeLoader's types, no duplicate keys."""


for _loader in (PyStrictLoader, StrictLoader):
    _loader.add_constructor(
        yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates
    )


def load_strict(text: str | bytes) -> object:
    """One YAML document through ``StrictLoader``; raises ``yaml.YAMLError``."""
    return yaml.load(text, Loader=StrictLoader)


def describe_yaml_error(error: yaml.YAMLError) -> str:
    """``line L, column C: <context>: <problem>`` (1-based), or the error's text in one line."""
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        what = ": ".join(part for part in (error.context, error.problem) if part)
        if mark is not None:
            return f"line {mark.line + 1}, column {mark.column + 1}: {what or 'invalid'}"
        if what:
            return what
    return " ".join(str(error).split())
