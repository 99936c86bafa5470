"""The metric names a PromQL expression reads, and the same expression with its time windows
scaled: a tokenizer of PromQL's lexical grammar, not pattern matching on the text.

Prometheus's lexer (``promql/parser/lex.go``) is the spec: identifiers and metric names
(``[a-zA-Z_:][a-zA-Z0-9_:]*``), strings in double, single or back quotes (backslash escapes
in the first two), numbers (decimal, hex, exponents, ``Inf``/``NaN``), durations
(``5m``, ``1h30m``, only inside ``[...]`` and after ``offset``), ``#`` comments, and
operators. What is a metric name then follows from the parser's rules: an identifier that
is not inside a selector's braces, not a function or aggregation (followed by ``(`` or by a
grouping clause), not a keyword, and not in the label list of ``by``/``without``/``on``/
``ignoring``/``group_left``/``group_right``. Anything the lexer does not know raises
``PromqlError``, so an expression this module cannot read fails loudly instead of yielding
fewer names. ``{__name__=...}`` selectors are refused for the same reason.

``promtool check rules`` remains the judge of whether an expression is valid; this module
only reads names out of valid ones (tests/deploy/test_monitoring.py runs both).
"""

from __future__ import annotations

from typing import Final, NamedTuple

KEYWORDS: Final = frozenset({"and", "or", "unless", "bool", "offset", "atan2"})
GROUPING: Final = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
AGGREGATIONS: Final = frozenset(
    {
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
        "bottomk", "topk", "quantile", "limitk", "limit_ratio",
    }
)  # fmt: skip
NUMBER_WORDS: Final = frozenset({"inf", "nan"})
OPERATORS: Final = ("==", "!=", "<=", ">=", "=~", "!~", "+", "-", "*", "/", "%", "^", "<", ">", "=")
PUNCTUATION: Final = "(){}[],:@"
UNIT_SECONDS: Final = {
    "ms": 0.001,
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 604800,
    "y": 31536000,
}


class PromqlError(ValueError):
    """The text is not PromQL this tokenizer can read; the message says where."""


class Token(NamedTuple):
    kind: str  # ident, string, number, duration, op, punct
    text: str
    start: int
    end: int


def _is_ident_start(c: str) -> bool:
    return c.isascii() and (c.isalpha() or c in "_:")


def _is_ident_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c in "_:")


def _duration_end(expr: str, i: int) -> int:
    """The end of the duration starting at ``i`` (one or more number+unit pairs)."""
    j = i
    while j < len(expr) and expr[j].isdigit():
        k = j
        while k < len(expr) and expr[k].isdigit():
            k += 1
        unit = expr[k : k + 2] if expr[k : k + 2] == "ms" else expr[k : k + 1]
        if unit not in UNIT_SECONDS:
            raise PromqlError(f"bad duration at {i}: {expr[i : k + 1]!r}")
        j = k + len(unit)
    if j == i:
        raise PromqlError(f"a duration expected at {i}: {expr[i : i + 8]!r}")
    return j


def tokens(expr: str) -> list[Token]:
    out: list[Token] = []
    i, n = 0, len(expr)
    in_range = False  # inside [...]: durations, not numbers
    while i < n:
        c = expr[i]
        if c.isspace():
            i += 1
        elif c == "#":
            while i < n and expr[i] != "\n":
                i += 1
        elif c in "\"'`":
            j = i + 1
            while j < n and expr[j] != c:
                j += 2 if expr[j] == "\\" and c != "`" else 1
            if j >= n:
                raise PromqlError(f"unterminated string at {i}")
            out.append(Token("string", expr[i : j + 1], i, j + 1))
            i = j + 1
        elif c.isdigit() and (in_range or (out and out[-1].text == "offset")):
            j = _duration_end(expr, i)
            out.append(Token("duration", expr[i:j], i, j))
            i = j
        elif c.isdigit() or (c == "." and i + 1 < n and expr[i + 1].isdigit()):
            j = i
            if expr[i : i + 2].lower() == "0x":
                j = i + 2
                while j < n and expr[j] in "0123456789abcdefABCDEF":
                    j += 1
            else:
                while j < n and (expr[j].isdigit() or expr[j] == "."):
                    j += 1
                if j < n and expr[j] in "eE":
                    j += 1
                    if j < n and expr[j] in "+-":
                        j += 1
                    while j < n and expr[j].isdigit():
                        j += 1
            if j < n and _is_ident_char(expr[j]):
                raise PromqlError(f"bad number at {i}: {expr[i : j + 1]!r}")
            out.append(Token("number", expr[i:j], i, j))
            i = j
        elif c == ":" and in_range:  # a subquery's step: [5m:1m]
            out.append(Token("punct", c, i, i + 1))
            i += 1
        elif _is_ident_start(c):
            j = i + 1
            while j < n and _is_ident_char(expr[j]):
                j += 1
            word = expr[i:j]
            kind = "number" if word.lower() in NUMBER_WORDS else "ident"
            out.append(Token(kind, word, i, j))
            i = j
        elif c in PUNCTUATION:
            if c == "[":
                in_range = True
            elif c == "]":
                in_range = False
            out.append(Token("punct", c, i, i + 1))
            i += 1
        else:
            op = next((o for o in OPERATORS if expr.startswith(o, i)), None)
            if op is None:
                raise PromqlError(f"unexpected {c!r} at {i} in {expr!r}")
            out.append(Token("op", op, i, i + len(op)))
            i += len(op)
    return out


def metric_names(expr: str) -> set[str]:
    """Every metric name ``expr`` selects."""
    toks = tokens(expr)
    names: set[str] = set()
    braces = 0
    i = 0
    while i < len(toks):
        t = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if t.text == "{":
            braces += 1
        elif t.text == "}":
            braces -= 1
        elif t.kind == "ident" and braces:
            if t.text == "__name__":
                raise PromqlError(f"{{__name__=...}} selectors are not read here: {expr!r}")
        elif t.kind == "ident" and t.text in GROUPING:
            if nxt is not None and nxt.text == "(":  # skip the label list
                depth = 0
                while i < len(toks):
                    depth += toks[i].text == "("
                    depth -= toks[i].text == ")"
                    if toks[i].text == ")" and depth == 0:
                        break
                    i += 1
        elif t.kind == "ident" and t.text not in KEYWORDS:
            is_call = nxt is not None and (nxt.text == "(" or nxt.text in GROUPING)
            if not is_call:  # ``sum by (x) (...)``: the grouping clause is read next
                names.add(t.text)
        i += 1
    if braces:
        raise PromqlError(f"unbalanced braces in {expr!r}")
    return names


def seconds(duration: str) -> float:
    total, i = 0.0, 0
    while i < len(duration):
        j = i
        while duration[j].isdigit():
            j += 1
        unit = "ms" if duration[j : j + 2] == "ms" else duration[j]
        total += int(duration[i:j]) * UNIT_SECONDS[unit]
        i = j + len(unit)
    return total


def duration_text(value: float) -> str:
    """A PromQL duration for ``value`` seconds, in whole milliseconds."""
    millis = max(1, round(value * 1000))
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def scaled(expr: str, divisor: float) -> str:
    """``expr`` with every range and offset duration divided by ``divisor``."""
    parts: list[str] = []
    last = 0
    for t in tokens(expr):
        if t.kind == "duration":
            parts.append(expr[last : t.start])
            parts.append(duration_text(seconds(t.text) / divisor))
            last = t.end
    parts.append(expr[last:])
    return "".join(parts)
