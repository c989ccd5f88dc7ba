from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from genaug.service.pool import LabelStats, PoolError, PoolStore, _spread, choose_label

H = W = 16
PID = "shapes-0123456789ab"


def _images(n: int, value: int = 0) -> np.ndarray:
    """n distinct images: image k has every pixel (value + k) % 256 in channel 0."""
    out = np.zeros((n, H, W, 3), np.uint8)
    out[..., 0] = ((value + np.arange(n)) % 256)[:, None, None]
    out[..., 1] = 7
    return out


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PoolStore]:
    s = PoolStore(tmp_path / "pool.db", capacity_per_label=100)
    yield s
    s.close()


def test_add_and_sample_shapes_dtypes_counts(store: PoolStore) -> None:
    store.add(PID, "I", _images(10), range(100, 110), model_hash="m", next_index=10)
    store.add(PID, "P", _images(10, 50), range(200, 210), model_hash="m", next_index=10)
    sample = store.sample(PID, ["I", "P", "R"], 8, np.random.default_rng(0))
    assert sample.images.shape == (8, H, W, 3) and sample.images.dtype == np.uint8
    assert sample.images.flags.writeable
    assert sample.seeds.dtype == np.int64 and sample.seeds.shape == (8,)
    assert sample.labels == ["I"] * 4 + ["P"] * 4  # grouped, in request order, spread evenly
    np.testing.assert_array_equal(sample.label_indices(["I", "P", "R"]), [0] * 4 + [1] * 4)
    for image, seed, label in zip(sample.images, sample.seeds, sample.labels, strict=True):
        base = 100 if label == "I" else 200
        offset = 0 if label == "I" else 50
        assert image[0, 0, 0] == (seed - base + offset) % 256  # pixels travel with their seed
        assert (image[..., 1] == 7).all()
    assert len(set(sample.seeds.tolist())) == 8
    stats = store.stats(PID, ["I", "P", "R"])
    assert stats["I"] == LabelStats(fill=10, generated=10, served=4, next_index=10, fill_served=4)
    assert stats["R"] == LabelStats()
    assert store.fill(PID) == {"I": 10, "P": 10}
    assert store.fill("other-pool") == {}
    assert store.pools() == [PID]


def test_sample_spreads_and_caps_at_available(store: PoolStore) -> None:
    store.add(PID, "I", _images(2), [1, 2], model_hash="m")
    store.add(PID, "P", _images(30), range(3, 33), model_hash="m")
    sample = store.sample(PID, ["I", "P"], 10)
    assert sample.labels.count("I") == 2 and sample.labels.count("P") == 8
    sample = store.sample(PID, ["I"], 10)  # only distinct images: fewer than asked
    assert len(sample) == 2
    empty = store.sample(PID, ["R"], 10)
    assert len(empty) == 0 and empty.images.shape == (0, 0, 0, 3)
    assert len(store.sample(PID, ["P", "P"], 5)) == 5  # duplicates in the request ignored


def test_least_served_first(store: PoolStore) -> None:
    store.add(PID, "I", _images(12), range(12), model_hash="m")
    rng = np.random.default_rng(1)
    seen: list[int] = []
    for _ in range(3):
        seen += store.sample(PID, ["I"], 4, rng).seeds.tolist()
    assert sorted(seen) == list(range(12))  # every image once before any twice
    assert store.stats(PID)["I"].served == 12


def test_spread_is_even_and_random_in_remainder() -> None:
    rng = np.random.default_rng(0)
    assert _spread(9, [10, 10, 10], rng) == [3, 3, 3]
    assert sorted(_spread(10, [1, 100, 100], rng)) == [1, 4, 5]
    assert _spread(10, [2, 3, 0], rng) == [2, 3, 0]
    assert _spread(0, [5], rng) == [0]
    firsts = {tuple(_spread(1, [5, 5], np.random.default_rng(s))) for s in range(20)}
    assert firsts == {(1, 0), (0, 1)}


def test_persists_across_reopen_and_resumes_next_index(tmp_path: Path) -> None:
    path = tmp_path / "pool.db"
    with PoolStore(path, capacity_per_label=50) as store:
        assert store.next_index(PID, "I") == 0
        store.add(PID, "I", _images(5), range(5), model_hash="m", next_index=5)
        store.sample(PID, ["I"], 2)
        assert store.reserve(PID, "I", 3) == 5
    with PoolStore(path, capacity_per_label=50) as store:
        assert store.next_index(PID, "I") == 8
        assert store.stats(PID)["I"] == LabelStats(5, 5, 2, 8, 2)
        store.add(PID, "I", _images(3), range(5, 8), model_hash="m")  # next_index kept
        store.add(PID, "I", _images(1), [9], model_hash="m", next_index=4)  # never goes back
        assert store.next_index(PID, "I") == 8
        assert sorted(store.sample(PID, ["I"], 100).seeds.tolist()) == [0, 1, 2, 3, 4, 5, 6, 7, 9]
        assert store.integrity_check() == "ok"
    with pytest.raises(PoolError, match="closed"):
        store.fill(PID)


def test_evicts_most_served_then_oldest(tmp_path: Path) -> None:
    with PoolStore(tmp_path / "pool.db", capacity_per_label=4) as store:
        store.add(PID, "I", _images(4), [0, 1, 2, 3], model_hash="m")
        conn = sqlite3.connect(tmp_path / "pool.db")
        conn.execute("UPDATE images SET served = 5 WHERE seed = 2")
        conn.execute("UPDATE images SET served = 3 WHERE seed = 3")
        conn.commit()
        conn.close()
        assert store.add(PID, "I", _images(1), [10], model_hash="m") == 1
        assert sorted(store.sample(PID, ["I"], 10).seeds.tolist()) == [0, 1, 3, 10]
        # now 0, 1, 10 served once, 3 four times: 3 goes, then the oldest of the rest (0)
        assert store.add(PID, "I", _images(2), [11, 12], model_hash="m") == 2
        left = store.sample(PID, ["I"], 10).seeds.tolist()
        assert sorted(left) == [1, 10, 11, 12]
        stats = store.stats(PID)["I"]
        assert stats.fill == 4 and stats.generated == 7 and stats.served == 8
        # a batch larger than capacity keeps capacity images
        store.add(PID, "P", _images(9), range(100, 109), model_hash="m")
        assert store.fill(PID)["P"] == 4
        # pools are separate
        store.add("other", "I", _images(3), [1, 2, 3], model_hash="x")
        assert store.fill(PID)["I"] == 4 and store.fill("other") == {"I": 3}
        assert store.drop_pool("other") == 3 and store.fill("other") == {}
        assert store.integrity_check() == "ok"


def test_add_validates_input(store: PoolStore) -> None:
    with pytest.raises(ValueError, match="uint8"):
        store.add(PID, "I", np.zeros((1, H, W, 3), np.float32), [0], model_hash="m")
    with pytest.raises(ValueError, match=r"\[n, h, w, 3\]"):
        store.add(PID, "I", np.zeros((H, W, 3), np.uint8), [0], model_hash="m")
    with pytest.raises(ValueError, match="2 seeds for 1 images"):
        store.add(PID, "I", _images(1), [0, 1], model_hash="m")
    assert store.fill(PID) == {}


def test_wal_mode_and_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "pool.db"
    with PoolStore(path, capacity_per_label=1):
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(PoolError, match="GENAUG_POOL_PATH"):
        PoolStore(junk, capacity_per_label=1)


def test_threads_write_and_sample_concurrently(store: PoolStore) -> None:
    errors: list[BaseException] = []
    served = [0]

    def writer() -> None:
        try:
            for k in range(20):
                store.add(PID, "I", _images(4), range(4 * k, 4 * k + 4), model_hash="m")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(20):
                served[0] += len(store.sample(PID, ["I"], 3))
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    stats = store.stats(PID)["I"]
    assert stats.generated == 80 and stats.served == served[0] == stats.fill_served


WRITER = """
import sys
import numpy as np
from pathlib import Path
from genaug.service.pool import PoolStore

store = PoolStore(Path(sys.argv[1]), capacity_per_label=10**9)
start = store.next_index("p", "I")
k = start
while True:
    n = 16
    images = np.full((n, 32, 32, 3), k % 256, np.uint8)
    store.add("p", "I", images, range(k, k + n), model_hash="m", next_index=k + n)
    k += n
    if k - start == n:
        print("ready", flush=True)
"""


def test_sigkill_during_writes_leaves_consistent_db(tmp_path: Path) -> None:
    path = tmp_path / "pool.db"
    rng = np.random.default_rng(0)
    for _round in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(float(rng.uniform(0.05, 0.3)))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        assert proc.returncode == -signal.SIGKILL
        with PoolStore(path, capacity_per_label=10**9) as store:
            assert store.integrity_check() == "ok"
            stats = store.stats("p")["I"]
            assert stats.fill == stats.generated == stats.next_index > 0
            assert stats.fill % 16 == 0  # whole batches only
            sample = store.sample("p", ["I"], 10**6)
            assert sorted(sample.seeds.tolist()) == list(range(stats.fill))
            assert (sample.images == (sample.seeds // 16 * 16 % 256)[:, None, None, None]).all()
        conn = sqlite3.connect(path)
        orphans = conn.execute(
            "SELECT (SELECT COUNT(*) FROM image_data WHERE id NOT IN (SELECT id FROM images))"
            " + (SELECT COUNT(*) FROM images WHERE id NOT IN (SELECT id FROM image_data))"
        ).fetchone()[0]
        conn.close()
        assert orphans == 0


def _stats(fill: int, fill_served: int = 0) -> LabelStats:
    return LabelStats(fill=fill, fill_served=fill_served)


def test_choose_label() -> None:
    assert choose_label({"I": _stats(10), "P": _stats(0), "R": _stats(5)}, 100) == "P"
    assert choose_label({"I": _stats(0), "P": _stats(0)}, 100) == "I"  # ties: first
    full = {"I": _stats(100), "P": _stats(100)}
    assert choose_label(full, 100) is None
    assert choose_label(full, 100, {"I": 5.0}) is None
    # demand outweighs a small fill difference, not an empty label vs. a nearly full one
    assert choose_label({"I": _stats(10), "P": _stats(20)}, 100, {"P": 3.0}) == "P"
    assert choose_label({"I": _stats(0), "P": _stats(95)}, 100, {"P": 1.0}) == "I"
    assert choose_label({"I": _stats(10), "P": _stats(20)}, 100, {"P": 3.0, "I": 3.0}) == "I"
    # refresh: a full label worn beyond the threshold is filled again (evicting the most served)
    worn = {"I": _stats(100, 500), "P": _stats(100, 10)}
    assert choose_label(worn, 100, refresh_served=2.0) == "I"
    assert choose_label(worn, 100, refresh_served=10.0) is None
    assert choose_label({}, 100) is None
    with pytest.raises(ValueError):
        choose_label({"I": _stats(0)}, 0)


