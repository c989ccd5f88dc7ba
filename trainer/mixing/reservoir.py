"""A class-indexed reservoir of synthetic images that a ``tf.data`` map can sample.

The reservoir is the trainer-side half of genaug: a fixed-shape host tensor
``images[C, M, H, W, K]`` (uint8, ``K`` 3 for RGB or 1 for a luminance/depth channel) plus
``fill[C]`` (how many of the ``M`` slots of each class
hold an image). A feeder thread writes into it; :meth:`SyntheticReservoir.mix` returns a map
function that swaps real examples for synthetic ones with pure graph ops, optionally
rebalancing the classes (the replacement's class drawn from given weights, its label changed
with its pixels). Nothing in the map calls Python, does I/O, or waits: an empty class keeps
its real image. The ops themselves are in :mod:`~genaug.trainer.mixing.graph`.

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
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from genaug.mixing import resolve_share

from .graph import MapFn, MixOptions, map_fn

__all__ = ["SyntheticReservoir"]

log = logging.getLogger(__name__)


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
        image_shape: ``(H, W, K)`` of one image with ``K`` 3 (RGB) or 1 (one channel, e.g. a
            depth map; ask the recipe for ``output_channels: 1``), equal to the real images
            it replaces.
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
        if len(shape) != 3 or shape[2] not in (1, 3) or min(shape) < 1:
            raise ValueError(
                f"image_shape {image_shape!r} must be (H, W, 3) or (H, W, 1) with H, W >= 1"
            )
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
            self.replaced_per_class = tf.Variable(
                tf.zeros([self.num_classes], tf.int64), trainable=False,
                name="genaug_reservoir_replaced_per_class",
            )

    # ----------------------------------------------------------------------------- writing

    def write(self, label: int, images: np.ndarray) -> int:
        """Store ``images`` (uint8 ``[n, H, W, K]`` or one ``[H, W, K]``) as class ``label``.

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
                f"[n, {', '.join(map(str, self.image_shape))}]; request that output size and "
                "channel count from the service (recipe output_height/output_width/"
                "output_channels)"
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

    def replaced_counts(self) -> np.ndarray:
        """Replacements per (new) class since the last :meth:`reset_counters`, int64 ``[C]``."""
        return np.asarray(self.replaced_per_class.numpy())

    def reset_counters(self) -> None:
        """Zero :attr:`mixed_counter`, :attr:`seen_counter` and :attr:`replaced_per_class`."""
        self.mixed_counter.assign(0)
        self.seen_counter.assign(0)
        self.replaced_per_class.assign(tf.zeros([self.num_classes], tf.int64))

    # ----------------------------------------------------------------------------- mixing

    def mix(
        self,
        p: float | Sequence[float] | str = "auto",
        *,
        real_per_class: float | None = None,
        key: str | None = None,
        rebalance: Sequence[float] | None = None,
        other_inputs: str = "keep",
        scale: float | None = None,
        offset: float = 0.0,
        seed: int | None = None,
        synthetic_weight: float | None = None,
    ) -> MapFn:
        """Return a ``tf.data`` map function that replaces real images by synthetic ones.

        The function takes ``(features, label, *rest)`` and returns the same structure, where
        ``features`` is an image tensor ``[B, H, W, C]`` / ``[H, W, C]`` or a dict holding one
        under ``key`` (the ``depth_rgb`` modality of a multimodal model, say).

        Which examples are replaced: an example of class ``c`` is replaced with probability
        ``p[c]`` (``p`` is one number for every class or one per class). The default,
        ``p="auto"``, is the share that falls as real data grows
        (:func:`genaug.mixing.default_share` of ``real_per_class``, the real images per class
        you train on: 0.5 at 1 or 2, 0.29 at 5, 0.17 at 10, 0.04 at 50), measured not to make a
        few-shot classifier worse than its real images alone (docs/gain.md).

        What replaces it:

        * without ``rebalance``: an image of its own class ``c``, drawn uniformly from the
          filled slots; while class ``c`` is empty the example keeps its real image. Labels
          are unchanged.
        * with ``rebalance`` (``C`` non-negative weights): an image of class ``k`` drawn from
          that distribution, renormalised over the classes that hold at least one image
          (classes still empty get no replacements; ``p`` is unchanged). The label changes
          with the pixels: a sparse label becomes ``k`` (same dtype and shape), a one-hot or
          soft label becomes ``k``'s one-hot. ``rebalance=[1, 1, 4]`` makes 4 in 6
          replacements class 2: the rare class is oversampled without a second dataset.

        The pixels are converted to the real image's dtype as ``pixel * scale + offset``.
        Labels may be sparse ints (``[B]``, ``[B, 1]`` or a scalar) or one-hot / soft vectors
        ``[B, C]`` (the class is their argmax). Labels outside ``[0, C)`` are never replaced.

        The other inputs of a dict example (``metadata``, ``depth_map``...) are not touched by
        default (``other_inputs="keep"``): a replaced example pairs a synthetic ``key`` image
        with the real example's other inputs. Without ``rebalance`` those belong to the same
        class, so the example stays consistent. With ``rebalance`` the class may change: the
        other inputs then belong to the old class while the label says the new one. Pass
        ``other_inputs="zero"`` to zero every other input of the replaced examples (the
        model sees "this modality only", as in modality dropout); or leave ``rebalance`` off
        for multimodal data whose modalities must agree.

        Every replaced example adds 1 to :attr:`mixed_counter` and to its new class in
        :attr:`replaced_per_class`; every example adds 1 to :attr:`seen_counter`.

        Synthetic images may count less: with ``synthetic_weight=w`` the function also yields
        Keras sample weights, ``(features, label, sample_weight)``: float32 ``[B]`` (a scalar
        for unbatched examples), ``w`` for replaced examples and 1 for real ones, made by the
        same graph ops from the same draw as the pixels, so they never disagree. When the
        dataset already yields a sample weight (``(x, y, sw)``), replaced examples get
        ``sw * w`` and real ones keep ``sw``. ``model.fit`` weighs each example's loss by it.

        Args:
            p: replacement probability in ``[0, 1]``, one number or one per class (indexed
                by the example's own class); ``"auto"`` (default): the default share of
                ``real_per_class``.
            real_per_class: how many real images per class the dataset holds (needed by
                ``p="auto"``, which says so in a ``ValueError`` without it).
            key: the dict key of the image when features are a dict.
            rebalance: ``C`` non-negative class weights for the class of a replacement.
            other_inputs: ``"keep"`` or ``"zero"`` (dict features only; see above).
            scale: multiplier from uint8 pixels to the real images' range. Default: 1 for
                integer real images, ``1/255`` for floating ones (real images in ``[0, 1]``);
                pass ``1.0`` for float images in ``[0, 255]``.
            offset: added after scaling (``scale=2/255, offset=-1`` for ``[-1, 1]``).
            seed: op-level seed for the random draws (with ``tf.random.set_seed`` for a
                reproducible sequence).
            synthetic_weight: sample weight of a replaced example, a finite number >= 0 (say
                0.5); ``None`` (default) yields no weights.

        Example::

            ds = ds.map(reservoir.mix(p=[0.3, 0.3, 0.9], key="depth_rgb", rebalance=[1, 1, 4]),
                        num_parallel_calls=tf.data.AUTOTUNE)
        """
        if isinstance(p, str):
            p = resolve_share(p, real_per_class=real_per_class)
        probs = self._per_class("p", p, upper=1.0)
        weights = None if rebalance is None else self._per_class("rebalance", rebalance)
        if weights is not None and not any(w > 0 for w in weights):
            raise ValueError(
                f"rebalance={list(rebalance or [])} has no positive weight; give each class "
                "the share of replacements it should get, e.g. [1, 1, 4]"
            )
        if other_inputs not in ("keep", "zero"):
            raise ValueError(f"other_inputs={other_inputs!r} must be 'keep' or 'zero'")
        if synthetic_weight is not None and not (
            isinstance(synthetic_weight, int | float) and 0.0 <= synthetic_weight < float("inf")
        ):
            raise ValueError(
                f"synthetic_weight={synthetic_weight!r} must be a finite number >= 0 (the loss "
                "weight of a synthetic example; 1 counts it like a real one), or None"
            )
        options = MixOptions(probs, weights, scale, offset, seed)
        return map_fn(self, options, key=key, other_inputs=other_inputs,
                      synthetic_weight=synthetic_weight)

    def _per_class(
        self, name: str, value: float | Sequence[float], *, upper: float | None = None
    ) -> list[float]:
        if isinstance(value, int | float):
            values = [float(value)] * self.num_classes
        else:
            values = [float(v) for v in value]
            if len(values) != self.num_classes:
                raise ValueError(
                    f"{name} has {len(values)} values; the reservoir has {self.num_classes} "
                    f"classes: give one per class or {'one number' if upper else 'none'}"
                )
        for i, v in enumerate(values):
            if not (v >= 0.0 and (upper is None or v <= upper)) or v != v:
                bound = f"within [0, {upper:g}]" if upper is not None else ">= 0"
                raise ValueError(f"{name}[{i}]={v} must be {bound}")
        return values
