"""One diagnosis: what :func:`~genaug.trainer.checks.diagnose.diagnose` and its callback share.

:class:`DiagnosisSession` holds the model, the dataset, the
:class:`~genaug.trainer.checks.probe.StepProbe` that measures each step and the
:class:`~genaug.trainer.checks.findings.DiagnoseReport` being written. The entry points drive
it (audit the dataset, run steps, measure half a batch, try XLA);
:meth:`DiagnosisSession.finish` turns what the probe measured into one verdict per code, each
through the pure judgements of :mod:`~genaug.trainer.checks.findings`. TensorFlow is imported
inside functions.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..hardware.devices import DeviceError, tensorflow_sees_service_gpu, visible_after_hiding
from ..hardware.gpus import match_service_gpu, service_device
from .findings import (
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
from .probe import StepProbe, gpu_memory, half_batch, num_classes_of

__all__ = ["DiagnosisSession"]

_PY_FIX = ("move the Python call out of the graph: write it with TensorFlow ops, precompute "
           "it, or (generated images) let a ReservoirFeeder fill a SyntheticReservoir and "
           "mix it with reservoir.mix(), pure graph ops")


class DiagnosisSession:
    """One diagnosis: the audit, the probe and the verdicts (see the module docstring)."""

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
        from .audit import python_ops_in_dataset

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
        from .audit import python_ops_in_model

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
        from ..hardware import nvml

        table = nvml.gpus()
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
