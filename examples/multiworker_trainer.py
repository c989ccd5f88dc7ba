"""Several machines: MultiWorkerMirroredStrategy with a custom training loop.

Run one copy per worker, each with its own ``TF_CONFIG`` (on one machine for a try-out)::

    genaug serve --recipes recipes/wound_phases.yaml            # the generator, once
    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]},
                "task": {"type": "worker", "index": 0}}' \\
        python examples/multiworker_trainer.py http://127.0.0.1:8000 &
    TF_CONFIG='{... "task": {"type": "worker", "index": 1}}' \\
        python examples/multiworker_trainer.py http://127.0.0.1:8000

Rules this follows (docs/deploy.md, "Several trainers, several machines"):

1. Devices first, then the strategy: ``configure_devices`` hides the generator's GPU before
   TensorFlow initialises, and MultiWorkerMirroredStrategy must be created at program start,
   before anything else touches TensorFlow (collective ops are configured then).
2. Each worker has its own reservoir (created after the strategy, outside its scope) and its
   own feeder: the reservoir is a host variable of this process, which no other worker sees.
3. A custom training loop: Keras 3 ``model.fit`` under MultiWorkerMirroredStrategy fails in
   this TensorFlow/Keras with "Attempt to convert a value (PerReplica...)", with or without
   genaug (tests/trainer/mixing/test_multiworker.py records it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from genaug.client import GenaugError
from genaug.trainer import DeviceError, FeederConfigError, configure_devices

URL = os.environ.get("GENAUG_URL", "http://127.0.0.1:8000")


def main(url: str = URL, recipe: str = "wound-phases", steps: int = 6,
         global_batch: int = 16) -> dict[str, object]:
    configure_devices(service_url=url)  # 1. before TensorFlow initialises: hides its GPU

    import keras
    import numpy as np
    import tensorflow as tf

    from genaug.client import Client
    from genaug.trainer import ReservoirFeeder, SyntheticReservoir, assert_no_python_ops

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # 1. then the strategy
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)

    with Client(url) as client:  # the recipe says the labels and the image size
        spec = client.recipe(recipe)
    labels = spec["labels"]
    size = spec["spec"]["output_height"] or spec["spec"]["height"]

    # 2. This worker's own reservoir and feeder.
    reservoir = SyntheticReservoir(len(labels), slots_per_class=32, image_shape=(size, size, 3))
    feeder = ReservoirFeeder(reservoir, url=url, recipe=recipe, batch=16, interval_s=0.2,
                             label_map={name: i for i, name in enumerate(labels)},
                             client_kwargs={"client_id": f"worker-{task}"})

    rng = np.random.default_rng(task)  # stand-in for this worker's real data, in [0, 1]
    x = rng.random([64, size, size, 3], dtype=np.float32)
    y = (np.arange(64) % len(labels)).astype(np.int32)
    mix = reservoir.mix(p=0.5)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        ds = ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True)
        return ds.map(mix).prefetch(2)

    assert_no_python_ops(dataset=dataset_fn(tf.distribute.InputContext()))
    dist = strategy.distribute_datasets_from_function(dataset_fn)

    with strategy.scope():
        model = keras.Sequential([
            keras.Input((size, size, 3)), keras.layers.Conv2D(8, 3, 2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(len(labels)),
        ])
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(iterator: object) -> tf.Tensor:
        def replica_step(images: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                per_example = loss_fn(target, model(images, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        per_replica = strategy.run(replica_step, args=next(iterator))  # type: ignore[call-overload]
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    feeder.start()  # strict: a configuration mistake raises here, before the first step
    # Optional, for a short demo: let the first images arrive (training never has to wait).
    for _ in range(100):
        if reservoir.fill_counts().min() > 0:
            break
        time.sleep(0.1)
    iterator = iter(dist)
    try:
        losses = [float(train_step(iterator)) for _ in range(steps)]
    finally:
        feeder.stop()
    stats = feeder.stats
    result = {"task": task, "losses": losses, "images_received": stats.images_received,
              "mixed_fraction": reservoir.mixed_fraction(),
              "replicas": strategy.num_replicas_in_sync}
    print(f"worker {task}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, feeder "
          f"{stats.images_received} images, mixed {result['mixed_fraction']:.0%}")
    print("GENAUG_RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default=URL)
    parser.add_argument("--recipe", default="wound-phases")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    try:
        main(args.url, args.recipe, args.steps)
    except (GenaugError, DeviceError, FeederConfigError) as exc:  # the message says the fix
        sys.exit(f"multiworker_trainer: {exc}")
    except KeyboardInterrupt:
        print("multiworker_trainer: interrupted; nothing is saved, run it again",
              file=sys.stderr)
        sys.exit(130)
