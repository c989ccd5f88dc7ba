"""The measuring half of :func:`~genaug.trainer.checks.diagnose.diagnose`: a stand-in for
``model.train_function`` that runs Keras's own traced step and watches it.

:class:`StepProbe` takes the place of ``model.train_function`` (in :func:`diagnose`'s loop or
during the first epoch of ``fit``). Each call pulls the next distributed batch in Python, timed
(the :class:`~genaug.trainer.checks.instruments.StepTimer` method: Keras 3 fetches batches inside
its traced function, where no callback can see the wait), then hands it to the function it
replaced, which runs Keras's traced ``one_step_on_data`` on it. After the step it reads the
step functions' tracing counts, the loss, and one small ``tf.function`` per replica that says
whether each floating input is finite and counts the labels per class. It never changes what
the step computes.

Also here: the GPU memory probe (TensorFlow's allocator statistics and NVML's total), the
half-batch used for the memory estimate, and the number of classes a model predicts.
TensorFlow is imported inside functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..hardware import nvml
from ..hardware.gpus import cuda_order
from ..hardware.nvml import GpuInfo
from .findings import DeviceMemory, Leaf, input_bound, retrace_findings
from .instruments import StepTimer

__all__ = ["StepProbe", "TensorFlowGpuMemory", "gpu_memory", "half_batch", "num_classes_of"]

_ROLES = ("x", "y", "sample_weight")


def _roles(data: Any) -> list[tuple[str, Any]]:
    if isinstance(data, tuple | list) and 1 <= len(data) <= 3:
        return list(zip(_ROLES, data, strict=False))
    return [("x", data)]


def _flatten(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key in sorted(value, key=str):
            yield from _flatten(value[key], f"{path}[{key!r}]")
    elif isinstance(value, tuple | list):
        for i, item in enumerate(value):
            yield from _flatten(item, f"{path}[{i}]")
    elif value is not None:
        yield path, value


def _leaf(path: str, value: Any) -> Leaf:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return path, None, repr(value)[:60]
    dims = shape.as_list() if hasattr(shape, "as_list") else list(shape)
    return path, tuple(dims), str(getattr(dtype, "name", dtype))


class _TimedIterator:
    """Times ``next()`` on the real iterator (for a ``train_function`` that pulls itself)."""

    def __init__(self, inner: Iterator[Any]) -> None:
        self.inner, self.wait = inner, 0.0
        self.batches: list[Any] = []

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        t0 = time.perf_counter()
        data = next(self.inner)
        self.wait += time.perf_counter() - t0
        self.batches.append(data)
        return data


class StepProbe:
    """Stands in for ``model.train_function``; see the module docstring.

    Example::

        probe = StepProbe(model, strategy=model.distribute_strategy, num_classes=3)
        probe.install()
        model.train_function(iterator)   # one step, watched
        probe.uninstall()
        probe.figures()
    """

    def __init__(self, model: Any, *, strategy: Any, num_classes: int | None) -> None:
        self.model, self.strategy, self.num_classes = model, strategy, num_classes
        self.original: Any = None
        self.fns: list[Any] = []
        self.timer = StepTimer()
        self.steps = 0
        self.replicas = int(strategy.num_replicas_in_sync)
        self.global_batch = 0
        self.retraces: list[tuple[int, list[str], str]] = []
        self.losses: list[float] = []
        self.bad_input: tuple[int, str] | None = None
        self.bad_loss: tuple[int, float, list[str]] | None = None
        self.class_counts = np.zeros([num_classes], np.int64) if num_classes else None
        self.last_batch: Any = None
        self.start_weights: list[Any] | None = None
        self.peak: int | None = None
        self.measured_batch = 0
        self.half_size = 0
        self._memory: DeviceMemory | None = None
        self._measure_at: int | None = None
        self._traces_start = self._traces_seen = 0
        self._spec_at_trace: list[Leaf] | None = None
        self._last_spec: list[Leaf] = []
        self._last_x: Any = None
        self._per_replica = 0
        self._check: Any = None

    # -- setup ----------------------------------------------------------------------------

    def build(self, dataset: Any) -> None:
        """Build the model, loss, metrics and optimizer state as ``fit`` does before its first
        step (variables created inside the trace would be traced as placeholders)."""
        import tensorflow as tf

        build = getattr(self.model, "_symbolic_build", None)
        if build is None:
            return
        n = self.replicas

        def per_replica(spec: Any) -> Any:
            shape = spec.shape
            if shape.rank and shape[0] is not None:
                shape = [shape[0] // n, *shape[1:]]
            return tf.TensorSpec(shape, spec.dtype)

        with self.strategy.scope():
            build(data_batch=tf.nest.map_structure(per_replica, dataset.element_spec))

    def snapshot(self) -> Callable[[], None]:
        """Keep the weights and optimizer state; the returned function puts them back."""
        model = self.model
        weights = model.get_weights()
        self.start_weights = weights
        optimizer = getattr(model, "optimizer", None)
        variables = list(getattr(optimizer, "variables", None) or [])
        values = [np.array(v.numpy()) for v in variables]

        def restore() -> None:
            model.set_weights(weights)
            for variable, value in zip(variables, values, strict=True):
                variable.assign(value)
            model.reset_metrics()

        return restore

    def measure_with(self, memory: DeviceMemory | None, *, at_step: int) -> None:
        """Measure the peak device memory of step ``at_step`` (1-based)."""
        self._memory, self._measure_at = memory, at_step

    def install(self) -> None:
        from .audit import step_functions

        if self.original is None:
            self.model.make_train_function()
            self.original = self.model.train_function
            self.fns = step_functions(self.model)
            self._traces_start = self._traces_seen = self._traces()
        self.model.train_function = self

    def uninstall(self) -> None:
        if self.model.train_function is self:
            self.model.train_function = self.original

    def _traces(self) -> int:
        return sum(int(fn.experimental_get_tracing_count()) for fn in self.fns)

    # -- one step -------------------------------------------------------------------------

    def __call__(self, iterator: Iterator[Any]) -> Any:
        if self._memory is not None and self._measure_at == self.steps + 1:
            logs: list[Any] = []

            def run() -> int:
                logs.append(self._step(iterator))
                return self._per_replica

            self.peak = self._memory.measure(run)
            self.measured_batch = self._per_replica
            return logs[0]
        return self._step(iterator)

    def _step(self, iterator: Iterator[Any]) -> Any:
        if getattr(self.original, "_genaug_timed", False):
            # A StepTimer already wraps the step (the reference trainer): let it pull, through
            # a timed iterator, so that its own figures stay true.
            timed = _TimedIterator(iterator)
            t0 = time.perf_counter()
            logs = self.original(timed)
            total, wait, batches = time.perf_counter() - t0, timed.wait, timed.batches
        else:
            t0 = time.perf_counter()
            batches = [next(iterator)]
            for _ in range(int(getattr(self.model, "steps_per_execution", 1) or 1) - 1):
                try:
                    batches.append(next(iterator))
                except StopIteration:
                    break
            wait = time.perf_counter() - t0
            logs = self.original(iter(batches))  # not a tf iterator: Keras runs one_step_on_data
            total = time.perf_counter() - t0
        self.timer.waits.append(wait)
        self.timer.totals.append(total)
        self.steps += 1
        for batch in batches:
            self._inspect(batch)
        self._after(logs)
        return logs

    def _inspect(self, batch: Any) -> None:
        parts = self.strategy.experimental_local_results(batch)
        leaves = [(p, v) for role, value in _roles(parts[0]) for p, v in _flatten(value, role)]
        self._last_spec = [_leaf(p, v) for p, v in leaves]
        self.last_batch = batch
        first = self._last_spec[0][1] if self._last_spec else None
        self._per_replica = int(first[0]) if first and first[0] is not None else 0
        self.global_batch = self._per_replica * len(parts)
        self._last_x = dict(_roles(parts[0])).get("x")
        float_paths = [p for p, v in leaves if _is_float(v)]
        floats = tuple(tuple(v for role, value in _roles(part)
                             for _, v in _flatten(value, role) if _is_float(v)) for part in parts)
        labels = tuple(self._labels(dict(_roles(part)).get("y")) for part in parts)
        if not float_paths and labels[0] is None:
            return
        if self._check is None:
            devices = tuple(str(getattr((f or (lab,))[0], "device", "") or "")
                            for f, lab in zip(floats, labels, strict=True))
            self._check = _make_check(self.num_classes or 0, devices)
        out = self._check(floats, labels).numpy()  # one call and one copy per step
        finite, counts = out[: len(float_paths)], out[len(float_paths):]
        if self.bad_input is None and not finite.all():
            self.bad_input = (self.steps, float_paths[int(np.argmin(finite))])
        if self.class_counts is not None and labels[0] is not None:
            self.class_counts += counts

    def _labels(self, y: Any) -> Any:
        """``y`` when the class check can read it (sparse ids, or one-hot over the classes)."""
        c = self.num_classes
        shape = getattr(y, "shape", None)
        if not c or shape is None or not hasattr(y, "dtype"):
            return None
        rank = shape.rank
        if rank == 1 or (rank == 2 and shape[-1] == 1):
            return y
        if rank == 2 and shape[-1] == c and y.dtype.is_floating:
            return y
        return None

    def _after(self, logs: Any) -> None:
        traces = self._traces()
        if traces > self._traces_seen:
            if self.steps > 1 and self._spec_at_trace is not None:
                changes, fix = retrace_findings(self._spec_at_trace, self._last_spec)
                self.retraces.append((self.steps, changes, fix))
            self._spec_at_trace, self._traces_seen = self._last_spec, traces
        elif self._spec_at_trace is None:
            self._spec_at_trace = self._last_spec
        loss = logs.get("loss") if isinstance(logs, Mapping) else None
        if loss is None:
            return
        value = float(np.asarray(loss))
        self.losses.append(value)
        if self.bad_loss is None and not np.isfinite(value):
            from .instruments import non_finite_culprits

            # Now, while the weights are those of the bad step (diagnose restores them).
            self.bad_loss = (self.steps, value, non_finite_culprits(
                self.model, self._last_x, self.start_weights) if self._last_x is not None
                else [])

    # -- results --------------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        waits, totals = self.timer.steady(1)
        share, _ = input_bound(waits, totals)
        step_ms, wait_ms = self.timer.median_ms()
        return {
            "steps": self.steps,
            "global_batch": self.global_batch,
            "replicas": self.replicas,
            "step_ms_median": None if step_ms is None else round(step_ms, 2),
            "wait_ms_median": None if wait_ms is None else round(wait_ms, 3),
            "input_wait_share": round(share, 4),
            "steps_s": round(sum(self.timer.totals), 3),
            "traces": self._traces() - self._traces_start,
            "retrace_steps": [s for s, _, _ in self.retraces],
            "loss_first": self.losses[0] if self.losses else None,
            "loss_last": self.losses[-1] if self.losses else None,
            "class_counts": None if self.class_counts is None else self.class_counts.tolist(),
        }


def _is_float(value: Any) -> bool:
    return bool(getattr(getattr(value, "dtype", None), "is_floating", False))


def _make_check(num_classes: int, devices: tuple[str, ...]) -> Any:
    """``check(floats, labels)`` over every replica's part of a batch: one int64 vector of
    (1 per float leaf that is finite on every replica, then the label count per class).
    Each replica's part is reduced on its own device; only the small result moves."""
    import tensorflow as tf

    def class_ids(labels: Any) -> Any:
        if labels.shape.rank == 2 and labels.shape[-1] == num_classes and num_classes > 1:
            ids = tf.argmax(labels, -1, output_type=tf.int32)
        else:
            flat = tf.reshape(labels, [-1])
            if flat.dtype.is_floating:
                flat = tf.where(tf.math.is_finite(flat), tf.round(flat), -tf.ones_like(flat))
            ids = tf.cast(flat, tf.int32)
        return tf.boolean_mask(ids, (ids >= 0) & (ids < num_classes))

    def check(floats: tuple[tuple[Any, ...], ...], labels: tuple[Any, ...]) -> Any:
        finite, counts = [], []
        for device, part, part_labels in zip(devices, floats, labels, strict=True):
            with tf.device(device):
                finite.append(tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in part])
                              if part else tf.ones([0], tf.bool))
                if part_labels is not None and num_classes > 0:
                    counts.append(tf.math.bincount(class_ids(part_labels), minlength=num_classes,
                                                   maxlength=num_classes, dtype=tf.int64))
        all_finite = tf.cast(tf.reduce_all(tf.stack(finite), axis=0), tf.int64)
        total = tf.add_n(counts) if counts else tf.zeros([max(num_classes, 0)], tf.int64)
        return tf.concat([all_finite, total], 0)

    return tf.function(check, reduce_retracing=True)


def half_batch(strategy: Any, batch: Any) -> tuple[Any, int]:
    """The first half of each replica's part of ``batch``, distributed like it; and the
    per-replica size of that half."""
    import tensorflow as tf

    parts = strategy.experimental_local_results(batch)
    sizes: list[int] = []

    def take(t: Any) -> Any:
        shape = getattr(t, "shape", None)
        if shape is None or not shape.rank or shape[0] is None:
            return t
        n = max(1, int(shape[0]) // 2)
        sizes.append(n)
        return t[:n]

    halves = [tf.nest.map_structure(take, p) for p in parts]
    size = sizes[0] if sizes else 0
    if len(halves) == 1:
        return halves[0], size
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: halves[ctx.replica_id_in_sync_group]), size


class TensorFlowGpuMemory:
    """Peak memory of TensorFlow's allocator on one GPU, and that GPU's size from NVML."""

    def __init__(self, name: str, total: int | None) -> None:
        self.name, self._total = name, total

    def capacity(self) -> int | None:
        return self._total

    def measure(self, run: Callable[[], int]) -> int | None:
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats(self.name)
        run()
        return int(tf.config.experimental.get_memory_info(self.name)["peak"])


def gpu_memory(table: Sequence[GpuInfo] | None = None,
               environ: Mapping[str, str] | None = None) -> TensorFlowGpuMemory | None:
    """The memory probe of TensorFlow's first visible GPU; ``None`` without a GPU."""
    import tensorflow as tf

    visible = tf.config.get_visible_devices("GPU")
    if not visible:
        return None
    index = int(visible[0].name.rsplit(":", 1)[-1])
    table = table if table is not None else nvml.gpus()
    order = cuda_order(table, environ) if table else None
    total = None
    if order is not None and index < len(order):
        total = nvml.memory_total(order[index].uuid)
    return TensorFlowGpuMemory("GPU:0", total)


def num_classes_of(model: Any, num_classes: int | None, reservoir: Any) -> int | None:
    """Classes for the empty-class check: given, the reservoir's, or the output units of a
    model trained with a cross-entropy loss (1 unit: 2 classes); else ``None``."""
    if num_classes:
        return int(num_classes)
    if reservoir is not None:
        return int(reservoir.num_classes)
    loss = getattr(model, "loss", None)
    name = str(getattr(loss, "name", None) or getattr(loss, "__name__", None) or loss).lower()
    if "crossentropy" not in name:
        return None
    units = None
    try:
        units = model.outputs[0].shape[-1]
    except Exception:  # subclassed model: the last layer may say
        units = getattr(model.layers[-1], "units", None) if getattr(model, "layers", None) \
            else None
    if not isinstance(units, int) or units < 1:
        return None
    return 2 if units == 1 else units
