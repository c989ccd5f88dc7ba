"""Few-shot training on the digits, in a TensorFlow child process: the demo's runs.

:func:`run_fewshot` starts ``python -m genaug.experiments.fewshot`` with a list of
:class:`FewShotRun` and reads one result line per run back; :func:`fewshot_child` is what runs
there: a small CNN trained on a few real digits per class (:mod:`genaug.digits`) under
``MirroredStrategy`` over logical CPUs, optionally mixing pool images in through a
:class:`~genaug.trainer.mixing.reservoir.SyntheticReservoir` fed by a
:class:`~genaug.trainer.feeding.feeder.ReservoirFeeder`, scored on the 500 held-out test digits.
``genaug demo`` (:mod:`genaug.experiments.demo`) runs two of them.

A run's ``trainer`` says which child trains it: ``"tensorflow"`` (this module's
:func:`fewshot_child`) or ``"torch"`` (:mod:`genaug.experiments.fewshot_torch`, the same task,
network and settings, mixing through :class:`genaug.torch.MixedDataset`; no TensorFlow).
Both print the same result lines; :func:`run_fewshot` starts one child per run of
consecutive runs with the same trainer.

This module imports neither TensorFlow nor torch at import time: each lives in its child
process (TensorFlow's configured, logical devices, before it initialises).

Example::

    from genaug.experiments.fewshot import FewShotRun, run_fewshot
    real, mixed = run_fewshot([FewShotRun(arm="real only"),
                               FewShotRun(arm="p=0.5", service=url, recipe="digits", p=0.5)])
    real["test_accuracy"], mixed["test_accuracy"]
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from genaug.local_service import INTERRUPT_GRACE_S, start_child, stop_child

__all__ = ["TORCH_UNSUPPORTED", "TRAINERS", "FewShotRun", "PoolStoppedError", "child_main",
           "fewshot_child", "poll_pool", "print_result", "raise_if_stopped", "run_fewshot",
           "tf_child_env", "torch_child_env"]

_RESULT = "GENAUG_FEWSHOT_RESULT "  # prefix of the child's JSON result lines
# Progress lines of the child start with this; only they are echoed (a library's warning,
# whatever its indentation, stays in the tail kept for errors).
_PROGRESS = "GENAUG_FEWSHOT_PROGRESS "

#: The child module that trains a run of each ``FewShotRun.trainer``
#: (``python -m MODULE --fewshot-json JSON``; both print the same lines).
TRAINERS = {"tensorflow": "genaug.experiments.fewshot",
            "torch": "genaug.experiments.fewshot_torch"}

#: The options the torch child refuses (set, they raise naming the option), and why.
TORCH_UNSUPPORTED = {
    "rebalance": "genaug.torch's MixedDataset replaces an example by an image of its own class "
                 "only",
    "synthetic_weight": "genaug.torch's MixedDataset does not say which examples it replaced, "
                        "so no sample weight can follow them",
}


@dataclass
class FewShotRun:
    """One few-shot training run on the digits (a row of the benchmark, a line of the demo).

    Attributes:
        arm: a name for the result (``"real only"``, ``"text-to-image p=0.5"``...).
        seed: picks the few-shot subset (:func:`genaug.digits.subset` of ``split``) and
            seeds the model's initialisation, shuffling and mixing.
        per_class: real images per class; ``None``: every image of ``split`` (a full-data
            ceiling).
        split: the real images' split (:data:`genaug.digits.SPLITS`): ``fewshot``, or
            ``generator`` for the ceiling of a task the generator split covers.
        classes: the task's digits (default all ten); the model has one output per digit
            here, the pool's labels ``"<digit>"`` map to them, and test accuracy is over the
            ``test`` digits of these classes only.
        steps / batch / learning_rate: training (global batch over ``cpu_replicas``).
        service / recipe / p: mixing from that recipe's pool; ``p == 0`` or no recipe: real
            images only; ``p == 1``: synthetic only (every real image replaced).
        slots_per_class: reservoir size; training starts when every class holds
            ``prefill_per_class`` images (or after ``prefill_timeout_s``).
        pool_per_label: before mixing starts, wait (up to ``prefill_timeout_s``) until the
            recipe's pool holds this many images of every label: with a pool capacity of
            the same number, mixing always starts from the same full pool (the demo).
        synthetic_weight: sample weight of a replaced (synthetic) example
            (``reservoir.mix(synthetic_weight=...)``); ``None``: the same as a real one.
        rebalance: class weights of the replacements (``reservoir.mix(rebalance=...)``, one
            per task class); ``None``: each example is replaced by its own class.
        need_recipes: report per-class need (error on the validation images, after every
            epoch, :class:`~genaug.trainer.feeding.need.NeedCallback`) to these recipes of
            ``service`` (``POST /v1/recipes/{name}/feedback``, client id from ``arm``).
        reservoir_split: instead of a service's pool, write up to ``slots_per_class`` real
            images per class of this split (:data:`genaug.digits.SPLITS`, drawn with
            ``seed``) into the reservoir and mix them in with ``p``: a perfect generator's
            pool, the reference that says how much the mixing itself can give.
        trainer: ``"tensorflow"`` (``MirroredStrategy`` over ``cpu_replicas`` logical CPUs)
            or ``"torch"`` (:mod:`genaug.experiments.fewshot_torch`: one process at the same
            global batch, so ``cpu_replicas`` does not apply; it refuses the options of
            :data:`TORCH_UNSUPPORTED`).
        loader_workers: torch only: the ``DataLoader``'s workers (``persistent_workers``),
            each drawing its own stream of the pool; 0: in the training process.

    Every run is also scored on **validation** images: the ``fewshot`` split's images of the
    task's classes that it did not train on (all of them for a run on another split), never
    the ``test`` digits; benchmarks choose their settings on it.
    """

    arm: str
    seed: int = 0
    per_class: int | None = 5
    split: str = "fewshot"
    classes: list[int] | None = None
    steps: int = 300
    batch: int = 32
    learning_rate: float = 2e-3
    cpu_replicas: int = 2
    service: str | None = None
    recipe: str | None = None
    p: float = 0.0
    slots_per_class: int = 64
    prefill_per_class: int = 32
    prefill_timeout_s: float = 300.0
    pool_per_label: int = 0
    synthetic_weight: float | None = None
    rebalance: list[float] | None = None
    need_recipes: list[str] = field(default_factory=list)
    reservoir_split: str | None = None
    trainer: str = "tensorflow"
    loader_workers: int = 2
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.trainer not in TRAINERS:
            raise ValueError(f"FewShotRun trainer {self.trainer!r}: choose one of "
                             f"{sorted(TRAINERS)}")
        if self.trainer == "torch":
            for name, why in TORCH_UNSUPPORTED.items():
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"FewShotRun {self.arm!r}: trainer='torch' does not support {name}= "
                        f"({why}); leave {name} unset, or train with trainer='tensorflow'")
        if self.loader_workers < 0:
            raise ValueError(f"FewShotRun loader_workers {self.loader_workers} must be >= 0 "
                             "(0: the DataLoader draws in the training process)")


class PoolStoppedError(RuntimeError):
    """A pool wait that cannot end: the recipe's judge stopped labels the wait needs (it
    accepted under 10 % of their images, so the service makes no more). ``stopped`` maps each
    to the judge's reason and fix, which the message quotes.

    Example::

        try:
            wait_for_pool(url, "digits", 32)
        except PoolStoppedError as exc:
            sys.exit(f"{exc}")   # names each stopped label, why, and the fix
    """

    def __init__(self, recipe: str, stopped: dict[str, str], fill: dict[str, int],
                 want: int | None) -> None:
        self.recipe, self.stopped = recipe, dict(stopped)
        held = ", ".join(f"{label} {fill.get(label, 0)}" for label in stopped)
        short = f" short of {want} images" if want is not None else ""
        super().__init__(
            f"recipe {recipe!r}: the judge stopped {len(stopped)} label(s){short} ({held} "
            "held), so no more of their images are made and waiting cannot fill them:\n"
            + "\n".join(f"  {label}: {why}" for label, why in stopped.items()))


def raise_if_stopped(detail: dict[str, Any], want: int | None,
                     labels: Sequence[str] | None = None) -> None:
    """Raise :class:`PoolStoppedError` when the judge stopped a label of ``detail`` (a
    ``GET /v1/recipes/{name}`` answer) that holds fewer than ``want`` images (``None``: any
    stopped label, for a wait on the pool's totals); ``labels`` limits the check (default:
    every label of the recipe)."""
    fill = {str(k): int(v) for k, v in (detail.get("fill") or {}).items()}
    reasons = detail.get("stopped") or {}
    names = list(fill) if labels is None else list(labels)
    stopped = {label: str(reasons[label]) for label in names
               if label in reasons and (want is None or fill.get(label, 0) < want)}
    if stopped:
        raise PoolStoppedError(str(detail.get("name")), stopped, fill, want)


def poll_pool(
    fetch: Callable[[], dict[str, Any]],
    *,
    per_label: int | None,
    labels: Sequence[str] | None = None,
    filled: Callable[[dict[str, Any]], bool] | None = None,
    timeout: float = 120.0,
    poll_s: float = 0.5,
) -> dict[str, Any]:
    """Poll one recipe's pool until it is filled; return the last answer of ``fetch``.

    ``fetch`` makes one ``GET /v1/recipes/{name}`` with whatever client the caller holds
    (``lambda: client.recipe("digits")``). Filled: ``filled(detail)`` where given, else every
    label of ``labels`` (default: the recipe's) holds ``per_label`` images. Raises
    :class:`PoolStoppedError` as soon as the judge stopped one of those labels short of
    ``per_label`` (``None``: any stopped label): the service makes no more of its images, so
    no wait would end. Raises ``TimeoutError`` naming the fill after ``timeout`` s.

    Example::

        with Client(url) as client:
            detail = poll_pool(lambda: client.recipe("digits"), per_label=32, timeout=300)
    """
    deadline = time.monotonic() + timeout
    while True:
        detail = fetch()
        fill = {str(k): int(v) for k, v in (detail.get("fill") or {}).items()}
        names = [str(x) for x in (labels if labels is not None
                                  else detail.get("labels") or list(fill))]
        if filled is not None:
            done = filled(detail)
        else:
            done = per_label is not None and bool(names) and min(
                fill.get(name, 0) for name in names) >= per_label
        if done:
            return detail
        raise_if_stopped({**detail, "fill": fill}, per_label, names)
        if time.monotonic() >= deadline:
            wanted = f"{per_label} images per label" if per_label is not None else "more"
            raise TimeoutError(
                f"pool of recipe {detail.get('name')!r} holds {fill} after {timeout:.0f} s; "
                f"wanted {wanted} (is pre-generation on? GENAUG_PREGENERATE, or ask for a "
                "fill: genaug pregenerate)")
        time.sleep(poll_s)


def _wait_for_full_pool(run: FewShotRun, deadline: float) -> str:
    """Until every label of ``run.recipe``'s pool holds ``run.pool_per_label`` images (or
    the deadline): mixing then starts from the same pool whatever the timing. Raises
    :class:`PoolStoppedError` when the judge stopped a label short of it: no wait fills it."""
    from genaug.client import Client

    assert run.service is not None and run.recipe is not None
    recipe = run.recipe
    with Client(run.service, client_id=_client_id(run.arm), timeout=30.0) as client:
        try:
            poll_pool(lambda: client.recipe(recipe), per_label=run.pool_per_label,
                      timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            # the run goes on with what there is; the progress line says so, not "holds N"
            fill = client.recipe(recipe)["fill"]
            return f"holds only {min(fill.values(), default=0)} of {run.pool_per_label} " \
                   "images per label at the deadline"
    return f"holds {run.pool_per_label} images per label"


def tf_child_env(threads: int = 2) -> dict[str, str]:
    """Environment of a TensorFlow child: CPU only, quiet, small thread pools."""
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "KERAS_BACKEND": "tensorflow",
        "TF_NUM_INTEROP_THREADS": str(threads),
        "TF_NUM_INTRAOP_THREADS": str(threads),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "PYTHONUNBUFFERED": "1",
    }


def torch_child_env(threads: int = 1) -> dict[str, str]:
    """Environment of a PyTorch child: CPU only (the experiments are CPU runs), one OpenMP
    thread by default: torch's threads spin while they wait, and on a shared 2-core machine
    two of them made the demo's step 3x slower than one (66 vs 21 ms at load 3.6). Its
    DataLoader workers take one thread each, as torch sets them."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "PYTHONUNBUFFERED": "1",
    }


def run_fewshot(
    runs: Sequence[FewShotRun], *, timeout_s: float = 600.0, echo: bool = True,
) -> list[dict[str, Any]]:
    """Run ``runs`` in order, each group of consecutive runs with the same ``trainer`` in one
    child process of that trainer; return their results.

    Each result is the run's fields plus ``test_accuracy`` (on the 500 ``test`` digits),
    ``mixed_fraction``, ``feeder`` (images received), ``fit_s``. With ``echo`` the child's
    progress lines are printed as they come. Raises ``RuntimeError`` when a child fails or
    all of them together take more than ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    results: list[dict[str, Any]] = []
    for trainer, group in itertools.groupby(runs, key=lambda run: run.trainer):
        results += _run_child(trainer, list(group), deadline=deadline, timeout_s=timeout_s,
                              echo=echo)
    return results


def _run_child(trainer: str, runs: list[FewShotRun], *, deadline: float, timeout_s: float,
               echo: bool) -> list[dict[str, Any]]:
    """``runs`` (all of ``trainer``) in one child process of that trainer."""
    cmd = [sys.executable, "-m", TRAINERS[trainer], "--fewshot-json",
           json.dumps([asdict(r) for r in runs])]
    env = torch_child_env() if trainer == "torch" else tf_child_env()
    # start_child: the kernel ends the child if this process dies; the finally below stops it
    # (SIGTERM, then SIGKILL) when this process is interrupted or gives up waiting.
    proc = start_child(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    results: list[dict[str, Any]] = []
    tail: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith(_RESULT):
                results.append(json.loads(line[len(_RESULT):]))
                continue
            tail = (tail + [line.rstrip()])[-40:]
            if echo and line.startswith(_PROGRESS):
                print(line[len(_PROGRESS):].rstrip(), flush=True)
            if time.monotonic() > deadline:
                raise TimeoutError
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except (TimeoutError, subprocess.TimeoutExpired):
        raise RuntimeError(f"the few-shot training did not finish within {timeout_s:.0f} s; "
                           "last output:\n" + "\n".join(tail)) from None
    finally:
        stop_child(proc, grace_s=INTERRUPT_GRACE_S)
        proc.stdout.close()
    if proc.returncode != 0 or len(results) != len(runs):
        raise RuntimeError(f"the few-shot training process ({trainer}) failed (exit "
                           f"{proc.returncode}); last output:\n" + "\n".join(tail))
    return results


def _client_id(arm: str) -> str:
    """A valid ``X-Client-Id`` naming the arm (1-64 of letters, digits and ``._:@/-``)."""
    return ("fewshot-" + re.sub(r"[^A-Za-z0-9._:@/-]+", "-", arm).strip("-"))[:64]


def _build_cnn(seed: int, classes: int = 10) -> Any:
    """A small CNN for float [0, 255] 64x64 images; shifts and rotations as graph ops."""
    import keras

    return keras.Sequential(
        [
            keras.Input((64, 64, 3)),
            keras.layers.Rescaling(1.0 / 255.0),
            keras.layers.RandomTranslation(0.08, 0.08, fill_mode="constant", seed=seed),
            keras.layers.RandomRotation(0.04, fill_mode="constant", seed=seed + 1),
            keras.layers.AveragePooling2D(2),  # 32x32 holds all a digit has (8x8 at source)
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dropout(0.3, seed=seed + 2),
            keras.layers.Dense(classes),
        ],
        name="fewshot_cnn",
    )


def _one_run(run: FewShotRun, devices: list[str], test: tuple[Any, Any]) -> dict[str, Any]:
    import keras
    import numpy as np
    import tensorflow as tf

    from genaug.digits import load_split, subset

    keras.backend.clear_session()
    keras.utils.set_random_seed(run.seed)
    classes = run.classes or list(range(10))
    index = {digit: i for i, digit in enumerate(classes)}
    images, labels = load_split(run.split)
    # The subset is drawn over the whole split (the same shots as every other user of seed
    # ``run.seed``), then the task's classes are kept.
    keep = (np.arange(len(labels)) if run.per_class is None
            else subset(labels, run.per_class, seed=run.seed))
    keep = keep[np.isin(labels[keep], classes)]
    x = images[keep].astype(np.float32)
    y = np.asarray([index[int(d)] for d in labels[keep]], dtype=np.int32)
    if run.split == "fewshot":  # validate on the split's images this run did not train on
        x_val, y_val = _validation(images, labels, index, trained=keep)
    else:
        x_val, y_val = _validation(*load_split("fewshot"), index)
    ds = (tf.data.Dataset.from_tensor_slices((x, y))
          .shuffle(len(x), seed=run.seed, reshuffle_each_iteration=True)
          .repeat().batch(run.batch, drop_remainder=True))
    reservoir = feeder = None
    mixing = run.p > 0 and run.recipe is not None and run.service is not None
    if run.p > 0 and (run.reservoir_split is not None or mixing):
        from genaug.trainer.mixing.reservoir import SyntheticReservoir

        reservoir = SyntheticReservoir(len(classes), run.slots_per_class, (64, 64, 3))
        ds = ds.map(reservoir.mix(p=run.p, scale=1.0, seed=run.seed, rebalance=run.rebalance,
                                  synthetic_weight=run.synthetic_weight),
                    num_parallel_calls=tf.data.AUTOTUNE)
    if reservoir is not None and run.reservoir_split is not None:
        extra_images, extra_labels = load_split(run.reservoir_split)
        rng = np.random.default_rng(run.seed)
        for digit in classes:
            own = np.flatnonzero(extra_labels == digit)
            pick = rng.choice(own, min(len(own), run.slots_per_class), replace=False)
            reservoir.write(index[digit], extra_images[pick])
    elif reservoir is not None:
        from genaug.trainer.feeding.feeder import ReservoirFeeder

        feeder = ReservoirFeeder(
            reservoir, url=run.service, recipe=run.recipe,
            label_map={str(d): index[d] for d in classes}, batch=32, interval_s=0.2,
            client_kwargs={"client_id": _client_id(run.arm), "timeout": 30.0},
        )
        deadline = time.monotonic() + run.prefill_timeout_s
        if run.pool_per_label > 0:
            waited = time.monotonic()
            held = _wait_for_full_pool(run, deadline)
            print(f"{_PROGRESS}  {run.arm:<24} seed {run.seed}: the pool {held} "
                  f"(waited {time.monotonic() - waited:.0f} s)", flush=True)
        feeder.start()
        want = min(run.prefill_per_class, run.slots_per_class)
        while reservoir.fill_counts().min() < want and time.monotonic() < deadline:
            time.sleep(0.2)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        model = _build_cnn(run.seed, len(classes))
        model.compile(
            optimizer=keras.optimizers.Adam(run.learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"], jit_compile=False,
        )
    epochs = 5
    callbacks, need_client = _need_callbacks(run, index, (x_val, y_val))
    t0 = time.perf_counter()
    try:
        model.fit(ds, epochs=epochs, steps_per_epoch=max(1, run.steps // epochs), verbose=0,
                  callbacks=callbacks)
    finally:
        if feeder is not None:
            feeder.stop()
        if need_client is not None:
            need_client.close()
    fit_s = time.perf_counter() - t0
    in_task = np.isin(test[1], classes)
    test_y = np.asarray([index[int(d)] for d in test[1][in_task]], dtype=np.int32)
    test_ds = tf.data.Dataset.from_tensor_slices((test[0][in_task], test_y)).batch(100)
    _, accuracy = model.evaluate(test_ds, verbose=0)
    val_ds = tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(100)
    _, val_accuracy = model.evaluate(val_ds, verbose=0)
    result = asdict(run)
    result.update(
        test_accuracy=float(accuracy), validation_accuracy=float(val_accuracy),
        validation_images=int(len(y_val)),
        need=callbacks[0].last_need if callbacks else None,
        fit_s=round(fit_s, 1), train_images=int(len(x)),
        mixed_fraction=reservoir.mixed_fraction() if reservoir is not None else 0.0,
        feeder=feeder.stats.images_received if feeder is not None else 0,
        reservoir_fill=reservoir.fill_counts().tolist() if reservoir is not None else [],
    )
    return result


def _validation(images: Any, labels: Any, index: dict[int, int],
                trained: Any = None) -> tuple[Any, Any]:
    """The run's validation images: the ``fewshot`` split's (``images``, ``labels``) images
    of the task's classes (``index``) that the run did not train on (``trained``: positions
    in that split, when the run trained on it)."""
    import numpy as np

    held = np.ones(len(labels), dtype=bool)
    if trained is not None:
        held[trained] = False
    held &= np.isin(labels, list(index))
    y = np.asarray([index[int(d)] for d in labels[held]], dtype=np.int32)
    return images[held].astype(np.float32), y


def _need_callbacks(run: FewShotRun, index: dict[int, int],
                    validation: tuple[Any, Any]) -> tuple[list[Any], Any]:
    """A :class:`~genaug.trainer.feeding.need.NeedCallback` reporting to ``run.need_recipes``
    (and the client it reports through), or nothing."""
    if not run.need_recipes or run.service is None:
        return [], None
    from genaug.client import Client
    from genaug.trainer.feeding.need import NeedCallback

    client = Client(run.service, client_id=_client_id(run.arm), timeout=30.0)

    def report(need: dict[str, float]) -> None:
        for recipe in run.need_recipes:
            client.feedback(recipe, need)

    callback = NeedCallback(report, label_map={str(d): i for d, i in index.items()},
                            validation=validation)
    return [callback], client


def fewshot_child(runs: list[FewShotRun]) -> list[dict[str, Any]]:
    """In the TensorFlow process: configure ``cpu_replicas`` logical CPUs, run each run,
    print one result line per run (read by :func:`run_fewshot`)."""
    import numpy as np

    from genaug.digits import load_split
    from genaug.trainer.hardware.devices import configure_devices

    others = sorted({run.trainer for run in runs} - {"tensorflow"})
    if others:
        raise ValueError(f"the TensorFlow child got runs of trainer {others}: run_fewshot "
                         f"sends those to {[TRAINERS[t] for t in others]}")
    devices = configure_devices(None, runs[0].cpu_replicas if runs else 2)
    test_images, test_labels = load_split("test")
    test = (test_images.astype(np.float32), test_labels.astype(np.int32))
    results = []
    for run in runs:
        result = _one_run(run, devices, test)
        print_result(run, result)
        results.append(result)
    return results


def print_result(run: FewShotRun, result: dict[str, Any]) -> None:
    """A child's two lines for a finished run: its progress line, and the JSON result line
    :func:`run_fewshot` reads."""
    print(f"{_PROGRESS}  {run.arm:<24} seed {run.seed}: test accuracy "
          f"{result['test_accuracy']:.3f} ({run.steps} steps in {result['fit_s']:.0f} s, "
          f"{100 * result['mixed_fraction']:.0f}% synthetic)", flush=True)
    print(_RESULT + json.dumps(result), flush=True)


def child_main(trainer: str, child: Callable[[list[FewShotRun]], Any],
               argv: Sequence[str] | None = None) -> int:
    """``python -m TRAINERS[trainer] --fewshot-json JSON``: run those :class:`FewShotRun`
    dicts with ``child`` (the trainer's child of :func:`run_fewshot`)."""
    parser = argparse.ArgumentParser(prog=f"python -m {TRAINERS[trainer]}")
    parser.add_argument("--fewshot-json", required=True,
                        help=f"run these FewShotRun dicts here (the {trainer} child)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    child([FewShotRun(**r) for r in json.loads(args.fewshot_json)])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The TensorFlow child of :func:`run_fewshot` (:func:`child_main`)."""
    return child_main("tensorflow", fewshot_child, argv)


if __name__ == "__main__":
    raise SystemExit(main())
