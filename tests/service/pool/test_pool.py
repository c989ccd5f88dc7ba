"""The pool store, one suite for both backends (SQLite file, real PostgreSQL server)."""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from _postgres import shared_cluster

from genaug.service.pool.choice import choose_label
from genaug.service.pool.draw import spread
from genaug.service.pool.open import check_pool_settings, open_pool, replica_info
from genaug.service.pool.sqlite import SqlitePoolStore
from genaug.service.pool.store import PoolStore
from genaug.service.pool.tables import POOL_TABLES
from genaug.service.pool.types import (
    SCHEMA_VERSION,
    LabelStats,
    PoolConfigError,
    PoolError,
    PoolSchemaError,
    parse_partition,
)
from genaug.service.settings import Settings

H = W = 16
PID = "shapes-0123456789ab"
DATA = Path(__file__).parent / "data"
Opener = Callable[..., PoolStore]


def _images(n: int, value: int = 0, channels: int = 3) -> np.ndarray:
    """n distinct images: image k has every pixel (value + k) % 256 in channel 0."""
    out = np.zeros((n, H, W, channels), np.uint8)
    out[..., 0] = ((value + np.arange(n)) % 256)[:, None, None]
    if channels > 1:
        out[..., 1] = 7
    return out


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
    assert stats["I"].newest is not None and abs(stats["I"].newest - time.time()) < 60
    assert stats["I"] == LabelStats(fill=10, generated=10, served=4, next_index=10, fill_served=4,
                                 accepted=10, newest=stats["I"].newest)
    assert stats["R"] == LabelStats()
    assert store.fill(PID) == {"I": 10, "P": 10}
    assert store.fill("other-pool") == {}
    assert store.reads.pools() == [PID]


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


def test_sample_now_answers_on_this_thread_or_not_at_all(
    store: PoolStore, backend: str, target: str
) -> None:
    """The service's event loop reads small samples itself, but must never wait for a lock:
    while another process holds SQLite's write lock ``sample_now`` says ``None`` at once and
    counts nothing; a networked backend always says ``None`` (the caller uses a thread)."""
    store.add(PID, "I", _images(6), range(6), model_hash="m")
    if backend != "sqlite":
        assert store.sample_now(PID, ["I"], 2) is None
        return
    first = store.sample_now(PID, ["I"], 3)
    assert first is not None and len(first) == 3
    assert store.stats(PID)["I"].served == 3  # counted, exactly as sample() counts
    # its connection never runs a WAL checkpoint (file I/O the event loop must not do)
    nowait = store._local.conn_nowait  # type: ignore[attr-defined]
    assert nowait.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    other = sqlite3.connect(target, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a writer in another process, say a batch being stored
    try:
        started = time.monotonic()
        assert store.sample_now(PID, ["I"], 3) is None
        assert time.monotonic() - started < 1.0  # did not wait out the 30 s busy timeout
        assert store.fill(PID) == {"I": 6}  # reads go on meanwhile
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.stats(PID)["I"].served == 3  # the refused sample counted nothing
    second = store.sample_now(PID, ["I"], 3)
    assert second is not None  # least served first: the other three
    assert sorted(first.seeds.tolist() + second.seeds.tolist()) == list(range(6))


def test_spread_is_even_and_random_in_remainder() -> None:
    rng = np.random.default_rng(0)
    assert spread(9, [10, 10, 10], rng) == [3, 3, 3]
    assert sorted(spread(10, [1, 100, 100], rng)) == [1, 4, 5]
    assert spread(10, [2, 3, 0], rng) == [2, 3, 0]
    assert spread(0, [5], rng) == [0]
    firsts = {tuple(spread(1, [5, 5], np.random.default_rng(s))) for s in range(20)}
    assert firsts == {(1, 0), (0, 1)}


def test_persists_across_reopen_and_resumes_next_index(open_store: Opener) -> None:
    store = open_store(capacity_per_label=50)
    assert store.stats(PID, ["I"])["I"].next_index == 0
    store.add(PID, "I", _images(5), range(5), model_hash="m", next_index=5)
    store.sample(PID, ["I"], 2)
    res = store.reserve(PID, "I", 3, target=50)
    assert res is not None and res.indices == [5, 6, 7]
    store.close()
    store = open_store(capacity_per_label=50)
    assert store.stats(PID, ["I"])["I"].next_index == 8
    # a closed store's leases go
    assert replace(store.stats(PID)["I"], newest=None) == LabelStats(5, 5, 2, 8, 2, accepted=5)
    store.add(PID, "I", _images(3), range(5, 8), model_hash="m")  # next_index kept
    store.add(PID, "I", _images(1), [9], model_hash="m", next_index=4)  # never goes back
    assert store.stats(PID, ["I"])["I"].next_index == 8
    assert sorted(store.sample(PID, ["I"], 100).seeds.tolist()) == [0, 1, 2, 3, 4, 5, 6, 7, 9]
    assert store.integrity_check() == "ok"
    store.close()
    with pytest.raises(PoolError, match="closed"):
        store.fill(PID)


def _serve(store: PoolStore, counts: dict[int, int]) -> None:
    """Set the served count of the images with these seeds (white box, both backends)."""
    with store._tx(write=True) as conn:
        for seed, served in counts.items():
            store._exec(conn, "UPDATE images SET served = ? WHERE seed = ?", (served, seed))
        store._exec(conn, "UPDATE counters SET served_total = served_total + ?",
                    (sum(counts.values()),))


def test_evicts_most_served_then_oldest(open_store: Opener) -> None:
    store = open_store(capacity_per_label=4)
    store.add(PID, "I", _images(4), [0, 1, 2, 3], model_hash="m")
    _serve(store, {2: 5, 3: 3})
    assert store.add(PID, "I", _images(1), [10], model_hash="m") == 1
    assert sorted(store.sample(PID, ["I"], 10).seeds.tolist()) == [0, 1, 3, 10]
    # now 0, 1, 10 served once, 3 four times: 3 goes, then the oldest of the rest (0)
    assert store.add(PID, "I", _images(2), [11, 12], model_hash="m") == 2
    left = store.sample(PID, ["I"], 10).seeds.tolist()
    assert sorted(left) == [1, 10, 11, 12]
    stats = store.stats(PID)["I"]
    assert stats.fill == 4 and stats.generated == 7 and stats.served == 16
    # a batch larger than capacity keeps capacity images
    store.add(PID, "P", _images(9), range(100, 109), model_hash="m")
    assert store.fill(PID)["P"] == 4
    # pools are separate
    store.add("other", "I", _images(3), [1, 2, 3], model_hash="x")
    store.set_target("other", ["I"], 3)
    assert store.fill(PID)["I"] == 4 and store.fill("other") == {"I": 3}
    assert store.drop_pool("other") == 3 and store.fill("other") == {}
    assert "other" not in store.reads.pools() and store.stats("other") == {}
    assert store.integrity_check() == "ok"


def test_every_table_with_a_pool_id_is_dropped_with_the_pool(store: PoolStore) -> None:
    """The registry :data:`POOL_TABLES` is the schema's: each backend's tables with a
    ``pool_id`` column are the images, the fill jobs (kept as history) and the registry's."""
    with store.unit_of_work(write=False) as uow:
        if isinstance(store, SqlitePoolStore):
            tables = [str(r[0]) for r in uow.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()]
            keyed = {t for t in tables
                     if any(c[1] == "pool_id"
                            for c in uow.execute(f"PRAGMA table_info({t})").fetchall())}
        else:
            keyed = {str(r[0]) for r in uow.execute(
                "SELECT table_name FROM information_schema.columns WHERE column_name ="
                " 'pool_id' AND table_schema = current_schema()").fetchall()}
    assert keyed == {"images", "jobs", *POOL_TABLES}


def test_add_validates_input(store: PoolStore) -> None:
    with pytest.raises(ValueError, match="uint8"):
        store.add(PID, "I", np.zeros((1, H, W, 3), np.float32), [0], model_hash="m")
    with pytest.raises(ValueError, match=r"\[n, h, w, c\]"):
        store.add(PID, "I", np.zeros((H, W, 3), np.uint8), [0], model_hash="m")
    with pytest.raises(ValueError, match="c 1 or 3"):
        store.add(PID, "I", np.zeros((1, H, W, 4), np.uint8), [0], model_hash="m")
    with pytest.raises(ValueError, match="2 seeds for 1 images"):
        store.add(PID, "I", _images(1), [0, 1], model_hash="m")
    assert store.fill(PID) == {}


def test_one_channel_images_sources_and_columns(store: PoolStore) -> None:
    res = store.reserve(PID, "depth", 3, target=10)
    assert res is not None
    store.add(PID, "depth", _images(3, channels=1), [5, 6, 7], model_hash="m",
              reservation=res, sources=["aa", "bb", None], scheduler="euler",
              adapter="lora", adapter_scale=0.5)
    sample = store.sample(PID, ["depth"], 3)
    assert sample.images.shape == (3, H, W, 1)
    assert sorted(sample.sources or [], key=str) == sorted(["aa", "bb", None], key=str)
    for image, seed in zip(sample.images, sample.seeds, strict=True):
        assert image[0, 0, 0] == seed - 5
    with store._tx(write=False) as conn:
        rows = store._exec(conn, "SELECT DISTINCT scheduler, adapter, adapter_scale, channels"
                                 " FROM images").fetchall()
    assert [tuple(r) for r in rows] == [("euler", "lora", 0.5, 1)]
    assert [label for label, _, _ in store.reads.iter_images(PID)] == ["depth"] * 3


def test_reserve_counts_stored_and_in_flight_as_one(store: PoolStore) -> None:
    a = store.reserve(PID, "I", 4, target=6)
    b = store.reserve(PID, "I", 4, target=6)
    assert a is not None and b is not None
    assert (a.indices, b.indices) == ([0, 1, 2, 3], [4, 5])  # capped at the room left
    assert store.reserve(PID, "I", 4, target=6) is None
    assert store.stats(PID, ["I"])["I"] == LabelStats(next_index=6, reserved=6)
    store.add(PID, "I", _images(4), [10, 11, 12, 13], model_hash="m", reservation=a)
    assert store.stats(PID, ["I"])["I"].reserved == 2
    assert store.reserve(PID, "I", 4, target=6) is None  # stored + in flight still 6
    # a retried add stores nothing twice (its plan indices are already there)
    store.add(PID, "I", _images(4), [10, 11, 12, 13], model_hash="m", reservation=a)
    assert store.fill(PID) == {"I": 4}
    # a failed batch gives its room back; its indices stay a gap, never reused
    store.release(b)
    c = store.reserve(PID, "I", 4, target=6)
    assert c is not None and c.indices == [6, 7]
    assert store.reads.plan_indices(PID) == {"I": [0, 1, 2, 3]}
    assert store.stats(PID, ["I"])["I"].generated == 4


def test_targets_are_shared_and_never_lowered(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    a.set_target(PID, ["I", "P"], 5)
    b.set_target(PID, ["I"], 3)
    assert {k: s.target for k, s in b.stats(PID, ["I", "P", "R"]).items()} == {
        "I": 5, "P": 5, "R": 0}


def test_partition_takes_indices_congruent_to_i_mod_n(open_store: Opener) -> None:
    plain = open_store()
    plain.add(PID, "I", _images(5), range(5), model_hash="m", next_index=37)
    plain.close()
    one = open_store(partition=(1, 4))
    first = one.reserve(PID, "I", 3, target=100)
    second = one.reserve(PID, "I", 2, target=100)
    assert first is not None and second is not None
    assert first.indices == [37, 41, 45] and second.indices == [49, 53]
    zero = open_store(partition=(0, 4))  # continues after the highest index handed out
    res = zero.reserve(PID, "I", 2, target=100)
    assert res is not None and res.indices == [56, 60]


def test_parse_partition_and_settings_checks(tmp_path: Path) -> None:
    assert parse_partition(None) is None and parse_partition("2/3") == (2, 3)
    for bad in ("3/3", "1", "-1/2", "a/b", "1/0"):
        with pytest.raises(PoolConfigError, match="GENAUG_REPLICA"):
            parse_partition(bad)
    check_pool_settings(Settings(pool_url="postgres://u:p@h/db"))
    with pytest.raises(PoolConfigError, match="scheme 'mysql'") as info:
        check_pool_settings(Settings(pool_url="mysql://u:p@h/db"))
    assert "\n" not in str(info.value) and "p@h" not in str(info.value)
    with pytest.raises(PoolConfigError, match="both GENAUG_POOL_URL and GENAUG_POOL_PATH"):
        check_pool_settings(Settings(pool_url="postgresql://h/db", pool_path=tmp_path / "x"))
    assert replica_info(Settings(replica="1/2")) == {"partition": "1/2",
                                                     "pool_backend": "sqlite",
                                                     "pregenerate": True, "role": "all"}
    assert replica_info(Settings(pregenerate=False))["pregenerate"] is False
    assert replica_info(Settings(pool_url="postgresql://h/db"))["pool_backend"] == "postgresql"


def test_dead_owners_reservations_expire_and_are_planned_again(open_store: Opener) -> None:
    dead = open_store(lease_s=0.5)
    alive = open_store(lease_s=0.5)
    lost = dead.reserve(PID, "I", 4, target=4)
    assert lost is not None
    dead._stop_heartbeat.set()  # the process is gone: nobody renews its lease
    assert alive.reserve(PID, "I", 4, target=4) is None
    mine = alive.reserve(PID, "I", 1, target=5)  # the live store's heartbeat keeps it
    assert mine is not None
    deadline = time.monotonic() + 10
    again = None
    while again is None and time.monotonic() < deadline:
        time.sleep(0.2)
        again = alive.reserve(PID, "I", 4, target=5)
    assert again is not None and again.indices == [5, 6, 7, 8]  # new indices, not 0..3
    assert alive.stats(PID, ["I"])["I"].reserved == 5


def test_close_gives_back_its_reservations(open_store: Opener) -> None:
    a = open_store()
    assert a.reserve(PID, "I", 3, target=3) is not None
    a.close()
    assert open_store().reserve(PID, "I", 3, target=3) is not None


def test_concurrent_planners_stop_exactly_at_target_without_repeats(
    open_store: Opener,
) -> None:
    stores = [open_store() for _ in range(4)]
    errors: list[BaseException] = []

    def planner(store: PoolStore, seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            while True:
                res = store.reserve(PID, "I", int(rng.integers(1, 5)), target=60)
                if res is None:
                    return
                time.sleep(float(rng.uniform(0, 0.01)))
                store.add(PID, "I", _images(res.count), [1000 + i for i in res.indices],
                          model_hash="m", reservation=res)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=planner, args=(s, i)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    stats = stores[0].stats(PID, ["I"])["I"]
    assert stats.fill == stats.generated == 60 and stats.reserved == 0
    assert stores[0].reads.plan_indices(PID)["I"] == list(range(60))


def test_newer_schema_is_refused_with_a_clear_message(open_store: Opener) -> None:
    store = open_store()
    store.add(PID, "I", _images(1), [1], model_hash="m")
    with store._tx(write=True) as conn:
        store._exec(conn, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    store.close()
    with pytest.raises(PoolSchemaError, match="schema version 99, newer than this genaug") as e:
        open_store()
    assert "upgrade genaug" in str(e.value) and "\n" not in str(e.value)


def test_a_version_1_file_is_upgraded_in_place_and_keeps_its_images(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    shutil.copy(DATA / "pool_v1.db", path)  # written by genaug 0.1's PoolStore (schema v1)
    pid = "shapes-361f7691b896"
    with open_pool(path, capacity_per_label=100) as store:
        stats = store.stats(pid)
        assert {k: (s.fill, s.generated, s.next_index) for k, s in stats.items()} == {
            "circle": (3, 3, 3), "square": (2, 2, 2)}
        assert stats["circle"].served == 1
        sample = store.sample(pid, ["circle", "square"], 10)
        assert sorted(sample.seeds.tolist()) == [1000, 1001, 1002, 1100, 1101]
        assert sample.images.shape == (5, 8, 8, 3)
        for image, seed in zip(sample.images, sample.seeds, strict=True):
            assert (image[..., 0] == seed - 1000).all()
        res = store.reserve(pid, "circle", 2, target=5)  # reservations work on it now
        assert res is not None and res.indices == [3, 4]
        assert store.integrity_check() == "ok"
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
        str(SCHEMA_VERSION),)
    assert conn.execute("SELECT DISTINCT channels, scheduler FROM images").fetchall() == [
        (3, "default")]
    # schema 4's provenance: not recorded for images stored before, never guessed
    assert conn.execute("SELECT DISTINCT steps, guidance, strength, adapter_hash, judge_key,"
                        " judge_settings FROM images").fetchall() == [(None,) * 6]
    assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone() == (0,)
    conn.close()


def test_wal_mode_and_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "pool.db"
    with open_pool(path, capacity_per_label=1):
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(PoolError, match="GENAUG_POOL_PATH"):
        open_pool(junk, capacity_per_label=1)


def test_postgres_connection_errors_are_one_clear_line() -> None:
    cluster = shared_cluster()
    with pytest.raises(PoolError, match="cannot connect") as info:
        open_pool(cluster.url(password="wrong"), capacity_per_label=1)
    message = str(info.value)
    assert "password" in message and "\n" not in message and "wrong" not in message
    with pytest.raises(PoolError, match="cannot connect") as info:
        open_pool("postgresql://genaug:x@127.0.0.1:1/none", capacity_per_label=1)
    assert "GENAUG_POOL_URL" in str(info.value) and "\n" not in str(info.value)


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
from genaug.service.pool.open import open_pool

store = open_pool(Path(sys.argv[1]), capacity_per_label=10**9)
start = store.stats("p", ["I"])["I"].next_index
k = start
while True:
    n = 16
    images = np.full((n, 32, 32, 3), k % 256, np.uint8)
    store.add("p", "I", images, range(k, k + n), model_hash="m", next_index=k + n)
    k += n
    if k - start == n:
        print("ready", flush=True)
"""


def test_sigkill_during_writes_leaves_consistent_db(tmp_path: Path) -> None:  # SQLite WAL
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
        with open_pool(path, capacity_per_label=10**9) as store:
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




def test_one_factory_builds_every_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """open_pool is the only place a backend is constructed: open_pool_store hands it the
    settings' values (two factories once drifted: a timeout reached only one of them)."""
    import ast

    import genaug.service.pool.open as pool_open
    from genaug.service.settings import Settings

    service = Path(pool_open.__file__).resolve().parents[1]
    builders = {"SqlitePoolStore", "PostgresPoolStore"}
    built_in = {
        str(path.relative_to(service))
        for path in service.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in builders
    }
    assert built_in == {"pool/open.py"}
    calls: list[tuple[object, dict[str, object]]] = []
    monkeypatch.setattr(pool_open, "open_pool", lambda target, **kw: calls.append((target, kw)))
    pool_open.open_pool_store(Settings(pool_path=tmp_path / "p.db", replica="1/3",
                                       pool_lease_s=7, pool_capacity_per_label=9))
    assert calls == [(tmp_path / "p.db", {"capacity_per_label": 9, "partition": (1, 3),
                                          "lease_s": 7.0})]


def test_seeds_as_the_planner_draws_them_round_trip_exactly(store: PoolStore) -> None:
    """The planner's seeds are 63-bit (a BLAKE2b hash cut to 63 bits): every one of them goes
    in and comes back exactly, through sampling, browsing, the pixels by seed and a verdict,
    on both backends. (Seeds near 2**63 are where a float, or a JSON number read by a browser,
    loses digits.)"""
    from genaug.service.recipes.load import load_recipes

    recipe = load_recipes(Path(__file__).parents[3] / "recipes" / "digits.yaml")["digits"]
    seeds = [recipe.plan("3", k).seed for k in range(12)]
    assert max(seeds) > 2**53 and max(seeds) < 2**63  # what the planner really draws
    store.add(PID, "3", _images(12), seeds, model_hash="m", next_index=12)

    sampled = store.sample(PID, ["3"], 12)
    assert sorted(sampled.seeds.tolist()) == sorted(seeds)
    page = store.curation.browse(PID, "3", rejected=False, limit=50)
    assert sorted(image.seed for image in page.images) == sorted(seeds)
    for k, seed in enumerate(seeds):
        pixels = store.curation.image(PID, "3", seed)
        assert pixels is not None and pixels[0, 0, 0] == k  # the pixels of exactly that seed
    assert store.curation.image(PID, "3", seeds[0] + 1) is None  # one off is another image: none

    result = store.curation.verdict(PID, "3", [seeds[5]], keep=False)
    assert result.changed == [seeds[5]] and not result.unknown
    assert seeds[5] not in store.sample(PID, ["3"], 12).seeds.tolist()
    assert store.curation.verdict(PID, "3", [seeds[5]], keep=True).changed == [seeds[5]]
