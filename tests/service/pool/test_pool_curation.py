"""Curation in the pool store, both backends (SQLite file, real PostgreSQL server): the judge's
scores and keep flags, a person's verdicts, what targets count, browsing, the v2 -> v3 upgrade."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from _postgres import back_to_version, shared_cluster, stored_schema_version

from genaug.service.jobs.queries import JobQueries
from genaug.service.pool.open import open_pool
from genaug.service.pool.store import PoolStore
from genaug.service.pool.types import SCHEMA_VERSION

H = W = 8
PID = "digits-0123456789ab"
DATA = Path(__file__).parent / "data"
Opener = Callable[..., PoolStore]


def _images(n: int, value: int = 0) -> np.ndarray:
    """n distinct one-channel images: image k has every pixel (value + k) % 256."""
    out = np.zeros((n, H, W, 1), np.uint8)
    out[..., 0] = ((value + np.arange(n)) % 256)[:, None, None]
    return out


def _sampled_seeds(store: PoolStore, label: str, rounds: int = 5) -> set[int]:
    seen: set[int] = set()
    for _ in range(rounds):
        seen |= set(store.sample(PID, [label], 100).seeds.tolist())
    return seen


def test_scores_stored_and_judge_rejected_never_sampled(store: PoolStore) -> None:
    scores = [0.9, 0.1, 0.8, 0.2, 0.7, 0.3]
    keep = [s >= 0.5 for s in scores]
    store.add(PID, "3", _images(6), range(300, 306), model_hash="m", scores=scores, keep=keep)
    store.add(PID, "3", _images(2, 10), [310, 311], model_hash="m", next_index=8)  # unjudged
    assert _sampled_seeds(store, "3") == {300, 302, 304, 310, 311}
    stats = store.stats(PID, ["3"])["3"]
    assert (stats.fill, stats.accepted, stats.rejected, stats.rejected_by_person) == (5, 5, 3, 0)
    assert (stats.generated, stats.judged_total, stats.accepted_total) == (8, 6, 3)
    assert store.fill(PID) == {"3": 5}

    accepted = store.curation.browse(PID, "3", rejected=False, offset=0, limit=10)
    assert accepted.total == 5
    assert [(i.seed, i.score) for i in accepted.images] == [  # least-scored first, unjudged last
        (304, pytest.approx(0.7)), (302, pytest.approx(0.8)), (300, pytest.approx(0.9)),
        (310, None), (311, None)]
    rejected = store.curation.browse(PID, "3", rejected=True, offset=1, limit=1)
    assert rejected.total == 3 and [i.seed for i in rejected.images] == [303]
    assert rejected.images[0].rejected_by == "judge" and not rejected.images[0].accepted
    assert rejected.images[0].as_dict()["score"] == pytest.approx(0.2)
    image = store.curation.image(PID, "3", 303)  # a rejected image's pixels can still be looked at
    assert image is not None and image.shape == (H, W, 1) and (image == 3).all()
    assert store.curation.image(PID, "3", 999) is None
    assert sorted(s for _, s, _ in store.reads.iter_images(PID)) == [300, 302, 304, 310, 311]
    assert len(list(store.reads.iter_images(PID, include_rejected=True))) == 8


def test_add_checks_scores_and_keep(store: PoolStore) -> None:
    with pytest.raises(ValueError, match="keep flags need the judge's scores"):
        store.add(PID, "3", _images(1), [1], model_hash="m", keep=[True])
    with pytest.raises(ValueError, match="2 scores and 1 keep flags for 1 images"):
        store.add(PID, "3", _images(1), [1], model_hash="m", scores=[0.1, 0.2], keep=[True])
    with pytest.raises(ValueError, match="finite"):
        store.add(PID, "3", _images(1), [1], model_hash="m", scores=[float("nan")])
    assert store.fill(PID) == {}


def test_targets_count_accepted_images(store: PoolStore) -> None:
    res = store.reserve(PID, "5", 4, target=4)
    assert res is not None and res.count == 4
    store.add(PID, "5", _images(4), range(500, 504), model_hash="m", reservation=res,
              scores=[0.9, 0.1, 0.9, 0.1], keep=[True, False, True, False])
    res = store.reserve(PID, "5", 10, target=4)  # 2 accepted: room for 2 more, not 0
    assert res is not None and res.count == 2 and res.indices == [4, 5]
    store.add(PID, "5", _images(2, 4), [504, 505], model_hash="m", reservation=res,
              scores=[0.9, 0.9], keep=[True, True])
    assert store.reserve(PID, "5", 10, target=4) is None
    assert store.curation.verdict(PID, "5", [500], keep=False).changed == [500]
    res = store.reserve(PID, "5", 10, target=4)  # a person's reject makes room too
    assert res is not None and res.count == 1


def test_rejected_images_are_bounded_oldest_first_and_lifetime_counters_stay(
    open_store: Opener,
) -> None:
    store = open_store(capacity_per_label=3)
    store.add(PID, "7", _images(3), [1, 2, 3], model_hash="m", scores=[0.9] * 3)
    evicted = store.add(PID, "7", _images(5, 3), range(4, 9), model_hash="m",
                        scores=[0.0] * 5, keep=[False] * 5)
    assert evicted == 2
    stats = store.stats(PID)["7"]
    assert (stats.accepted, stats.rejected, stats.judged_total, stats.accepted_total) == (
        3, 3, 8, 3)
    page = store.curation.browse(PID, "7", rejected=True, offset=0, limit=10)
    assert sorted(i.seed for i in page.images) == [6, 7, 8]  # 4 and 5 (oldest) went
    assert _sampled_seeds(store, "7") == {1, 2, 3}  # accepted ones kept their room


def test_person_rejects_and_restores(store: PoolStore) -> None:
    store.add(PID, "2", _images(4), [20, 21, 22, 23], model_hash="m",
              scores=[0.9, 0.8, 0.1, 0.2], keep=[True, True, False, False])
    result = store.curation.verdict(PID, "2", [20, 22], keep=False)
    assert (result.changed, result.unchanged, result.unknown) == ([20, 22], [], [])
    assert _sampled_seeds(store, "2") == {21}
    stats = store.stats(PID)["2"]
    assert (stats.accepted, stats.rejected, stats.rejected_by_person) == (1, 1, 2)
    assert stats.accepted_total == 2  # the judge's count: a person's verdict leaves it be
    page = store.curation.browse(PID, "2", rejected=True, offset=0, limit=10)
    assert {i.seed: i.rejected_by for i in page.images} == {20: "person", 22: "person",
                                                           23: "judge"}

    # unknown seeds: nothing applied, the unknown ones listed
    result = store.curation.verdict(PID, "2", [23, 99, 98], keep=True)
    assert not result.applied and result.unknown == [99, 98] and result.changed == []
    assert _sampled_seeds(store, "2") == {21}
    assert store.curation.verdict(PID, "9", [20], keep=True).unknown == [20]  # seeds are per label

    # restore overrides the judge's reject; restoring a judge-kept image clears the reject
    result = store.curation.verdict(PID, "2", [20, 23, 21], keep=True)
    assert (result.changed, result.unchanged) == ([20, 23], [21])
    assert _sampled_seeds(store, "2") == {20, 21, 23}
    verdicts = {i.seed: i.verdict for i in store.curation.browse(PID, "2", rejected=False).images}
    assert verdicts == {20: None, 21: None, 23: "restore"}
    stats = store.stats(PID)["2"]
    assert (stats.accepted, stats.rejected, stats.rejected_by_person) == (3, 0, 1)
    assert store.curation.verdict(PID, "2", [23], keep=False).changed == [23]  # a restore undone
    assert _sampled_seeds(store, "2") == {20, 21}


def test_63_bit_seeds_round_trip_exactly(store: PoolStore, shapes_recipe: str) -> None:
    """Seeds as the planner draws them (BLAKE2b cut to 63 bits), and the edges of that range:
    stored, listed, judged by a person and read back digit for digit on both backends (a
    float anywhere on the way would merge 2**53 and 2**53 + 1)."""
    from genaug.service.intake.fields import SEED_MAX
    from genaug.service.recipes.load import parse_recipes

    recipe = parse_recipes(shapes_recipe, path=Path("recipes.yaml"))["shapes"]
    planned = [item.seed for item in recipe.plan_batch("circle", 0, 4)]
    seeds = [SEED_MAX, SEED_MAX - 1, 2**53 + 1, 2**53, *planned]
    store.add(PID, "5", _images(len(seeds), 50), seeds, model_hash="m",
              scores=[0.5] * len(seeds))
    page = store.curation.browse(PID, "5", rejected=False)
    assert [i.seed for i in page.images] == seeds and _sampled_seeds(store, "5") == set(seeds)
    assert store.curation.verdict(PID, "5", [2**53 + 1, SEED_MAX], keep=False).changed == [
        2**53 + 1, SEED_MAX]
    assert _sampled_seeds(store, "5") == set(seeds) - {2**53 + 1, SEED_MAX}
    rejected = store.curation.browse(PID, "5", rejected=True)
    assert [(i.seed, i.rejected_by) for i in rejected.images] == [
        (SEED_MAX, "person"), (2**53 + 1, "person")]
    for k, seed in enumerate(seeds):
        image = store.curation.image(PID, "5", seed)
        assert image is not None and int(image[0, 0, 0]) == 50 + k


def test_browse_pages_through_a_label(open_store: Opener) -> None:
    store = open_store(capacity_per_label=200)
    store.add(PID, "1", _images(120), range(1000, 1120), model_hash="m",
              scores=np.linspace(0.0, 1.0, 120), keep=[True] * 120)
    seeds: list[int] = []
    for offset in range(0, 120, 50):
        page = store.curation.browse(PID, "1", rejected=False, offset=offset, limit=50)
        assert page.total == 120 and page.offset == offset
        seeds += [i.seed for i in page.images]
    assert seeds == list(range(1000, 1120))
    with pytest.raises(ValueError, match="limit 1..500"):
        store.curation.browse(PID, "1", rejected=False, limit=0)


def test_a_reject_on_one_replica_is_never_sampled_by_another() -> None:
    url = shared_cluster().new_database()
    with open_pool(url, capacity_per_label=100) as one, \
            open_pool(url, capacity_per_label=100) as two:
        one.add(PID, "4", _images(20), range(400, 420), model_hash="m",
                scores=[0.9] * 20)
        assert two.sample(PID, ["4"], 100).seeds.size == 20
        verdict = one.curation.verdict(PID, "4", [401, 405, 419], keep=False)
        assert verdict.changed == [401, 405, 419]
        for _ in range(5):
            seen = set(two.sample(PID, ["4"], 100).seeds.tolist())
            assert seen == set(range(400, 420)) - {401, 405, 419}
        assert two.stats(PID)["4"].rejected_by_person == 3
        two.curation.verdict(PID, "4", [405], keep=True)
        assert 405 in set(one.sample(PID, ["4"], 100).seeds.tolist())


def test_a_version_2_file_is_upgraded_in_place_and_keeps_its_images(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    shutil.copy(DATA / "pool_v2.db", path)  # written by the schema-2 PoolStore
    with open_pool(path, capacity_per_label=100) as store:
        stats = store.stats(PID)
        assert {k: (s.fill, s.accepted, s.rejected, s.generated, s.judged_total)
                for k, s in stats.items()} == {"0": (3, 3, 0, 3, 0), "1": (2, 2, 0, 2, 0)}
        assert stats["0"].served == 1 and stats["0"].target == 10
        sample = store.sample(PID, ["0", "1"], 10)
        assert sorted(sample.seeds.tolist()) == [2000, 2001, 2002, 2100, 2101]
        page = store.curation.browse(PID, "0", rejected=False)
        assert [(i.seed, i.score, i.verdict) for i in page.images] == [
            (2000, None, None), (2001, None, None), (2002, None, None)]
        assert store.curation.verdict(PID, "0", [2001], keep=False).changed == [2001]
        store.add(PID, "0", _images(1), [2003], model_hash="m", next_index=4, scores=[0.5])
        assert store.stats(PID)["0"].judged_total == 1
        assert store.integrity_check() == "ok"
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
        str(SCHEMA_VERSION),)
    assert conn.execute("SELECT COUNT(*) FROM images").fetchone() == (6,)
    conn.close()


def test_a_version_2_postgres_database_is_upgraded_in_place() -> None:
    url = shared_cluster().new_database()
    with open_pool(url, capacity_per_label=100) as store:
        store.add(PID, "0", _images(3), [1, 2, 3], model_hash="m")
        back_to_version(store, 2)
    with open_pool(url, capacity_per_label=100) as store:
        assert store.stats(PID)["0"].accepted == 3
        assert store.curation.verdict(PID, "0", [2], keep=False).changed == [2]
        assert set(store.sample(PID, ["0"], 10).seeds.tolist()) == {1, 3}
        assert stored_schema_version(store) == str(SCHEMA_VERSION)
        assert JobQueries(store).create(PID, "digits", "per_label", {"0": 3}).state == "queued"
