"""The extender's HTTP listeners (shell).

``app``              ``make_app`` (kube-scheduler's verbs + operability, owns the lifecycle),
                     ``make_permits_app`` (the agents' permit port in this process),
                     ``make_metrics_app``, ``serve``.
``keys``             the typed ``AppKey``s the listeners share.
``middleware``       request context (request id, canonical log line, latency); errors
                     answered through ``answers``.
``answers``          the one error boundary: an ``ExtenderError`` as status, headers, body.
``verbs``            filter, prioritize, bind, preempt: decode, call ``core.verbs``, encode.
``connections``      aiohttp's server options for every listener, and the guards of the
                     listeners other pods reach (permits, metrics).
``penalties``        client addresses whose new connections the kernel drops for a while.
``bodies``           reading request bodies within their size and time limits and the
                     process-wide in-flight budget, inflating gzip within the size limit.
``permit_port``      ``POST /v1/permits`` (the front's handler) and ``LocalDesk`` (the one
                     decode, the ``Extender``'s decisions, the refusals' statuses: ``ERRORS``).
``moves``            ``POST /v1/moves`` on the permit port: the vm-controller reserves and
                     cancels a live move's target room (``LocalDesk.answer_moves`` decides).
``front``            the permit front: the permit port in a child process, its channel to the
                     main process, and that process's side of it.
``recommend``        ``/v1/recommend`` and the auto-publish task.
``recommend_worker`` recommendations computed in a worker process, off the event loop.
``ops``              healthz, readyz, metrics, state, queue.

The top of the extender's layers: it may import everything below it (``sync``, ``service``,
``kube``, the pure packages); nothing but ``__main__`` imports it. Handlers stay thin:
decode, call the ``Extender`` or a pure function, encode.
"""
