"""The demo's grid is one labelled rectangle, and the demo says which protocol it shows."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from genaug.trainer.demo import PROTOCOL_LINE, labelled_grid


def test_grid_rows_and_columns_make_one_rectangle() -> None:
    rows = {f"generated {k}": np.full([10, 8, 8, 3], 20 * k, np.uint8) for k in range(4)}
    rows["real"] = np.full([10, 8, 8, 3], 100, np.uint8)
    rows["variant"] = np.full([10, 8, 8, 3], 150, np.uint8)
    png = labelled_grid(rows, columns=[str(d) for d in range(10)], scale=2)
    with Image.open(io.BytesIO(png)) as grid:
        tiles = np.asarray(grid.convert("RGB"))
    # every cell of the 6 x 10 rectangle holds its row's image: no empty corner
    margin, header, step = 72, 18, 16 + 4
    for r, value in enumerate([0, 20, 40, 60, 100, 150]):
        for c in range(10):
            cell = tiles[header + r * step + 8, margin + c * step + 8]
            assert tuple(cell) == (value,) * 3, (r, c, cell)
    with pytest.raises(ValueError, match="columns"):
        labelled_grid(rows, columns=["0"])


def test_the_protocol_line_is_one_line_pointing_to_the_benchmark() -> None:
    from bench.harness import find

    assert "\n" not in PROTOCOL_LINE and "augmentation_gain" in PROTOCOL_LINE
    find("augmentation_gain")  # the benchmark it names exists (python -m bench lists it)
    assert "all 10 digit classes" in PROTOCOL_LINE
