"""Feeding: getting the service's images into the reservoir, and telling it what is needed.

- ``feeder.py``: :class:`~genaug.trainer.feeding.feeder.ReservoirFeeder`, the daemon thread's
  lifecycle (start, stop, stats, need reports); ``callback.py``, its Keras callback
  (``feeder.callback()``).
- ``cycle.py``: what the feeder thread does between start and stop: one request cycle (the
  labels it asks for, where the images go), its counters and its backoff.
- ``preflight.py``: a strict feeder's first-contact checks
  (:class:`~genaug.trainer.feeding.preflight.FeederConfigError`).
- ``labels.py``: matching a dataset's class names with a recipe's labels.
- ``need.py``: :class:`~genaug.trainer.feeding.need.NeedCallback`, per-class need measured on
  held-out real images (Keras), reported through the feeder; ``class_error.py``, the measure
  itself, without Keras.

Only ``need.py`` and ``callback.py`` import TensorFlow (Keras), each when used; the feeder
imports neither it nor torch (``genaug.torch`` runs it).
"""
