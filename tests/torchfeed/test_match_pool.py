"""``PoolDataset(match=...)``: pool images brought to the user's own images' size, channels,
framing and light in every process that draws (issue 57, item 3).

The real shots are MNIST's 28x28 one-channel digits; the pool is the ``shapes`` recipe's
(32x32 RGB) on a real service. A ``MixedDataset`` of the shots in a ``DataLoader`` of 2
workers (fork and spawn) hands out only the shots themselves and the pool's images as
``DomainMatch.fit(shots)`` makes them.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import torch
from _torch_match import first_images, mnist_shots
from _torch_shapes import wait_for_pool
from torch.utils.data import DataLoader, TensorDataset

from genaug.match import DomainMatch
from genaug.torch import MixedDataset, PoolDataset

LABELS = {"circle": 0, "square": 1, "triangle": 2}
CAPACITY = 24  # pool_service's capacity per label: a full pool holds these and no more


def _as_bytes(image: torch.Tensor) -> bytes:
    """A handed-out float ``[C, H, W]`` image as the uint8 ``[H, W, C]`` it was made from."""
    pixels = (image * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()
    return bytes(pixels.numpy().tobytes())


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_matched_mix_in_workers_hands_out_pool_images_of_the_shots_domain(
        pool_service: Any, context: str) -> None:
    shots = mnist_shots()
    labels = np.arange(len(shots)) % 3
    real = TensorDataset(torch.from_numpy(shots).permute(0, 3, 1, 2).float() / 255.0,
                         torch.from_numpy(labels))
    pool = PoolDataset(pool_service.url, "shapes", trainer_id=f"match-{context}", seed=0,
                       match=shots)
    mixed = MixedDataset(real, pool, p=1.0, seed=0)
    loader = DataLoader(mixed, batch_size=10, num_workers=2, multiprocessing_context=context,
                        persistent_workers=True, worker_init_fn=first_images)
    handed = [(image, int(label)) for _ in range(2) for images, labels in loader
              for image, label in zip(images, labels, strict=True)]

    wait_for_pool(pool_service.url, "shapes", at_least=CAPACITY)  # full: all it will hold
    from genaug.client import Client

    match = DomainMatch.fit(shots)
    with Client(pool_service.url) as client:
        matched = {LABELS[name]: {m.tobytes() for m in match(
            client.sample("shapes", labels=[name], n=CAPACITY).images)} for name in LABELS}
    own = {(shot.tobytes(), int(label)) for shot, label in zip(shots, labels, strict=True)}
    synthetic = 0
    for image, label in handed:
        assert tuple(image.shape) == (1, 28, 28)  # the shots' [C, H, W], not the recipe's
        pixels = _as_bytes(image)
        if (pixels, label) in own:
            continue
        assert pixels in matched[label], "neither a shot nor a matched pool image of its label"
        synthetic += 1
    assert len(handed) == 60 and synthetic > 0, (len(handed), synthetic)
    assert mixed.stats()["synthetic"] == synthetic


def test_match_is_fitted_once_refused_in_one_line_and_pickles() -> None:
    shots = mnist_shots()
    pool = PoolDataset("http://127.0.0.1:8000", "shapes", match=shots)
    assert pool.config.match == DomainMatch.fit(shots)
    assert pickle.loads(pickle.dumps(pool.config.match)) == pool.config.match  # to workers
    floats = torch.from_numpy(shots).permute(0, 3, 1, 2).float() / 255.0  # [N, 1, 28, 28]
    with pytest.raises(ValueError) as info:
        PoolDataset("http://127.0.0.1:8000", "shapes", match=floats.numpy())
    message = str(info.value)
    assert "\n" not in message and "PoolDataset match=" in message and "[30, 1, 28, 28]" in message
    assert ".permute(0, 2, 3, 1)" in message  # the fix, for a torch user's layout
