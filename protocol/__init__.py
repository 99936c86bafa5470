"""Wire types shared by the scheduler extender and the autoscaler agent.

Pure: no I/O, no clocks, no globals. Everything here is a frozen ``msgspec.Struct`` or a
pure function over them, so both sides (and the simulator) can import it freely.

Modules:
    quantity   Kubernetes resource quantities ("250m", "1Gi") to exact integers.
    kube       the subset of Kubernetes objects (Pod, Node, Status, events) we read.
    extender   kube-scheduler extender v1 messages (PascalCase on the wire).
    versions   the agent<->extender protocol versions and their negotiation.
    permits    the agent<->extender ResourceRequest / Permit messages.
    annotations  the label and annotation keys both sides read, and their parsing.
    codec      one cached Encoder/Decoder per type; decode errors carry a ``$.path``.
"""
