"""Reference trainer (``genaug train``): a small Keras classifier with synthetic mixing.

What it shows, end to end, on a folder of class sub-folders (``DIR/<class>/<image>.png``) or on
a generated demo set (:func:`genaug.trainer.data.make_demo_dataset`):

* **Checks before anything is built**: a missing folder, 0 images, a class with 0 images, fewer
  images than one global batch each raise :class:`~genaug.trainer.data.DatasetError` saying
  what was found, where, and the layout expected.
* **Fixed shapes**: a static global batch with ``drop_remainder=True``; the step function is
  traced once (the summary prints its tracing count).
* **Devices**: ``MirroredStrategy`` over the GPUs given (``--gpus 1,2,3``, by index as
  TensorFlow lists them: leave out the service's); without ``--gpus`` the CPU, split into
  ``--cpu-replicas N`` logical devices if asked. Devices are configured before TensorFlow
  initialises, which is why :func:`configure_devices` comes first and this module imports
  TensorFlow only inside functions.
* **Mixing**: ``--service URL --recipe NAME --p 0.5``: a
  :class:`~genaug.trainer.reservoir.SyntheticReservoir` (created outside the strategy scope)
  mixed into each batch with graph ops, refreshed by a
  :class:`~genaug.trainer.feeder.ReservoirFeeder` thread sampling the recipe's pool (or
  ``generate`` with ``--prompt LABEL=TEXT`` when the service has no such recipe). Dataset class
  names are matched to the recipe's label names; a class with no label is an error.
* **No Python in the graph**: :func:`~genaug.trainer.audit.assert_no_python_ops` runs on the
  dataset and the train step before ``fit``.
* **NaN/Inf**: training stops at the first non-finite loss, naming the step and, where it can,
  the first layer whose output is non-finite on a probe batch and the non-finite weights.
* **Summary**: steps, the synthetic fraction actually mixed, the step function's tracing
  count and the share of step time spent waiting for input.

How input waiting is measured: Keras 3 fetches the next batch *inside* the traced train
function (``iterator.get_next()`` in ``multi_step_on_iterator``), so gaps between
``on_train_batch_end`` and the next ``on_train_batch_begin`` contain no input wait at all and
would always report ~0 %. Instead :class:`StepTimer` wraps ``model.train_function``: it calls
``next()`` on the distributed iterator in Python (this blocks exactly as long as the input
pipeline is behind: with a ready prefetch buffer it returns in microseconds), then runs Keras's
own traced ``one_step_on_data`` on that batch. Wait share = time in ``next()`` / time of the
whole step, first step (tracing) excluded. Execution is synchronous (TensorFlow's default), so
a step's time ends when its computation has finished.

Example::

    genaug train --data ~/wounds --batch-size 64 --epochs 5 \\
        --service http://gen-host:8000 --recipe wound-phases --p 0.5 --gpus 1,2,3,4
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genaug.trainer.data import DatasetError, FolderScan, make_demo_dataset, scan_image_folder

if TYPE_CHECKING:
    from genaug.trainer.feeder import ReservoirFeeder
    from genaug.trainer.reservoir import SyntheticReservoir

__all__ = [
    "DeviceError",
    "LabelMapError",
    "NonFiniteLossError",
    "StepTimer",
    "TrainConfig",
    "TrainSummary",
    "Trainer",
    "add_train_arguments",
    "build_default_model",
    "configure_devices",
    "match_labels",
    "run_train",
    "train",
]

logger = logging.getLogger(__name__)

ModelBuilder = Callable[[int, tuple[int, int, int]], Any]


class DeviceError(RuntimeError):
    """The devices asked for cannot be used (missing GPU index, TensorFlow already started)."""


class LabelMapError(ValueError):
    """A dataset class has no matching label in the recipe (or the mapping is ambiguous)."""


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or Inf; ``step`` is the 1-based global step, ``culprits`` the
    findings (first non-finite layer output, non-finite weights)."""

    def __init__(self, message: str, *, step: int, loss: float, culprits: Sequence[str]) -> None:
        super().__init__(message)
        self.step = step
        self.loss = loss
        self.culprits = list(culprits)


# ----------------------------------------------------------------------------- configuration


@dataclass
class TrainConfig:
    """Everything :class:`Trainer` needs; the CLI flags map one to one (see
    :func:`add_train_arguments`).

    Attributes:
        data: folder of class sub-folders; ``None`` generates the demo set (``demo_per_class``
            images per class of ``I``/``P``/``R``) into a temporary folder.
        image_size: square side images are resized to (and the reservoir holds).
        batch_size: the *global* batch, split across replicas; must divide by their number.
        gpus: TensorFlow GPU indices to train on; ``None``: the CPU.
        cpu_replicas: without ``gpus``, split the CPU into this many logical devices.
        service / recipe / prompts / p: mixing. ``p=0`` or no ``service`` disables it.
        label_map: dataset class name -> recipe label name, for classes whose names differ.
    """

    data: Path | None = None
    demo_per_class: int = 96
    image_size: int = 64
    batch_size: int = 32
    epochs: int = 2
    steps_per_epoch: int | None = None
    learning_rate: float = 3e-3
    gpus: list[int] | None = None
    cpu_replicas: int | None = None
    service: str | None = None
    recipe: str | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    label_map: dict[str, str] = field(default_factory=dict)
    p: float = 0.5
    slots_per_class: int = 128
    feeder_batch: int = 32
    feeder_interval_s: float = 0.5
    feeder_wait_s: float = 0.0
    seed: int = 0
    cache: bool = True
    verbose: int = 1

    @property
    def mixing(self) -> bool:
        """Mixing is on: a service, a recipe or prompts, and ``p > 0``."""
        return bool(self.service) and bool(self.recipe or self.prompts) and self.p > 0


@dataclass
class TrainSummary:
    """What a run did; :meth:`format` is what ``genaug train`` prints."""

    steps: int = 0
    epochs: int = 0
    global_batch: int = 0
    replicas: int = 0
    devices: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    images: int = 0
    final_loss: float | None = None
    final_accuracy: float | None = None
    mixing: bool = False
    p: float = 0.0
    mixed_fraction: float = 0.0
    examples_seen: int = 0
    tracing_counts: dict[str, int] = field(default_factory=dict)
    input_wait_share: float | None = None
    median_step_ms: float | None = None
    median_wait_ms: float | None = None
    audit: str = "not run"
    feeder: dict[str, Any] | None = None
    label_map: dict[str, int] = field(default_factory=dict)
    source: str = ""
    fit_s: float = 0.0

    @property
    def step_tracing_count(self) -> int:
        """Traces of the function that ran the steps (the most traced one): 1 is healthy."""
        return max(self.tracing_counts.values(), default=0)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly copy."""
        return asdict(self)

    def format(self) -> str:
        """A short multi-line report."""
        lines = ["genaug train summary"]
        per_epoch = self.steps // self.epochs if self.epochs else self.steps
        lines.append(
            f"  steps            {self.steps} ({self.epochs} epoch(s) x {per_epoch}), global batch "
            f"{self.global_batch} on {self.replicas} replica(s) [{', '.join(self.devices)}]"
        )
        lines.append(
            f"  data             {self.images} images, classes {self.classes} ({self.source})"
        )
        if self.final_loss is not None:
            acc = f", accuracy {self.final_accuracy:.3f}" if self.final_accuracy is not None else ""
            lines.append(f"  last epoch       loss {self.final_loss:.4f}{acc}")
        if self.mixing:
            lines.append(
                f"  synthetic mixed  {self.mixed_fraction:.3f} of {self.examples_seen} examples "
                f"(p={self.p}; below p while the reservoir was filling)"
            )
        else:
            lines.append("  synthetic mixed  off (no --service/--recipe, or --p 0)")
        counts = ", ".join(f"{k}: {v}" for k, v in self.tracing_counts.items()) or "n/a"
        lines.append(f"  step tracing     {self.step_tracing_count} ({counts})")
        if self.input_wait_share is not None:
            lines.append(
                f"  input wait       {100 * self.input_wait_share:.1f}% of step time (median step "
                f"{self.median_step_ms:.1f} ms, median wait {self.median_wait_ms:.2f} ms; "
                "first step excluded)"
            )
        lines.append(f"  graph audit      {self.audit}")
        if self.feeder is not None:
            f = self.feeder
            lines.append(
                f"  feeder           {f['images_received']} images in {f['requests']} requests, "
                f"{f['errors']} errors{'; last: ' + f['last_error'] if f['last_error'] else ''}"
            )
        lines.append(f"  fit time         {self.fit_s:.1f} s")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- devices


def configure_devices(
    gpus: Sequence[int] | None = None, cpu_replicas: int | None = None
) -> list[str]:
    """Make exactly the requested devices visible; return the names for ``MirroredStrategy``.

    Must run before TensorFlow initialises its runtime (before any op or ``tf.config`` query
    that creates devices). ``gpus`` are indices into ``tf.config.list_physical_devices("GPU")``
    (list the service's GPU nowhere); without them the CPU is used, and GPUs TensorFlow would
    otherwise grab are hidden. ``cpu_replicas`` splits the CPU into that many logical devices.

    Raises:
        DeviceError: a GPU index that does not exist, ``cpu_replicas < 1``, both options, or
            TensorFlow already initialised.
    """
    import tensorflow as tf

    if gpus and cpu_replicas:
        raise DeviceError("pass --gpus or --cpu-replicas, not both")
    physical_gpus = tf.config.list_physical_devices("GPU")
    try:
        if gpus:
            if not physical_gpus:
                raise DeviceError(
                    f"--gpus {','.join(map(str, gpus))} asked for GPUs but TensorFlow sees none "
                    "(CUDA build? CUDA_VISIBLE_DEVICES?); leave out --gpus to train on the CPU"
                )
            bad = [g for g in gpus if not 0 <= g < len(physical_gpus)]
            if bad or len(set(gpus)) != len(gpus):
                raise DeviceError(
                    f"--gpus {','.join(map(str, gpus))}: TensorFlow sees {len(physical_gpus)} "
                    f"GPU(s), indices 0..{len(physical_gpus) - 1}; invalid or repeated: "
                    f"{bad or gpus}"
                )
            chosen = [physical_gpus[g] for g in gpus]
            tf.config.set_visible_devices(chosen, "GPU")
            for device in chosen:
                tf.config.experimental.set_memory_growth(device, True)
            return [f"/gpu:{i}" for i in range(len(chosen))]
        if physical_gpus:
            logger.warning(
                "TensorFlow sees %d GPU(s) but --gpus was not given: training on the CPU and "
                "leaving every GPU alone (the service may own one)", len(physical_gpus)
            )
            tf.config.set_visible_devices([], "GPU")
        if cpu_replicas is not None:
            if cpu_replicas < 1:
                raise DeviceError(f"--cpu-replicas {cpu_replicas} must be >= 1")
            cpu = tf.config.list_physical_devices("CPU")[0]
            try:
                tf.config.set_logical_device_configuration(
                    cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(cpu_replicas)]
                )
            except RuntimeError:
                # Already initialised: fine if it was with exactly this split (a second run
                # in one process, a notebook re-running a cell).
                if len(tf.config.list_logical_devices("CPU")) != cpu_replicas:
                    raise
            return [f"/cpu:{i}" for i in range(cpu_replicas)]
        return ["/cpu:0"]
    except RuntimeError as exc:
        if isinstance(exc, DeviceError):
            raise
        raise DeviceError(
            f"cannot configure devices ({exc}): TensorFlow was already initialised in this "
            "process. --gpus / --cpu-replicas must be applied before any TensorFlow op runs; "
            "start training in a fresh process"
        ) from exc


# ----------------------------------------------------------------------------- labels


def match_labels(
    class_names: Sequence[str],
    recipe_labels: Sequence[str],
    *,
    explicit: Mapping[str, str] | None = None,
    recipe: str = "the recipe",
) -> dict[str, int]:
    """Map recipe label name -> dataset class index (the feeder's ``label_map``).

    Each class is matched by ``explicit[class]``, else the exact name, else a unique
    case-insensitive match. Recipe labels matched by no class are ignored (never sampled).

    Raises:
        LabelMapError: a class with no label (naming the class, the labels and the fix), an
            explicit mapping to an unknown label, or two classes on one label.
    """
    explicit = dict(explicit or {})
    unknown_keys = sorted(set(explicit) - set(class_names))
    if unknown_keys:
        raise LabelMapError(
            f"--label-map names class(es) {unknown_keys} that are not in the dataset "
            f"(classes: {list(class_names)})"
        )
    lower: dict[str, list[str]] = {}
    for label in recipe_labels:
        lower.setdefault(label.lower(), []).append(label)
    out: dict[str, int] = {}
    missing: list[str] = []
    for index, name in enumerate(class_names):
        if name in explicit:
            label = explicit[name]
            if label not in recipe_labels:
                raise LabelMapError(
                    f"--label-map {name}={label}: {recipe} has no label {label!r} "
                    f"(labels: {list(recipe_labels)})"
                )
        elif name in recipe_labels:
            label = name
        elif len(lower.get(name.lower(), [])) == 1:
            label = lower[name.lower()][0]
        else:
            missing.append(name)
            continue
        if label in out:
            raise LabelMapError(
                f"classes {class_names[out[label]]!r} and {name!r} both map to label {label!r} "
                f"of {recipe}; each class needs its own label"
            )
        out[label] = index
    if missing:
        raise LabelMapError(
            f"dataset class(es) {missing} have no label in {recipe} (its labels: "
            f"{list(recipe_labels)}; dataset classes: {list(class_names)}). Synthetic images "
            "must come from the class they replace: rename the class folder, pass "
            "--label-map CLASS=LABEL, or train without mixing (--p 0)"
        )
    return out


RecipeDescription = tuple[list[str], dict[str, int], tuple[int, int] | None]


def _recipe_description(info: Mapping[str, Any]) -> RecipeDescription:
    """(label names, pool fill per label, output size) from ``GET /v1/recipes/{name}``.

    Tolerant of where the service puts them (``label_names``, ``labels`` as a list or a dict,
    ``spec.labels``; ``fill`` at the top, in ``pool`` or per label).
    """
    raw_spec = info.get("spec")
    spec: Mapping[str, Any] = raw_spec if isinstance(raw_spec, Mapping) else {}
    labels: list[str] = []
    fill: dict[str, int] = {}
    for source in (info.get("label_names"), info.get("labels"), spec.get("labels")):
        if isinstance(source, Mapping) and source:
            labels = [str(k) for k in source]
            for k, v in source.items():
                if isinstance(v, Mapping) and isinstance(v.get("fill"), int):
                    fill[str(k)] = int(v["fill"])
            break
        if isinstance(source, list) and source:
            labels = [str(x["name"]) if isinstance(x, Mapping) else str(x) for x in source]
            for x in source:
                if isinstance(x, Mapping) and isinstance(x.get("fill"), int):
                    fill[str(x["name"])] = int(x["fill"])
            break
    raw_pool = info.get("pool")
    pool: Mapping[str, Any] = raw_pool if isinstance(raw_pool, Mapping) else {}
    for candidate in (info.get("fill"), pool.get("fill"), info.get("stats"), pool.get("stats")):
        if isinstance(candidate, Mapping):
            for k, v in candidate.items():
                if isinstance(v, int):
                    fill[str(k)] = v
                elif isinstance(v, Mapping) and isinstance(v.get("fill"), int):
                    fill[str(k)] = int(v["fill"])
    size: tuple[int, int] | None = None
    holder: Mapping[str, Any]
    for holder in (info, spec):
        h = holder.get("output_height") or holder.get("height")
        w = holder.get("output_width") or holder.get("width")
        if isinstance(h, int) and isinstance(w, int):
            size = (h, w)
            break
    return labels, fill, size


def recipe_status(url: str, recipe: str, *, timeout: float = 10.0) -> RecipeDescription:
    """Label names, pool fill per label and output size of ``recipe`` on the service at ``url``.

    Raises the client's errors (``NotFoundError`` for an unknown recipe or a service without
    recipe endpoints, ``TransportError`` when unreachable).
    """
    from genaug.client import Client

    with Client(url, client_id="genaug-train", timeout=timeout, retry_deadline=timeout) as client:
        info = client.recipe(recipe)
    return _recipe_description(info)


# ----------------------------------------------------------------------------- model


def build_default_model(num_classes: int, image_shape: tuple[int, int, int]) -> Any:
    """A small CNN for ``[0, 255]`` float images: three strided convolutions and a head."""
    import keras

    return keras.Sequential(
        [
            keras.Input(image_shape),
            keras.layers.Rescaling(1.0 / 255.0, name="rescale"),
            keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu", name="conv1"),
            keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu", name="conv2"),
            keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu", name="conv3"),
            keras.layers.GlobalAveragePooling2D(name="pool"),
            keras.layers.Dense(num_classes, name="logits"),
        ],
        name="genaug_reference_cnn",
    )


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
        :func:`~genaug.trainer.audit.assert_no_python_ops` can audit it before training."""
        from genaug.trainer.audit import step_functions

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


def _first_non_finite_output(model: Any, x: Any) -> str | None:
    """The first layer (in ``model.layers`` order) whose output on ``x`` is NaN/Inf."""
    import keras
    import numpy as np

    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    try:
        inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
        probe_model = keras.Model(inputs, [layer.output for layer in layers])
        outputs = probe_model(x, training=False)
    except Exception:  # noqa: BLE001 - subclassed model: fall back to a sequential walk
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


def _non_finite_culprits(
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
    except Exception as exc:  # noqa: BLE001 - diagnosis must never hide the real error
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


def _make_nan_guard() -> Any:
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


# ----------------------------------------------------------------------------- trainer


class Trainer:
    """The reference training run, in steps a test or a notebook can drive.

    Example::

        trainer = Trainer(TrainConfig(data=Path("wounds"), service="http://127.0.0.1:8000",
                                      recipe="wound-phases", p=0.5, cpu_replicas=4))
        trainer.prepare()              # checks, devices, dataset, model, audit
        summary = trainer.fit()        # raises NonFiniteLossError on NaN/Inf
        print(summary.format())

    Args:
        config: the run.
        build_model: ``(num_classes, (H, W, 3)) -> keras.Model`` taking float ``[0, 255]``
            images and returning logits; default :func:`build_default_model`.
    """

    def __init__(self, config: TrainConfig, *, build_model: ModelBuilder | None = None) -> None:
        self.config = config
        self.build_model = build_model or build_default_model
        self.scan: FolderScan | None = None
        self.devices: list[str] = []
        self.strategy: Any = None
        self.dataset: Any = None
        self.base_dataset: Any = None
        self.model: Any = None
        self.reservoir: SyntheticReservoir | None = None
        self.feeder: ReservoirFeeder | None = None
        self.label_map: dict[str, int] = {}
        self.timer = StepTimer()
        self.summary = TrainSummary()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    # -- preparation -------------------------------------------------------------------------

    def prepare(self) -> None:
        """Check the data, configure devices, build dataset/model/mixing, audit the graph."""
        cfg = self.config
        if cfg.batch_size < 1 or cfg.epochs < 1 or cfg.image_size < 8:
            raise DatasetError(
                f"batch_size={cfg.batch_size}, epochs={cfg.epochs} must be >= 1 and "
                f"image_size={cfg.image_size} >= 8"
            )
        if cfg.data is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="genaug-demo-data-")
            root = make_demo_dataset(
                Path(self._tmp.name), per_class=cfg.demo_per_class, size=cfg.image_size,
                seed=cfg.seed,
            )
            self.summary.source = f"generated demo set, {cfg.demo_per_class} PNGs per class"
        else:
            root = Path(cfg.data)
            self.summary.source = str(root)
        # Data first: a wrong folder fails in milliseconds, before TensorFlow starts.
        self.scan = scan_image_folder(root, global_batch=cfg.batch_size)
        self.devices = configure_devices(cfg.gpus, cfg.cpu_replicas)
        if cfg.batch_size % len(self.devices):
            raise DatasetError(
                f"global batch {cfg.batch_size} does not split evenly over {len(self.devices)} "
                f"replicas ({', '.join(self.devices)}); use a multiple of {len(self.devices)}"
            )
        if cfg.mixing:
            self._resolve_labels()
        self._build()

    def _resolve_labels(self) -> None:
        """Fill :attr:`label_map` from the service's recipe (or the prompts' labels)."""
        cfg = self.config
        assert self.scan is not None
        classes = list(self.scan.class_names)
        labels: list[str] | None = None
        use_recipe = cfg.recipe is not None
        if cfg.recipe is not None:
            from genaug.client import GenaugError, NotFoundError, TransportError

            try:
                labels, fill, size = recipe_status(cfg.service or "", cfg.recipe)
            except NotFoundError as exc:
                if not cfg.prompts:
                    raise LabelMapError(
                        f"the service at {cfg.service} has no recipe {cfg.recipe!r} ({exc}); "
                        "check --recipe (genaug serve --recipes FILE) or pass --prompt "
                        "LABEL=TEXT to generate instead"
                    ) from exc
                logger.warning("service has no recipe %r (%s): generating from --prompt instead",
                               cfg.recipe, exc)
                use_recipe = False
            except (TransportError, GenaugError) as exc:
                logger.warning(
                    "service %s not reachable now (%s); assuming recipe labels equal the class "
                    "names %s. Training starts anyway; the feeder connects when it can",
                    cfg.service, exc, classes,
                )
            else:
                if size is not None and size != (cfg.image_size, cfg.image_size):
                    raise LabelMapError(
                        f"recipe {cfg.recipe!r} serves {size[0]}x{size[1]} images but training "
                        f"uses {cfg.image_size}x{cfg.image_size}; set --image-size {size[0]} or "
                        "the recipe's output_height/output_width"
                    )
                logger.info("recipe %r: labels %s, pool fill %s", cfg.recipe, labels, fill)
        if not use_recipe:
            labels = list(cfg.prompts)
        recipe_name = f"recipe {cfg.recipe!r}" if use_recipe else "the --prompt labels"
        self.label_map = match_labels(
            classes, labels if labels is not None else classes, explicit=cfg.label_map,
            recipe=recipe_name,
        )
        self._use_recipe = use_recipe

    def _build(self) -> None:
        import keras
        import tensorflow as tf

        from genaug.trainer.audit import assert_no_python_ops
        from genaug.trainer.feeder import ReservoirFeeder
        from genaug.trainer.reservoir import SyntheticReservoir

        cfg = self.config
        assert self.scan is not None
        keras.utils.set_random_seed(cfg.seed)
        size = (cfg.image_size, cfg.image_size)
        shape = (cfg.image_size, cfg.image_size, 3)
        n_classes = len(self.scan.class_names)

        base = keras.utils.image_dataset_from_directory(
            self.scan.root, labels="inferred", label_mode="int",
            class_names=list(self.scan.class_names), color_mode="rgb", batch_size=None,
            image_size=size, shuffle=False, verbose=False,
        )  # float32 [H, W, 3] in [0, 255], int32 label
        if cfg.cache:
            base = base.cache()
        base = base.shuffle(
            min(self.scan.total, 10_000), seed=cfg.seed, reshuffle_each_iteration=True
        ).batch(cfg.batch_size, drop_remainder=True)
        self.base_dataset = base
        ds = base
        if cfg.mixing:
            # Outside strategy.scope(): one host variable read by the one input pipeline.
            self.reservoir = SyntheticReservoir(n_classes, cfg.slots_per_class, shape)
            ds = ds.map(self.reservoir.mix(p=cfg.p, scale=1.0), num_parallel_calls=tf.data.AUTOTUNE)
        self.dataset = ds.prefetch(tf.data.AUTOTUNE)

        self.strategy = tf.distribute.MirroredStrategy(self.devices)
        with self.strategy.scope():
            self.model = self.build_model(n_classes, shape)
            self.model.compile(
                optimizer=keras.optimizers.Adam(cfg.learning_rate),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
                jit_compile=False,  # XLA adds nothing for this model and fails on some hosts
            )
            # Build the optimizer's slots now: tracing the step for the audit must not be
            # where they are created (Adam's slots would be traced as empty placeholders).
            self.model.optimizer.build(self.model.trainable_variables)

        if cfg.mixing:
            assert self.reservoir is not None
            recipe = cfg.recipe if getattr(self, "_use_recipe", False) else None
            self.feeder = ReservoirFeeder(
                self.reservoir, url=cfg.service, recipe=recipe,
                label_map=self.label_map,
                prompts=None if recipe else {k: cfg.prompts[k] for k in self.label_map},
                batch=cfg.feeder_batch, interval_s=cfg.feeder_interval_s, wait_s=cfg.feeder_wait_s,
                backoff_max_s=5.0, client_kwargs={"client_id": "genaug-train", "timeout": 30.0},
            )

        # Trace the step exactly as fit will call it (one real batch, no weight changes), then
        # walk the dataset graph and the traced step: fit reuses that trace.
        self.timer.install(self.model)
        self.timer.trace(self.model, self.dataset)
        if self.reservoir is not None:
            self.reservoir.reset_counters()
        assert_no_python_ops(dataset=self.dataset, model=self.model)
        self.summary.audit = "no Python ops in the dataset graph or the train step"
        s = self.summary
        s.global_batch, s.replicas, s.devices = cfg.batch_size, len(self.devices), self.devices
        s.classes, s.images = list(self.scan.class_names), self.scan.total
        s.mixing, s.p, s.label_map = cfg.mixing, cfg.p if cfg.mixing else 0.0, self.label_map

    # -- training ----------------------------------------------------------------------------

    def fit(self, callbacks: Sequence[Any] = ()) -> TrainSummary:
        """Train; return the summary. Raises :class:`NonFiniteLossError` on NaN/Inf loss."""
        from genaug.trainer.audit import tracing_counts

        if self.model is None:
            self.prepare()
        cfg = self.config
        guard = _make_nan_guard()
        all_callbacks: list[Any] = [guard]
        if self.feeder is not None:
            all_callbacks.append(self.feeder.callback())
        all_callbacks.extend(callbacks)
        t0 = time.perf_counter()
        try:
            history = self.model.fit(
                self.dataset, epochs=cfg.epochs, steps_per_epoch=cfg.steps_per_epoch,
                callbacks=all_callbacks, verbose=cfg.verbose, shuffle=False,
            )
        finally:
            if self.feeder is not None:
                self.feeder.stop()
        s = self.summary
        s.fit_s = time.perf_counter() - t0
        s.steps = len(self.timer.totals)
        s.epochs = len(history.history.get("loss", []))
        if history.history.get("loss"):
            s.final_loss = float(history.history["loss"][-1])
        if history.history.get("accuracy"):
            s.final_accuracy = float(history.history["accuracy"][-1])
        if self.reservoir is not None:
            s.mixed_fraction = self.reservoir.mixed_fraction()
            s.examples_seen = int(self.reservoir.seen_counter.numpy())
        s.tracing_counts = tracing_counts(self.model)
        s.input_wait_share = self.timer.wait_share()
        s.median_step_ms, s.median_wait_ms = self.timer.median_ms()
        if self.feeder is not None:
            st = self.feeder.stats
            s.feeder = {
                "images_received": st.images_received, "requests": st.requests,
                "errors": st.errors, "last_error": st.last_error,
            }
        if guard.tripped is not None:
            step, epoch, batch, loss = guard.tripped
            probe = next(iter(self.base_dataset.take(1)))[0]
            culprits = _non_finite_culprits(self.model, probe, guard.snapshot, epoch)
            where = "; ".join(culprits) or "no non-finite weight or layer output found"
            raise NonFiniteLossError(
                f"loss became {loss} at step {step} (epoch {epoch}, batch {batch}); training "
                f"stopped there. {where}. Typical causes: a learning rate too high "
                f"(now {cfg.learning_rate:g}), non-finite input pixels, log/division of zero "
                "in a custom layer or loss.",
                step=step, loss=loss, culprits=culprits,
            )
        return s

    def close(self) -> None:
        """Stop the feeder and remove a generated demo folder."""
        if self.feeder is not None:
            self.feeder.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def train(config: TrainConfig, *, build_model: ModelBuilder | None = None) -> TrainSummary:
    """Prepare, fit and clean up; return the summary (see :class:`Trainer`)."""
    with Trainer(config, build_model=build_model) as trainer:
        trainer.prepare()
        return trainer.fit()


# ----------------------------------------------------------------------------- CLI


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated GPU indices, got {text!r}"
        ) from None


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return key.strip(), value.strip()


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``genaug train`` flags to ``parser`` (see :func:`run_train`)."""
    data = parser.add_argument_group("data")
    data.add_argument("--data", type=Path, default=None,
                      help="folder laid out as DIR/<class>/<image>.png; default: a generated "
                      "demo set (3 wound phases I/P/R, procedurally drawn)")
    data.add_argument("--demo-per-class", type=int, default=96,
                      help="images per class of the generated demo set (default 96)")
    data.add_argument("--image-size", type=int, default=64, help="square image side (default 64)")
    run = parser.add_argument_group("training")
    run.add_argument("--batch-size", type=int, default=32,
                     help="global batch, split over the replicas (default 32)")
    run.add_argument("--epochs", type=int, default=2)
    run.add_argument("--steps-per-epoch", type=int, default=None)
    run.add_argument("--learning-rate", type=float, default=3e-3)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--gpus", type=_int_list, default=None,
                     help="TensorFlow GPU indices to train on, e.g. 1,2,3,4 (never the service's); "
                     "default: the CPU")
    run.add_argument("--cpu-replicas", type=int, default=None,
                     help="without --gpus: split the CPU into N logical devices (MirroredStrategy)")
    run.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1,
                     help="Keras fit verbosity: 1 progress bar (default), 2 one line per epoch")
    mix = parser.add_argument_group("synthetic mixing")
    mix.add_argument("--service", default=None, help="genaug service URL, e.g. http://127.0.0.1:8000")
    mix.add_argument("--recipe", default=None, help="recipe to sample from the service's pool")
    mix.add_argument("--prompt", type=_pair, action="append", default=[], metavar="LABEL=TEXT",
                     help="generate with this prompt for LABEL (without --recipe, or when the "
                     "service does not know it); repeat per label")
    mix.add_argument("--label-map", type=_pair, action="append", default=[], metavar="CLASS=LABEL",
                     help="dataset class -> recipe label where names differ; repeatable")
    mix.add_argument("--p", type=float, default=0.5, help="replacement probability (default 0.5)")
    mix.add_argument("--slots-per-class", type=int, default=128,
                     help="synthetic images kept per class in the reservoir (default 128)")
    mix.add_argument("--feeder-batch", type=int, default=32, help="images per feeder request")
    mix.add_argument("--feeder-interval", type=float, default=0.5,
                     help="seconds between feeder requests (default 0.5)")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` for parsed ``genaug train`` arguments."""
    return TrainConfig(
        data=args.data, demo_per_class=args.demo_per_class, image_size=args.image_size,
        batch_size=args.batch_size, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
        learning_rate=args.learning_rate, gpus=args.gpus, cpu_replicas=args.cpu_replicas,
        service=args.service, recipe=args.recipe, prompts=dict(args.prompt),
        label_map=dict(args.label_map), p=args.p, slots_per_class=args.slots_per_class,
        feeder_batch=args.feeder_batch, feeder_interval_s=args.feeder_interval, seed=args.seed,
        verbose=args.verbose,
    )


def run_train(args: argparse.Namespace) -> int:
    """Run ``genaug train`` for parsed arguments; print the summary. Returns an exit code:
    0 done, 2 bad data/devices/labels (nothing trained), 3 stopped on a non-finite loss."""
    from genaug.trainer.audit import PythonInGraphError

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        for noisy in ("tensorflow", "absl", "httpx"):  # per-step "Reduce to ..." INFO lines
            logging.getLogger(noisy).setLevel(logging.WARNING)
    config = config_from_args(args)
    if (config.service is None) != (config.recipe is None and not config.prompts):
        if config.service is None:
            print("genaug train: error: --recipe/--prompt need --service URL", file=sys.stderr)  # noqa: T201
            return 2
        print("genaug train: error: --service needs --recipe NAME or --prompt LABEL=TEXT",  # noqa: T201
              file=sys.stderr)
        return 2
    try:
        summary = train(config)
    except (DatasetError, LabelMapError, DeviceError, PythonInGraphError) as exc:
        print(f"genaug train: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    except NonFiniteLossError as exc:
        print(f"genaug train: stopped: {exc}", file=sys.stderr)  # noqa: T201
        return 3
    print(summary.format())  # noqa: T201
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m genaug.trainer.train [flags]`` (the same as ``genaug train``)."""
    parser = argparse.ArgumentParser(prog="genaug train", description=__doc__.split("\n")[0])
    add_train_arguments(parser)
    return run_train(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
