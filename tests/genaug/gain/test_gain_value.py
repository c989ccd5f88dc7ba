"""``genaug gain`` can tell a gain from no gain, on real digits: held-out real MNIST digits
help one shot per label with their interval above 0; the same digits under shuffled labels
never 'help', and by default they are not mixed at all (their labels disagree with the
shots')."""

from __future__ import annotations

import json
from pathlib import Path

from _gain_helpers import FAST, gain, summary


def test_held_out_real_digits_help_and_shuffled_ones_do_not(digits: dict[str, Path]) -> None:
    out = digits["root"] / "report"
    done = gain(str(digits["data"]), "--arms", "real", "--extra",
                 f"heldout={digits['heldout']}", "--extra", f"shuffled={digits['shuffled']}",
                 "--min-agreement", "-1", "--out", str(out), *FAST, cwd=digits["root"])
    assert done.returncode == 0, done.stderr
    rows = summary(out)
    helped = rows[("heldout", 1)]
    assert helped["verdict"] == "helps" and helped["low"] > 0, helped
    shuffled = rows[("shuffled", 1)]
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


def test_images_whose_labels_disagree_with_the_shots_are_not_mixed(
        digits: dict[str, Path]) -> None:
    """The default guard: shuffled labels' agreement with the shots is under the floor on
    every seed, so those cells train on the shots alone (a gain of exactly 0, said so), while
    the held-out digits are mixed on every seed."""
    out = digits["root"] / "guarded"
    done = gain(str(digits["data"]), "--arms", "real", "--extra",
                f"heldout={digits['heldout']}", "--extra", f"shuffled={digits['shuffled']}",
                "--out", str(out), *FAST, cwd=digits["root"])
    assert done.returncode == 0, done.stderr
    rows = summary(out)
    shuffled, helped = rows[("shuffled", 1)], rows[("heldout", 1)]
    assert shuffled["unmixed"] == 4 and shuffled["mean"] == 0.0, shuffled
    assert shuffled["verdict"] == "no measurable gain"
    assert "(not mixed on 4 of 4 seeds: its images did not agree with the shots' classes)" \
        in done.stdout
    assert helped["unmixed"] == 0 and helped["verdict"] == "helps", helped
    cells = json.loads((out / "gain.json").read_text())["cells"]
    agreements = {c["arm"]: [] for c in cells}
    for c in cells:
        agreements[c["arm"]].append(c.get("agreement"))
    assert agreements["real"] == [None] * 4
    assert all(a >= 0.1 for a in agreements["heldout"]), agreements
    assert all(a < 0.1 for a in agreements["shuffled"]), agreements
