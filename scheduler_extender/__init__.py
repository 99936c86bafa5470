"""The scheduler extender: capacity accounting for VM pods, behind kube-scheduler's extender API.

Pure packages decide; the shell around them does the I/O and holds no policy:

* ``core``: pod facts, the per-node ledger, placement (filter, prioritize, preempt) and permits;
* ``admission``: the admission queue and per-namespace quotas;
* ``recommender``: the scale-up recommender;
* ``state``: ``/state``, the ledger as JSON-ready values.

The shell, top to bottom (``pyproject.toml``'s import contracts hold these layers):

* ``http``: the listeners (kube-scheduler's verbs, Prometheus's metrics port, the agents' permit
  port). ``serve`` runs the permit port in a child process, the permit front (``http.front``):
  connections, bodies, token checks and TokenReviews and per-agent budgets happen there, and
  only an authenticated body, undecoded, reaches the main process over a socketpair, where it
  is decoded once and decided (the permit path, below);
* ``sync``, ``quota_source``: what keeps the ``Extender`` up to date (the API server's watches,
  the quota file);
* ``service``: the ``Extender``, the ledger and everything that feeds it or acts on it;
* ``kube``: what the extender writes to and asks of the API server (durable permits, Events,
  nudges, TokenReviews), and the standalone stand-in for it;
* ``config``, ``metrics``, ``errors``: the typed config tree, the Prometheus metrics, the
  HTTP-facing error tree.

The permit path, as it runs (each name is the code that does the step on its line;
``tests/unit/test_docstrings.py`` resolves every one)::

    agent --POST /v1/permits, JSON--> the front's listener          http.front.run_front
      authenticate, spend the caller's budget, read the body        http.permit_port.permits
      --Ask(identity, the body's bytes)--> the main process         http.front.ChannelDesk.permits
      decode the batch, once                                        http.permit_port.LocalDesk
      caller and version, then synced/leading, then                 service.Extender.permits
        token node, negotiation                                     core.batches.admit
        seqs, decide_batch, seqs recorded: Decisions or Refused     core.batches.decide
      refusal -> status (batch, ItemError), PermitBatch -> JSON     http.permit_port.ERRORS
      <--Answer(status, body bytes)-- <--HTTP-- agent               http.front.MainSide

``permit_front.mode: inline`` (and tests, tools) skips the two channel hops:
``http.app.make_permits_app`` hands the front's handler a ``LocalDesk`` of its own process.
"""
