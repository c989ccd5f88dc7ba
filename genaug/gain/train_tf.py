"""``genaug gain``'s built-in classifier in TensorFlow: the network and training of
:mod:`~genaug.gain.train_torch`, mixed through the product's own reservoir.

The synthetic images are written into a :class:`~genaug.trainer.SyntheticReservoir` and the
real shots' ``tf.data`` pipeline maps :meth:`~genaug.trainer.SyntheticReservoir.mix` with
``p=share`` over it (each example replaced by an image of its own class with that
probability), then the random rotation, scale and shift as graph ops
(``ImageProjectiveTransformV3``): what a trainer using genaug runs, with no Python in the
graph. Adam under a one-cycle learning rate (peak 3e-3), ``steps`` batches of ``batch``.

Example::

    accuracy = train_and_score(x_real, y_real, x_syn, y_syn, x_test, y_test,
                               num_classes=10, seed=0, share=0.5)
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from genaug.trainer import SyntheticReservoir

__all__ = ["small_cnn", "train_and_score"]

STEPS = 300
BATCH = 64
PEAK_LR = 3e-3


def small_cnn(shape: tuple[int, int, int], num_classes: int, width: int = 16) -> tf.keras.Model:
    """The built-in classifier: :class:`~genaug.gain.train_torch.SmallCNN` in Keras."""
    layers = tf.keras.layers

    def block(x: tf.Tensor, filters: int, pool: bool) -> tf.Tensor:
        x = layers.Conv2D(filters, 3, padding="same")(x)
        x = layers.ReLU()(layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x))
        return layers.MaxPooling2D(2)(x) if pool else x

    inputs = tf.keras.Input(shape)
    x = block(inputs, width, True)
    x = block(x, 2 * width, True)
    x = block(x, 2 * width, False)
    outputs = layers.Dense(num_classes)(layers.GlobalAveragePooling2D()(x))
    return tf.keras.Model(inputs, outputs)


class OneCycle(tf.keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[misc]
    """Cosine warm-up over the first 30 % of the steps to ``peak``, cosine decay after
    (torch's ``OneCycleLR`` defaults)."""

    def __init__(self, peak: float, steps: int) -> None:
        self.peak, self.steps = peak, float(steps)

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        t = tf.cast(step, tf.float32) / self.steps
        start, end = self.peak / 25.0, self.peak / 25.0 / 1e4
        up = start + (self.peak - start) * (1 - tf.cos(math.pi * t / 0.3)) / 2
        down = end + (self.peak - end) * (1 + tf.cos(math.pi * (t - 0.3) / 0.7)) / 2
        return tf.where(t < 0.3, up, down)

    def get_config(self) -> dict[str, float]:
        return {"peak": self.peak, "steps": self.steps}


def _augment(images: tf.Tensor, seed: int) -> tf.Tensor:
    """Random rotation (12 degrees), scale (10 %) and shift (1/14 of the side) per image."""
    shape = tf.shape(images)
    b, h, w = shape[0], tf.cast(shape[1], tf.float32), tf.cast(shape[2], tf.float32)
    draws = tf.random.uniform([b, 4], -1.0, 1.0, seed=seed)
    angle = draws[:, 0] * (12 * math.pi / 180)
    scale = 1 + draws[:, 1] * 0.1
    tx, ty = draws[:, 2] * w / 14, draws[:, 3] * h / 14
    cos, sin = tf.cos(angle) / scale, tf.sin(angle) / scale
    cx, cy = (w - 1) / 2, (h - 1) / 2
    # Output pixel (x, y) reads input (a0 x + a1 y + a2, b0 x + b1 y + b2): about the centre.
    a2 = cx - cos * cx + sin * cy + tx
    b2 = cy - sin * cx - cos * cy + ty
    zeros = tf.zeros_like(cos)
    transforms = tf.stack([cos, -sin, a2, sin, cos, b2, zeros, zeros], axis=1)
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=images, transforms=transforms, output_shape=shape[1:3],
        interpolation="BILINEAR", fill_mode="CONSTANT", fill_value=0.0)


def train_and_score(x_real: np.ndarray, y_real: np.ndarray, x_syn: np.ndarray | None,
                    y_syn: np.ndarray | None, x_test: np.ndarray, y_test: np.ndarray, *,
                    num_classes: int, seed: int, share: float, steps: int = STEPS,
                    batch: int = BATCH) -> float:
    """Train :func:`small_cnn` on the real images mixed with the synthetic ones through a
    reservoir at ``share`` (module doc); its accuracy on the test images."""
    tf.keras.utils.set_random_seed(seed)
    shape = tuple(int(d) for d in x_real.shape[1:])
    reservoir = SyntheticReservoir(num_classes, max(1, _most_per_class(y_syn, num_classes)),
                                   image_shape=(shape[0], shape[1], shape[2]))
    if x_syn is not None and y_syn is not None:
        for c in range(num_classes):
            if (y_syn == c).any():
                reservoir.write(c, x_syn[y_syn == c])
    real = tf.data.Dataset.from_tensor_slices(
        (x_real.astype(np.float32) / 255.0, y_real.astype(np.int64)))
    ds = real.shuffle(len(x_real), seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.batch(batch).map(reservoir.mix(p=share, seed=seed))
    ds = ds.map(lambda x, y: (_augment(x, seed), y)).prefetch(2)
    model = small_cnn((shape[0], shape[1], shape[2]), num_classes)
    model.compile(optimizer=tf.keras.optimizers.Adam(OneCycle(PEAK_LR, steps)),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)
    logits = model.predict(x_test.astype(np.float32) / 255.0, batch_size=512, verbose=0)
    return float((np.argmax(logits, axis=1) == y_test).mean())


def _most_per_class(labels: np.ndarray | None, num_classes: int) -> int:
    if labels is None or not len(labels):
        return 1
    return int(np.bincount(labels.astype(np.int64), minlength=num_classes).max())
