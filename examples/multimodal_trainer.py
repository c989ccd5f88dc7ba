"""A multimodal wound-phase classifier with a rare class, fed by your own fine-tuned UNet.

Shaped like the model of the incident that started genaug (docs: ../shared/seeds/000): four
inputs (``metadata``, ``depth_rgb``, ``depth_map``, ``thermal_map``), three healing phases
I/P/R of which R is rare, ``MirroredStrategy`` on every GPU but the generator's.

Once, on the generator's machine: convert the fine-tuned UNet you saved from PyTorch (the
one place genaug unpickles, and only with that flag), then serve it with a recipe::

    genaug convert-unet checkpoint_best.pt unet.safetensors --trust-this-file
    genaug serve --unet-weights unet.safetensors --recipes recipes/wound_phases.yaml

Then, on the trainer's machine (or the same one)::

    python examples/multimodal_trainer.py http://127.0.0.1:8000 [--epochs 2] [--cpu-replicas 2]

What it shows:

* ``configure_devices(service_url=...)`` first: the generator's GPU is hidden from
  TensorFlow (NVML matches ``/v1/info``'s device UUID), memory growth on for the others.
* ``reservoir.mix(key="depth_rgb", rebalance=...)``: only ``depth_rgb`` is replaced; the
  class of a replacement is drawn with inverse-frequency weights, so the rare phase R gets
  most synthetic images, and the one-hot label follows the pixels.
* The other inputs of a replaced example: with ``rebalance`` its class may change, while
  ``metadata``, ``depth_map`` and ``thermal_map`` still belong to the original patient of
  the old class. ``other_inputs="zero"`` zeroes them for replaced examples (the model learns
  "depth_rgb only" for those, as with modality dropout) instead of pairing an R image with
  an I thermal map under an R label. Keep ``other_inputs="keep"`` (the default) without
  ``rebalance``: then the class never changes and the pairing stays within one class.
* Input-range scaling: this model expects ``depth_rgb`` in ``[-1, 1]``; the reservoir
  holds uint8, so ``scale=2/255, offset=-1`` converts synthetic pixels to the real range.
* A strict feeder: a wrong label name, image size or recipe stops ``fit`` before its first
  step instead of training on real images only.

Random arrays stand in for the real data: swap in your ``tf.data`` pipeline (same dict).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from genaug.client import GenaugError
from genaug.trainer import DeviceError, FeederConfigError, configure_devices

URL = os.environ.get("GENAUG_URL", "http://127.0.0.1:8000")
PHASES = ["I", "P", "R"]
COUNTS = [60, 48, 12]  # R is rare


def make_data(size: int, seed: int = 0) -> tuple[dict[str, Any], Any]:
    """Stand-in multimodal examples: dict of four inputs and one-hot labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = sum(COUNTS)
    labels = np.repeat(np.arange(len(PHASES)), COUNTS)
    features = {
        "metadata": rng.normal(size=(n, 6)).astype(np.float32),
        "depth_rgb": rng.uniform(-1, 1, (n, size, size, 3)).astype(np.float32),
        "depth_map": rng.uniform(0, 1, (n, size, size, 1)).astype(np.float32),
        "thermal_map": rng.uniform(0, 1, (n, size, size, 1)).astype(np.float32),
    }
    return features, np.eye(len(PHASES), dtype=np.float32)[labels]


def build_model(size: int) -> Any:
    import keras

    inputs = {
        "metadata": keras.Input((6,), name="metadata"),
        "depth_rgb": keras.Input((size, size, 3), name="depth_rgb"),
        "depth_map": keras.Input((size, size, 1), name="depth_map"),
        "thermal_map": keras.Input((size, size, 1), name="thermal_map"),
    }
    branches = [keras.layers.Dense(8, activation="relu")(inputs["metadata"])]
    for name in ("depth_rgb", "depth_map", "thermal_map"):
        h = keras.layers.Conv2D(8, 3, strides=2, activation="relu")(inputs[name])
        branches.append(keras.layers.GlobalAveragePooling2D()(h))
    h = keras.layers.Concatenate()(branches)
    return keras.Model(inputs, keras.layers.Dense(len(PHASES))(h), name="wound_phases")


def main(url: str = URL, recipe: str = "wound-phases", epochs: int = 2,
         cpu_replicas: int | None = None, batch: int = 24) -> dict[str, Any]:
    # 1. Devices before anything else touches TensorFlow: hides the generator's GPU.
    devices = configure_devices(cpu_replicas=cpu_replicas, service_url=url)

    import keras
    import tensorflow as tf

    from genaug.client import Client
    from genaug.trainer import ReservoirFeeder, SyntheticReservoir, assert_no_python_ops

    strategy = tf.distribute.MirroredStrategy(devices)  # 2. then the strategy
    with Client(url) as client:
        spec = client.recipe(recipe)["spec"]
    size = spec["output_height"] or spec["height"]

    # 3. Then the reservoir, outside strategy.scope(); its feeder samples the recipe's pool.
    reservoir = SyntheticReservoir(len(PHASES), slots_per_class=64, image_shape=(size, size, 3))
    feeder = ReservoirFeeder(reservoir, url=url, recipe=recipe, batch=24, interval_s=0.2,
                             label_map={name: i for i, name in enumerate(PHASES)},
                             client_kwargs={"client_id": "multimodal-trainer"})

    inverse_frequency = [max(COUNTS) / c for c in COUNTS]  # [1.0, 1.25, 5.0]: R gets most
    mix = reservoir.mix(
        p=[0.3, 0.3, 0.6],          # per own class: R examples are replaced more often too
        key="depth_rgb",            # only this input is generated
        rebalance=inverse_frequency,
        other_inputs="zero",        # see the module docstring
        scale=2 / 255, offset=-1.0,  # uint8 -> the model's [-1, 1]
    )
    features, labels = make_data(size)
    ds = (tf.data.Dataset.from_tensor_slices((features, labels))
          .shuffle(len(labels), seed=0).batch(batch, drop_remainder=True)
          .map(mix, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2))

    with strategy.scope():
        model = build_model(size)
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.CategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    assert_no_python_ops(dataset=ds, model=model)

    feeder.start()  # strict: configuration mistakes raise here; the callback would too
    try:
        for _ in range(100):  # a short demo lets the first images arrive; training never waits
            if reservoir.fill_counts().min() > 0:
                break
            time.sleep(0.1)
        model.fit(ds, epochs=epochs, verbose=2, callbacks=[feeder.callback()])
    finally:
        feeder.stop()
    replaced = reservoir.replaced_counts().tolist()
    stats = feeder.stats
    print(f"feeder: {stats.images_received} images; replaced depth_rgb by new class "
          f"{dict(zip(PHASES, replaced, strict=True))}; mixed {reservoir.mixed_fraction():.0%} "
          f"on {strategy.num_replicas_in_sync} replica(s)")
    return {"images_received": stats.images_received, "replaced_per_class": replaced,
            "mixed_fraction": reservoir.mixed_fraction(), "devices": devices}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default=URL)
    parser.add_argument("--recipe", default="wound-phases")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--cpu-replicas", type=int, default=None)
    args = parser.parse_args()
    try:
        main(args.url, args.recipe, args.epochs, args.cpu_replicas)
    except (GenaugError, DeviceError, FeederConfigError) as exc:  # the message says the fix
        sys.exit(f"multimodal_trainer: {exc}")
    except KeyboardInterrupt:
        print("multimodal_trainer: interrupted; nothing is saved, run it again", file=sys.stderr)
        sys.exit(130)
