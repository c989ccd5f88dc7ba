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


def test_the_protocol_line_is_one_line_pointing_to_genaug_gain() -> None:
    assert "\n" not in PROTOCOL_LINE
    assert "genaug gain" in PROTOCOL_LINE and "docs/gain.md" in PROTOCOL_LINE
    assert "all 10 digit classes" in PROTOCOL_LINE


def test_the_verdict_says_plainly_whether_mixing_won_beside_the_gain_reports_interval() -> None:
    """The run's figure beside what the committed ``genaug gain`` report on these digits
    measured for the demo's setting (the pool at 5 shots), interval included."""
    import json

    from genaug.experiments.demo import GAIN_REPORT, measured, verdict

    row = next(r for r in json.loads(GAIN_REPORT.read_text())["summary"]
               if r["arm"] == "pool" and r["k"] == 5)
    won = verdict(0.888, 0.932, seed=0, pool_per_label=16)
    assert won.startswith("mixing gained +4.4 points in this run") and "\n" not in won
    assert "16 images per digit" in won
    assert (f"genaug gain measured pool {row['mean']:+.1f} points [{row['low']:+.1f}, "
            f"{row['high']:+.1f}] at k=5 over {row['seeds']} seeds") in won
    assert won.endswith(f"{row['verdict']} (docs/gain/digits/gain.md)")
    lost = verdict(0.888, 0.860, seed=0, pool_per_label=16)
    assert lost.startswith("mixing did not beat real only in this run (-2.8 points)"), lost
    assert "docs/gain.md" in measured(report=GAIN_REPORT.with_name("absent.json"))


def test_the_demo_finds_the_checkouts_digits_recipe() -> None:
    """The demo reads ``recipes/digits.yaml`` beside the package folders: a module that moves
    must keep finding it (the slow demo test is the only other check)."""
    from genaug.experiments.demo import default_recipes_path

    assert default_recipes_path().is_file(), default_recipes_path()
