"""The trainer side: mix a recipe's generated images into a Keras input pipeline.

    genaug serve --recipes recipes/wound_phases.yaml        # in another terminal
    python examples/trainer_example.py [URL] [--recipe wound-phases] [--epochs 2]

Random arrays stand in for your real dataset; swap in yours (same image size and classes).
A misconfiguration (no service at URL, no such recipe) ends in one line and exit status 1;
Ctrl-C in one line and 130.
"""

from __future__ import annotations

import argparse
import os
import sys

from genaug.client import GenaugError
from genaug.trainer import DeviceError, FeederConfigError, configure_devices


def main(url: str, recipe: str = "wound-phases", epochs: int = 2, steps: int = 4) -> dict:
    # First, before TensorFlow initialises: hide the generator's GPU (if it runs on this
    # machine), memory growth on the rest. Returns every other GPU, or the CPU.
    devices = configure_devices(service_url=url)

    import keras
    import numpy as np
    import tensorflow as tf

    from genaug.client import Client
    from genaug.trainer import ReservoirFeeder, SyntheticReservoir, assert_no_python_ops

    with Client(url) as client:  # the recipe says the labels and the image size
        spec = client.recipe(recipe)
    labels, size = spec["labels"], spec["spec"]["output_height"] or spec["spec"]["height"]
    strategy = tf.distribute.MirroredStrategy(devices)  # never the generator's GPU

    # Outside strategy.scope(): one host variable the input pipeline reads, refreshed in place.
    reservoir = SyntheticReservoir(len(labels), slots_per_class=32, image_shape=(size, size, 3))
    feeder = ReservoirFeeder(reservoir, url=url, recipe=recipe, batch=16, interval_s=0.2,
                             label_map={name: i for i, name in enumerate(labels)},
                             client_kwargs={"client_id": "trainer-example"})  # its own turn

    rng = np.random.default_rng(0)  # stand-in for the real dataset: float images in [0, 1]
    x = rng.random([16 * steps, size, size, 3], dtype=np.float32)
    y = np.arange(16 * steps, dtype=np.int32) % len(labels)
    ds = (tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
          .map(reservoir.mix(p=0.5)).prefetch(2))  # uint8 pixels scaled to [0, 1] for us

    with strategy.scope():
        model = keras.Sequential([
            keras.Input((size, size, 3)), keras.layers.Conv2D(8, 3, 2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(len(labels)),
        ])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert_no_python_ops(dataset=ds, model=model)  # no py_function anywhere in the hot path
    model.fit(ds, epochs=epochs, verbose=2, callbacks=[feeder.callback()])

    stats, fill, mixed = feeder.stats, reservoir.fill_counts().tolist(), reservoir.mixed_fraction()
    print(f"feeder: {stats.images_received} images in {stats.requests} requests, "
          f"reservoir fill {fill}, mixed {mixed:.0%}")
    return {"images_received": stats.images_received, "fill": fill, "mixed_fraction": mixed}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?",
                        default=os.environ.get("GENAUG_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--recipe", default="wound-phases")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="batches of 16 per epoch")
    args = parser.parse_args()
    try:
        main(args.url, args.recipe, args.epochs, args.steps)
    except (GenaugError, DeviceError, FeederConfigError) as exc:  # the message says the fix
        sys.exit(f"trainer_example: {exc}")
    except KeyboardInterrupt:
        print("trainer_example: interrupted; nothing is saved, run it again", file=sys.stderr)
        sys.exit(130)
