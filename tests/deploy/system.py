"""The rendered system and the configs its pods read, loaded with the components' own loaders."""

from __future__ import annotations

import yaml

from autoscaler_agent.config import parse_config as parse_agent_config
from scheduler_extender.config import parse_config as parse_extender_config
from testkit.manifests import MANIFESTS, arg_value, config_file, container, find, render

DOCS = render(MANIFESTS)
EXTENDER_POD = find(DOCS, "Deployment", "scheduler-extender")
AGENT_DS = find(DOCS, "DaemonSet", "autoscaler-agent")
SCHED = yaml.safe_load(
    config_file(
        DOCS,
        EXTENDER_POD,
        "kube-scheduler",
        arg_value(container(EXTENDER_POD, "kube-scheduler")["command"], "--config"),
    )
)
EXTENDER_CFG = parse_extender_config(
    yaml.safe_load(
        config_file(
            DOCS,
            EXTENDER_POD,
            "extender",
            arg_value(container(EXTENDER_POD, "extender")["args"], "--config"),
        )
    )
)
AGENT_CFG = parse_agent_config(
    config_file(
        DOCS, AGENT_DS, "agent", arg_value(container(AGENT_DS, "agent")["args"], "--config")
    )
)
