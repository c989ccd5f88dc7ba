"""Per-class need from predictions on held-out real data: pure NumPy, no TensorFlow.

:class:`~genaug.trainer.feeding.need.NeedCallback` (a Keras callback) and ``genaug.torch``'s
``class_need`` call :func:`per_class_need` on the model's predictions; no framework is
imported, so both trainers share it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np

__all__ = ["Measure", "per_class_need", "rebalance_weights"]

Measure = Literal["error", "loss"]


def per_class_need(
    probabilities: np.ndarray, labels: np.ndarray, num_classes: int, *, measure: Measure = "error"
) -> np.ndarray:
    """Need per class from predictions on held-out real data, float64 ``[num_classes]``.

    ``probabilities``: ``[n, num_classes]`` model outputs (probabilities or logits; the
    argmax is the same, and ``measure="loss"`` applies a softmax to rows that do not sum to
    1). ``labels``: sparse ``[n]`` (or ``[n, 1]``) or one-hot ``[n, num_classes]``.
    ``"error"``: the share of each class's examples predicted wrong; ``"loss"``: their mean
    cross-entropy. A class without held-out examples gets 0.

    Example::

        per_class_need(np.array([[0.9, 0.1], [0.6, 0.4]]), np.array([0, 1]), 2)  # [0., 1.]
    """
    probs = np.asarray(probabilities, np.float64)
    y = np.asarray(labels)
    if y.ndim == 2 and y.shape[1] == num_classes and num_classes > 1:
        y = y.argmax(axis=1)
    y = y.reshape(-1).astype(np.int64)
    if probs.ndim != 2 or probs.shape != (len(y), num_classes):
        raise ValueError(
            f"predictions of shape {probs.shape} do not match {len(y)} labels of "
            f"{num_classes} classes; the model must output one score per class"
        )
    if measure == "error":
        per_example = (probs.argmax(axis=1) != y).astype(np.float64)
    elif measure == "loss":
        rows = probs
        if not np.allclose(rows.sum(axis=1), 1.0, atol=1e-3) or (rows < 0).any():
            shifted = rows - rows.max(axis=1, keepdims=True)
            rows = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
        per_example = -np.log(np.clip(rows[np.arange(len(y)), y], 1e-12, 1.0))
    else:
        raise ValueError(f"measure={measure!r} must be 'error' or 'loss'")
    need = np.zeros([num_classes], np.float64)
    for c in range(num_classes):
        mask = y == c
        if mask.any():
            need[c] = float(per_example[mask].mean())
    return need


def rebalance_weights(
    need: Mapping[str, float] | None, label_map: Mapping[str, int]
) -> list[float]:
    """Class weights for ``reservoir.mix(rebalance=...)`` from a need report, so replacements
    are drawn by need as the service fills the pool by it: ``1 + m * share`` for each of the
    ``m`` classes (``share``: the class's part of the reported need; the planner's weights,
    :func:`genaug.service.pool.choice.label_weight`). No need, or all zeros: all 1 (even).

    Example::

        rebalance_weights({"3": 0.3, "8": 0.1}, {"3": 0, "5": 1, "8": 2})  # [3.25, 1.0, 1.75]
    """
    num_classes = max(label_map.values()) + 1 if label_map else 0
    weights = [1.0] * num_classes
    values = {label: max(0.0, float(v)) for label, v in (need or {}).items()
              if label in label_map}
    total = sum(values.values())
    if total > 0:
        for label, value in values.items():
            weights[label_map[label]] += len(label_map) * value / total
    return weights
