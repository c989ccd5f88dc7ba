"""One worker of a 2-worker MultiWorkerMirroredStrategy cluster on localhost.

Usage: ``TF_CONFIG=... python _multiworker_child.py``; prints ``GENAUG_RESULT {json}``.
Each worker builds the strategy first, then its own reservoir; it refreshes that reservoir
during a custom training loop and checks its own input pipeline sees the new images, for
``distribute_datasets_from_function`` and for ``experimental_distribute_dataset`` under
AutoShardPolicy DATA, OFF and AUTO. It also records what Keras ``model.fit`` does under this
strategy.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import tensorflow as tf

# The strategy first: collective ops must be configured before anything else runs.
strategy = tf.distribute.MultiWorkerMirroredStrategy()

import keras  # noqa: E402

from genaug.trainer import SyntheticReservoir, assert_no_python_ops  # noqa: E402

H = W = 4
GLOBAL_BATCH = 8
TASK = json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def filled(value: int, n: int = 4) -> np.ndarray:
    return np.full([n, H, W, 3], value, np.uint8)


def local_values(batch: Any) -> set[int]:
    parts = strategy.experimental_local_results(batch)
    return {int(v) for part in parts for v in np.unique(part.numpy())}


def check_mode(mode: str, res: SyntheticReservoir, first: int) -> dict[str, Any]:
    """Train steps before and after a refresh; which pixel values this worker's batches held."""
    res.write(0, filled(first))
    res.write(1, filled(first + 1))
    x = np.zeros([64, H, W, 3], np.uint8)
    y = ((np.arange(64) // 2) % 2).astype(np.int32)  # both classes in every shard and batch
    mix = res.mix(p=1.0)
    if mode == "function":
        def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            ds = tf.data.Dataset.from_tensor_slices((x, y))
            ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
            return ds.repeat().batch(ctx.get_per_replica_batch_size(GLOBAL_BATCH)).map(mix)

        dist = strategy.distribute_datasets_from_function(dataset_fn)
    else:
        ds = tf.data.Dataset.from_tensors(0).repeat(64).enumerate().map(
            lambda i, _: (tf.gather(x, i), tf.gather(y, i))
        ) if mode == "AUTO" else tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.repeat().batch(GLOBAL_BATCH).map(mix)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = getattr(
            tf.data.experimental.AutoShardPolicy, mode)
        dist = strategy.experimental_distribute_dataset(ds.with_options(options))
    assert_no_python_ops(dataset=ds if mode != "function" else dataset_fn(
        tf.distribute.InputContext(2, TASK, 1)))

    @tf.function
    def step(batch: Any) -> Any:
        def replica_fn(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
            return tf.reduce_max(tf.cast(images, tf.float32))

        per_replica = strategy.run(replica_fn, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    it = iter(dist)
    before: set[int] = set()
    for _ in range(3):
        batch = next(it)
        before |= local_values(batch[0])
        step(batch)  # a collective all-reduce across both workers
    res.write(0, filled(first + 10))  # the feeder refreshes during training
    res.write(1, filled(first + 11))
    after_steps: list[list[int]] = []
    for _ in range(6):
        batch = next(it)
        after_steps.append(sorted(local_values(batch[0])))
        step(batch)
    new = {first + 10, first + 11}
    seen_new_at = next((i for i, v in enumerate(after_steps) if set(v) == new), None)
    assert before == {first, first + 1}, (mode, before)
    assert seen_new_at is not None and seen_new_at <= 5, (mode, after_steps)
    return {"before": sorted(before), "after": after_steps, "seen_new_at": seen_new_at}


def keras_fit_error(res: SyntheticReservoir) -> str | None:
    """Keras 3 model.fit under MultiWorkerMirroredStrategy (with and without genaug's map)."""
    x = np.zeros([32, H, W, 3], np.float32)
    y = (np.arange(32) % 2).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)  # no genaug at all
    with strategy.scope():
        model = keras.Sequential([keras.Input((H, W, 3)), keras.layers.Flatten(),
                                  keras.layers.Dense(2)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    try:
        model.fit(ds, epochs=1, steps_per_epoch=2, verbose=0)
    except Exception as exc:  # recorded: the documented failure
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return None


def main() -> None:
    t0 = time.perf_counter()
    res = SyntheticReservoir(2, 4, (H, W, 3))  # after the strategy, outside its scope
    out: dict[str, Any] = {
        "task": TASK,
        "workers": strategy.extended._num_workers,
        "replicas": strategy.num_replicas_in_sync,
    }
    base = 20 + 100 * TASK  # this worker's own images: each worker has its own reservoir
    for k, mode in enumerate(("function", "DATA", "OFF", "AUTO")):
        out[mode] = check_mode(mode, res, base + 20 * k)
    out["keras_fit_error"] = keras_fit_error(res)
    out["seconds"] = round(time.perf_counter() - t0, 2)
    sys.stdout.write("GENAUG_RESULT " + json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
