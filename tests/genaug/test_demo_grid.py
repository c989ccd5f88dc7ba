"""The demo's grid is one labelled rectangle, and the demo says which protocol it shows."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from genaug.experiments.demo import PROTOCOL_LINE, labelled_grid


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

    assert "\n" not in PROTOCOL_LINE
    assert "python -m bench.gain.augmentation_gain" in PROTOCOL_LINE
    find("augmentation_gain")  # the benchmark it names exists (python -m bench lists it)
    assert "all 10 digit classes" in PROTOCOL_LINE


def test_the_verdict_says_plainly_whether_mixing_won_beside_the_benchmark() -> None:
    import re
    from pathlib import Path

    from genaug.experiments.demo import BENCHMARK, verdict

    # the figures shown beside the run are the ones docs/benchmarks.md records
    doc = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text()
    for arm, row in (("real only", "| 1 real only (5 per class, shifts/rotations) |"),
                     ("with mixing", "| 2 + text-to-image pool mixing, p = 0.5 |")):
        line = next(x for x in doc.splitlines() if x.startswith(row))
        mean, std = re.search(r"\*\*(\d\.\d+) ± (\d\.\d+)\*\*", line).groups()  # type: ignore[union-attr]
        assert BENCHMARK[arm] == (float(mean), float(std)), (arm, line)
    won = verdict(0.888, 0.932, seed=0, pool_per_label=16)
    assert won.startswith("mixing gained +4.4 points in this run") and "\n" not in won
    assert "0.897 ± 0.023" in won and "0.954 ± 0.011" in won and "16 images per digit" in won
    lost = verdict(0.888, 0.860, seed=0, pool_per_label=16)
    assert lost.startswith("mixing did not beat real only in this run (-2.8 points)"), lost


def test_the_demo_finds_the_checkouts_digits_recipe() -> None:
    """The demo reads ``recipes/digits.yaml`` beside the package folders: a module that moves
    must keep finding it (the slow demo test is the only other check)."""
    from genaug.experiments.demo import default_recipes_path

    assert default_recipes_path().is_file(), default_recipes_path()
