"""What the extender writes to and asks of the API server, and the stand-in that replaces it.

``link`` is the handle on the client connected later; ``durability`` records permits on the
pods; ``node_alloc`` and ``queue_notices`` post Events and nudge pods; ``auth`` reviews the
agents' tokens and ``metrics_auth`` the scrapers', both through one ``token_cache``, after
``token_shape`` has refused what a token's own claims rule out; ``standalone`` reads nodes
and pods from a file instead of an API server.

Shell: I/O only, no policy (decisions come from ``core``, ``admission`` and the ``service`` that
calls these). It may import ``kube_io``, ``protocol``, the pure packages and ``config``,
``metrics`` and ``errors``; never ``service``, ``sync`` or ``http``, which sit above it.
"""
