"""The extender's HTTP listeners (shell).

``app``         ``make_app`` (kube-scheduler's verbs + operability, owns the lifecycle),
                ``make_permits_app`` (the agents' permit port in this process), ``serve``.
``front``       the permit front: the permit port in a child process, its channel to the
                main process, and that process's side of it.
``middleware``  request context (request id, canonical log line, latency) and error mapping.
``verbs``       filter, prioritize, bind, preempt: decode, call the core, encode.
``permit_port`` ``POST /v1/permits`` (the front's handler) and ``LocalDesk`` (the decisions).
``recommend``   ``/v1/recommend`` and the auto-publish task.
``ops``         healthz, readyz, metrics, state, queue.

The top of the extender's layers: it may import everything below it (``sync``, ``service``,
``kube``, the pure packages); nothing but ``__main__`` imports it. Handlers stay thin:
decode, call the ``Extender`` or a pure function, encode.
"""
