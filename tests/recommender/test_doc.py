"""docs/RECOMMENDER.md's worked example is what the code answers, to the value."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import yaml

from scheduler_extender.config import parse_config
from scheduler_extender.recommender import encode_recommendation, load_snapshot, recommend

DOC = Path(__file__).resolve().parents[2] / "docs/RECOMMENDER.md"


def block(name: str) -> str:
    found = re.search(
        rf"<!-- worked-example: {name} -->\n```\w+\n(.*?)\n```", DOC.read_text(), re.DOTALL
    )
    assert found is not None, f"no {name} block in {DOC.name}"
    return found.group(1)


def test_the_worked_example_answer_is_what_the_code_gives():
    config = parse_config(yaml.safe_load(block("config"))).recommender_config()
    prepared = load_snapshot(block("snapshot").encode(), fmt="yaml")
    answer = encode_recommendation(recommend(prepared, config=config))
    assert msgspec.json.decode(answer) == msgspec.json.decode(block("answer"))


def test_every_field_of_the_example_answer_is_documented():
    answer_section = DOC.read_text().split("## The answer", 1)[1].split("## A worked example")[0]
    pools = {p["name"] for p in yaml.safe_load(block("snapshot"))["nodePools"]}
    # Map keys that are data (pool names in ``unscheduled[].pools``) are not fields.
    for key in set(re.findall(r'"(\w+)":', block("answer"))) - pools:
        # In a code span of the answer's tables: `key`, `key[]`, `diagnostics.key`...
        assert re.search(rf"`[^`\n]*\b{key}\b[^`\n]*`", answer_section), key
