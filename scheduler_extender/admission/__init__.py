"""The admission queue: which of our pods may take their namespace's quota now.

``quota`` is the config section and the arithmetic of room; ``queue`` admits pods in order,
with cohorts borrowing unused quota; ``view`` is what the metrics and ``/v1/queue`` show.

Pure: no I/O, no clock (callers pass ``now``). It may import ``protocol`` and
``scheduler_extender.core``; it does not know the recommender or the shell.
"""
