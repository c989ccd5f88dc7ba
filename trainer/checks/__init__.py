"""Checks: finding what makes a training setup slow, stuck or wrong, before it costs a run.

- ``audit.py``: the op types of a dataset and of a model's step functions; fails on ops that
  call back into Python (:func:`~genaug.trainer.checks.audit.assert_no_python_ops`).
- ``instruments.py``: step timing (input-bound or not) and the layer a NaN loss came from.
- ``diagnose.py``: :func:`~genaug.trainer.checks.diagnose.diagnose` and its Keras callback, the
  entry points; ``session.py``, one diagnosis's steps and verdicts; ``probe.py``, the stand-in
  train step that measures; ``findings.py``, the report and its pure judgements.
"""
