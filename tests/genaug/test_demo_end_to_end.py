"""genaug demo end to end, as the README runs it (CI size): ``genaug serve`` (the embedded
tiny-digits generator) as a child process, the grid through the client and, with training, the
TensorFlow child that trains the few-shot CNN under MirroredStrategy fed from the pool. Neither
torch's pipeline nor TensorFlow loads in the pytest process."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1200)
def test_demo_without_training_writes_the_digit_grid(tmp_path: Path) -> None:
    if importlib.util.find_spec("sklearn") is None:
        pytest.skip("needs scikit-learn")
    from PIL import Image

    out = tmp_path / "demo.png"
    proc = subprocess.run([sys.executable, "-m", "genaug.cli", "demo", "--no-train", "--out",
                           str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tiny-digits" in proc.stdout and "10 digits x 4 images" in proc.stdout
    assert "real digits and their img2img variants" in proc.stdout
    assert "the pool of 'digits' holds" in proc.stdout
    with Image.open(out) as grid:
        # one labelled rectangle: a column of 128 px tiles per digit; 4 generated rows, real,
        # variants
        assert grid.width >= 10 * 128 and 6 * 128 <= grid.height < 7 * 128
        assert grid.getpixel((grid.width - 64, grid.height - 64)) != (255, 255, 255)


@pytest.mark.timeout(1200)
def test_the_readme_demo_end_to_end_feeds_the_mixing_run(tmp_path: Path) -> None:
    """``make demo``'s command as the README runs it, training included: both runs train, and
    the mixing run is really fed from the pool (its arm's name, with spaces and '=', once made
    an X-Client-Id the service refused, and the run fed 0 images while reporting success)."""
    import re

    out = tmp_path / "demo.png"
    proc = subprocess.run([sys.executable, "-m", "genaug.cli", "demo", "--out", str(out)],
                          capture_output=True, text=True, timeout=1100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fed = re.search(r"\((\d+)% of examples synthetic, (\d+) images fed\)", proc.stdout)
    assert fed is not None, proc.stdout[-3000:]
    assert int(fed.group(1)) >= 20 and int(fed.group(2)) >= 160, fed.group(0)  # 16 per digit
    assert re.search(r"real only .*\s0\.\d{3}\n", proc.stdout) and out.is_file()
