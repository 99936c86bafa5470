"""The capacity core: who holds what on every node, and what may be placed or granted there.

``podinfo`` turns a Pod into the facts the ledger needs; ``ledger`` is the per-node account of
every pod (ours and foreign) with its invariants; ``placement`` holds the fit, score and
victim rules (and the fit and score indexes); ``verbs`` decides each of kube-scheduler's verbs
(filter, prioritize, bind, preempt) over them, for the HTTP handlers and the simulator
alike; ``permits`` answers agents' ResourceRequests; ``sequences``
refuses replayed and reordered ones (protocol v2); ``batches`` runs a permit batch's rules in
order (who may send it, the version, the seqs, ``decide_batch``); ``refusals`` types what they
refuse, with no HTTP status (the edge picks those); ``relief`` plans live moves (a VM whose grow
its node cut short, a node above the watermark, a node drained) for ``ledger``'s moves.

Pure: no I/O, no clock (callers pass ``now``), no randomness. It may import ``protocol`` and
nothing else of this project; every other package of the extender builds on it.
"""
