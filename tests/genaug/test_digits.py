"""genaug.digits: the fixed splits of scikit-learn's digits, the 64x64 round trip, folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

from genaug import digits


def test_splits_are_fixed_disjoint_stratified_and_cover_the_data() -> None:
    from sklearn.datasets import load_digits

    target = load_digits().target
    parts = {name: digits.split_indices(name) for name in digits.SPLITS}
    assert {k: len(v) for k, v in parts.items()} == {"test": 500, "fewshot": 300,
                                                     "generator": 997}
    union = np.concatenate(list(parts.values()))
    assert len(np.unique(union)) == len(union) == len(target) == 1797
    assert np.bincount(target[parts["test"]]).tolist() == [50] * 10
    assert np.bincount(target[parts["fewshot"]]).tolist() == [30] * 10
    # The permutation is fixed: these are the first test indices for good.
    assert parts["test"][:5].tolist() == digits.split_indices("test")[:5].tolist()
    with pytest.raises(ValueError, match="unknown digits split 'train'"):
        digits.split_indices("train")


def test_round_trip_to_load_digits_scale() -> None:
    images8, labels = digits.load_split8("test")
    images = digits.to_rgb64(images8)
    assert images.shape == (500, 64, 64, 3) and images.dtype == np.uint8
    assert (images[..., 0] == images[..., 2]).all()  # grey
    back = digits.to_digits8(images)
    assert back.shape == (500, 64)
    assert np.abs(back - images8.reshape(500, 64)).mean() < 1.0  # of 0..16
    # The judge recognises held-out real digits after the round trip (the bar generated
    # images are held to): measured 0.966.
    assert digits.fidelity(images, labels) > 0.93
    with pytest.raises(ValueError, match="8x8 blocks"):
        digits.to_digits8(np.zeros((1, 60, 60, 3), np.uint8))


def test_write_split_folders(tmp_path: Path) -> None:
    written = digits.write_split_folders(tmp_path, ["fewshot"], per_class=5, seed=1)
    folder = written["fewshot"]
    assert folder == tmp_path / "fewshot"
    counts = {d.name: len(list(d.glob("*.png"))) for d in sorted(folder.iterdir())}
    assert counts == {label: 5 for label in digits.LABELS}
    fewshot = set(digits.split_indices("fewshot").tolist())
    names = {int(p.stem) for p in folder.glob("*/*.png")}
    assert names <= fewshot  # file names are load_digits indices
    again = digits.write_split_folders(tmp_path / "b", ["fewshot"], per_class=5, seed=1)
    assert {int(p.stem) for p in again["fewshot"].glob("*/*.png")} == names
    other = digits.write_split_folders(tmp_path / "c", ["fewshot"], per_class=5, seed=2)
    assert {int(p.stem) for p in other["fewshot"].glob("*/*.png")} != names


def test_prompts_are_distinct_words() -> None:
    assert digits.PROMPTS["3"] == "a handwritten three"
    assert len(set(digits.PROMPTS.values())) == 10
