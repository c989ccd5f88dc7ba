"""Instruments for a Keras training run: input-wait timing and the NaN/Inf guard.

**Input wait** (:class:`StepTimer`). Keras 3 fetches the next batch *inside* the traced train
function (``iterator.get_next()`` in ``multi_step_on_iterator``), so gaps between
``on_train_batch_end`` and the next ``on_train_batch_begin`` contain no input wait at all and
would always report ~0 %. Instead :class:`StepTimer` wraps ``model.train_function``: it calls
``next()`` on the distributed iterator in Python (this blocks exactly as long as the input
pipeline is behind: with a ready prefetch buffer it returns in microseconds), then runs Keras's
own traced ``one_step_on_data`` on that batch. Wait share = time in ``next()`` / time of the
whole step, first step (tracing) excluded. Execution is synchronous (TensorFlow's default), so
a step's time ends when its computation has finished.

**NaN/Inf** (:func:`nan_guard`, :func:`non_finite_culprits`, :class:`NonFiniteLossError`).
The guard is a Keras callback that stops ``fit`` at the first step whose running loss is NaN or
Inf and records the step, epoch, batch and loss; at the start of each epoch it keeps a copy of
the weights. After ``fit`` returns, :func:`non_finite_culprits` names, where it can, the
non-finite values: the probe input batch itself, the first layer whose output on a probe batch
is non-finite (probed with the epoch's start weights when those are finite, so the layer named
is where NaN/Inf *arises*, not where corrupted weights carry it), and the non-finite weights
after the bad step. The trainer raises :class:`NonFiniteLossError` with them.

Nothing here imports TensorFlow or Keras at module import time.

Example::

    timer, guard = StepTimer(), nan_guard()
    timer.install(model)
    model.fit(ds, epochs=2, callbacks=[guard])
    timer.wait_share()         # e.g. 0.02
    if guard.tripped is not None:
        step, epoch, batch, loss = guard.tripped
        non_finite_culprits(model, probe_batch, guard.snapshot, epoch)
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["NonFiniteLossError", "StepTimer", "nan_guard", "non_finite_culprits"]


# ----------------------------------------------------------------------------- timing


class StepTimer:
    """Measures, per training step, the time spent waiting for input and the whole step.

    :meth:`install` replaces ``model.train_function`` (after Keras built it) by a function
    that pulls the next distributed batch in Python, timed, and hands it to Keras's own traced
    ``one_step_on_data`` (Keras's public path for non-``tf.data`` iterators). Everything else
    in ``fit`` (callbacks, progress bar, ``stop_training``) is unchanged. See the module
    docstring for why callback timestamps cannot measure input waiting under Keras 3.

    Example::

        timer = StepTimer()
        timer.install(model)
        model.fit(ds, epochs=2)
        timer.wait_share()         # e.g. 0.02
    """

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.totals: list[float] = []

    def install(self, model: Any) -> None:
        """Wrap ``model.train_function`` (idempotent for one model)."""
        model.make_train_function()
        inner = model.train_function
        if getattr(inner, "_genaug_timed", False):
            return
        waits, totals = self.waits, self.totals

        def timed_train_function(iterator: Any) -> Any:
            t0 = time.perf_counter()
            data = next(iterator)  # blocks while the input pipeline is behind
            t1 = time.perf_counter()
            # A list is not a tf.data / distributed iterator: Keras runs its traced
            # one_step_on_data on this one batch.
            logs = inner([data])
            t2 = time.perf_counter()
            waits.append(t1 - t0)
            totals.append(t2 - t0)
            return logs

        timed_train_function._genaug_timed = True  # type: ignore[attr-defined]
        model.train_function = timed_train_function

    def trace(self, model: Any, dataset: Any) -> None:
        """Trace Keras's ``one_step_on_data`` on one distributed batch of ``dataset`` without
        running it, so that ``fit`` (through :meth:`install`'s wrapper) reuses this trace and
        :func:`~genaug.trainer.checks.audit.assert_no_python_ops` can audit it before training."""
        from .audit import step_functions

        steps = [
            fn for fn in step_functions(model)
            if getattr(getattr(fn, "python_function", None), "__name__", "") == "one_step_on_data"
        ]
        if not steps:  # run_eagerly or another Keras layout: the audit traces on its own
            return
        import tensorflow as tf

        strategy = model.distribute_strategy
        per_replica = tf.nest.map_structure(
            lambda s: tf.TensorSpec(
                [s.shape[0] // strategy.num_replicas_in_sync, *s.shape[1:]], s.dtype
            ),
            dataset.element_spec,
        )
        build = getattr(model, "_symbolic_build", None)
        if build is None:  # another Keras: leave the tracing to fit and the audit
            return
        with strategy.scope():
            # What fit does first (metrics, loss and optimizer state, symbolically), so that
            # no variable is created inside the trace below.
            build(data_batch=per_replica)
        batch = next(iter(strategy.experimental_distribute_dataset(dataset)))
        steps[0].get_concrete_function(batch)

    def steady(self, skip: int = 1) -> tuple[list[float], list[float]]:
        """(waits, totals) without the first ``skip`` steps (tracing)."""
        return self.waits[skip:], self.totals[skip:]

    def wait_share(self, skip: int = 1) -> float | None:
        """Share of step time spent in ``next()``; ``None`` with no steady-state steps."""
        waits, totals = self.steady(skip)
        return sum(waits) / sum(totals) if totals and sum(totals) > 0 else None

    def median_ms(self, skip: int = 1) -> tuple[float | None, float | None]:
        """(median step, median wait) in milliseconds."""
        waits, totals = self.steady(skip)
        if not totals:
            return None, None
        return 1000 * statistics.median(totals), 1000 * statistics.median(waits)


# ----------------------------------------------------------------------------- NaN guard


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or Inf; ``step`` is the 1-based global step, ``culprits`` the
    findings (first non-finite layer output, non-finite weights)."""

    def __init__(self, message: str, *, step: int, loss: float, culprits: Sequence[str]) -> None:
        super().__init__(message)
        self.step = step
        self.loss = loss
        self.culprits = list(culprits)


def _first_non_finite_output(model: Any, x: Any) -> str | None:
    """The first layer (in ``model.layers`` order) whose output on ``x`` is NaN/Inf."""
    import keras
    import numpy as np

    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    try:
        inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
        probe_model = keras.Model(inputs, [layer.output for layer in layers])
        outputs = probe_model(x, training=False)
    except Exception:  # subclassed model: fall back to a sequential walk
        outputs, value = [], x
        for layer in layers:
            value = layer(value, training=False)
            outputs.append(value)
    for layer, out in zip(layers, outputs, strict=True):
        arr = np.asarray(out)
        if not np.all(np.isfinite(arr)):
            kind = "NaN" if np.isnan(arr).any() else "Inf"
            return f"layer {layer.name!r} ({type(layer).__name__}) outputs {kind}"
    return None


def non_finite_culprits(
    model: Any, probe: Any, snapshot: list[Any] | None = None, epoch: int = 0
) -> list[str]:
    """Where non-finite values are: the probe input; the first non-finite layer output with
    the weights of the epoch's start (``snapshot``: finite weights, so the layer named is where
    NaN/Inf *arises*, not where corrupted weights carry it); the weights after the bad step."""
    import numpy as np

    found: list[str] = []
    x = np.asarray(probe)
    if not np.all(np.isfinite(x)):
        found.append("the input batch itself holds non-finite values")
    try:
        after = model.get_weights()
        if snapshot is not None and all(np.all(np.isfinite(w)) for w in snapshot):
            model.set_weights(snapshot)
            try:
                first = _first_non_finite_output(model, x)
            finally:
                model.set_weights(after)
            if first:
                found.append(
                    f"first non-finite layer output on a probe batch with the (finite) weights "
                    f"of the start of epoch {epoch}: {first}"
                )
        if not any("layer output" in f for f in found):
            first = _first_non_finite_output(model, x)
            if first:
                found.append(f"first non-finite layer output on a probe batch: {first}")
    except Exception as exc:  # diagnosis must never hide the real error
        found.append(f"(could not probe layer outputs: {type(exc).__name__}: {exc})")
    bad = [
        getattr(w, "path", None) or w.name
        for w in model.weights
        if not np.all(np.isfinite(np.asarray(w.numpy())))
    ]
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        found.append(f"non-finite weights after that step: {', '.join(bad[:5])}{more}")
    return found


def nan_guard() -> Any:
    """A fresh Keras callback that stops ``fit`` at the first NaN/Inf loss (see the module
    docstring); after ``fit``, ``tripped`` is ``(step, epoch, batch, loss)`` or ``None``."""
    import keras

    class NonFiniteGuard(keras.callbacks.Callback):  # type: ignore[misc]
        """Stops ``fit`` at the first step whose running loss is NaN or Inf."""

        def __init__(self) -> None:
            super().__init__()
            self.global_step = 0
            self.epoch = 0
            self.batch = 0
            self.tripped: tuple[int, int, int, float] | None = None
            self.snapshot: list[Any] | None = None

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self.epoch = epoch
            # Once per epoch (a copy of the weights): lets the diagnosis probe with finite
            # weights and name the layer where NaN/Inf arises.
            self.snapshot = self.model.get_weights()

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self.global_step += 1
            loss = (logs or {}).get("loss")
            if loss is None or self.tripped is not None:
                return
            value = float(loss)
            if not math.isfinite(value):
                self.tripped = (self.global_step, self.epoch + 1, batch + 1, value)
                self.model.stop_training = True

    return NonFiniteGuard()
