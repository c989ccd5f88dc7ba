"""The host reservoir on its own: a ring per class, draws never torn nor of another class, and
its size from a byte budget."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from genaug.torch.reservoir import MAX_SLOTS, HostReservoir, slots_for


def _images(n: int, value: int) -> np.ndarray:
    return np.full((n, 8, 8, 3), value, np.uint8)


def test_a_class_is_a_ring_and_draws_come_from_its_filled_slots() -> None:
    res = HostReservoir(3, 4, (8, 8, 3))
    rng = np.random.default_rng(0)
    assert res.draw(1, rng) is None and res.draw_any(rng) is None
    assert res.write(1, _images(6, 7)) == 4  # the last 4 of a batch larger than the ring
    res.write(1, _images(1, 9))  # replaces the oldest
    assert res.fill_counts().tolist() == [0, 4, 0] and res.written == 5
    seen = {int(res.draw(1, rng)[0, 0, 0]) for _ in range(200)}  # type: ignore[index]
    assert seen == {7, 9}
    got = res.draw_any(rng)
    assert got is not None and got[1] == 1 and got[0].shape == (8, 8, 3)
    assert res.nbytes == 3 * 4 * 8 * 8 * 3


def test_draws_are_balanced_over_the_classes_that_hold_images() -> None:
    res = HostReservoir(3, 64, (8, 8, 3))
    res.write(0, _images(64, 1))
    res.write(2, _images(1, 3))  # one image only: still a third of the draws
    rng = np.random.default_rng(1)
    labels = [res.draw_any(rng)[1] for _ in range(3000)]  # type: ignore[index]
    assert labels.count(1) == 0
    assert abs(labels.count(2) - 1500) < 120 and abs(labels.count(0) - 1500) < 120


def test_a_draw_is_never_half_written_nor_of_another_class() -> None:
    """A writer replaces class c's images with ones whose every pixel is ``c * 50 + k % 50``
    while a reader draws: each drawn image is one value throughout, of its class's range."""
    stop = threading.Event()

    def writer() -> None:
        k = 0
        while not stop.is_set():
            c = k % 4
            res.write(c, _images(3, c * 50 + k % 50).repeat(2, axis=1).repeat(2, axis=2))
            k += 1

    res = HostReservoir(4, 8, (16, 16, 3))
    thread = threading.Thread(target=writer)
    thread.start()
    rng = np.random.default_rng(2)
    try:
        drawn = 0
        while drawn < 5000:
            got = res.draw_any(rng)
            if got is None:
                continue
            image, label = got
            values = np.unique(image)
            assert values.size == 1 and values[0] // 50 == label, (values, label)
            drawn += 1
    finally:
        stop.set()
        thread.join()


def test_bad_writes_are_refused_with_what_fits() -> None:
    res = HostReservoir(2, 4, (8, 8, 1))
    with pytest.raises(ValueError, match="outside"):
        res.write(2, np.zeros((1, 8, 8, 1), np.uint8))
    with pytest.raises(ValueError, match=r"expected uint8 \[n, 8, 8, 1\]"):
        res.write(0, np.zeros((1, 8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        res.write(0, np.zeros((1, 8, 8, 1), np.float32))


def test_the_budget_sets_the_slots_split_over_the_workers() -> None:
    one = 10 * 64 * 64 * 3
    assert slots_for(256 * 2**20, num_classes=10, image_shape=(64, 64, 3)) == min(
        MAX_SLOTS, 256 * 2**20 // one)
    assert slots_for(100 * one, num_classes=10, image_shape=(64, 64, 3), shares=4) == 25
    assert slots_for(10, num_classes=10, image_shape=(64, 64, 3)) == 1  # never 0
