"""The experiments that the demo and the benchmarks run, kept out of the trainer library.

- :mod:`~genaug.experiments.fewshot`: few-shot digit classifiers trained under
  MirroredStrategy on a few real images per class, with and without generated ones mixed in
  through the reservoir and a feeder (each run in its own TensorFlow process).
- :mod:`~genaug.experiments.fewshot_torch`: the same runs in a PyTorch process, mixing through
  ``genaug.torch`` (``FewShotRun(trainer="torch")``).
- :mod:`~genaug.experiments.demo`: ``genaug demo``'s grid and its two few-shot runs.

``genaug demo`` and ``bench/`` use them; code that trains with genaug imports
``genaug.trainer`` instead.
"""
