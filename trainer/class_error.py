"""Per-class need from predictions on held-out real data: pure NumPy, no TensorFlow.

:class:`~genaug.trainer.need.NeedCallback` (a Keras callback) calls :func:`per_class_need`
on the model's predictions; kept apart so it is tested, and usable, without importing Keras.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

__all__ = ["Measure", "per_class_need"]

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
