"""The Keras side of a :class:`~genaug.trainer.feeding.feeder.ReservoirFeeder`: a callback
that starts it when ``fit`` begins and stops it when ``fit`` ends. Kept apart so that the
feeder imports no Keras (``genaug.torch`` runs the same feeder without TensorFlow).

Example::

    model.fit(ds, epochs=5, callbacks=[feeder_callback(feeder)])   # = feeder.callback()
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

__all__ = ["feeder_callback"]

log = logging.getLogger("genaug.trainer.feeding.feeder")  # the feeder's own log


class Startable(Protocol):
    """What the callback needs of a feeder: a
    :class:`~genaug.trainer.feeding.feeder.ReservoirFeeder` has it."""

    @property
    def running(self) -> bool: ...

    @property
    def stats(self) -> Any: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = ...) -> None: ...


def feeder_callback(feeder: Startable) -> Any:
    """A Keras callback that starts ``feeder`` at ``on_train_begin`` and stops it at
    ``on_train_end`` (only if it started it there)."""
    import keras

    class ReservoirFeederCallback(keras.callbacks.Callback):  # type: ignore[misc]
        """Ties a :class:`ReservoirFeeder` to ``model.fit``."""

        def __init__(self) -> None:
            super().__init__()
            self.started_here = False

        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            if not feeder.running:
                feeder.start()
                self.started_here = True

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            if self.started_here:
                feeder.stop()
                self.started_here = False
            log.info("genaug feeder: %s", feeder.stats)

    return ReservoirFeederCallback()
