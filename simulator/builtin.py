"""The built-in scenario: what ``vm-simulator`` runs with no argument.

Pure data. A small cluster over one simulated hour that shows every part at work: three nodes,
a dozen VMs (three databases hit by pgbench-like bursts, web servers on a daily-ish sine, two
steady batch VMs), a foreign pod arriving, a hypervisor failing during a burst, an extender
restart, a VM deleted, and a large VM no node can take until the recommender adds one.
"""

from __future__ import annotations

from typing import Final

from simulator.scenario import Scenario, parse_scenario

DEFAULT_SCENARIO_YAML: Final = """\
name: default
duration_seconds: 3600
description: >-
  A small cluster over one hour with every part at work: three databases hit by pgbench-like
  bursts, web servers on a sine, steady batch VMs, a foreign pod arriving, a hypervisor failing
  during a burst, an extender restart, a VM deleted, and a large VM (analytics) that waits,
  pending, until the recommender's new node joins.
seed: 7
nodes:
  - {name: node-a, cpu: 24, memory: 96Gi, pool: general, zone: zone-a}
  - {name: node-b, cpu: 24, memory: 96Gi, pool: general, zone: zone-b}
  - {name: node-c, cpu: 24, memory: 96Gi, pool: general, zone: zone-c}
node_pools:
  - {name: general, zones: [zone-a, zone-b, zone-c], cpu: 24, memory: 96Gi, max_count: 6,
     provision_seconds: 90}
traces:
  # pgbench: idle, then a burst of clients that keeps ~6.5 vCPUs busy, then idle again.
  pgbench-early:
    - {at_seconds: 0, level_vcpus: 0.3}
    - {at_seconds: 300, level_vcpus: 6.5}
    - {at_seconds: 900, level_vcpus: 0.4}
  pgbench-late:
    - {at_seconds: 0, level_vcpus: 0.3}
    - {at_seconds: 1200, level_vcpus: 6.5}
    - {at_seconds: 1800, level_vcpus: 0.4}
  pgbench-ramp:
    - {at_seconds: 0, level_vcpus: 0.5}
    - {at_seconds: 2400, ramp: {to_vcpus: 5, over_seconds: 300}}
    - {at_seconds: 3300, level_vcpus: 0.5}
  web:
    - {at_seconds: 0, sine: {mean_vcpus: 1.4, amplitude_vcpus: 1.0, period_seconds: 1200}}
  steady:
    - {at_seconds: 0, level_vcpus: 2.5}
  big:
    - {at_seconds: 0, level_vcpus: 11}
vms:
  - {name: db-1, min_vcpus: 1, max_vcpus: 8, trace: pgbench-early}
  - {name: db-2, min_vcpus: 1, max_vcpus: 8, trace: pgbench-late}
  - {name: db-3, min_vcpus: 1, max_vcpus: 8, trace: pgbench-ramp}
  - {name: web-1, min_vcpus: 1, max_vcpus: 4, trace: web}
  - {name: web-2, min_vcpus: 1, max_vcpus: 4, trace: web}
  - {name: web-3, min_vcpus: 1, max_vcpus: 4, trace: web}
  - {name: web-4, min_vcpus: 1, max_vcpus: 4, trace: web}
  - {name: web-5, min_vcpus: 1, max_vcpus: 4, trace: web}
  - {name: web-6, min_vcpus: 1, max_vcpus: 4, trace: web}
  - {name: batch-1, min_vcpus: 2, max_vcpus: 6, scaling_unit: 2, trace: steady}
  - {name: batch-2, min_vcpus: 2, max_vcpus: 6, scaling_unit: 2, trace: steady}
  - {name: analytics, namespace: data, min_vcpus: 12, max_vcpus: 16, start_seconds: 1500,
     priority: 10, trace: big}
foreign_pods:
  - {name: log-shipper, cpu: 2, memory: 2Gi, start_seconds: 600}
events:
  - {at_seconds: 1230, kind: hypervisor-fail, vm: db-2, for_seconds: 30}
  - {at_seconds: 2000, kind: extender-restart, down_seconds: 10}
  - {at_seconds: 2700, kind: delete-vm, vm: web-6}
plot_vms: [db-1, db-2, db-3, web-1, batch-1, analytics]
"""


def default_scenario() -> Scenario:
    return parse_scenario(DEFAULT_SCENARIO_YAML)
