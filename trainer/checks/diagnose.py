"""Run a few steps of a real training setup and say what would make it slow, stuck or wrong.

:func:`diagnose` takes the user's batched ``tf.data`` pipeline and compiled Keras model, runs
``steps`` training steps exactly as ``fit`` runs them (Keras's own traced
``one_step_on_data``, on batches of the distributed dataset), and returns a
:class:`~genaug.trainer.checks.findings.DiagnoseReport` whose problems each carry a code, what was
found and the fix. Afterwards the model's weights, optimizer state and metrics are put back;
the input pipeline has been read for ``steps`` batches (a reservoir's counters include them).
:func:`diagnose_callback` checks the first epoch of a real ``fit`` the same way, with no
extra step. Both drive a :class:`~genaug.trainer.checks.session.DiagnosisSession`, which holds
the measuring step (:mod:`~genaug.trainer.checks.probe`) and writes the verdicts.

How each code is measured:

* ``python-op``: the op types of the dataset graph and of the traced train step
  (:mod:`genaug.trainer.checks.audit`).
* ``retracing``: the tracing count of the step's ``tf.function``\\ s, read after every step;
  a trace after the first step is compared with the batch of the previous trace, argument by
  argument (shape, dtype, or a Python value).
* ``input-bound``: the time ``next()`` on the iterator blocks, against the whole step
  (the :class:`~genaug.trainer.checks.instruments.StepTimer` method; the first step is excluded).
* ``nan``: the loss Keras returns after each step, and every floating input and label of the
  batch (one small ``tf.function`` per replica and step); for a loss gone NaN with finite
  inputs, :func:`~genaug.trainer.checks.instruments.non_finite_culprits` names the layer.
* ``empty-class``: a per-class count of the labels of every step (sparse or one-hot); with
  ``reservoir=``, its fill per class (a class with no synthetic image).
* ``oom-risk``: peak device memory of one step (``tf.config.experimental.get_memory_info``,
  which counts GPU allocations only) against the device's memory (NVML), at the batch and at
  half of it: the largest batch that fits, by a linear fit. Without a GPU nothing is
  measured and the table says so; :class:`~genaug.trainer.checks.findings.DiagnoseEnv` takes
  another :class:`~genaug.trainer.checks.findings.DeviceMemory`.
* ``xla``: with ``jit_compile=True``, one extra step compiled with XLA; the op and node it
  fails on come from the error.
* ``gpu-overlap``: TensorFlow's visible GPUs against the genaug service's
  (:func:`~genaug.trainer.hardware.devices.tensorflow_sees_service_gpu`).

Example::

    from genaug.trainer import diagnose
    report = diagnose(train_ds, model, steps=20)   # prints the table
    assert report.ok, report.problems

    model.fit(train_ds, epochs=5, callbacks=[diagnose_callback()])
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from .findings import DiagnoseEnv, DiagnoseReport
from .session import DiagnosisSession

__all__ = ["diagnose", "diagnose_callback"]

log = logging.getLogger(__name__)


def _show(report: DiagnoseReport) -> None:
    sys.stdout.write(report.format() + "\n")
    sys.stdout.flush()


def _log(report: DiagnoseReport) -> None:
    for p in report.problems:
        log.warning("diagnose %s: %s (fix: %s)", p.code, p.message, p.fix)


def diagnose(
    dataset: Any,
    model: Any,
    *,
    steps: int = 20,
    strategy: Any = None,
    jit_compile: bool = False,
    num_classes: int | None = None,
    reservoir: Any = None,
    env: DiagnoseEnv | None = None,
    show: bool = True,
) -> DiagnoseReport:
    """Run ``steps`` training steps of ``model`` on ``dataset`` and report what is wrong.

    Args:
        dataset: the batched ``tf.data.Dataset`` ``fit`` would get (``(x, y)`` or
            ``(x, y, sample_weight)`` elements).
        model: a compiled Keras model (built or not; fit before or not).
        steps: steps to run (at least 2: the first one traces).
        strategy: the strategy the model was built in (default ``model.distribute_strategy``).
        jit_compile: also compile one step with XLA and report the op it fails on.
        num_classes: classes for the empty-class check (default: the model's output units
            with a cross-entropy loss, or the reservoir's classes).
        reservoir: the :class:`~genaug.trainer.mixing.reservoir.SyntheticReservoir` mixed in, to
            check it holds images of every class.
        env: injected host facts (tests, unusual hosts); see :class:`DiagnoseEnv`.
        show: print the table to stdout.

    The model's weights, optimizer state and metrics are restored afterwards.
    """
    if steps < 2:
        raise ValueError(f"steps={steps}: diagnose needs at least 2 (the first one traces)")
    strategy = strategy if strategy is not None else model.distribute_strategy
    session = DiagnosisSession(model, strategy=strategy, dataset=dataset, num_classes=num_classes,
                       reservoir=reservoir, env=env or DiagnoseEnv())
    session.audit_dataset()
    session.probe.build(dataset)
    snapshot = session.probe.snapshot()
    distributed = strategy.experimental_distribute_dataset(dataset)
    iterator, epoch_start, epochs = iter(distributed), 0, 1
    session.probe.measure_with(session.memory, at_step=steps)
    session.probe.install()
    try:
        while session.probe.steps < steps:
            if session.step(iterator):
                continue
            if session.failure is not None or session.probe.steps == epoch_start:
                break  # the step failed, or a fresh pass over the data gave no batch
            # The data ended: start the next pass, as fit's next epoch would.
            iterator, epoch_start, epochs = iter(distributed), session.probe.steps, epochs + 1
        session.probe.uninstall()
        if session.failure is None:
            session.measure_half()
            if jit_compile:
                session.xla_step()
    finally:
        session.probe.uninstall()
        snapshot()
    report = session.finish(extra_step=True)
    report.figures["passes"] = epochs
    _log(report)
    if show:
        _show(report)
    return report


def diagnose_callback(
    *,
    dataset: Any = None,
    num_classes: int | None = None,
    reservoir: Any = None,
    env: DiagnoseEnv | None = None,
    show: bool = True,
    on_report: Callable[[DiagnoseReport], None] | None = None,
) -> Any:
    """A Keras callback that diagnoses the first epoch of a real ``fit``.

    The same checks as :func:`diagnose`, on the epoch's own steps: nothing extra runs (no
    XLA step, and the memory estimate has one batch size). Pass ``dataset`` to audit its
    graph too. After the first epoch the callback's ``report`` holds the
    :class:`~genaug.trainer.checks.findings.DiagnoseReport`, the table is printed (``show``) and
    ``on_report`` is called with it. Training goes on unchanged.

    Example::

        check = diagnose_callback(dataset=train_ds)
        model.fit(train_ds, epochs=5, callbacks=[check])
        check.report.problems
    """
    import keras

    class DiagnoseCallback(keras.callbacks.Callback):  # type: ignore[misc]
        """Diagnoses the first epoch of ``fit``; see :func:`diagnose_callback`."""

        def __init__(self) -> None:
            super().__init__()
            self.report: DiagnoseReport | None = None
            self._session: DiagnosisSession | None = None

        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            if self.report is not None:
                return
            self._session = DiagnosisSession(
                self.model, strategy=self.model.distribute_strategy, dataset=dataset,
                num_classes=num_classes, reservoir=reservoir, env=env or DiagnoseEnv())
            self._session.audit_dataset()
            self._session.probe.measure_with(self._session.memory, at_step=2)
            self._session.probe.install()

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self._finish()

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            self._finish()

        def _finish(self) -> None:
            if self._session is None or self.report is not None:
                return
            self.report = self._session.finish(extra_step=False)
            self._session = None
            _log(self.report)
            if show:
                _show(self.report)
            if on_report is not None:
                on_report(self.report)

    return DiagnoseCallback()
