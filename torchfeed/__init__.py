"""genaug.torch: feed PyTorch training from a genaug pool, never blocking a step.

- :class:`PoolDataset`: an ``IterableDataset`` of synthetic ``(image, label)`` pairs drawn
  from a recipe's pool through a reservoir in each process that a background thread refills.
- :class:`MixedDataset`: the user's own dataset with each example replaced, at a ratio ``p``,
  by a synthetic image of its class; real images while a class has none yet.
- :func:`class_need`: per-label need on held-out real data, for
  :meth:`PoolDataset.report_need`, so the pool fills what this trainer lacks.
- :func:`diagnose`: a few steps of a ``DataLoader``, with a finding and a fix for the fork
  hazard, a starved or over-drawn pool, failing requests and slow steps.

DataLoader workers (``fork`` or ``spawn``, persistent or not) and DDP ranks each draw their
own stream; the service counts them as one trainer (client ids ``<trainer>/r<rank>/w<worker>``:
one fair share, one need). Install with ``pip install 'genaug[torch]'``: torch, no TensorFlow.

Example::

    from torch.utils.data import DataLoader
    from genaug.torch import MixedDataset, PoolDataset

    pool = PoolDataset("http://gen-host:8000", "digits", seed=0)
    loader = DataLoader(MixedDataset(my_digits, pool, p=0.3, seed=0), batch_size=64,
                        num_workers=2, persistent_workers=True)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dataset import MixedDataset, PoolDataset
    from .diagnosis import Finding, diagnose
    from .need import class_need
    from .reservoir import HostReservoir

__all__ = ["Finding", "HostReservoir", "MixedDataset", "PoolDataset", "class_need", "diagnose"]

_WHERE = {"Finding": "diagnosis", "HostReservoir": "reservoir", "MixedDataset": "dataset",
          "PoolDataset": "dataset", "class_need": "need", "diagnose": "diagnosis"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
