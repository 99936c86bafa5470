"""The scheduler extender: capacity accounting for VM pods, behind kube-scheduler's extender API.

Pure packages decide; the shell around them does the I/O and holds no policy:

* ``core``: pod facts, the per-node ledger, placement (filter, prioritize, preempt) and permits;
* ``admission``: the admission queue and per-namespace quotas;
* ``recommender``: the scale-up recommender;
* ``state``: ``/state``, the ledger as JSON-ready values.

The shell, top to bottom (``pyproject.toml``'s import contracts hold these layers):

* ``http``: the listeners (kube-scheduler's verbs, Prometheus's metrics port, the agents' permit
  port). ``serve`` runs the permit port in a child process, the permit front (``http.front``):
  connections, bodies, token checks and TokenReviews, per-agent budgets and decoding happen
  there, and only an authenticated, decoded batch reaches the main process over a socketpair,
  where the replay checks and the decisions run on the ``Extender``;
* ``sync``, ``quota_source``: what keeps the ``Extender`` up to date (the API server's watches,
  the quota file);
* ``service``: the ``Extender``, the ledger and everything that feeds it or acts on it;
* ``kube``: what the extender writes to and asks of the API server (durable permits, Events,
  nudges, TokenReviews), and the standalone stand-in for it;
* ``config``, ``metrics``, ``errors``: the typed config tree, the Prometheus metrics, the
  HTTP-facing error tree.
"""
