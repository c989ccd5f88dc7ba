"""The gain tests' data: real MNIST digits as a user's folder and as ``--extra`` arms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _gain_helpers import mnist, write


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``data``: 40 real MNIST digits per label; ``heldout``: 32 others per label;
    ``shuffled``: the held-out ones in the next label's folder."""
    root = tmp_path_factory.mktemp("gain-digits")
    x, y = mnist()
    rng = np.random.default_rng(0)
    data, heldout = [], []
    for c in range(10):
        mine = rng.permutation(np.flatnonzero(y == c))
        data += mine[:40].tolist()
        heldout += mine[40:72].tolist()
    write(root / "data", x[data], y[data])
    write(root / "heldout", x[heldout], y[heldout])
    write(root / "shuffled", x[heldout], (y[heldout] + 1) % 10)
    return {"root": root, "data": root / "data", "heldout": root / "heldout",
            "shuffled": root / "shuffled"}
