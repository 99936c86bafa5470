"""One line for a YAML syntax error, without PyYAML's stand-in names for the source.

PyYAML names what it parsed ``"<unicode string>"`` or ``"<byte string>"`` when handed text
rather than a file, and spreads the message over several lines with a caret picture. Callers
put the real file name in front of this line; it says where in the file and what is wrong.
"""

from __future__ import annotations

import yaml

__all__ = ["describe_yaml_error"]


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
