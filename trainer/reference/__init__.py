"""The reference trainer: the library behind ``genaug train``.

- ``config.py``: :class:`~genaug.trainer.reference.config.TrainConfig`, every setting once,
  and the command's flags derived from it.
- ``data.py``: an image folder (one subfolder per class) or the built-in demo dataset.
- ``train.py``: :class:`~genaug.trainer.reference.train.Trainer`, the model, the reservoir and
  the feeder put together; ``command.py``, the ``genaug train`` command itself.
- ``summary.py``: what a run reports when it ends.
"""
