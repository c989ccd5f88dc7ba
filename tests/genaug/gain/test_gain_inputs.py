"""``genaug gain``'s refusals (one line, a non-zero exit) and the user's own training
function, as docs/gain.md writes it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from _gain_helpers import FAST, gain

from genaug.local_service import free_port


def test_bad_inputs_are_one_line_and_a_non_zero_exit(digits: dict[str, Path],
                                                     tmp_path: Path) -> None:
    # A label with fewer images than k + the test split: named, with its count.
    short = tmp_path / "short"
    for label, count in (("a", 30), ("b", 12)):
        (short / label).mkdir(parents=True)
        for i in range(count):
            (short / label / f"{i}.png").write_bytes(
                (digits["data"] / "3" / sorted(os.listdir(digits["data"] / "3"))[i]).read_bytes())
    done = gain(str(short), "--arms", "real", "--shots", "5", "--test-per-label", "10",
                 cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "genaug gain: label(s) b (12) hold(s) fewer images than 5 shots + 10 test images; "
        "give more images, fewer --shots, or a smaller --test-per-label")
    # An empty folder; a folder that is not there.
    (tmp_path / "empty").mkdir()
    done = gain(str(tmp_path / "empty"), "--arms", "real", cwd=tmp_path)
    assert done.returncode == 2 and "holds no label folder" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    # Unreadable files are counted and skipped, the run goes on (here to its next refusal).
    (short / "a" / "notes.txt").write_text("not an image")
    (short / "b" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n cut short")
    done = gain(str(short), "--arms", "real", "--shots", "5", "--test-per-label", "10",
                 cwd=tmp_path)
    assert "2 file(s) of DATA are not images that can be read, skipped" in done.stderr
    # A service that does not answer: one line, naming it and what to do.
    port = free_port()
    done = gain(str(digits["data"]), "--recipe", "digits", "--url",
                 f"http://127.0.0.1:{port}", "--arms", "real,pool", *FAST, cwd=tmp_path,
                 timeout=120)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert f"the service at http://127.0.0.1:{port} is not reachable" in last
    assert "genaug serve" in last
    # A bad flag: argparse's one line.
    done = gain(str(digits["data"]), "--shots", "0,5", cwd=tmp_path)
    assert done.returncode == 2 and "'0,5' is not a list of whole numbers >= 1" in done.stderr
    done = gain(str(digits["data"]), "--arms", "real,poool", cwd=tmp_path)
    assert done.returncode == 2 and "the arms are real, pool, variants, adapted" in done.stderr
    done = gain(str(digits["data"]), "--min-agreement", "2", cwd=tmp_path)
    assert done.returncode == 2 and "'2' is not an agreement in [-1, 1]; e.g. 0.1" in done.stderr


def test_the_documented_training_function_trains_every_cell(digits: dict[str, Path],
                                                            tmp_path: Path) -> None:
    """docs/gain.md's own training function, as written, through --train."""
    import re

    page = (Path(__file__).resolve().parents[3] / "docs" / "gain.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S)
                if "def train(" in b]
    (tmp_path / "mytrain.py").write_text(block)
    out = tmp_path / "report"
    done = gain(str(digits["data"]), "--arms", "real", "--extra",
                 f"heldout={digits['heldout']}", "--train", "mytrain:train", "--out", str(out),
                 "--shots", "1", "--seeds", "2", "--test-per-label", "20", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "gain.json").read_text())
    assert report["settings"]["train"] == "mytrain:train"
    assert len(report["cells"]) == 4 and all(0 < c["accuracy"] <= 1 for c in report["cells"])
    # A function that cannot be imported: one line.
    done = gain(str(digits["data"]), "--arms", "real", "--train", "nosuch:train", "--out",
                 str(tmp_path / "none"), cwd=tmp_path)
    assert done.returncode == 2 and "cannot import 'nosuch'" in done.stderr
