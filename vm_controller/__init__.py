"""The VirtualMachine controller: a VirtualMachine object in, a runner pod, a Service and a
status out.

- ``decide``: pure. The pod and Service a VM should have, and from the pod that exists, what to
  do next and what the status says.
- ``controller``: the shell. Watches VirtualMachines and their pods, queues a VM whenever one of
  its objects changes, applies ``decide``'s actions.
- ``migrations``: pure. Which VirtualMachineMigrations are refused and why, the target pod,
  the statuses, what a restarted controller does with a move under way.
- ``migrator``: the shell of live moves: the extender's reservation (``POST /v1/moves``), the
  objects, and QMP over TCP to both runner pods (its docstring has the threat model).
- ``metrics``, ``__main__``: the ``vm-controller`` command (``--help``).

Why the project's own list+watch layer (``kube_io``) and not kopf: kopf is built around
handlers for *changes* of one resource (on.create, on.update, on.delete) with its progress kept
in annotations on the object; a VM's runner pod is a second resource whose disappearance must
recreate it, which kopf expresses only with extra handlers on pods or a polling timer. The
controller here is level-triggered instead (controller-runtime's model: any change to a VM or
its pod queues the VM, and one pure function decides from the whole state), which is both
smaller (the decision is one function) and safer (a missed event is repaired by the next list,
as ``kube_io.watch`` relists on 410). ``kube_io`` already has what it needs, tested against the
real API server: list+watch with resume, bookmarks and backoff, typed errors, Events, msgspec
decoding. kopf would add a second Kubernetes client, its own logging (not structlog) and its own
retry policy beside the ones the extender and the agent use.

No finalizer: the pod and the Service carry an owner reference to their VirtualMachine, so the
garbage collector removes them with it, and the controller holds nothing outside the cluster
that a finalizer would have to release.
"""
