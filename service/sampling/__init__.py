"""Which sampler draws a label: the one package that answers it.

- :mod:`~genaug.service.sampling.modes`: the words (``quality``, ``turbo``, a recipe's
  ``auto``), :class:`~genaug.service.sampling.modes.Sampling` with its stable id, the turbo
  mode a service serves (resolved once, at the app's start).
- :mod:`~genaug.service.sampling.pools`: the planner's one place to ask which sampler draws
  a recipe's label next.
- :mod:`~genaug.service.sampling.auto`: ``speed: auto``'s state machine, per pool.
- :mod:`~genaug.service.sampling.rule`: its statistics, pure.
- :mod:`~genaug.service.sampling.records`: what it keeps in the pool database, typed; the
  store's queries (:mod:`~genaug.service.pool.sampler_queries`) implement them.

Below the recipes, the intake, the pipeline and the pool, which all speak its words: it
imports only the batching vocabulary and the service's errors, never the store or the
pipeline (a test: ``tests/test_import_order.py``).
"""
