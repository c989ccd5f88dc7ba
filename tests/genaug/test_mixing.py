"""The default synthetic share: half at one or two real images per class, falling after."""

from __future__ import annotations

import math

import pytest

from genaug.mixing import MAX_SHARE, default_share, resolve_share


def test_the_share_is_half_at_the_fewest_shots_and_falls_as_real_data_grows() -> None:
    assert default_share(0) == default_share(1) == default_share(2) == MAX_SHARE == 0.5
    assert default_share(5) == pytest.approx(2 / 7)
    assert default_share(10) == pytest.approx(1 / 6)
    shares = [default_share(k) for k in range(1, 500)]
    assert all(a >= b for a, b in zip(shares, shares[1:], strict=False))
    assert 0 < default_share(10_000) < 0.001


def test_auto_needs_the_real_images_per_class_and_numbers_are_checked() -> None:
    assert resolve_share("auto", real_per_class=10) == pytest.approx(1 / 6)
    assert resolve_share(0.3, real_per_class=None) == 0.3
    with pytest.raises(ValueError, match="p='auto' needs real_per_class"):
        resolve_share("auto", real_per_class=None)
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="within"):
            resolve_share(bad, real_per_class=None)
    with pytest.raises(ValueError, match="'auto'"):
        resolve_share("half", real_per_class=3)
    with pytest.raises(ValueError, match="real_per_class"):
        default_share(-1)
