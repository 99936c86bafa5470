"""Config errors name their $.path and exit 3; --help explains every flag; examples load."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scheduler_extender.__main__ import EXIT_CONFIG, main
from scheduler_extender.config import AuthMode, Config, ConfigError, load_config, parse_config
from scheduler_extender.kube.standalone import load_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_defaults() -> None:
    config = parse_config(None)
    assert config == Config()
    assert config.scheduler_name == "vm-scheduler"
    assert (config.listen.verbs.port, config.listen.permits.port) == (10298, 10299)
    assert config.system_reserve.cpu_fraction == 0.2
    assert config.auth.mode is AuthMode.TOKENREVIEW
    assert config.auth.audience == "vm-autoscaling-extender"


def test_example_config_is_the_defaults() -> None:
    assert load_config(EXAMPLES / "extender-config.yaml") == Config()


def test_example_standalone_cluster_loads() -> None:
    cluster = load_cluster(EXAMPLES / "standalone-cluster.yaml")
    assert [n.name for n in cluster.nodes] == ["node-a", "node-b"]


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"scheduler_nmae": "x"}, "$"),
        ({"listen": {"verbs": {"port": 0}}}, "$.listen.verbs.port"),
        ({"system_reserve": {"cpu_fraction": 1.5}}, "$.system_reserve.cpu_fraction"),
        ({"scoring": {"strategy": "random"}}, "$.scoring.strategy"),
        ({"auth": {"mode": "static"}}, "$.auth"),
        ({"durability": {"retry_initial_seconds": 5, "retry_max_seconds": 1}}, "$.durability"),
        ({"limits": {"permits_max_body_bytes": "big"}}, "$.limits.permits_max_body_bytes"),
        ([1, 2], "$"),
        ({"relief": {"enabled": "yes"}}, "$.relief.enabled"),
        ({"relief": {"interval_seconds": 0.5}}, "$.relief.interval_seconds"),
        ({"relief": {"watermark": 1.5}}, "$.relief.watermark"),
        ({"relief": {"drain": {"below_share": 0}}}, "$.relief.drain.below_share"),
        ({"relief": {"watermak": 0.8}}, "$.relief"),
        ({"relief": {"failure_backoff_seconds": 7200}}, "$.relief"),
    ],
    ids=[
        "unknown",
        "port",
        "fraction",
        "strategy",
        "static-no-token",
        "retry",
        "type",
        "list",
        "relief-switch",
        "relief-interval",
        "relief-watermark",
        "relief-drain-share",
        "relief-unknown",
        "relief-backoff-above-its-max",
    ],
)
def test_errors_name_the_path(data: object, path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert f"at `{path}`" in str(caught.value)


def test_bad_config_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("auth:\n  mode: sometimes\n")
    assert main(["--config", str(bad)]) == EXIT_CONFIG == 3
    assert "$.auth.mode" in capsys.readouterr().err
    assert main(["serve", "--config", str(tmp_path / "missing.yaml")]) == 3
    bad.write_text("nodes: [{name: a}]\n")
    assert main(["--standalone", str(bad)]) == 3
    assert "$.nodes[0]" in capsys.readouterr().err


def test_help_explains_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--config", "--kubeconfig", "--standalone", "--log-level", "serve"):
        assert flag in out


def test_the_commented_quota_example_loads() -> None:
    text = (EXAMPLES / "extender-config.yaml").read_text()
    block = "\n".join(
        line[2:] for line in text.splitlines() if line.startswith(("# quota:", "#   "))
    )
    quota = parse_config(yaml.safe_load(block)).quota
    assert quota is not None and quota.file is None
    assert sorted(quota.inline().cohort_members()["research"]) == ["team-a", "team-b"]


@pytest.mark.parametrize(
    ("quota", "message"),
    [
        (
            {"namespaces": {"team-a": {"vcpus": -1, "memory_bytes": 1}}},
            "Expected `int` >= 0 - at `$.quota.namespaces.team-a.vcpus`",
        ),
        (
            {"file": "/q.yaml", "namespaces": {"team-a": {"vcpus": 1, "memory_bytes": 1}}},
            "quota.file and quota.namespaces are exclusive: keep one source - at `$.quota`",
        ),
        ({"namespace": {}}, "Object contains unknown field `namespace` - at `$.quota`"),
    ],
    ids=["negative", "two-sources", "typo"],
)
def test_quota_section_errors_name_their_path(quota: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config({"quota": quota})
    assert str(e.value) == message
