"""Recipes: what to generate for a labelled dataset.

``spec`` (the models, their checks, the per-image plan, the pool identity), ``load`` (YAML or
JSON files with line numbers, start-up checks) and ``sources`` (a label's real images and the
one :func:`~genaug.service.recipes.sources.source_hash`). Imported by the pool and the intake;
imports only ``batching.items`` (the scheduler names).
"""
