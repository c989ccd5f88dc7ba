"""A class-indexed reservoir of synthetic images that a ``tf.data`` map can sample.

The reservoir is the trainer-side half of genaug: a fixed-shape host tensor
``images[C, M, H, W, 3]`` (uint8) plus ``fill[C]`` (how many of the ``M`` slots of each class
hold an image). A feeder thread writes into it; :meth:`SyntheticReservoir.mix` returns a map
function that swaps real examples for synthetic ones with pure graph ops. Nothing in the map
calls Python, does I/O, or waits: an empty class keeps its real image.

Why the variables live on ``/CPU:0`` and outside any ``strategy.scope()``:

* ``tf.data`` runs on the host; a host variable read inside a map function is read through its
  resource handle every time the map runs, so each :meth:`~SyntheticReservoir.write` is seen by
  the next batch without re-tracing the map or the step function.
* A variable created inside ``MirroredStrategy.scope()`` becomes a ``MirroredVariable`` with one
  copy per device; the input pipeline would read one copy while writes from a plain thread would
  have to be mirrored by hand. One host variable, read by the one input pipeline that feeds all
  replicas on this host, sees every refresh. The constructor refuses to run inside a strategy
  scope for that reason.
* Limits: the variable lives in this process's memory. It does not survive serializing the
  dataset graph to another process (tf.data service, ``replicate``); multi-host training builds
  one reservoir and one feeder per worker.

Consistency (why labels and pixels never tear apart):

* Slots are indexed by class, so whatever a reader gathers from ``images[c]`` is an image that
  was written for class ``c``: an old one or a new one, never another class's.
* Within a class, images are written before the fill count grows, and the fill count never
  shrinks, so a reader that saw ``fill[c] = k`` only samples slots that were complete when it
  read ``k``.
* A slot being overwritten by a newer image of the same class is not observed half-written:
  ``ResourceScatterNdUpdate`` holds the variable's exclusive lock while it copies, and
  ``ResourceGatherNd`` reads under the shared lock, so each gathered image is either the old or
  the new one in full (``tests/trainer`` checks this with a writer thread hammering the
  reservoir).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
import tensorflow as tf

__all__ = ["SyntheticReservoir"]

log = logging.getLogger(__name__)

MapFn = Callable[..., tuple[Any, ...]]


class SyntheticReservoir:
    """Fixed-shape, class-indexed store of uint8 synthetic images on the host.

    Each class has ``slots_per_class`` slots used as a ring buffer: once a class is full, new
    images replace its oldest ones. Host memory: ``C * M * H * W * 3`` bytes (10 classes x 256
    slots at 224x224 is 385 MB).

    Example::

        reservoir = SyntheticReservoir(num_classes=3, slots_per_class=128, image_shape=(64, 64, 3))
        reservoir.write(2, images)                 # uint8 [n, 64, 64, 3], from any thread
        ds = ds.batch(32, drop_remainder=True).map(reservoir.mix(p=0.5))
        model.fit(ds, epochs=3)
        reservoir.mixed_fraction()                 # share of examples actually replaced

    Args:
        num_classes: number of classes ``C``; labels are sparse ints in ``[0, C)``.
        slots_per_class: images kept per class ``M``.
        image_shape: ``(H, W, 3)`` of one image, equal to the real images it replaces.
    """

    def __init__(
        self,
        num_classes: int,
        slots_per_class: int,
        image_shape: tuple[int, int, int] = (64, 64, 3),
    ) -> None:
        if num_classes < 1 or slots_per_class < 1:
            raise ValueError(
                f"num_classes={num_classes} and slots_per_class={slots_per_class} must both be >= 1"
            )
        shape = tuple(int(d) for d in image_shape)
        if len(shape) != 3 or shape[2] != 3 or min(shape) < 1:
            raise ValueError(f"image_shape {image_shape!r} must be (H, W, 3) with H, W >= 1")
        if tf.distribute.has_strategy():
            raise RuntimeError(
                "SyntheticReservoir was created inside a tf.distribute strategy scope; its "
                "variables would become per-replica copies that the input pipeline cannot see "
                "refreshed. Create it before `with strategy.scope():`."
            )
        self.num_classes = int(num_classes)
        self.slots_per_class = int(slots_per_class)
        self.image_shape: tuple[int, int, int] = (shape[0], shape[1], shape[2])
        self._lock = threading.Lock()
        self._cursor = np.zeros([self.num_classes], np.int64)  # next slot to write, per class
        self._fill_np = np.zeros([self.num_classes], np.int32)
        with tf.device("/CPU:0"):
            self.images = tf.Variable(
                tf.zeros([self.num_classes, self.slots_per_class, *self.image_shape], tf.uint8),
                trainable=False,
                name="genaug_reservoir_images",
            )
            self.fill = tf.Variable(
                tf.zeros([self.num_classes], tf.int32),
                trainable=False,
                name="genaug_reservoir_fill",
            )
            self.mixed_counter = tf.Variable(
                tf.constant(0, tf.int64), trainable=False, name="genaug_reservoir_mixed"
            )
            self.seen_counter = tf.Variable(
                tf.constant(0, tf.int64), trainable=False, name="genaug_reservoir_seen"
            )

    # ----------------------------------------------------------------------------- writing

    def write(self, label: int, images: np.ndarray) -> int:
        """Store ``images`` (uint8 ``[n, H, W, 3]`` or one ``[H, W, 3]``) as class ``label``.

        Safe to call from any thread while a dataset is reading. When ``n`` exceeds the slots
        of a class only the last ``slots_per_class`` images are kept. Returns how many were
        stored.

        Raises:
            ValueError: wrong label, dtype or image size (the reservoir never resizes: ask the
                service for the right output size instead).
        """
        if not 0 <= int(label) < self.num_classes:
            raise ValueError(f"label {label} is outside [0, {self.num_classes})")
        arr = np.asarray(images)
        if arr.ndim == 3:
            arr = arr[None]
        if arr.ndim != 4 or tuple(arr.shape[1:]) != self.image_shape:
            raise ValueError(
                f"images of shape {tuple(arr.shape)} do not fit the reservoir: expected "
                f"[n, {', '.join(map(str, self.image_shape))}]; request that output size from "
                "the service (recipe or output_height/output_width)"
            )
        if arr.dtype != np.uint8:
            raise ValueError(f"images have dtype {arr.dtype}; expected uint8 in [0, 255]")
        if arr.shape[0] == 0:
            return 0
        arr = arr[-self.slots_per_class :]
        n = int(arr.shape[0])
        label = int(label)
        with self._lock:
            slots = (self._cursor[label] + np.arange(n)) % self.slots_per_class
            indices = np.stack([np.full([n], label), slots], axis=1).astype(np.int64)
            # Pixels first, then the fill count: a reader never samples a slot before its
            # image is complete.
            self.images.scatter_nd_update(indices, arr)
            self._cursor[label] = (self._cursor[label] + n) % self.slots_per_class
            new_fill = min(self.slots_per_class, int(self._fill_np[label]) + n)
            if new_fill != self._fill_np[label]:
                self._fill_np[label] = new_fill
                self.fill.scatter_nd_update([[label]], [new_fill])
        return n

    def fill_counts(self) -> np.ndarray:
        """Images held per class, int32 ``[C]`` (a copy; cheap, no TensorFlow call)."""
        with self._lock:
            return self._fill_np.copy()

    def clear(self) -> None:
        """Forget all images (fill counts to 0); the pixels stay but are never sampled."""
        with self._lock:
            self._fill_np[:] = 0
            self._cursor[:] = 0
            self.fill.assign(tf.zeros([self.num_classes], tf.int32))

    # ----------------------------------------------------------------------------- counters

    def mixed_fraction(self) -> float:
        """Share of examples that went through :meth:`mix` and were replaced (0.0 if none)."""
        seen = int(self.seen_counter.numpy())
        return int(self.mixed_counter.numpy()) / seen if seen else 0.0

    def reset_counters(self) -> None:
        """Zero :attr:`mixed_counter` and :attr:`seen_counter`."""
        self.mixed_counter.assign(0)
        self.seen_counter.assign(0)

    # ----------------------------------------------------------------------------- mixing

    def mix(
        self,
        p: float = 0.5,
        *,
        key: str | None = None,
        scale: float | None = None,
        offset: float = 0.0,
        seed: int | None = None,
    ) -> MapFn:
        """Return a ``tf.data`` map function that replaces real images by synthetic ones.

        The function takes ``(features, label, *rest)`` and returns the same structure, where
        ``features`` is an image tensor ``[B, H, W, 3]`` / ``[H, W, 3]`` or a dict holding one
        under ``key`` (only that entry changes; e.g. the ``depth_rgb`` modality of a multimodal
        model). Each example whose class holds at least one image is replaced with probability
        ``p`` by an image drawn uniformly from the filled slots of its own class, converted to
        the real image's dtype as ``pixel * scale + offset``. Labels are unchanged.

        Labels may be sparse ints (``[B]``, ``[B, 1]`` or a scalar) or one-hot / soft vectors
        ``[B, C]`` (the class is their argmax). Labels outside ``[0, C)`` are never replaced.

        Every replaced example adds 1 to :attr:`mixed_counter`, every example to
        :attr:`seen_counter`.

        Args:
            p: replacement probability in ``[0, 1]``.
            key: the dict key of the image when features are a dict.
            scale: multiplier from uint8 pixels to the real images' range. Default: 1 for
                integer real images, ``1/255`` for floating ones (real images in ``[0, 1]``);
                pass ``1.0`` for float images in ``[0, 255]``.
            offset: added after scaling (``scale=2/255, offset=-1`` for ``[-1, 1]``).
            seed: op-level seed for the random draws (with ``tf.random.set_seed`` for a
                reproducible sequence).

        Example::

            ds = ds.map(reservoir.mix(p=0.5, key="depth_rgb"),
                        num_parallel_calls=tf.data.AUTOTUNE)
        """
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"p={p} must be within [0, 1]")
        prob = float(p)

        def mix_fn(features: Any, label: Any, *rest: Any) -> tuple[Any, ...]:
            if key is None:
                if isinstance(features, Mapping):
                    raise ValueError(
                        f"features is a dict with keys {sorted(features)}; pass mix(key=...) "
                        "naming the image to replace"
                    )
                image = features
            else:
                if not isinstance(features, Mapping) or key not in features:
                    found = sorted(features) if isinstance(features, Mapping) else type(features)
                    raise ValueError(f"mix(key={key!r}) but features are {found}")
                image = features[key]
            mixed = self._mix_tensor(tf.convert_to_tensor(image), label, prob, scale, offset, seed)
            if key is None:
                return (mixed, label, *rest)
            replaced = dict(features)
            replaced[key] = mixed
            return (replaced, label, *rest)

        # No Python control flow on tensors inside: AutoGraph has nothing to convert.
        return cast(MapFn, tf.autograph.experimental.do_not_convert(mix_fn))

    def _sparse_labels(self, label: Any, batched: bool) -> tf.Tensor:
        label = tf.convert_to_tensor(label)
        base = 1 if batched else 0
        rank = label.shape.rank
        if rank == base:
            sparse = label
        elif rank == base + 1 and label.shape[-1] == 1:
            sparse = tf.squeeze(label, -1)
        elif rank == base + 1 and label.shape[-1] == self.num_classes:
            sparse = tf.argmax(label, axis=-1)
        else:
            raise ValueError(
                f"label of shape {label.shape} does not match images "
                f"({'batched' if batched else 'unbatched'}); expected sparse class ids "
                f"({'[B]' if batched else '[]'}) or one-hot of width {self.num_classes}"
            )
        if not batched:
            sparse = tf.reshape(sparse, [1])
        return tf.cast(sparse, tf.int32)

    def _mix_tensor(
        self,
        image: tf.Tensor,
        label: Any,
        p: float,
        scale: float | None,
        offset: float,
        seed: int | None,
    ) -> tf.Tensor:
        rank = image.shape.rank
        if rank not in (3, 4):
            raise ValueError(
                f"image of shape {image.shape} must be [B, H, W, 3] or [H, W, 3] with a known rank"
            )
        batched = rank == 4
        inner = image.shape[1:] if batched else image.shape
        if not inner.is_compatible_with(self.image_shape):
            raise ValueError(
                f"real images have shape {inner}, the reservoir holds {self.image_shape}; "
                "build the reservoir with the training image size"
            )
        dtype = image.dtype
        if scale is None:
            scale = 1.0 / 255.0 if dtype.is_floating else 1.0
        labels = self._sparse_labels(label, batched)
        images = image if batched else image[None]
        n = tf.shape(labels)[0]

        valid = (labels >= 0) & (labels < self.num_classes)
        safe = tf.where(valid, labels, tf.zeros_like(labels))
        fill = tf.where(valid, tf.gather(self.fill.read_value(), safe), tf.zeros_like(labels))
        draw = tf.random.uniform([n], seed=seed)
        replace = (draw < p) & (fill > 0)
        pick = tf.random.uniform([n], seed=None if seed is None else seed + 1)
        slot = tf.cast(tf.floor(pick * tf.cast(fill, tf.float32)), tf.int32)
        slot = tf.clip_by_value(slot, 0, tf.maximum(fill - 1, 0))

        rows = tf.where(replace)  # int64 [k, 1]
        where_idx = tf.stack([tf.gather_nd(safe, rows), tf.gather_nd(slot, rows)], axis=1)
        synthetic = self.images.gather_nd(where_idx)  # uint8 [k, H, W, 3]
        if dtype == tf.uint8 and scale == 1.0 and offset == 0.0:
            converted = synthetic
        elif dtype.is_floating:
            converted = tf.cast(synthetic, dtype) * tf.cast(scale, dtype) + tf.cast(offset, dtype)
        else:
            converted = tf.cast(tf.round(tf.cast(synthetic, tf.float32) * scale + offset), dtype)
        out = tf.tensor_scatter_nd_update(images, rows, converted)

        count_mixed = self.mixed_counter.assign_add(tf.cast(tf.shape(rows)[0], tf.int64))
        count_seen = self.seen_counter.assign_add(tf.cast(n, tf.int64))
        with tf.control_dependencies([count_mixed, count_seen]):
            out = tf.identity(out)
        return out if batched else out[0]
