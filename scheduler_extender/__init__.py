"""The scheduler extender: capacity accounting for VM pods, behind kube-scheduler's extender API.

Pure packages decide; the shell around them does the I/O and holds no policy:

* ``core``: pod facts, the per-node ledger, placement (filter, prioritize, preempt) and permits;
* ``admission``: the admission queue and per-namespace quotas;
* ``recommender``: the scale-up recommender;
* ``state``: ``/state``, the ledger as JSON-ready values.

The shell, top to bottom (``pyproject.toml``'s import contracts hold these layers):

* ``http``: the two listeners (kube-scheduler's verbs, the agents' permit port);
* ``sync``, ``quota_source``: what keeps the ``Extender`` up to date (the API server's watches,
  the quota file);
* ``service``: the ``Extender``, the ledger and everything that feeds it or acts on it;
* ``kube``: what the extender writes to and asks of the API server (durable permits, Events,
  nudges, TokenReviews), and the standalone stand-in for it;
* ``config``, ``metrics``, ``errors``: the typed config tree, the Prometheus metrics, the
  HTTP-facing error tree.
"""
