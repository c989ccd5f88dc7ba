"""Tell the service which classes training still needs: per-class error on held-out real data.

:class:`NeedCallback` is a Keras callback. Every ``every_epochs`` epochs (or every
``every_batches`` batches) it runs the model on a held-out split of *real* images, measures
each class's error (or mean loss), and reports it as need, per recipe label, to the genaug
service (``POST /v1/recipes/{name}/feedback``): the service's planner then fills those labels'
pools faster. The measuring and the report run in Python between steps, in the callback;
nothing is added to the ``tf.data`` pipeline or the step functions (the audit stays clean).

Where the report goes:

- a :class:`~genaug.trainer.feeding.feeder.ReservoirFeeder`: ``feeder.report_need(need)``; its
  thread posts it before its next request (training never waits for the network);
- a ``genaug.client.Client`` (with ``recipe=``): ``client.feedback(recipe, need)``, a short
  blocking call;
- any callable taking the need dict.

A failed report is logged and never raised into training.

Example::

    feeder = ReservoirFeeder(reservoir, url=URL, recipe="digits", label_map=label_map,
                             client_kwargs={"client_id": "trainer-a"})
    need = NeedCallback(feeder, label_map=label_map, validation=(x_val, y_val))
    model.fit(ds, epochs=10, callbacks=[feeder.callback(), need])
    need.last_need   # {"3": 0.21, "8": 0.17, ...}
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np

from genaug.feeding.class_error import Measure, per_class_need

__all__ = ["NeedCallback", "per_class_need"]

log = logging.getLogger(__name__)


class NeedCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Measures per-class need on held-out real data and reports it to the genaug service.

    Example::

        need = NeedCallback(client, recipe="digits", label_map={"0": 0, "1": 1},
                            validation=(x_val, y_val), every_batches=200)
        model.fit(ds, epochs=5, callbacks=[need])

    Args:
        report: a ``ReservoirFeeder`` (``report_need``), a client with ``feedback(recipe,
            need)`` (then ``recipe`` is required), or a callable taking the need dict.
        label_map: recipe label name -> class index (the feeder's ``label_map``).
        validation: ``(x, y)`` held-out *real* images and labels (sparse or one-hot),
            never trained on.
        recipe: the recipe to report for, with a client.
        every_epochs: report after every this many epochs (default 1).
        every_batches: instead, report every this many training batches.
        measure: ``"error"`` (share misclassified, default) or ``"loss"`` (mean
            cross-entropy) per class.
        batch_size: prediction batch size on the held-out split.
    """

    def __init__(
        self,
        report: Any,
        *,
        label_map: Mapping[str, int],
        validation: tuple[Any, Any],
        recipe: str | None = None,
        every_epochs: int = 1,
        every_batches: int | None = None,
        measure: Measure = "error",
        batch_size: int = 256,
    ) -> None:
        super().__init__()
        if not label_map:
            raise ValueError("label_map is empty; map recipe label names to class indices")
        if every_epochs < 1 or (every_batches is not None and every_batches < 1):
            raise ValueError(
                f"every_epochs={every_epochs} and every_batches={every_batches} must be >= 1"
            )
        if measure not in ("error", "loss"):
            raise ValueError(f"measure={measure!r} must be 'error' or 'loss'")
        self._send = self._sender(report, recipe)
        self.label_map = {str(k): int(v) for k, v in label_map.items()}
        self.num_classes = max(self.label_map.values()) + 1
        x, y = validation
        self.x_val = np.asarray(x)
        self.y_val = np.asarray(y)
        if len(self.x_val) != len(self.y_val) or len(self.x_val) == 0:
            raise ValueError(
                f"validation has {len(self.x_val)} images and {len(self.y_val)} labels; give "
                "the same number, at least one (a held-out split of real images)"
            )
        self.every_epochs = int(every_epochs)
        self.every_batches = None if every_batches is None else int(every_batches)
        self.measure: Measure = measure
        self.batch_size = int(batch_size)
        self._batches = 0
        #: The last need measured (label name -> value), or ``None`` before the first.
        self.last_need: dict[str, float] | None = None
        #: How many reports were handed on, and how many failed.
        self.reports = 0
        self.failures = 0

    @staticmethod
    def _sender(report: Any, recipe: str | None) -> Callable[[dict[str, float]], Any]:
        if hasattr(report, "report_need"):
            return report.report_need  # type: ignore[no-any-return]
        if hasattr(report, "feedback"):
            if recipe is None:
                raise ValueError("reporting through a client needs recipe=...")
            return lambda need: report.feedback(recipe, need)
        if callable(report):
            return report  # type: ignore[no-any-return]
        raise TypeError(
            f"report={type(report).__name__}: pass a ReservoirFeeder, a genaug Client (with "
            "recipe=...) or a callable taking the need dict"
        )

    def measure_need(self) -> dict[str, float]:
        """Run the model on the held-out split and return the need per recipe label."""
        probs = self.model.predict(self.x_val, batch_size=self.batch_size, verbose=0)
        need = per_class_need(np.asarray(probs), self.y_val, self.num_classes,
                              measure=self.measure)
        return {label: round(float(need[idx]), 6) for label, idx in self.label_map.items()}

    def report_now(self) -> dict[str, float] | None:
        """Measure and report once (what the schedule calls); ``None`` when it failed."""
        try:
            need = self.measure_need()
            self.last_need = need
            self._send(need)
        except Exception as exc:  # never raise into training
            self.failures += 1
            log.warning("genaug need report failed (training goes on): %s: %s",
                        type(exc).__name__, exc)
            return None
        self.reports += 1
        log.debug("genaug need reported: %s", need)
        return need

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.every_batches is None:
            return
        self._batches += 1
        if self._batches % self.every_batches == 0:
            self.report_now()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.every_batches is None and (epoch + 1) % self.every_epochs == 0:
            self.report_now()
