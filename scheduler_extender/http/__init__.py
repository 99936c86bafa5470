"""The extender's two HTTP listeners (shell).

``app``         ``make_app`` (kube-scheduler's verbs + operability, owns the lifecycle),
                ``make_permits_app`` (the agents' permit port), ``serve``.
``middleware``  request context (request id, canonical log line, latency) and error mapping.
``verbs``       filter, prioritize, bind, preempt: decode, call the core, encode.
``permit_port`` ``POST /v1/permits``.
``ops``         healthz, readyz, metrics, state.
"""
