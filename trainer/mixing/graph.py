"""The graph ops behind :meth:`~genaug.trainer.mixing.reservoir.SyntheticReservoir.mix`.

:func:`map_fn` builds the ``tf.data`` map function; :func:`mix_tensor` is its core: which
examples are replaced (a uniform draw against ``p`` of their class), by which class (their own,
or one drawn from the ``rebalance`` weights renormalised over the classes that hold images),
from which slot (uniform over the filled ones), converted to the real images' dtype and range,
with the label changed with the pixels when the class changes and the reservoir's counters
updated. Everything is a TensorFlow op reading the reservoir's host variables through their
handles: nothing calls Python, does I/O or waits, and each write is seen by the next batch
without re-tracing. The arguments were validated by ``mix()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import tensorflow as tf

__all__ = ["MapFn", "MixOptions", "ReservoirVariables", "map_fn", "mix_tensor"]


class ReservoirVariables(Protocol):
    """What the graph ops read and count in a reservoir (a
    :class:`~genaug.trainer.mixing.reservoir.SyntheticReservoir` is one): named here so the
    ops need not import the class that builds them, and the two modules make no circle."""

    num_classes: int
    image_shape: tuple[int, int, int]
    images: tf.Variable
    fill: tf.Variable
    mixed_counter: tf.Variable
    seen_counter: tf.Variable
    replaced_per_class: tf.Variable

MapFn = Callable[..., tuple[Any, ...]]


@dataclass(frozen=True)
class MixOptions:
    """What one ``mix()`` call asked for, validated by :meth:`SyntheticReservoir.mix`."""

    p: list[float]
    weights: list[float] | None
    scale: float | None
    offset: float
    seed: int | None


def map_fn(
    reservoir: ReservoirVariables,
    options: MixOptions,
    *,
    key: str | None,
    other_inputs: str,
    synthetic_weight: float | None,
) -> MapFn:
    """The map function :meth:`SyntheticReservoir.mix` returns (see its docstring)."""

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
        mixed, new_label, replaced = mix_tensor(
            reservoir, tf.convert_to_tensor(image), label, options
        )
        if synthetic_weight is not None:
            rest = _weighted(rest, replaced, float(synthetic_weight), mixed.shape.rank == 4)
        if key is None:
            return (mixed, new_label, *rest)
        out = dict(features)
        out[key] = mixed
        if other_inputs == "zero":
            for name, value in features.items():
                if name != key:
                    out[name] = _zero_where(
                        tf.convert_to_tensor(value), replaced, mixed.shape.rank == 4
                    )
        return (out, new_label, *rest)

    # No Python control flow on tensors inside: AutoGraph has nothing to convert.
    return cast(MapFn, tf.autograph.experimental.do_not_convert(mix_fn))


def _labels(reservoir: ReservoirVariables, label: Any, batched: bool) -> tuple[tf.Tensor, str]:
    """(sparse int32 [n], kind) with kind in {"sparse", "column", "dense"}."""
    label = tf.convert_to_tensor(label)
    base = 1 if batched else 0
    rank = label.shape.rank
    if rank == base:
        sparse, kind = label, "sparse"
    elif rank == base + 1 and label.shape[-1] == 1:
        sparse, kind = tf.squeeze(label, -1), "column"
    elif rank == base + 1 and label.shape[-1] == reservoir.num_classes:
        sparse, kind = tf.argmax(label, axis=-1), "dense"
    else:
        raise ValueError(
            f"label of shape {label.shape} does not match images "
            f"({'batched' if batched else 'unbatched'}); expected sparse class ids "
            f"({'[B]' if batched else '[]'}) or one-hot of width {reservoir.num_classes}"
        )
    if not batched:
        sparse = tf.reshape(sparse, [1])
    return tf.cast(sparse, tf.int32), kind


def _relabel(
    reservoir: ReservoirVariables, label: Any, kind: str, batched: bool, replaced: tf.Tensor,
    new_class: tf.Tensor,
) -> tf.Tensor:
    """``label`` with the replaced examples set to ``new_class`` (shape and dtype kept)."""
    label = tf.convert_to_tensor(label)
    if kind == "dense":
        onehot = tf.one_hot(new_class, reservoir.num_classes, dtype=label.dtype)
        rows = label if batched else label[None]
        out = tf.where(replaced[:, None], onehot, rows)
        return out if batched else out[0]
    flat = tf.reshape(label, [-1])
    out = tf.where(replaced, tf.cast(new_class, label.dtype), flat)
    return tf.reshape(out, tf.shape(label))


def mix_tensor(
    reservoir: ReservoirVariables, image: tf.Tensor, label: Any, options: MixOptions
) -> tuple[tf.Tensor, Any, tf.Tensor]:
    """(mixed images, labels, replaced bool [n])."""
    rank = image.shape.rank
    channels = reservoir.image_shape[2]
    if rank not in (3, 4):
        raise ValueError(
            f"image of shape {image.shape} must be [B, H, W, {channels}] or "
            f"[H, W, {channels}] with a known rank"
        )
    batched = rank == 4
    inner = image.shape[1:] if batched else image.shape
    if not inner.is_compatible_with(reservoir.image_shape):
        raise ValueError(
            f"real images have shape {inner}, the reservoir holds {reservoir.image_shape}; "
            "build the reservoir with the training image size and channels"
        )
    dtype = image.dtype
    scale = options.scale
    if scale is None:
        scale = 1.0 / 255.0 if dtype.is_floating else 1.0
    offset = options.offset
    seed = options.seed
    labels, kind = _labels(reservoir, label, batched)
    images = image if batched else image[None]
    n = tf.shape(labels)[0]

    valid = (labels >= 0) & (labels < reservoir.num_classes)
    own = tf.where(valid, labels, tf.zeros_like(labels))
    fill = reservoir.fill.read_value()
    p = tf.where(valid, tf.gather(tf.constant(options.p, tf.float32), own), 0.0)
    draw = tf.random.uniform([n], seed=seed)
    if options.weights is None:
        target = own
        available = tf.gather(fill, own) > 0
    else:
        # Renormalise the weights over the classes that hold an image: an empty class
        # gets no replacements, the others share its weight.
        weights = tf.constant(options.weights, tf.float32) * tf.cast(fill > 0, tf.float32)
        total = tf.reduce_sum(weights)
        logits = tf.where(weights > 0, tf.math.log(tf.maximum(weights, 1e-30)), -1e30)
        target = tf.cast(
            tf.random.categorical(
                logits[None], n, seed=None if seed is None else seed + 2
            )[0],
            tf.int32,
        )
        target = tf.clip_by_value(target, 0, reservoir.num_classes - 1)
        available = tf.fill([n], total > 0) & (tf.gather(weights, target) > 0)
    replace = valid & (draw < p) & available
    target_fill = tf.gather(fill, target)
    pick = tf.random.uniform([n], seed=None if seed is None else seed + 1)
    slot = tf.cast(tf.floor(pick * tf.cast(target_fill, tf.float32)), tf.int32)
    slot = tf.clip_by_value(slot, 0, tf.maximum(target_fill - 1, 0))

    rows = tf.where(replace)  # int64 [k, 1]
    where_idx = tf.stack([tf.gather_nd(target, rows), tf.gather_nd(slot, rows)], axis=1)
    synthetic = reservoir.images.gather_nd(where_idx)  # uint8 [k, H, W, C]
    if dtype == tf.uint8 and scale == 1.0 and offset == 0.0:
        converted = synthetic
    elif dtype.is_floating:
        converted = tf.cast(synthetic, dtype) * tf.cast(scale, dtype) + tf.cast(offset, dtype)
    else:
        converted = tf.cast(tf.round(tf.cast(synthetic, tf.float32) * scale + offset), dtype)
    out = tf.tensor_scatter_nd_update(images, rows, converted)
    new_label = label
    if options.weights is not None:
        new_label = _relabel(reservoir, label, kind, batched, replace, target)

    replaced_classes = tf.gather_nd(target, rows)
    per_class = tf.math.bincount(
        replaced_classes, minlength=reservoir.num_classes, maxlength=reservoir.num_classes,
        dtype=tf.int64,
    )
    updates = [
        reservoir.mixed_counter.assign_add(tf.cast(tf.shape(rows)[0], tf.int64)),
        reservoir.seen_counter.assign_add(tf.cast(n, tf.int64)),
        reservoir.replaced_per_class.assign_add(per_class),
    ]
    with tf.control_dependencies(updates):
        out = tf.identity(out)
    return (out if batched else out[0]), new_label, replace


def _weighted(
    rest: tuple[Any, ...], replaced: tf.Tensor, weight: float, batched: bool
) -> tuple[Any, ...]:
    """``rest`` with the sample weight first: ``weight`` where replaced, else 1 (or the given
    sample weight, times ``weight`` where replaced)."""
    mask = replaced if batched else replaced[0]
    if not rest:
        ones = tf.ones(tf.shape(mask), tf.float32)
        return (tf.where(mask, tf.fill(tf.shape(mask), tf.constant(weight, tf.float32)), ones),)
    given = tf.convert_to_tensor(rest[0])
    rank = given.shape.rank
    if rank is None:
        raise ValueError("synthetic_weight needs a sample weight of known rank")
    if batched and rank > 1:  # [B, 1] or per-timestep weights: broadcast the mask
        mask = tf.reshape(mask, [-1] + [1] * (rank - 1))
    scaled = given * tf.cast(weight, given.dtype)
    return (tf.where(mask, scaled, given), *rest[1:])


def _zero_where(value: tf.Tensor, replaced: tf.Tensor, batched: bool) -> tf.Tensor:
    """``value`` with the inputs of replaced examples zeroed."""
    if not batched or value.shape.rank == 0:
        return tf.where(replaced[0], tf.zeros_like(value), value)
    rank = value.shape.rank
    if rank is None:
        raise ValueError("other_inputs='zero' needs inputs of known rank")
    mask = tf.reshape(replaced, [-1] + [1] * (rank - 1))
    return tf.where(mask, tf.zeros_like(value), value)
