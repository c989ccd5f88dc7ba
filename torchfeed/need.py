"""What a PyTorch trainer still needs, per recipe label: each class's error (or mean loss) on
held-out *real* images, for :meth:`~genaug.torch.dataset.PoolDataset.report_need`.

The measure is the TensorFlow side's (:func:`~genaug.feeding.class_error.per_class_need`,
no TensorFlow in it); this module runs the model over a held-out loader without gradients and
names each class by its recipe label. The service's planner then fills those labels faster.

Example::

    need = class_need(model, val_loader, pool.label_map())
    pool.report_need(need)        # a thread posts it; training does not wait
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from genaug.feeding.class_error import Measure, per_class_need

__all__ = ["class_need"]


@torch.no_grad()
def class_need(model: torch.nn.Module, data: Iterable[Any], label_map: Mapping[str, int], *,
               measure: Measure = "error", device: torch.device | str | None = None
               ) -> dict[str, float]:
    """Per recipe label, the need measured on ``data`` (batches ``(images, labels)`` of real,
    held-out examples): ``"error"`` (share misclassified) or ``"loss"`` (mean cross-entropy).
    The model's outputs may be logits or probabilities; it is put in eval mode and back."""
    was_training = model.training
    model.eval()
    outputs: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    try:
        for images, targets in data:
            if device is not None:
                images = images.to(device)
            outputs.append(model(images).float().cpu().numpy())
            labels.append(np.asarray(targets.cpu() if isinstance(targets, torch.Tensor)
                                     else targets).reshape(-1))
    finally:
        model.train(was_training)
    if not outputs:
        raise ValueError("class_need: the held-out data yielded no batch")
    probs = np.concatenate(outputs)
    num_classes = probs.shape[1]
    need = per_class_need(probs, np.concatenate(labels), num_classes, measure=measure)
    return {name: round(float(need[i]), 6) for name, i in label_map.items()
            if 0 <= i < num_classes}
