"""The full loop on the embedded default: service, pool, reservoir, MirroredStrategy training.

:func:`run_full_demo` starts ``genaug serve`` (the embedded ``tiny-digits`` generator on the
CPU) with ``recipes/digits.yaml`` and a throw-away pool, writes a labelled grid of generated
digits through the client, and lets the pool fill while a *separate* TensorFlow process
(torch is never imported there) trains a small CNN twice on a 5-shot subset of scikit-learn's
digits (5 real images per class, :mod:`genaug.digits`): once on the real images alone, once
mixing pool images in through :class:`~genaug.trainer.reservoir.SyntheticReservoir` fed by a
:class:`~genaug.trainer.feeder.ReservoirFeeder`. It prints both test accuracies on the 500
held-out test digits and stops everything. About two minutes on 2 CPU cores.

The same few-shot run backs ``bench/augmentation_gain.py`` (more seeds, more steps, more
arms): :func:`run_fewshot` starts the TensorFlow child, :func:`fewshot_child` is what runs
there. The gain comes from the generator: it was trained on the 997 images of the
``generator`` split, which the few-shot classifier never sees (as SDXL saw far more images
than any user's data set holds).

This module imports neither TensorFlow nor torch at import time: both live in the child
processes.

Example::

    from genaug.trainer.demo import run_full_demo
    raise SystemExit(run_full_demo())
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEMO_RECIPE",
    "FewShotRun",
    "default_recipes_path",
    "fewshot_child",
    "run_fewshot",
    "run_full_demo",
    "tf_child_env",
    "wait_for_pool",
]

log = logging.getLogger(__name__)

DEMO_RECIPE = "digits"
"""The recipe in ``recipes/digits.yaml``; its labels ``0``..``9`` are the digit classes."""

_RESULT = "GENAUG_FEWSHOT_RESULT "  # prefix of the child's JSON result lines


def default_recipes_path() -> Path:
    """``recipes/digits.yaml`` of the source checkout (next to ``trainer/``)."""
    return Path(__file__).resolve().parents[1] / "recipes" / "digits.yaml"


def wait_for_pool(
    url: str, recipe: str, per_label: int, *, timeout: float = 120.0
) -> dict[str, int]:
    """Poll ``GET /v1/recipes/{recipe}`` until every label's pool fill reaches ``per_label``.

    Returns the last fill seen. Raises ``TimeoutError`` naming the fill after ``timeout`` s.
    """
    from genaug.client import Client
    from genaug.trainer.labels import recipe_description

    deadline = time.monotonic() + timeout
    fill: dict[str, int] = {}
    with Client(url, client_id="genaug-demo", timeout=10.0) as client:
        while True:
            labels, fill, _ = recipe_description(client.recipe(recipe))
            fill = {label: fill.get(label, 0) for label in labels}
            if labels and min(fill.values()) >= per_label:
                return fill
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"pool of recipe {recipe!r} at {url} holds {fill} after {timeout:.0f} s; "
                    f"wanted {per_label} per label (is pre-generation on? GENAUG_PREGENERATE)"
                )
            time.sleep(0.5)


# ----------------------------------------------------------------------------- few-shot runs


@dataclass
class FewShotRun:
    """One few-shot training run on the digits (a row of the benchmark, a line of the demo).

    Attributes:
        arm: a name for the result (``"real only"``, ``"text-to-image p=0.5"``...).
        seed: picks the few-shot subset (:func:`genaug.digits.subset` of the ``fewshot``
            split) and seeds the model's initialisation, shuffling and mixing.
        per_class: real images per class.
        steps / batch / learning_rate: training (global batch over ``cpu_replicas``).
        service / recipe / p: mixing from that recipe's pool; ``p == 0`` or no recipe: real
            images only; ``p == 1``: synthetic only (every real image replaced).
        slots_per_class: reservoir size; training starts when every class holds
            ``prefill_per_class`` images (or after ``prefill_timeout_s``).
    """

    arm: str
    seed: int = 0
    per_class: int = 5
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
    extra: dict[str, Any] = field(default_factory=dict)


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


def run_fewshot(
    runs: Sequence[FewShotRun], *, timeout_s: float = 600.0, echo: bool = True,
) -> list[dict[str, Any]]:
    """Run ``runs`` in one TensorFlow child process (in order); return their results.

    Each result is the run's fields plus ``test_accuracy`` (on the 500 ``test`` digits),
    ``mixed_fraction``, ``feeder`` (images received), ``fit_s``. With ``echo`` the child's
    progress lines are printed as they come. Raises ``RuntimeError`` when the child fails.
    """
    cmd = [sys.executable, "-m", "genaug.trainer.demo", "--fewshot-json",
           json.dumps([asdict(r) for r in runs])]
    proc = subprocess.Popen(cmd, env=tf_child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    results: list[dict[str, Any]] = []
    tail: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith(_RESULT):
                results.append(json.loads(line[len(_RESULT):]))
                continue
            tail = (tail + [line.rstrip()])[-40:]
            if echo and line.startswith("  "):
                print(line.rstrip(), flush=True)  # noqa: T201
            if time.monotonic() > deadline:
                raise TimeoutError
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except (TimeoutError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the few-shot training did not finish within {timeout_s:.0f} s; "
                           "last output:\n" + "\n".join(tail)) from None
    if proc.returncode != 0 or len(results) != len(runs):
        raise RuntimeError(f"the few-shot training process failed (exit {proc.returncode}); "
                           "last output:\n" + "\n".join(tail))
    return results


def _client_id(arm: str) -> str:
    """A valid ``X-Client-Id`` naming the arm (1-64 of letters, digits and ``._:@/-``)."""
    return ("fewshot-" + re.sub(r"[^A-Za-z0-9._:@/-]+", "-", arm).strip("-"))[:64]


def _build_cnn(seed: int) -> Any:
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
            keras.layers.Dense(10),
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
    images, labels = load_split("fewshot")
    keep = subset(labels, run.per_class, seed=run.seed)
    x = images[keep].astype(np.float32)
    y = labels[keep].astype(np.int32)
    ds = (tf.data.Dataset.from_tensor_slices((x, y))
          .shuffle(len(x), seed=run.seed, reshuffle_each_iteration=True)
          .repeat().batch(run.batch, drop_remainder=True))
    reservoir = feeder = None
    mixing = run.p > 0 and run.recipe is not None and run.service is not None
    if mixing:
        from genaug.trainer.feeder import ReservoirFeeder
        from genaug.trainer.reservoir import SyntheticReservoir

        reservoir = SyntheticReservoir(10, run.slots_per_class, (64, 64, 3))
        ds = ds.map(reservoir.mix(p=run.p, scale=1.0, seed=run.seed),
                    num_parallel_calls=tf.data.AUTOTUNE)
        feeder = ReservoirFeeder(
            reservoir, url=run.service, recipe=run.recipe,
            label_map={str(d): d for d in range(10)}, batch=32, interval_s=0.2,
            client_kwargs={"client_id": f"genaug-fewshot-{run.arm}", "timeout": 30.0},
        )
        feeder.start()
        deadline = time.monotonic() + run.prefill_timeout_s
        want = min(run.prefill_per_class, run.slots_per_class)
        while reservoir.fill_counts().min() < want and time.monotonic() < deadline:
            time.sleep(0.2)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        model = _build_cnn(run.seed)
        model.compile(
            optimizer=keras.optimizers.Adam(run.learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"], jit_compile=False,
        )
    epochs = 5
    t0 = time.perf_counter()
    try:
        model.fit(ds, epochs=epochs, steps_per_epoch=max(1, run.steps // epochs), verbose=0)
    finally:
        if feeder is not None:
            feeder.stop()
    fit_s = time.perf_counter() - t0
    test_ds = tf.data.Dataset.from_tensor_slices(test).batch(100)
    _, accuracy = model.evaluate(test_ds, verbose=0)
    result = asdict(run)
    result.update(
        test_accuracy=float(accuracy), fit_s=round(fit_s, 1),
        mixed_fraction=reservoir.mixed_fraction() if reservoir is not None else 0.0,
        feeder=feeder.stats.images_received if feeder is not None else 0,
        reservoir_fill=reservoir.fill_counts().tolist() if reservoir is not None else [],
    )
    return result


def fewshot_child(runs: list[FewShotRun]) -> list[dict[str, Any]]:
    """In the TensorFlow process: configure ``cpu_replicas`` logical CPUs, run each run,
    print one result line per run (read by :func:`run_fewshot`)."""
    import numpy as np

    from genaug.digits import load_split
    from genaug.trainer.devices import configure_devices

    devices = configure_devices(None, runs[0].cpu_replicas if runs else 2)
    test_images, test_labels = load_split("test")
    test = (test_images.astype(np.float32), test_labels.astype(np.int32))
    results = []
    for run in runs:
        result = _one_run(run, devices, test)
        print(f"  {run.arm:<24} seed {run.seed}: test accuracy "  # noqa: T201
              f"{result['test_accuracy']:.3f} ({run.steps} steps in {result['fit_s']:.0f} s, "
              f"{100 * result['mixed_fraction']:.0f}% synthetic)", flush=True)
        print(_RESULT + json.dumps(result), flush=True)  # noqa: T201
        results.append(result)
    return results


# ----------------------------------------------------------------------------- the demo


def write_digit_grid(client: Any, out: Path, *, per_label: int = 4) -> None:
    """Generate ``per_label`` images per digit through ``client`` (the recipe's prompts and
    the service's default steps and guidance); save a labelled grid, one row per digit, then
    a row of real few-shot digits (one per class) and a row of an img2img variant of each
    (strength 0.5).

    All 20 calls go out at once from a thread pool (the sync client is thread-safe): the
    service batches them, and pool pre-generation, which only runs while nothing waits, does
    not slip in between one row and the next.
    """
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from genaug.demo import labelled_grid
    from genaug.digits import PROMPTS, load_split, subset

    t0 = time.monotonic()
    images, labels = load_split("fewshot")
    real = images[subset(labels, 1, seed=0)]
    with ThreadPoolExecutor(2 * len(PROMPTS)) as pool:
        rows_made = {label: pool.submit(client.generate, prompt, n=per_label,
                                        seed=1000 * int(label))
                     for label, prompt in PROMPTS.items()}
        variants_made = [pool.submit(client.variants, real[d], PROMPTS[str(d)], strength=0.5,
                                     n_per_image=1, seed=d) for d in range(10)]
        rows: dict[str, np.ndarray] = {label: f.result().images for label, f in rows_made.items()}
        rows["real"] = real
        rows["variant"] = np.stack([f.result().images[0] for f in variants_made])
    out.write_bytes(labelled_grid(rows))
    print(f"      wrote {out}: {len(PROMPTS)} digits x {per_label} images + a row of real "  # noqa: T201
          f"digits and their img2img variants in {time.monotonic() - t0:.1f} s")


def run_full_demo(
    *,
    port: int = 0,
    steps: int = 300,
    pool_per_label: int = 16,
    cpu_replicas: int = 2,
    p: float = 0.5,
    seed: int = 0,
    recipes: Path | None = None,
    workdir: Path | None = None,
    train_timeout_s: float = 420.0,
    grid_out: Path | None = None,
    train: bool = True,
) -> int:
    """Service + grid + pool + few-shot training with and without mixing; returns an exit
    code (0 ok).

    Args:
        port: service port (0: a free one).
        steps: training steps of each of the two few-shot runs (global batch 32).
        pool_per_label: pool images per digit the mixing run waits for (and holds in its
            reservoir) before it starts; the pool keeps filling meanwhile.
        cpu_replicas: logical CPU devices for ``MirroredStrategy`` in the trainer process.
        p: replacement probability of the mixing run.
        seed: which 5-shot subset and initialisation.
        recipes: recipe file (default: the checkout's ``recipes/digits.yaml``).
        workdir: where the pool database and the service log go (default: a temporary
            folder, removed afterwards).
        train_timeout_s: the trainer process is killed after this long.
        grid_out: also write a labelled grid PNG, generated through the client, here.
        train: False stops after the grid and the pool (no TensorFlow needed).
    """
    from genaug.client import Client, GenaugError
    from genaug.demo import free_port, running_service

    recipes = recipes or default_recipes_path()
    if not recipes.is_file():
        print(f"genaug demo: recipe file {recipes} not found; pass recipes=PATH", file=sys.stderr)  # noqa: T201
        return 2
    try:
        import sklearn  # noqa: F401  (the digits ship inside scikit-learn)
    except ImportError:
        print("genaug demo: needs scikit-learn for its real data (the handwritten digits "  # noqa: T201
              "that ship inside it): pip install scikit-learn, or 'genaug[dev]'",
              file=sys.stderr)
        return 2
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = tempfile.TemporaryDirectory(prefix="genaug-full-demo-") if workdir is None else None
    work = Path(tmp.name) if tmp is not None else Path(workdir or ".")
    work.mkdir(parents=True, exist_ok=True)
    service_log = work / "service.log"
    # On a small CPU the service and the trainer share cores: one thread for torch leaves the
    # rest to TensorFlow (a GPU deployment gives the service its own device instead).
    service_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    service_env.pop("GENAUG_MODEL", None)  # the demo is about the embedded default
    started = time.monotonic()
    try:
        print(f"[1/4] starting the genaug service (tiny-digits generator, CPU) at {url}, "  # noqa: T201
              f"recipes {recipes.name}, pool {work / 'pool.db'}")
        with running_service(
            port,
            extra_args=["--recipes", str(recipes), "--pool-path", str(work / "pool.db"),
                        "--pool-capacity-per-label", str(max(4 * pool_per_label, 64))],
            env=service_env,
            log_path=service_log,
        ) as proc:
            try:
                with Client(url, client_id="genaug-demo") as client:
                    client.wait_ready(timeout=180)
                    if grid_out is not None:
                        print(f"[2/4] ready after {time.monotonic() - started:.1f} s; "  # noqa: T201
                              "generating one row per digit through the client")
                        write_digit_grid(client, grid_out)
                if not train:
                    fill = wait_for_pool(url, DEMO_RECIPE, pool_per_label, timeout=300)
                    print(f"[3/4] after {time.monotonic() - started:.1f} s the pool of "  # noqa: T201
                          f"{DEMO_RECIPE!r} holds {fill} (filled while the service was idle)")
                    return 0
            except (GenaugError, TimeoutError) as exc:
                print(f"genaug demo: the service did not get ready: {exc} (log: {service_log})",  # noqa: T201
                      file=sys.stderr)
                return 1
            print(f"[3/4] training a small CNN on 5 real digits per class (few-shot split), "  # noqa: T201
                  f"{cpu_replicas} logical CPUs under MirroredStrategy, in a separate "
                  "TensorFlow process; the pool keeps filling meanwhile")
            base = FewShotRun(arm="real only", seed=seed, steps=steps,
                              cpu_replicas=cpu_replicas)
            mixed = FewShotRun(arm=f"with genaug p={p}", seed=seed, steps=steps,
                               cpu_replicas=cpu_replicas, service=url, recipe=DEMO_RECIPE, p=p,
                               slots_per_class=pool_per_label,
                               prefill_per_class=pool_per_label)
            try:
                real, gen = run_fewshot([base, mixed], timeout_s=train_timeout_s)
            except RuntimeError as exc:
                print(f"genaug demo: {exc}", file=sys.stderr)  # noqa: T201
                return 1
        print(f"[4/4] test accuracy on the 500 held-out test digits:\n"  # noqa: T201
              f"      real only (5 per class, shifts/rotations)   {real['test_accuracy']:.3f}\n"
              f"      + genaug mixing (p={p}, pool of recipe {DEMO_RECIPE!r})  "
              f"{gen['test_accuracy']:.3f}   ({100 * gen['mixed_fraction']:.0f}% of "
              f"examples synthetic, {gen['feeder']} images fed)\n"
              "      The generator learned from 997 other real digits that the classifier "
              "never sees;\n      bench/augmentation_gain.py measures this over 5 seeds "
              "(docs/benchmarks.md).")
        print(f"service stopped (exit code {proc.returncode}); whole demo "  # noqa: T201
              f"{time.monotonic() - started:.1f} s")
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m genaug.trainer.demo [--fewshot-json JSON]``: the demo, or a few-shot child."""
    parser = argparse.ArgumentParser(prog="python -m genaug.trainer.demo")
    parser.add_argument("--fewshot-json", default=None,
                        help="run these FewShotRun dicts here (the TensorFlow child)")
    args = parser.parse_args(argv)
    if args.fewshot_json is not None:
        logging.basicConfig(level=logging.WARNING)
        fewshot_child([FewShotRun(**r) for r in json.loads(args.fewshot_json)])
        return 0
    return run_full_demo()


if __name__ == "__main__":
    raise SystemExit(main())
