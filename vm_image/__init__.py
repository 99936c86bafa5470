"""Guest images for the VMs this project scales, built from pinned Debian packages.

Two variants:

``minimal``
    A kernel plus an initramfs (busybox, node_exporter, virtio-net modules, a CPU onliner and a
    serial shell). Small and quick to boot under TCG, so tests boot a real guest with it.
``full``
    A debootstrapped Debian root with PostgreSQL and a pgbench database, as a raw disk image.
    Realistic, slow to build; see ``vm_image/README.md``.

Entry point: ``python -m vm_image {minimal,full}`` (or ``vm_image/build.sh``). Only the standard
library is used, so a bare Debian machine with ``python3`` can build the image.
"""
