"""Runs one guest VM under QEMU for a VM pod: the process a VM pod's container executes.

Layout (functional core, imperative shell):

``cmdline``     pure: the typed ``VmSpec`` and ``build_qemu_command(spec)``; accelerator choice.
``qmp``         a minimal QMP client, only what shutdown needs (the agent has its own).
``supervisor``  starts QEMU, waits, and on SIGTERM powers the guest down cleanly.
``cli``         argparse to ``VmSpec``; ``python -m vm_runner --help`` documents every flag.
"""

from vm_runner.cmdline import Accel, Forward, VmSpec, build_qemu_command, resolve_accel

__all__ = ["Accel", "Forward", "VmSpec", "build_qemu_command", "resolve_accel"]
