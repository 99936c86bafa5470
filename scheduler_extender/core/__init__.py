"""The capacity core: who holds what on every node, and what may be placed or granted there.

``podinfo`` turns a Pod into the facts the ledger needs; ``ledger`` is the per-node account of
every pod (ours and foreign) with its invariants; ``placement`` answers filter, prioritize and
preempt (and keeps the fit index); ``permits`` answers agents' ResourceRequests.

Pure: no I/O, no clock (callers pass ``now``), no randomness. It may import ``protocol`` and
nothing else of this project; every other package of the extender builds on it.
"""
