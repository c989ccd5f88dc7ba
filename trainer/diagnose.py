"""Run a few steps of a real training setup and say what would make it slow, stuck or wrong.

:func:`diagnose` takes the user's batched ``tf.data`` pipeline and compiled Keras model, runs
``steps`` training steps exactly as ``fit`` runs them (Keras's own traced
``one_step_on_data``, on batches of the distributed dataset), and returns a
:class:`~genaug.trainer.diagnosis.DiagnoseReport` whose problems each carry a code, what was
found and the fix. Afterwards the model's weights, optimizer state and metrics are put back;
the input pipeline has been read for ``steps`` batches (a reservoir's counters include them).
:func:`diagnose_callback` checks the first epoch of a real ``fit`` the same way, with no
extra step.

How each code is measured:

* ``python-op``: the op types of the dataset graph and of the traced train step
  (:mod:`genaug.trainer.audit`).
* ``retracing``: the tracing count of the step's ``tf.function``\\ s, read after every step;
  a trace after the first step is compared with the batch of the previous trace, argument by
  argument (shape, dtype, or a Python value).
* ``input-bound``: the time ``next()`` on the iterator blocks, against the whole step
  (the :class:`~genaug.trainer.instruments.StepTimer` method; the first step is excluded).
* ``nan``: the loss Keras returns after each step, and every floating input and label of the
  batch (one small ``tf.function`` per replica and step); for a loss gone NaN with finite
  inputs, :func:`~genaug.trainer.instruments.non_finite_culprits` names the layer.
* ``empty-class``: a per-class count of the labels of every step (sparse or one-hot); with
  ``reservoir=``, its fill per class (a class with no synthetic image).
* ``oom-risk``: peak device memory of one step (``tf.config.experimental.get_memory_info``,
  which counts GPU allocations only) against the device's memory (NVML), at the batch and at
  half of it: the largest batch that fits, by a linear fit. Without a GPU nothing is
  measured and the table says so; :class:`~genaug.trainer.diagnosis.DiagnoseEnv` takes
  another :class:`~genaug.trainer.diagnosis.DeviceMemory`.
* ``xla``: with ``jit_compile=True``, one extra step compiled with XLA; the op and node it
  fails on come from the error.
* ``gpu-overlap``: TensorFlow's visible GPUs against the genaug service's
  (:func:`~genaug.trainer.devices.tensorflow_sees_service_gpu`).

Example::

    from genaug.trainer import diagnose
    report = diagnose(train_ds, model, steps=20)   # prints the table
    assert report.ok, report.problems

    model.fit(train_ds, epochs=5, callbacks=[diagnose_callback()])
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from genaug.trainer.devices import (
    DeviceError,
    match_service_gpu,
    service_device,
    tensorflow_sees_service_gpu,
    visible_after_hiding,
)
from genaug.trainer.diagnosis import (
    DeviceMemory,
    DiagnoseEnv,
    DiagnoseReport,
    function_label,
    input_bound,
    is_xla_error,
    memory_estimate,
    oom_fix,
    oom_problem,
    xla_failure,
)
from genaug.trainer.probe import StepProbe, gpu_memory, half_batch, num_classes_of

__all__ = ["diagnose", "diagnose_callback"]

log = logging.getLogger(__name__)

_PY_FIX = ("move the Python call out of the graph: write it with TensorFlow ops, precompute "
           "it, or (generated images) let a ReservoirFeeder fill a SyntheticReservoir and "
           "mix it with reservoir.mix(), pure graph ops")


class _Session:
    """One diagnosis: what :func:`diagnose` and the callback share (audit, probe, verdicts)."""

    def __init__(self, model: Any, *, strategy: Any, dataset: Any, num_classes: int | None,
                 reservoir: Any, env: DiagnoseEnv) -> None:
        self.model, self.strategy, self.dataset = model, strategy, dataset
        self.reservoir, self.env = reservoir, env
        self.report = DiagnoseReport()
        self.t0 = time.perf_counter()
        self.memory: DeviceMemory | None = env.memory if env.memory is not None else gpu_memory(
            env.gpu_table, env.environ)
        self.probe = StepProbe(model, strategy=strategy,
                               num_classes=num_classes_of(model, num_classes, reservoir))
        self.dataset_findings: list[Any] = []
        self.failure: tuple[str, str, str] | None = None  # (code, message, fix)
        self.peak_half: int | None = None

    def audit_dataset(self) -> None:
        if self.dataset is None:
            return
        from genaug.trainer.audit import python_ops_in_dataset

        self.dataset_findings = python_ops_in_dataset(self.dataset)

    def step(self, iterator: Iterator[Any]) -> bool:
        """One step through the probe; False when the data ran out or the step failed."""
        import tensorflow as tf

        try:
            self.probe(iterator)
        except (StopIteration, tf.errors.OutOfRangeError):
            return False
        except tf.errors.ResourceExhaustedError as exc:
            self.failure = ("oom-risk", f"out of memory at step {self.probe.steps + 1}: "
                            f"{str(exc).splitlines()[0][:200]}",
                            "halve the batch, use smaller images, or mixed precision "
                            "(keras.mixed_precision.set_global_policy('mixed_float16'))")
            return False
        except tf.errors.OpError as exc:
            if not is_xla_error(str(exc)):
                raise
            self.failure = ("xla", *xla_failure(str(exc)))
            return False
        return True

    def measure_half(self) -> None:
        """Peak memory of one step at half the batch (the second point of the estimate)."""
        batch = self.probe.last_batch
        if self.memory is None or self.probe.peak is None or batch is None:
            return
        half, size = half_batch(self.strategy, batch)
        if size < 1:
            return

        def run() -> int:
            self.probe.original(iter([half]))
            return int(size)

        self.peak_half = self.memory.measure(run)
        self.probe.half_size = size

    def xla_step(self) -> None:
        """One step compiled with XLA (a separate function: the model's own stays as it is)."""
        import tensorflow as tf

        batch = self.probe.last_batch
        if batch is None:
            self.report.skipped("xla", "no batch to compile a step for")
            return
        model, strategy = self.model, self.strategy

        def xla_train_step(data: Any) -> Any:
            return strategy.run(model.train_step, args=(data,))

        try:
            tf.function(xla_train_step, jit_compile=True)(batch)
        except tf.errors.OpError as exc:
            self.report.add("xla", *xla_failure(str(exc)))
            self.report.figures["xla"] = "failed"
            return
        self.report.figures["xla"] = "compiled and ran one step"
        self.report.passed("xla")

    def finish(self, *, extra_step: bool) -> DiagnoseReport:
        self.probe.uninstall()
        report, probe, f = self.report, self.probe, self.report.figures
        f.update(probe.figures())
        if self.failure is not None:
            report.add(*self.failure)
        self._python_ops()
        self._retracing()
        self._input_bound()
        self._nan()
        self._classes()
        self._memory(extra_step)
        if "xla" not in report.checked:
            report.skipped("xla", "jit_compile=False" if not getattr(self.model, "jit_compile",
                                                                      False)
                           else "the model's own steps are XLA-compiled and ran")
        self._gpu_overlap()
        f["diagnose_s"] = round(time.perf_counter() - self.t0, 3)
        f["problems"] = report.codes
        return report

    # -- verdicts -------------------------------------------------------------------------

    def _python_ops(self) -> None:
        from genaug.trainer.audit import python_ops_in_model

        findings = list(self.dataset_findings)
        try:
            findings += python_ops_in_model(self.model)
        except ValueError:  # the step never traced (it failed first): the dataset alone
            pass
        self.report.figures["python_ops"] = len(findings)
        if not findings:
            if self.dataset is None:
                self.report.figures["python_ops_note"] = "train step only (no dataset= given)"
            self.report.passed("python-op")
            return
        for finding in findings[:5]:
            name = finding.function or (finding.path[-1] if finding.path else None)
            self.report.add("python-op", (
                f"{finding.op_type} in the {finding.where}, in function "
                f"{function_label(name)!r} ({finding.reason})"), _PY_FIX)

    def _retracing(self) -> None:
        probe = self.probe
        if not probe.fns:
            self.report.skipped("retracing", "the model runs eagerly (no traced step)")
            return
        if not probe.retraces:
            self.report.passed("retracing")
            return
        steps = [s for s, _, _ in probe.retraces]
        _, changes, fix = probe.retraces[0]
        self.report.add("retracing", (
            f"the train step was traced again at step(s) {steps} of {probe.steps}: "
            f"{'; '.join(changes)}"), fix)

    def _input_bound(self) -> None:
        waits, totals = self.probe.timer.steady(1)
        if len(totals) < 2:
            self.report.skipped("input-bound", "fewer than 2 steps after the first")
            return
        share, bound = input_bound(waits, totals)
        if not bound:
            self.report.passed("input-bound")
            return
        step_ms, wait_ms = self.probe.timer.median_ms()
        fix = ("keep the input ahead of the model: map(..., num_parallel_calls="
               "tf.data.AUTOTUNE), .cache() after decoding, .prefetch(tf.data.AUTOTUNE)")
        if self.dataset_findings:
            fix = "replace the Python function in the dataset (see python-op), then " + fix
        self.report.add("input-bound", (
            f"{100 * share:.0f}% of step time is spent waiting for the next batch (median "
            f"step {step_ms:.1f} ms, median wait {wait_ms:.1f} ms, over {len(totals)} steps)"),
            fix)

    def _nan(self) -> None:
        probe = self.probe
        if probe.bad_input is not None:
            step, path = probe.bad_input
            self.report.add("nan", f"{path} holds NaN or Inf at step {step}", (
                "find the map that makes them (a division by a zero std, log of 0, a corrupt "
                f"file): tf.debugging.check_numerics({path.split('[')[0]}, ...) in the map "
                "names it; or drop such examples with filter()"))
            return
        if probe.bad_loss is None:
            self.report.passed("nan")
            return
        step, loss, culprits = probe.bad_loss
        lr = _learning_rate(self.model)
        where = f"; {'; '.join(culprits)}" if culprits else ""
        self.report.add("nan", (
            f"the loss became {loss} at step {step} with finite inputs and labels{where}"), (
            f"lower the learning rate{f' (now {lr:g})' if lr is not None else ''} or clip "
            "gradients (optimizer clipnorm=1.0); check custom layers and losses for log(0) "
            "or a division by zero"))

    def _classes(self) -> None:
        probe, report = self.probe, self.report
        counts = probe.class_counts
        if counts is None:
            report.skipped("empty-class", "not a classification loss (pass num_classes=)")
            return
        missing = [int(c) for c in np.flatnonzero(counts == 0)]
        if missing:
            report.add("empty-class", (
                f"class(es) {missing} of {counts.size} never appeared in {probe.steps} steps "
                f"({int(counts.sum())} labels; per class {counts.tolist()})"), (
                "check the labels the pipeline yields: a class folder with 0 images, a "
                "filter or label map that drops the class, or more classes than labels"))
        if self.reservoir is not None:
            fill = np.asarray(self.reservoir.fill_counts())
            report.figures["reservoir_fill"] = fill.tolist()
            empty = [int(c) for c in np.flatnonzero(fill == 0)]
            if empty:
                how = ("the reservoir is empty: nothing has written to it (start its feeder: "
                       "feeder.start(), or feeder.callback() in fit)") if len(empty) == fill.size \
                    else f"the reservoir holds no synthetic image of class(es) {empty}"
                report.add("empty-class", f"{how}; fill per class {fill.tolist()}", (
                    "map every class to a recipe label in the feeder's label_map and fill its "
                    "pool (genaug pregenerate --recipe NAME --per-label N; genaug doctor "
                    "--recipe NAME shows the fill)"))
        report.passed("empty-class")

    def _memory(self, extra_step: bool) -> None:
        report, probe = self.report, self.probe
        if self.memory is None:
            report.figures["memory"] = ("not measured: no GPU (tf.config.experimental."
                                        "get_memory_info counts GPU memory only)")
            report.skipped("oom-risk", "no GPU memory to measure")
            return
        if probe.peak is None:
            report.skipped("oom-risk", f"{self.memory.name} reported no peak")
            return
        estimate = memory_estimate(
            peak_full=probe.peak, peak_half=self.peak_half, batch=probe.measured_batch,
            half=probe.half_size, capacity=self.memory.capacity(), replicas=probe.replicas)
        report.figures.update(memory_device=self.memory.name, **estimate)
        if not extra_step:
            report.figures["memory_note"] = "one batch size (the callback takes no extra step)"
        text = oom_problem(estimate, global_batch=probe.global_batch, device=self.memory.name)
        if text is not None:
            report.add("oom-risk", text, oom_fix(estimate, global_batch=probe.global_batch))
        report.passed("oom-risk")

    def _gpu_overlap(self) -> None:
        env, report = self.env, self.report
        url = env.service_url or os.environ.get("GENAUG_URL", "").split(",")[0].strip()
        info = env.service_info
        if info is None:
            if not url:
                report.skipped("gpu-overlap", "no service URL (GENAUG_URL)")
                return
            try:
                info = _service_info(url)
            except Exception as exc:  # any client error: nothing to compare
                report.skipped("gpu-overlap", f"the service at {url} did not answer ({exc})")
                return
        device = service_device(info, url)
        report.figures["service_device"] = device.name or device.type
        warning = tensorflow_sees_service_gpu(info, url, table=env.gpu_table,
                                              environ=env.environ,
                                              visible_indices=env.visible_gpus)
        if warning is None:
            report.passed("gpu-overlap")
            return
        head, _, _ = warning.partition(". Call ")
        report.add("gpu-overlap", head, _overlap_fix(url, info, env))


def _overlap_fix(url: str, info: Mapping[str, Any], env: DiagnoseEnv) -> str:
    fix = (f"call genaug.trainer.configure_devices(service_url={url!r}) first thing, before "
           "TensorFlow starts (it hides that GPU by UUID)")
    table = env.gpu_table
    if table is None:
        from genaug.trainer.devices import nvml_gpus

        table = nvml_gpus()
    found = match_service_gpu(table or [], service_device(info, url))
    if table and found is not None:
        try:
            visible = visible_after_hiding(table, found, env.environ)
        except DeviceError:
            return fix
        fix += f", or start training with CUDA_VISIBLE_DEVICES={visible}"
    return fix


def _service_info(url: str) -> Mapping[str, Any]:
    from genaug.client import Client

    with Client(url, timeout=3.0, retry_deadline=1.0) as client:
        info: Mapping[str, Any] = client.info()
    return info


def _learning_rate(model: Any) -> float | None:
    try:
        value = float(np.asarray(model.optimizer.learning_rate))
    except Exception:  # a schedule or no optimizer: say nothing
        return None
    return value if math.isfinite(value) else None


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
        reservoir: the :class:`~genaug.trainer.reservoir.SyntheticReservoir` mixed in, to
            check it holds images of every class.
        env: injected host facts (tests, unusual hosts); see :class:`DiagnoseEnv`.
        show: print the table to stdout.

    The model's weights, optimizer state and metrics are restored afterwards.
    """
    if steps < 2:
        raise ValueError(f"steps={steps}: diagnose needs at least 2 (the first one traces)")
    strategy = strategy if strategy is not None else model.distribute_strategy
    session = _Session(model, strategy=strategy, dataset=dataset, num_classes=num_classes,
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
    :class:`~genaug.trainer.diagnosis.DiagnoseReport`, the table is printed (``show``) and
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
            self._session: _Session | None = None

        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            if self.report is not None:
                return
            self._session = _Session(
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
