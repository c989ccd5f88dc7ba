"""Reference trainer (``genaug train``): a small Keras classifier with synthetic mixing.

What it shows, end to end, on a folder of class sub-folders (``DIR/<class>/<image>.png``) or on
a generated demo set (:func:`genaug.trainer.reference.data.make_demo_dataset`):

* **Checks before anything is built**: a missing folder, 0 images, a class with 0 images, fewer
  images than one global batch each raise :class:`~genaug.trainer.reference.data.DatasetError`
  saying what was found, where, and the layout expected.
* **Fixed shapes**: a static global batch with ``drop_remainder=True``; the step function is
  traced once (the summary prints its tracing count).
* **Devices**: ``MirroredStrategy`` over the GPUs given (``--gpus 1,2,3``, by index as
  TensorFlow lists them); with ``--service`` the service's own GPU is hidden from TensorFlow
  first (:func:`~genaug.trainer.hardware.devices.configure_devices`, NVML), and without ``--gpus``
  every other GPU is used; with no GPU the CPU, split into ``--cpu-replicas N`` logical
  devices if asked. Devices are configured before TensorFlow
  initialises, which is why :func:`~genaug.trainer.hardware.devices.configure_devices` comes first
  and this module imports TensorFlow only inside functions.
* **Mixing**: ``--service URL --recipe NAME --p 0.5``: a
  :class:`~genaug.trainer.mixing.reservoir.SyntheticReservoir` (created outside the strategy scope)
  mixed into each batch with graph ops, refreshed by a
  :class:`~genaug.trainer.feeding.feeder.ReservoirFeeder` thread sampling the recipe's pool (or
  ``generate`` with ``--prompt LABEL=TEXT`` when the service has no such recipe). Dataset class
  names are matched to the recipe's label names (:mod:`genaug.feeding.labels`); a class with
  no label is an error. ``--rebalance 1,1,4`` draws a replacement's class from those weights
  (the label follows the pixels), oversampling a rare class. The feeder is strict: a
  configuration mistake the service reveals stops the run before its first step (exit 2).
* **No Python in the graph**: :func:`~genaug.trainer.checks.audit.assert_no_python_ops` runs on the
  dataset and the train step before ``fit``.
* **NaN/Inf**: training stops at the first non-finite loss, naming the step and, where it can,
  the first layer whose output is non-finite on a probe batch and the non-finite weights
  (:func:`~genaug.trainer.checks.instruments.nan_guard`).
* **Doctor** (``--doctor``): before ``fit``, :func:`~genaug.trainer.checks.diagnose.diagnose` runs
  20 steps of the prepared pipeline and model, with the feeder started so the reservoir is seen
  as training will see it, and prints its table; any problem stops the run with exit status 4
  before training (the weights are restored after the steps, so a clean run trains as if it
  had not looked).
* **Summary**: steps, the synthetic fraction actually mixed, the step function's tracing
  count and the share of step time spent waiting for input, measured by
  :class:`~genaug.trainer.checks.instruments.StepTimer` (its module docstring says how: callback
  timestamps cannot see input waiting under Keras 3).

Example::

    genaug train --data ~/wounds --batch-size 64 --epochs 5 \\
        --service http://127.0.0.1:8000 --recipe wound-phases --p 0.5 --rebalance 1,1,4

Every flag is a :class:`~genaug.trainer.reference.config.TrainConfig` field
(``--feeder-batch`` is ``feeder_batch``, see :mod:`~genaug.trainer.reference.config`); the
report printed at the end is a :class:`~genaug.trainer.reference.summary.TrainSummary`. The
command itself (flags in, exit status out) is :mod:`~genaug.trainer.reference.command`.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genaug.feeding.labels import LabelMapError, match_labels, recipe_status

from ..checks.instruments import (
    NonFiniteLossError,
    StepTimer,
    nan_guard,
    non_finite_culprits,
)
from ..hardware.devices import configure_devices
from .config import TrainConfig
from .data import DatasetError, FolderScan, make_demo_dataset, scan_image_folder
from .summary import TrainSummary

if TYPE_CHECKING:
    from ..checks.findings import DiagnoseReport
    from ..feeding.feeder import ReservoirFeeder
    from ..mixing.reservoir import SyntheticReservoir

__all__ = ["Trainer", "build_default_model", "train"]

log = logging.getLogger(__name__)

ModelBuilder = Callable[[int, tuple[int, int, int]], Any]


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
        hide = cfg.service if cfg.service and cfg.hide_service_gpu else None
        self.devices = configure_devices(cfg.gpus, cfg.cpu_replicas, service_url=hide)
        if cfg.batch_size % len(self.devices):
            raise DatasetError(
                f"global batch {cfg.batch_size} does not split evenly over {len(self.devices)} "
                f"replicas ({', '.join(self.devices)}); use a multiple of {len(self.devices)}"
            )
        if cfg.rebalance is not None and len(cfg.rebalance) != len(self.scan.class_names):
            raise DatasetError(
                f"--rebalance has {len(cfg.rebalance)} weights but the data has "
                f"{len(self.scan.class_names)} classes {list(self.scan.class_names)}; give one "
                "weight per class, in that order"
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
                log.warning("service has no recipe %r (%s): generating from --prompt instead",
                               cfg.recipe, exc)
                use_recipe = False
            except (TransportError, GenaugError) as exc:
                log.warning(
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
                log.info("recipe %r: labels %s, pool fill %s", cfg.recipe, labels, fill)
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

        from ..checks.audit import assert_no_python_ops
        from ..feeding.feeder import ReservoirFeeder
        from ..mixing.reservoir import SyntheticReservoir

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
            mix = self.reservoir.mix(p=cfg.p, rebalance=cfg.rebalance, scale=1.0)
            ds = ds.map(mix, num_parallel_calls=tf.data.AUTOTUNE)
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
                strict=cfg.strict,
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
        from ..checks.audit import tracing_counts

        if self.model is None:
            self.prepare()
        cfg = self.config
        guard = nan_guard()
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
            s.replaced_per_class = self.reservoir.replaced_counts().tolist()
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
            culprits = non_finite_culprits(self.model, probe, guard.snapshot, epoch)
            where = "; ".join(culprits) or "no non-finite weight or layer output found"
            raise NonFiniteLossError(
                f"loss became {loss} at step {step} (epoch {epoch}, batch {batch}); training "
                f"stopped there. {where}. Typical causes: a learning rate too high "
                f"(now {cfg.learning_rate:g}), non-finite input pixels, log/division of zero "
                "in a custom layer or loss.",
                step=step, loss=loss, culprits=culprits,
            )
        return s

    def diagnose(self, steps: int = 20, *, fill_timeout_s: float = 10.0) -> DiagnoseReport:
        """Run :func:`~genaug.trainer.checks.diagnose.diagnose` on the prepared dataset and model
        and print its table; the model, the reservoir's counters and the step timer are left as
        they were, so :meth:`fit` trains as if nothing had run.

        With mixing, the feeder is started first (strict: a configuration mistake raises
        :class:`~genaug.feeding.preflight.FeederConfigError` here, as in ``fit``) and given
        up to ``fill_timeout_s`` seconds to put images of every class in the reservoir: a class
        still empty after that is reported, since the first steps would see it so.
        """
        from ..checks.diagnose import diagnose
        from ..checks.findings import DiagnoseEnv

        if self.model is None:
            self.prepare()
        started = False
        if self.feeder is not None and not self.feeder.running:
            self.feeder.start()
            started = True
        try:
            if self.reservoir is not None and self.feeder is not None:
                deadline = time.monotonic() + fill_timeout_s
                while (self.reservoir.fill_counts() == 0).any() and time.monotonic() < deadline:
                    time.sleep(0.1)
            report = diagnose(
                self.dataset, self.model, steps=steps, strategy=self.strategy,
                reservoir=self.reservoir,
                env=DiagnoseEnv(service_url=self.config.service if self.config.service
                                else None))
        finally:
            if started and self.feeder is not None:
                self.feeder.stop()
        if self.reservoir is not None:
            self.reservoir.reset_counters()
        self.timer.waits.clear()
        self.timer.totals.clear()
        return report

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
