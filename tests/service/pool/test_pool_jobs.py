"""Jobs, the judge's stops and each image's provenance in the pool database (schema 4), on
both backends (a SQLite file, a real PostgreSQL server): a fill handed off survives a restart
and every replica answers for it; a stop one replica's judge makes is every replica's; the
v3 -> v4 upgrade keeps every image and says what it did not record."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from _postgres import shared_cluster

from genaug.service.batching.items import IdleWork, Outcome
from genaug.service.errors import ConflictError, NotFoundError
from genaug.service.pool.job_progress import job_progress
from genaug.service.pool.open import open_pool
from genaug.service.pool.planner import PoolPlanner
from genaug.service.pool.store import PoolStore
from genaug.service.pool.types import SCHEMA_VERSION, Provenance
from genaug.service.recipes.load import parse_recipes
from genaug.service.recipes.spec import AdapterSpec, LabelSpec, Recipe

H = W = 8
PID = "digits-0123456789ab"
DATA = Path(__file__).parent / "data"
Opener = Callable[..., PoolStore]
#: What the export reads for an image stored before schema 4: nothing recorded.
UNRECORDED = Provenance()


def _images(n: int, value: int = 0) -> np.ndarray:
    out = np.zeros((n, H, W, 1), np.uint8)
    out[..., 0] = ((value + np.arange(n)) % 256)[:, None, None]
    return out


def _seeds(n: int, start: int = 0) -> list[int]:
    """63-bit seeds as the planner draws them."""
    recipe = Recipe(name="s", labels={"x": LabelSpec(prompts=["x"])}, height=8, width=8,
                    steps=1, guidance=0.0)
    return [recipe.plan("x", start + k).seed for k in range(n)]


# -- jobs in the store ---------------------------------------------------------------------------


def test_a_job_and_its_targets_are_one_transaction_and_survive_a_restart(
        open_store: Opener) -> None:
    store = open_store()
    store.add(PID, "0", _images(3), _seeds(3), model_hash="m", scores=[0.95, 0.2, 0.97],
              keep=[True, False, True])
    job = store.create_job(PID, "digits", "per_label", {"0": 5, "1": 5},
                           notify_url="https://hooks.example/fill")
    assert job.id.startswith("j_") and len(job.id) == 18 and job.state == "queued"
    stats = store.stats(PID, ["0", "1"])
    assert (stats["0"].target, stats["1"].target) == (5, 5)  # raised with the job
    assert job.start["0"] == {"generated": 3, "judged_total": 3, "accepted_total": 2,
                              "fill": 2, "reserved": 0, "target": 5}
    assert job.start["1"] == {"generated": 0, "judged_total": 0, "accepted_total": 0,
                              "fill": 0, "reserved": 0, "target": 5}
    later = store.create_job(PID, "digits", "images", {"1": 4}, targets={"1": 9})
    assert store.stats(PID, ["1"])["1"].target == 9
    store.close()
    again = open_store()  # a restart, or another replica
    assert again.get_job(job.id) == job
    assert [j.id for j in again.list_jobs()] == [later.id, job.id]  # newest first
    assert [j.id for j in again.list_jobs("digits", states=["queued"], limit=1)] == [later.id]
    assert again.list_jobs("other") == [] and again.get_job("j_0000000000000000") is None
    assert [j.id for j in again.live_jobs(PID)] == [job.id, later.id]
    with pytest.raises(ValueError, match="needs targets="):
        again.create_job(PID, "digits", "images", {"1": 4})


def test_exactly_one_replica_wins_a_terminal_transition(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    job = one.create_job(PID, "digits", "per_label", {"0": 1}, notify_url="https://h.example/")
    quiet = one.create_job(PID, "digits", "per_label", {"0": 1})
    assert one.set_state(job.id, "running", from_states=("queued",))
    wins: list[bool] = []
    gate = threading.Barrier(8)

    def finish(store: PoolStore) -> None:
        gate.wait()
        wins.append(store.set_state(job.id, "done", None, from_states=("queued", "running")))

    threads = [threading.Thread(target=finish, args=(s,)) for s in [one, two] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(wins) == [False] * 7 + [True]
    done = two.get_job(job.id)
    assert done is not None and done.state == "done" and done.ended is not None
    assert done.webhook_state == "pending"  # the winner scheduled the webhook, once
    assert not one.set_state(job.id, "stopped", "late", from_states=("queued", "running"))
    assert two.set_state(quiet.id, "failed", "its model is gone")
    failed = one.get_job(quiet.id)
    assert failed is not None and failed.webhook_state is None and failed.reason == (
        "its model is gone")
    with pytest.raises(ValueError, match="use \\['queued'"):
        one.set_state(job.id, "finished")


def test_cancel_releases_only_what_no_other_live_job_wants(open_store: Opener) -> None:
    store = open_store()
    store.add(PID, "0", _images(2), _seeds(2), model_hash="m", next_index=2)
    big = store.create_job(PID, "digits", "per_label", {"0": 10})
    small = store.create_job(PID, "digits", "per_label", {"0": 6})
    assert store.reserve(PID, "0", 1, target=10) is not None  # one image in flight
    cancelled = store.cancel_job(big.id)
    assert cancelled.state == "cancelled" and cancelled.ended is not None
    assert store.stats(PID, ["0"])["0"].target == 6  # what the live job still asks
    store.cancel_job(small.id)
    assert store.stats(PID, ["0"])["0"].target == 3  # fill 2 + 1 in flight: nothing wasted
    with pytest.raises(ConflictError, match="already ended \\(cancelled\\)") as e:
        store.cancel_job(small.id)
    assert e.value.status == 409 and e.value.field == "id"
    with pytest.raises(NotFoundError, match="no such job"):
        store.cancel_job("j_ffffffffffffffff")
    # A target someone else raised beyond the job's (a waiting sample) is left alone.
    held = store.create_job(PID, "digits", "per_label", {"1": 5})
    store.set_target(PID, ["1"], 50)
    store.cancel_job(held.id)
    assert store.stats(PID, ["1"])["1"].target == 50


def test_webhooks_are_claimed_by_one_replica_at_a_time(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    job = one.create_job(PID, "digits", "per_label", {"0": 1}, notify_url="https://h.example/")
    assert one.claim_webhook("a", 30) == []  # live: nothing to tell yet
    assert one.set_state(job.id, "done")
    claimed = one.claim_webhook("a", 30)
    assert [j.id for j in claimed] == [job.id] and claimed[0].webhook_attempts == 0
    one.webhook_attempted(job.id, 1000.0)  # attempts are counted as they are made
    one.webhook_attempted(job.id, 1002.0)  # ... the first one's time kept
    assert two.claim_webhook("b", 30) == []  # a's lease holds
    assert not two.finish_webhook(job.id, True, owner="b")  # not b's to finish
    assert one.finish_webhook(job.id, False, owner="a", retry_after_s=0.0)  # try again
    retried = two.claim_webhook("b", 0.3)
    assert [(j.webhook_attempts, j.webhook_first) for j in retried] == [(2, 1000.0)]
    time.sleep(0.5)  # b died: its lease runs out
    assert [j.id for j in one.claim_webhook("a", 30)] == [job.id]
    assert one.finish_webhook(job.id, True, owner="a")
    final = two.get_job(job.id)
    assert final is not None and final.webhook_state == "delivered"
    assert two.claim_webhook("b", 30) == []


def test_a_claim_lives_while_its_store_does_and_closing_hands_it_back(
        open_store: Opener) -> None:
    """The store's heartbeat renews its claims (a live deliverer never loses one to another
    replica), and a store that closes hands its undelivered claims back at once: the next
    start delivers without waiting out a lease."""
    one, two = open_store(), open_store()
    job = one.create_job(PID, "digits", "per_label", {"0": 1}, notify_url="https://h.example/")
    assert one.set_state(job.id, "done")
    assert [j.id for j in one.claim_webhook(one.owner, 0.3)] == [job.id]
    one.renew()  # as the heartbeat does: the lease is the store's lease_s again
    time.sleep(0.5)
    assert two.claim_webhook(two.owner, 30) == []  # renewed past its first 0.3 s
    one.close()
    assert [j.id for j in two.claim_webhook(two.owner, 30)] == [job.id]


def test_stops_count_only_under_the_key_they_were_recorded_under(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    why = ("stopped: the judge accepted 0 of the 50 images of label '1' it judged last, before "
           "2026-11-28 09:00 UTC")
    one.record_stop(PID, "1", why, "k1")
    assert two.stops(PID, "k1") == {"1": why} and two.stops(PID) == {"1": why}
    assert two.stops(PID, "k2") == {} and two.stops(PID, {"1": "k1"}) == {"1": why}
    assert two.stops(PID, {"0": "k1"}) == {}
    assert two.forget_stops(PID, {"1": "k1"}) == 0
    assert two.forget_stops(PID, {"1": "k3"}) == 1 and one.stops(PID) == {}
    one.record_stop(PID, "1", why, "k1")
    job = one.create_job(PID, "digits", "per_label", {"1": 4})
    one.drop_pool(PID)  # its stops go, and its live jobs fail
    assert one.stops(PID) == {}
    dropped = two.get_job(job.id)
    assert dropped is not None and dropped.state == "failed"
    assert dropped.reason == "its pool was dropped (genaug pool drop)"


# -- provenance and the v3 -> v4 upgrade ---------------------------------------------------------


def test_provenance_is_stored_with_each_image(open_store: Opener) -> None:
    store = open_store()
    made = Provenance(steps=30, guidance=5.0, strength=0.4, adapter_hash="1c0f2e3d4c5b6a79",
                      judge_key="3f9c0a1b2c3d4e5f", judge_settings='{"min_score": 0.9}')
    store.add(PID, "0", _images(2), _seeds(2), model_hash="m", provenance=made)
    store.add(PID, "0", _images(1), _seeds(1, 5), model_hash="m")
    records = list(store.iter_records(PID))
    assert [r.provenance for r in records] == [made, made, UNRECORDED]
    assert [r.seed for r in records] == _seeds(2) + _seeds(1, 5)
    assert (records[0].model_hash, records[0].image.shape) == ("m", (H, W, 1))


def test_a_version_3_file_is_upgraded_in_place_and_keeps_its_images(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    shutil.copy(DATA / "pool_v3.db", path)  # written by the schema-3 PoolStore
    with open_pool(path, capacity_per_label=100) as store:
        stats = store.stats(PID)
        assert {k: (s.fill, s.rejected, s.rejected_by_person, s.generated, s.judged_total,
                    s.accepted_total, s.target) for k, s in stats.items()} == {
            "0": (1, 1, 1, 3, 3, 2, 10), "1": (2, 0, 0, 2, 0, 0, 10)}
        records = list(store.iter_records(PID, include_rejected=True))
        assert [(r.label, r.seed, r.score, r.verdict, r.accepted) for r in records] == [
            ("0", 3000, pytest.approx(0.95), None, True),
            ("0", 3001, pytest.approx(0.2), None, False),
            ("0", 3002, pytest.approx(0.91), "reject", False),
            ("1", 3100, None, None, True), ("1", 3101, None, None, True)]
        assert all(r.provenance == UNRECORDED for r in records)  # not recorded: said so
        store.add(PID, "1", _images(1), [3102], model_hash="m", next_index=3,
                  provenance=Provenance(steps=2, guidance=3.0))
        assert list(store.iter_records(PID))[-1].provenance.steps == 2
        job = store.create_job(PID, "digits", "per_label", {"0": 4})
        assert store.get_job(job.id) == job and store.integrity_check() == "ok"
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
        str(SCHEMA_VERSION),)
    assert conn.execute("SELECT COUNT(*) FROM images").fetchone() == (6,)
    conn.close()


def test_a_version_4_file_is_upgraded_in_place_and_keeps_its_images_and_jobs(
        tmp_path: Path) -> None:
    """Schema 5 adds the recipe that made each pool and the first attempt of a webhook; a
    version-4 file keeps every image, its job and its pending webhook (attempts counted under
    version 4 stay), and has no recipe until a planner records one."""
    from genaug.service.recipes.load import load_recipes

    path = tmp_path / "v4.db"
    shutil.copy(DATA / "pool_v4.db", path)  # written by the schema-4 PoolStore
    with open_pool(path, capacity_per_label=100) as store:
        records = list(store.iter_records(PID, include_rejected=True))
        assert [(r.label, r.seed, r.accepted, r.provenance.steps) for r in records] == [
            ("0", 4000, True, 20), ("0", 4001, False, 20), ("1", 4100, True, 20)]
        (job,) = store.list_jobs()
        assert (job.state, job.webhook_state, job.webhook_attempts, job.webhook_first) == (
            "done", "pending", 1, None)
        assert store.stops(PID, "k") == {"0": "stopped: test"}
        assert store.stored_recipe(PID) is None
        recipe = load_recipes(Path(__file__).parents[3] / "recipes" / "digits.yaml")["digits"]
        store.record_recipe(PID, recipe)
        assert store.stored_recipe(PID) == recipe.model_copy(update={"description": ""})
        assert [j.id for j in store.claim_webhook(store.owner, 30)] == [job.id]
        store.webhook_attempted(job.id, 5.0)
        assert store.integrity_check() == "ok"
    with open_pool(path, capacity_per_label=100) as store:
        again = store.get_job(job.id)
        assert again is not None and (again.webhook_attempts, again.webhook_first) == (2, 5.0)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
        str(SCHEMA_VERSION),)
    conn.close()


def test_a_version_4_postgres_database_is_upgraded_in_place() -> None:
    url = shared_cluster().new_database()
    with open_pool(url, capacity_per_label=100) as store:
        job = store.create_job(PID, "digits", "per_label", {"0": 1}, notify_url="https://h.x/")
        assert store.set_state(job.id, "done")
        with store._tx(write=True) as conn:  # back to the version-4 layout
            store._exec(conn, "ALTER TABLE jobs DROP COLUMN webhook_first")
            store._exec(conn, "DROP TABLE recipes")
            store._exec(conn, "UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    with open_pool(url, capacity_per_label=100) as store:
        store.webhook_attempted(job.id, 7.0)
        again = store.get_job(job.id)
        assert again is not None and (again.webhook_attempts, again.webhook_first) == (1, 7.0)
        assert store.stored_recipe(PID) is None
        with store._tx(write=False) as conn:
            row = store._exec(
                conn, "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert row[0] == str(SCHEMA_VERSION)


def test_a_version_3_postgres_database_is_upgraded_in_place() -> None:
    url = shared_cluster().new_database()
    with open_pool(url, capacity_per_label=100) as store:
        store.add(PID, "0", _images(3), [1, 2, 3], model_hash="m", scores=[0.9, 0.1, 0.8],
                  keep=[True, False, True])
        with store._tx(write=True) as conn:  # back to the version-3 layout
            for column in ("steps", "guidance", "strength", "adapter_hash", "judge_key",
                           "judge_settings"):
                store._exec(conn, f"ALTER TABLE images DROP COLUMN {column}")
            store._exec(conn, "DROP TABLE jobs")
            store._exec(conn, "DROP TABLE stops")
            store._exec(conn, "DROP TABLE recipes")
            store._exec(conn, "UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    with open_pool(url, capacity_per_label=100) as store:
        records = list(store.iter_records(PID, include_rejected=True))
        assert [(r.seed, r.accepted) for r in records] == [(1, True), (2, False), (3, True)]
        assert all(r.provenance == UNRECORDED for r in records)
        store.add(PID, "0", _images(1), [4], model_hash="m",
                  provenance=Provenance(steps=4, judge_key="k"))
        assert list(store.iter_records(PID))[-1].provenance == Provenance(steps=4,
                                                                          judge_key="k")
        job = store.create_job(PID, "digits", "per_label", {"0": 5})
        store.record_stop(PID, "0", "stopped: ...", "k")
        assert store.get_job(job.id) == job and store.stops(PID, "k") == {"0": "stopped: ..."}
        with store._tx(write=False) as conn:
            row = store._exec(
                conn, "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert row[0] == str(SCHEMA_VERSION)


# -- progress, from counts as the store makes them -------------------------------------------------


def test_progress_counts_what_was_made_since_the_job_began(tmp_path: Path) -> None:
    with open_pool(tmp_path / "pool.db", capacity_per_label=4) as store:
        store.add(PID, "0", _images(1), _seeds(1), model_hash="m", scores=[0.9])
        job = store.create_job(PID, "digits", "per_label", {"0": 4, "1": 1})
        queued = job_progress(job, store.stats(PID, ["0", "1"]), {}, job.created + 1)
        assert (queued.state, queued.rate, queued.eta_s) == ("queued", 0.0, None)
        store.add(PID, "0", _images(3, 1), _seeds(3, 1), model_hash="m",
                  scores=[0.9, 0.1, 0.95], keep=[True, False, True])
        running = job_progress(job, store.stats(PID, ["0", "1"]), {}, job.created + 10)
        label = running.per_label["0"]
        assert (label.made, label.accepted, label.rejected, label.fill, label.missing) == (
            3, 2, 1, 3, 1)
        assert running.state == "running" and running.rate == pytest.approx(0.2)
        assert running.eta_s == pytest.approx(2 / 0.2)  # 1 of "0" and 1 of "1" missing
        why = "stopped: the judge accepted 0 of the 50 images ... Fix: ..."
        stopped = job_progress(job, store.stats(PID, ["0", "1"]), {"1": why}, job.created + 10)
        assert stopped.state == "stopped" and stopped.reason == f"label '1' {why}"
        store.add(PID, "0", _images(1, 9), _seeds(1, 9), model_hash="m", scores=[0.9])
        store.add(PID, "1", _images(1), _seeds(1), model_hash="m")
        done = job_progress(job, store.stats(PID, ["0", "1"]), {"1": why}, job.created + 20)
        assert (done.state, done.eta_s) == ("done", 0.0)  # a met label's stop is no matter
        # An "images" job of a label at the capacity: eviction keeps the fill flat, the
        # images made still count.
        more = store.create_job(PID, "digits", "images", {"0": 2}, targets={"0": 4})
        store.add(PID, "0", _images(2, 20), _seeds(2, 20), model_hash="m", scores=[0.9, 0.9])
        full = store.stats(PID, ["0"])
        assert full["0"].fill == 4
        assert job_progress(more, full, {}, more.created + 1).state == "done"
        # Images in flight when an "images" job began were planned for earlier asks: they
        # land after its start but are not the job's.
        flight = store.reserve(PID, "1", 2, target=3)
        assert flight is not None
        gain = store.create_job(PID, "digits", "images", {"1": 1}, targets={"1": 4})
        assert gain.start["1"]["reserved"] == 2
        store.add(PID, "1", _images(2, 30), _seeds(2, 30), model_hash="m", reservation=flight)
        landed = job_progress(gain, store.stats(PID, ["1"]), {}, gain.created + 1)
        assert landed.state == "running" and landed.per_label["1"].missing == 1
        store.add(PID, "1", _images(1, 40), _seeds(1, 40), model_hash="m")
        gained = job_progress(gain, store.stats(PID, ["1"]), {}, gain.created + 2)
        assert gained.state == "done"
        ended = store.cancel_job(store.create_job(PID, "digits", "per_label", {"0": 99}).id)
        kept = job_progress(ended, full, {}, ended.created + 1)
        assert (kept.state, kept.reason) == ("cancelled", "cancelled by a client")


# -- the planner: jobs, provenance, stops every replica sees ---------------------------------------


def _outcome(work: IdleWork) -> Outcome:
    """What a worker would return: one flat image per item, its value from its seed."""
    return Outcome(images=[np.full(item.output_shape, item.seed % 251, np.uint8)
                           for item in work.items])


def test_planner_fills_are_jobs_and_batches_keep_what_made_them(open_store: Opener) -> None:
    store = open_store()
    recipe = Recipe(name="r", labels={"a": LabelSpec(prompts=["x"]),
                                      "b": LabelSpec(prompts=["y"])},
                    height=8, width=8, steps=3, guidance=2.5,
                    adapter=AdapterSpec(name="lx", scale=0.8))
    planner = PoolPlanner({"r": recipe}, store, model_hash="m", pregenerate=False,
                          adapter_hashes={"lx": "1c0f2e3d4c5b6a79"})
    job = planner.raise_target("r", 3, notify_url="https://hooks.example/r")
    assert job is not None and job.asked == {"a": 3, "b": 3}
    assert planner.raise_target("r", 3, shared=False) is None  # in-process: no job
    status = planner.jobs.status(job.id)
    assert status is not None and status[0].state == "queued"
    work = planner.next_idle_batch(2)
    assert work is not None
    work.on_done(_outcome(work))
    status = planner.jobs.status(job.id)
    assert status is not None and status[0].state == "running" and status[1].made == 2
    while (work := planner.next_idle_batch(2)) is not None:
        work.on_done(_outcome(work))
    ended = planner.jobs.advance()
    assert [(j.id, j.state, j.webhook_state) for j in ended] == [(job.id, "done", "pending")]
    assert planner.jobs.advance() == []  # moved once
    records = list(store.iter_records(planner.pool_ids["r"]))
    assert len(records) == 6 and {r.provenance for r in records} == {Provenance(
        steps=3, guidance=2.5, strength=None, adapter_hash="1c0f2e3d4c5b6a79")}
    assert {(r.adapter, r.adapter_scale) for r in records} == {("lx", 0.8)}
    spent, shares = planner.spend_job("r", 4)
    assert spent.kind == "images" and spent.asked == {k: v for k, v in shares.items() if v}
    assert sum(shares.values()) == 4 and spent.state == "queued"


JUDGED = """
recipes:
  - name: d
    height: 16
    width: 16
    steps: 1
    guidance: 0.0
    judge: {shots: shots, min_score: MIN}
    labels:
      "5": {prompts: ["a handwritten five"]}
      "6": {prompts: ["a handwritten six"]}
"""


@pytest.fixture(scope="module")
def digit_shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root with ``shots/5`` and ``shots/6``: 5 real digits each (data seed 0)."""
    from genaug.digits import write_split_folders

    root = tmp_path_factory.mktemp("data")
    written = write_split_folders(root, ["fewshot"], per_class=5, seed=0)["fewshot"]
    (root / "shots").mkdir()
    for d in ("5", "6"):
        (written / d).rename(root / "shots" / d)
    return root


def _judged_planner(store: PoolStore, root: Path, min_score: float) -> PoolPlanner:
    from genaug.service.judge import build_judges

    recipes = {"d": parse_recipes(JUDGED.replace("MIN", str(min_score)),
                                  path=Path("r.yaml"))["d"]}
    return PoolPlanner(recipes, store, model_hash="m", pregenerate=False, data_root=root,
                       judges=build_judges(recipes, root, torch.device("cpu")))


def test_a_stop_one_replica_makes_is_every_replicas_and_ends_jobs(
        tmp_path: Path, digit_shots: Path) -> None:
    path = tmp_path / "pool.db"
    with open_pool(path, capacity_per_label=100) as one_store, \
            open_pool(path, capacity_per_label=100) as two_store:
        one = _judged_planner(one_store, digit_shots, 0.9)
        two = _judged_planner(two_store, digit_shots, 0.9)
        job = two.raise_target("d", 60, notify_url="https://hooks.example/d")
        assert job is not None
        # The judge scores flat images about 0.5 for either digit: under min_score 0.9
        # nothing is kept, and after 50 judged images of a label the planner stops it.
        for _ in range(40):
            work = one.next_idle_batch(8)
            if work is None:
                break
            work.on_done(_outcome(work))
        stopped = one.stopped("d")
        assert sorted(stopped) == ["5", "6"], stopped
        assert "Fix: give the judge more or better shots (judge.shots: shots/5)" in stopped["5"]
        time.sleep(0.1)
        assert two.stopped("d") == stopped  # read from the pool, not this replica's memory
        assert two.next_idle_batch(8) is None  # nothing planned for stopped labels
        status = two.jobs.status(job.id)
        assert status is not None
        after, progress = status
        assert (after.state, after.webhook_state) == ("stopped", "pending")
        assert after.reason is not None and after.reason.startswith(
            "label '5' stopped: the judge accepted 0 of the ")
        assert progress.per_label["6"].stopped and progress.per_label["6"].made > 0
        # The judge's fix (a lower min_score) and a restart: the old stop no longer counts.
        fixed = _judged_planner(two_store, digit_shots, 0.4)
        assert fixed.stopped("d") == {} and two_store.stops(fixed.pool_ids["d"]) == {}
        assert fixed.next_idle_batch(8) is not None
        settings = json.loads(next(iter(two_store.iter_records(
            fixed.pool_ids["d"], include_rejected=True))).provenance.judge_settings or "{}")
        assert settings["min_score"] == 0.9 and settings["rule"] == "shots"
        assert len(settings["shots_hash"]) == 16
