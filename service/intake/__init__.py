"""Intake: a request becomes work.

``schemas`` (the request models, bounded by the running configuration), ``parse`` (a JSON
body into a model, or a 422 that says why), ``uploads`` (the multipart upload of variants)
and ``plan`` (the one place a request or a pool batch becomes a ``GroupKey`` and its
``Item`` list). Imported by the HTTP edge and the pool planner; imports ``batching.items``,
``recipes`` and the service's leaves (settings, errors).
"""
