"""Feeding a Keras run: the TensorFlow side of :mod:`genaug.feeding` (the feeder both trainers
share, its first-contact checks, label matching and the class-error measure).

- ``feeder.py``: :class:`~genaug.trainer.feeding.feeder.ReservoirFeeder`, the shared feeder with
  a Keras callback and the warning when TensorFlow can use the generator's GPU; ``callback.py``,
  that callback (``feeder.callback()``).
- ``need.py``: :class:`~genaug.trainer.feeding.need.NeedCallback`, per-class need measured on
  held-out real images (Keras), reported through the feeder.

Only ``need.py`` and ``callback.py`` import TensorFlow (Keras), each when used.
"""
