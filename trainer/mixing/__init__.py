"""Mixing: the synthetic images a training step sees.

- ``reservoir.py``: :class:`~genaug.trainer.mixing.reservoir.SyntheticReservoir`, the
  class-indexed host store a feeder writes into, and its ``mix()`` map function.
- ``graph.py``: the pure graph ops ``mix()`` builds (which examples are replaced, by which
  slot, the relabelling and the sample weights); nothing in them calls Python.

Both import TensorFlow.
"""
