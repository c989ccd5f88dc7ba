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
from _postgres import back_to_version, shared_cluster, stored_schema_version

from genaug.service.api.errors import status_of
from genaug.service.batching.items import IdleWork, Outcome
from genaug.service.errors import ConflictError, NotFoundError
from genaug.service.jobs.fill_jobs import FillJobs
from genaug.service.jobs.progress import job_progress
from genaug.service.jobs.queries import JobQueries
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
    jobs = JobQueries(store)
    job = jobs.create(PID, "digits", "per_label", {"0": 5, "1": 5},
                           notify_url="https://hooks.example/fill")
    assert job.id.startswith("j_") and len(job.id) == 18 and job.state == "queued"
    stats = store.stats(PID, ["0", "1"])
    assert (stats["0"].target, stats["1"].target) == (5, 5)  # raised with the job
    assert job.start["0"] == {"generated": 3, "judged_total": 3, "accepted_total": 2,
                              "fill": 2, "reserved": 0, "target": 5}
    assert job.start["1"] == {"generated": 0, "judged_total": 0, "accepted_total": 0,
                              "fill": 0, "reserved": 0, "target": 5}
    later = jobs.create(PID, "digits", "images", {"1": 4}, targets={"1": 9})
    assert store.stats(PID, ["1"])["1"].target == 9
    store.close()
    again = open_store()  # a restart, or another replica
    jobs_again = JobQueries(again)
    assert jobs_again.get(job.id) == job
    assert [j.id for j in jobs_again.recent()] == [later.id, job.id]  # newest first
    assert [j.id for j in jobs_again.recent("digits", states=["queued"], limit=1)] == [later.id]
    assert jobs_again.recent("other") == [] and jobs_again.get("j_0000000000000000") is None
    assert [j.id for j in jobs_again.live(PID)] == [job.id, later.id]
    with pytest.raises(ValueError, match="needs targets="):
        jobs_again.create(PID, "digits", "images", {"1": 4})


def test_exactly_one_replica_wins_a_terminal_transition(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    jobs_one = JobQueries(one)
    job = jobs_one.create(PID, "digits", "per_label", {"0": 1}, notify_url="https://h.example/")
    quiet = jobs_one.create(PID, "digits", "per_label", {"0": 1})
    assert jobs_one.set_state(job.id, "running", from_states=("queued",))
    wins: list[bool] = []
    gate = threading.Barrier(8)

    def finish(store: PoolStore) -> None:
        gate.wait()
        jobs = JobQueries(store)
        wins.append(jobs.set_state(job.id, "done", None, from_states=("queued", "running")))

    threads = [threading.Thread(target=finish, args=(s,)) for s in [one, two] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(wins) == [False] * 7 + [True]
    jobs_two = JobQueries(two)
    done = jobs_two.get(job.id)
    assert done is not None and done.state == "done" and done.ended is not None
    assert done.webhook_state == "pending"  # the winner scheduled the webhook, once
    assert not jobs_one.set_state(job.id, "stopped", "late", from_states=("queued", "running"))
    assert jobs_two.set_state(quiet.id, "failed", "its model is gone")
    failed = jobs_one.get(quiet.id)
    assert failed is not None and failed.webhook_state is None and failed.reason == (
        "its model is gone")
    with pytest.raises(ValueError, match="use \\['queued'"):
        jobs_one.set_state(job.id, "finished")


def test_cancel_releases_only_what_no_other_live_job_wants(open_store: Opener) -> None:
    store = open_store()
    store.add(PID, "0", _images(2), _seeds(2), model_hash="m", next_index=2)
    jobs = JobQueries(store)
    big = jobs.create(PID, "digits", "per_label", {"0": 10})
    small = jobs.create(PID, "digits", "per_label", {"0": 6})
    assert store.reserve(PID, "0", 1, target=10) is not None  # one image in flight
    cancelled = jobs.cancel(big.id)
    assert cancelled.state == "cancelled" and cancelled.ended is not None
    assert store.stats(PID, ["0"])["0"].target == 6  # what the live job still asks
    jobs.cancel(small.id)
    assert store.stats(PID, ["0"])["0"].target == 3  # fill 2 + 1 in flight: nothing wasted
    with pytest.raises(ConflictError, match="already ended \\(cancelled\\)") as e:
        jobs.cancel(small.id)
    assert status_of(e.value) == 409 and e.value.field == "id"
    with pytest.raises(NotFoundError, match="no such job"):
        jobs.cancel("j_ffffffffffffffff")
    # A target someone else raised beyond the job's (a waiting sample) is left alone.
    held = jobs.create(PID, "digits", "per_label", {"1": 5})
    store.set_target(PID, ["1"], 50)
    jobs.cancel(held.id)
    assert store.stats(PID, ["1"])["1"].target == 50


def test_webhooks_are_claimed_by_one_replica_at_a_time(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    jobs_one = JobQueries(one)
    job = jobs_one.create(PID, "digits", "per_label", {"0": 1}, notify_url="https://h.example/")
    assert jobs_one.claim_webhook("a", 30) == []  # live: nothing to tell yet
    assert jobs_one.set_state(job.id, "done")
    claimed = jobs_one.claim_webhook("a", 30)
    assert [j.id for j in claimed] == [job.id] and claimed[0].webhook_attempts == 0
    jobs_one.webhook_attempted(job.id, 1000.0)  # attempts are counted as they are made
    jobs_one.webhook_attempted(job.id, 1002.0)  # ... the first one's time kept
    jobs_two = JobQueries(two)
    assert jobs_two.claim_webhook("b", 30) == []  # a's lease holds
    assert not jobs_two.finish_webhook(job.id, True, owner="b")  # not b's to finish
    assert jobs_one.finish_webhook(job.id, False, owner="a", retry_after_s=0.0)  # try again
    retried = jobs_two.claim_webhook("b", 0.3)
    assert [(j.webhook_attempts, j.webhook_first) for j in retried] == [(2, 1000.0)]
    time.sleep(0.5)  # b died: its lease runs out
    assert [j.id for j in jobs_one.claim_webhook("a", 30)] == [job.id]
    assert jobs_one.finish_webhook(job.id, True, owner="a")
    final = jobs_two.get(job.id)
    assert final is not None and final.webhook_state == "delivered"
    assert jobs_two.claim_webhook("b", 30) == []


def test_a_claim_lives_while_its_store_does_and_closing_hands_it_back(
        open_store: Opener) -> None:
    """The store's heartbeat renews the fill jobs' claims (a live deliverer never loses one to
    another replica), and a store that closes hands its undelivered claims back at once: the
    next start delivers without waiting out a lease."""
    one, two = open_store(), open_store()
    recipe = Recipe(name="digits", labels={"0": LabelSpec(prompts=["a zero"])}, height=8,
                    width=8, steps=1, guidance=0.0)
    # The fill jobs of a service on ``one``: their claims ride on its heartbeat and close.
    FillJobs(PoolPlanner({"digits": recipe}, one, model_hash="m", pregenerate=False))
    jobs_one = JobQueries(one)
    job = jobs_one.create(PID, "digits", "per_label", {"0": 1}, notify_url="https://h.example/")
    assert jobs_one.set_state(job.id, "done")
    assert [j.id for j in jobs_one.claim_webhook(one.owner, 0.3)] == [job.id]
    one.renew()  # as the heartbeat does: the lease is the store's lease_s again
    time.sleep(0.5)
    jobs_two = JobQueries(two)
    assert jobs_two.claim_webhook(two.owner, 30) == []  # renewed past its first 0.3 s
    one.close()
    assert [j.id for j in jobs_two.claim_webhook(two.owner, 30)] == [job.id]


def test_stops_count_only_under_the_key_they_were_recorded_under(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    why = ("stopped: the judge accepted 0 of the 50 images of label '1' it judged last, before "
           "2026-11-28 09:00 UTC")
    one.stops.record(PID, "1", why, "k1")
    assert two.stops.read(PID, "k1") == {"1": why} and two.stops.read(PID) == {"1": why}
    assert two.stops.read(PID, "k2") == {} and two.stops.read(PID, {"1": "k1"}) == {"1": why}
    assert two.stops.read(PID, {"0": "k1"}) == {}
    assert two.stops.forget(PID, {"1": "k1"}) == 0
    assert two.stops.forget(PID, {"1": "k3"}) == 1 and one.stops.read(PID) == {}
    one.stops.record(PID, "1", why, "k1")
    jobs_one = JobQueries(one)
    job = jobs_one.create(PID, "digits", "per_label", {"1": 4})
    one.drop_pool(PID, also=jobs_one.fail_live)  # its stops go; its live jobs fail with it
    assert one.stops.read(PID) == {}
    jobs_two = JobQueries(two)
    dropped = jobs_two.get(job.id)
    assert dropped is not None and dropped.state == "failed"
    assert dropped.reason == "its pool was dropped (genaug pool drop)"


# -- provenance and the v3 -> v4 upgrade ---------------------------------------------------------


def test_provenance_is_stored_with_each_image(open_store: Opener) -> None:
    store = open_store()
    made = Provenance(steps=30, guidance=5.0, strength=0.4, adapter_hash="1c0f2e3d4c5b6a79",
                      judge_key="3f9c0a1b2c3d4e5f", judge_settings='{"min_score": 0.9}')
    store.add(PID, "0", _images(2), _seeds(2), model_hash="m", provenance=made)
    store.add(PID, "0", _images(1), _seeds(1, 5), model_hash="m")
    records = list(store.reads.iter_records(PID))
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
        records = list(store.reads.iter_records(PID, include_rejected=True))
        assert [(r.label, r.seed, r.score, r.verdict, r.accepted) for r in records] == [
            ("0", 3000, pytest.approx(0.95), None, True),
            ("0", 3001, pytest.approx(0.2), None, False),
            ("0", 3002, pytest.approx(0.91), "reject", False),
            ("1", 3100, None, None, True), ("1", 3101, None, None, True)]
        assert all(r.provenance == UNRECORDED for r in records)  # not recorded: said so
        store.add(PID, "1", _images(1), [3102], model_hash="m", next_index=3,
                  provenance=Provenance(steps=2, guidance=3.0))
        assert list(store.reads.iter_records(PID))[-1].provenance.steps == 2
        jobs = JobQueries(store)
        job = jobs.create(PID, "digits", "per_label", {"0": 4})
        assert jobs.get(job.id) == job and store.integrity_check() == "ok"
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
        records = list(store.reads.iter_records(PID, include_rejected=True))
        assert [(r.label, r.seed, r.accepted, r.provenance.steps) for r in records] == [
            ("0", 4000, True, 20), ("0", 4001, False, 20), ("1", 4100, True, 20)]
        jobs = JobQueries(store)
        (job,) = jobs.recent()
        assert (job.state, job.webhook_state, job.webhook_attempts, job.webhook_first) == (
            "done", "pending", 1, None)
        assert store.stops.read(PID, "k") == {"0": "stopped: test"}
        assert store.recipe_specs.read(PID) is None
        recipe = load_recipes(Path(__file__).parents[3] / "recipes" / "digits.yaml")["digits"]
        store.recipe_specs.record(PID, recipe)
        assert store.recipe_specs.read(PID) == recipe.model_copy(update={"description": ""})
        assert [j.id for j in jobs.claim_webhook(store.owner, 30)] == [job.id]
        jobs.webhook_attempted(job.id, 5.0)
        assert store.integrity_check() == "ok"
    with open_pool(path, capacity_per_label=100) as store:
        again = JobQueries(store).get(job.id)
        assert again is not None and (again.webhook_attempts, again.webhook_first) == (2, 5.0)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
        str(SCHEMA_VERSION),)
    conn.close()


def test_a_version_4_postgres_database_is_upgraded_in_place() -> None:
    url = shared_cluster().new_database()
    with open_pool(url, capacity_per_label=100) as store:
        jobs = JobQueries(store)
        job = jobs.create(PID, "digits", "per_label", {"0": 1}, notify_url="https://h.x/")
        assert jobs.set_state(job.id, "done")
        back_to_version(store, 4)
    with open_pool(url, capacity_per_label=100) as store:
        jobs = JobQueries(store)
        jobs.webhook_attempted(job.id, 7.0)
        again = jobs.get(job.id)
        assert again is not None and (again.webhook_attempts, again.webhook_first) == (1, 7.0)
        assert store.recipe_specs.read(PID) is None
        assert stored_schema_version(store) == str(SCHEMA_VERSION)


def test_a_version_3_postgres_database_is_upgraded_in_place() -> None:
    url = shared_cluster().new_database()
    with open_pool(url, capacity_per_label=100) as store:
        store.add(PID, "0", _images(3), [1, 2, 3], model_hash="m", scores=[0.9, 0.1, 0.8],
                  keep=[True, False, True])
        back_to_version(store, 3)
    with open_pool(url, capacity_per_label=100) as store:
        records = list(store.reads.iter_records(PID, include_rejected=True))
        assert [(r.seed, r.accepted) for r in records] == [(1, True), (2, False), (3, True)]
        assert all(r.provenance == UNRECORDED for r in records)
        store.add(PID, "0", _images(1), [4], model_hash="m",
                  provenance=Provenance(steps=4, judge_key="k"))
        assert list(store.reads.iter_records(PID))[-1].provenance == Provenance(
            steps=4, judge_key="k")
        jobs = JobQueries(store)
        job = jobs.create(PID, "digits", "per_label", {"0": 5})
        store.stops.record(PID, "0", "stopped: ...", "k")
        assert jobs.get(job.id) == job and store.stops.read(PID, "k") == {"0": "stopped: ..."}
        assert stored_schema_version(store) == str(SCHEMA_VERSION)


# -- progress, from counts as the store makes them -------------------------------------------------


def test_progress_counts_what_was_made_since_the_job_began(tmp_path: Path) -> None:
    with open_pool(tmp_path / "pool.db", capacity_per_label=4) as store:
        store.add(PID, "0", _images(1), _seeds(1), model_hash="m", scores=[0.9])
        jobs = JobQueries(store)
        job = jobs.create(PID, "digits", "per_label", {"0": 4, "1": 1})
        queued = job_progress(job, store.stats(PID, ["0", "1"]), {}, job.created + 1)
        assert (queued.state, queued.rate, queued.eta_s) == ("queued", 0.0, None)
        store.add(PID, "0", _images(3, 1), _seeds(3, 1), model_hash="m",
                  scores=[0.9, 0.1, 0.95], keep=[True, False, True])
        running = job_progress(job, store.stats(PID, ["0", "1"]), {}, job.created + 10)
        label = running.labels["0"]
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
        more = jobs.create(PID, "digits", "images", {"0": 2}, targets={"0": 4})
        store.add(PID, "0", _images(2, 20), _seeds(2, 20), model_hash="m", scores=[0.9, 0.9])
        full = store.stats(PID, ["0"])
        assert full["0"].fill == 4
        assert job_progress(more, full, {}, more.created + 1).state == "done"
        # Images in flight when an "images" job began were planned for earlier asks: they
        # land after its start but are not the job's.
        flight = store.reserve(PID, "1", 2, target=3)
        assert flight is not None
        gain = jobs.create(PID, "digits", "images", {"1": 1}, targets={"1": 4})
        assert gain.start["1"]["reserved"] == 2
        store.add(PID, "1", _images(2, 30), _seeds(2, 30), model_hash="m", reservation=flight)
        landed = job_progress(gain, store.stats(PID, ["1"]), {}, gain.created + 1)
        assert landed.state == "running" and landed.labels["1"].missing == 1
        store.add(PID, "1", _images(1, 40), _seeds(1, 40), model_hash="m")
        gained = job_progress(gain, store.stats(PID, ["1"]), {}, gain.created + 2)
        assert gained.state == "done"
        ended = jobs.cancel(jobs.create(PID, "digits", "per_label", {"0": 99}).id)
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
    jobs = FillJobs(planner)
    job = jobs.fill("r", 3, notify_url="https://hooks.example/r")
    assert job.asked == {"a": 3, "b": 3} and job.target("a") == job.target("b") == 3
    planner.raise_target("r", 3)  # in-process pregenerate: this planner alone, no job
    assert [j.id for j in jobs.recent()] == [job.id]
    status = jobs.status(job.id)
    assert status is not None and status[0].state == "queued"
    work = planner.next_idle_batch(2)
    assert work is not None
    work.on_done(_outcome(work))
    status = jobs.status(job.id)
    assert status is not None and status[0].state == "running" and status[1].made == 2
    while (work := planner.next_idle_batch(2)) is not None:
        work.on_done(_outcome(work))
    ended = jobs.advance()
    assert [(j.id, j.state, j.webhook_state) for j in ended] == [(job.id, "done", "pending")]
    assert jobs.advance() == []  # moved once
    records = list(store.reads.iter_records(planner.pool_ids["r"]))
    assert len(records) == 6 and {r.provenance for r in records} == {Provenance(
        steps=3, guidance=2.5, strength=None, adapter_hash="1c0f2e3d4c5b6a79",
        speed="quality", sampler="quality:default:3:2.5")}
    assert {(r.adapter, r.adapter_scale) for r in records} == {("lx", 0.8)}
    answer, spent = jobs.budget("r", 4)
    shares = answer["per_label"]
    assert spent.kind == "images" and spent.asked == {k: v for k, v in shares.items() if v}
    assert sum(shares.values()) == answer["asked"] == 4 and spent.state == "queued"


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
        two_jobs = FillJobs(two)
        job = two_jobs.fill("d", 60, notify_url="https://hooks.example/d")
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
        status = two_jobs.status(job.id)
        assert status is not None
        after, progress = status
        assert (after.state, after.webhook_state) == ("stopped", "pending")
        assert after.reason is not None and after.reason.startswith(
            "label '5' stopped: the judge accepted 0 of the ")
        assert progress.labels["6"].stopped and progress.labels["6"].made > 0
        # The judge's fix (a lower min_score) and a restart: the old stop no longer counts.
        fixed = _judged_planner(two_store, digit_shots, 0.4)
        assert fixed.stopped("d") == {} and two_store.stops.read(fixed.pool_ids["d"]) == {}
        assert fixed.next_idle_batch(8) is not None
        settings = json.loads(next(iter(two_store.reads.iter_records(
            fixed.pool_ids["d"], include_rejected=True))).provenance.judge_settings or "{}")
        assert settings["min_score"] == 0.9 and settings["rule"] == "shots"
        assert len(settings["shots_hash"]) == 16
