"""Feeding, shared by both trainers: getting the service's images into a reservoir, and telling
the service what is needed. No TensorFlow, no torch: the TensorFlow trainer
(``genaug.trainer``) and the PyTorch one (``genaug.torch``) both import it.

- ``feeder.py``: :class:`~genaug.feeding.feeder.Feeder`, the daemon thread's lifecycle (start,
  stop, stats, need reports) around any reservoir with ``write`` and ``counts``.
- ``cycle.py``: what the feeder thread does between start and stop: one request cycle (the
  labels it asks for, where the images go), its counters and its backoff.
- ``preflight.py``: a strict feeder's first-contact checks
  (:class:`~genaug.feeding.preflight.FeederConfigError`).
- ``labels.py``: matching a dataset's class names with a recipe's labels.
- ``class_error.py``: per-class need measured on held-out real images, from predictions alone
  (what each trainer's need callback reports through its feeder).

What is a framework's stays with it: the Keras callback and ``NeedCallback`` in
``genaug.trainer.feeding``, the stream that runs a feeder per process in ``genaug.torch``.
"""
