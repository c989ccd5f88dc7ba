"""``speed: auto`` on the pool store, both backends: the decision rule's statistics, the
candidate set, probing, deciding, rejecting, persistence across restarts, the basis, and the
hysteresis that withdraws a decision only on evidence. The judge's encoder is the real tiny
one; the probe images are stored as the planner stores them (scores, keep flags, sampler)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from genaug.service.judge.encoders import load_encoder
from genaug.service.pool.store import PoolStore
from genaug.service.pool.tables import POOL_TABLES
from genaug.service.pool.types import Provenance
from genaug.service.recipes.spec import JudgeSpec, LabelSpec, Recipe
from genaug.service.sampling.auto import AutoSampler, auto_basis, candidates
from genaug.service.sampling.modes import Sampling, Turbo
from genaug.service.sampling.rule import (
    MARGIN,
    PROBE_IMAGES,
    Z,
    acceptance_interval,
    acceptance_test,
    diversity,
    diversity_of_sum,
    final_test,
)

PID = "shapes-0123456789ab"
LABELS = ("a", "b")


def _recipe() -> Recipe:
    return Recipe(name="shapes", labels={label: LabelSpec(prompts=[f"a {label}"])
                                         for label in LABELS},
                  height=16, width=16, steps=20, guidance=3.0,
                  judge=JudgeSpec(shots="shots"), speed="auto")


ENCODER = load_encoder("tiny-digits-encoder", torch.device("cpu"))


def _auto(store: PoolStore, judge_key: str = "j1", **kwargs: Any) -> AutoSampler:
    return AutoSampler(store.samplers, PID, _recipe(), judge_key=judge_key, adapters={},
                       turbo=None, **kwargs)


_SEEDS = iter(range(1, 1 << 40))


def _probe(store: PoolStore, auto: AutoSampler, sampling: Sampling, label: str, n: int, *,
           kept: int | None = None, alike: bool = False) -> None:
    """Store ``n`` judged images of ``label`` drawn by ``sampling``; ``kept`` of them kept
    (default all); ``alike``: all the same picture (no diversity)."""
    rng = np.random.default_rng(next(_SEEDS))
    images = rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)
    if alike:
        images[:] = images[0]
    kept = n if kept is None else kept
    keep = [i < kept for i in range(n)]
    # What the store thread adds with a judged batch: the sum of its unit judge embeddings.
    unit = torch.nn.functional.normalize(ENCODER.images(images).float(), dim=1).numpy()
    store.add(PID, label, images, [next(_SEEDS) for _ in range(n)], model_hash="m",
              scores=[0.95 if k else 0.1 for k in keep], keep=keep,
              embedding_sum=unit.sum(axis=0).tolist(),
              provenance=Provenance(steps=sampling.steps, guidance=sampling.guidance,
                                    judge_key=auto.judge_key, speed=sampling.speed,
                                    sampler=sampling.id))
    auto.stored()


def _probe_all(store: PoolStore, auto: AutoSampler, sampling: Sampling, **kw: Any) -> None:
    for label in LABELS:
        _probe(store, auto, sampling, label, PROBE_IMAGES, **kw)


# -- the rule -------------------------------------------------------------------------------


def test_the_rule_needs_evidence_not_just_a_close_rate() -> None:
    # Equal and perfect: not worse, with evidence, at the probe size.
    assert acceptance_test(64, 64, 64, 64) == "pass"
    # One miss in 64: not enough evidence either way yet.
    assert acceptance_test(63, 64, 64, 64) == "more"
    assert acceptance_test(254, 256, 256, 256) == "pass"
    # Clearly worse: fails.
    assert acceptance_test(40, 64, 63, 64) == "fail"
    # 32 images per arm are not enough to call 0.95 against 0.95: the half-width is wider
    # than the margin; 256 are.
    lower, upper = acceptance_interval(30, 32, 30, 32)
    assert lower < -MARGIN < 0 < upper
    assert acceptance_interval(243, 256, 243, 256)[0] > -MARGIN
    assert Z == pytest.approx(1.6449)


def test_diversity_is_the_rms_pairwise_distance_of_unit_embeddings_and_a_sum_says_it() -> None:
    assert diversity(np.ones((5, 3))) == pytest.approx(0.0)
    assert diversity(np.eye(4) * 7.0) == pytest.approx(math.sqrt(2))
    assert diversity(np.ones((1, 3))) == 0.0
    x = np.random.default_rng(0).normal(size=(50, 16))
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    assert diversity_of_sum(50, unit.sum(axis=0)) == pytest.approx(diversity(x), rel=1e-9)
    # Two batches' sums add up to the whole's: the store keeps one running sum.
    parts = unit[:20].sum(axis=0) + unit[20:].sum(axis=0)
    assert diversity_of_sum(50, parts) == pytest.approx(diversity(x), rel=1e-9)


def test_candidates_are_cheaper_than_the_recipe_cheapest_first_and_the_recipe_last() -> None:
    recipe = _recipe()
    got = candidates(recipe, None)
    own = Sampling("default", 20, 3.0)
    assert got[-1] == own and got[0] == Sampling("lcm", 1, 0.0)
    costs = [s.cost for s in got[:-1]]
    assert costs == sorted(costs) and max(costs) < own.cost == 40
    names = [s.name for s in got]
    assert len(set(names)) == len(names)
    assert "dpmpp_2m 2 steps, guidance 3" in names and "unipc 8 steps, guidance 3" in names
    assert "default 5 steps, guidance 3" in names and "default 10 steps, guidance 3" in names
    turbo = Turbo(Sampling("tcd", 2, 0.0, "turbo"))
    with_turbo = candidates(recipe, turbo)
    assert turbo.sampling in with_turbo and len(with_turbo) == len(got) + 1
    # A recipe already as cheap as a candidate keeps only the cheaper ones.
    cheap = recipe.model_copy(update={"steps": 2, "guidance": 0.0})
    assert candidates(cheap, None) == [Sampling("lcm", 1, 0.0), Sampling("default", 1, 0.0),
                                       Sampling("default", 2, 0.0)]


def test_the_basis_names_the_judge_the_adapters_and_turbo() -> None:
    base = auto_basis("j1", ["h1", None], None)
    assert base == auto_basis("j1", [None, "h1"], None)
    assert base != auto_basis("j2", ["h1", None], None)
    assert base != auto_basis("j1", ["h2", None], None)
    assert base != auto_basis("j1", ["h1", None], Turbo(Sampling("tcd", 2, 0.0, "turbo")))


# -- on a pool ------------------------------------------------------------------------------


def test_probes_decide_persist_and_withdraw_only_on_evidence(store: PoolStore) -> None:
    auto = _auto(store)
    own, first, second = auto.own, auto.candidates[0], auto.candidates[1]
    assert auto.sampling_for("a") == own  # the recipe's own sampler is probed first
    assert auto.describe()["state"] == "probing"
    _probe_all(store, auto, own)
    assert auto.sampling_for("a") == first == Sampling("lcm", 1, 0.0)
    _probe(store, auto, first, "a", PROBE_IMAGES)
    assert auto.sampling_for("a") == first and auto.describe()["state"] == "probing"
    _probe(store, auto, first, "b", PROBE_IMAGES)
    assert auto.sampling_for("b") == first
    told = auto.describe()
    assert told["state"] == "decided" and told["sampler"]["name"] == first.name
    assert told["cheaper"] == 40.0 and "within 0.05" in told["reason"]
    assert told["candidates"][0] == {"name": first.name, "id": first.id, "result": "chosen"}

    again = _auto(store)  # a restart, or another replica: the decision is the pool's
    assert again.sampling_for("b") == first and again.describe()["state"] == "decided"

    # A little worse: within the band, the decision stays (hysteresis).
    _probe(store, again, first, "a", PROBE_IMAGES, kept=PROBE_IMAGES - 4)
    assert again.sampling_for("a") == first
    # Worse with evidence: withdrawn, the next candidate is probed.
    _probe(store, again, first, "a", PROBE_IMAGES, kept=20)
    assert again.sampling_for("a") == second
    told = again.describe()
    assert told["state"] == "probing" and "withdrawn" in told["candidates"][0]["result"]


def test_a_worse_or_uniform_candidate_is_rejected_and_all_rejected_keeps_the_recipe(
        store: PoolStore) -> None:
    auto = _auto(store)
    own = auto.own
    _probe_all(store, auto, own)
    first = auto.sampling_for("a")
    _probe(store, auto, first, "a", PROBE_IMAGES, kept=30)
    _probe(store, auto, first, "b", PROBE_IMAGES)
    second = auto.sampling_for("a")
    assert second == auto.candidates[1]
    assert "acceptance 30/64" in auto.describe()["candidates"][0]["result"]
    _probe_all(store, auto, second, alike=True)  # every image the same picture
    assert auto.sampling_for("a") == auto.candidates[2]
    assert "diversity 0.00" in auto.describe()["candidates"][1]["result"]
    # Every candidate rejected: the recipe's own sampler draws the pool.
    for candidate in auto.candidates[2:-1]:
        assert auto.sampling_for("a") == candidate
        _probe_all(store, auto, candidate, kept=10)
    assert auto.sampling_for("a") == own
    told = auto.describe()
    assert told["state"] == "decided" and "no cheaper candidate" in told["reason"]


def test_a_new_judge_probes_again_with_images_it_judged(store: PoolStore) -> None:
    auto = _auto(store)
    _probe_all(store, auto, auto.own)
    _probe_all(store, auto, auto.candidates[0])
    assert auto.describe()["state"] == "probing"  # not read yet
    assert auto.sampling_for("a") == auto.candidates[0]
    assert auto.describe()["state"] == "decided"
    changed = _auto(store, judge_key="j2")  # the judge changed: its own evidence
    assert changed.basis != auto.basis
    assert changed.sampling_for("a") == changed.own
    assert "changed" in changed.describe()["reason"]


def test_an_undecided_label_gets_more_probes_on_both_arms(store: PoolStore) -> None:
    auto = _auto(store)
    own, first = auto.own, auto.candidates[0]
    _probe_all(store, auto, own)
    _probe(store, auto, first, "a", PROBE_IMAGES, kept=PROBE_IMAGES - 1)  # one miss: "more"
    _probe(store, auto, first, "b", PROBE_IMAGES)
    # Label a needs another round of both the recipe's sampler and the candidate's.
    assert auto.sampling_for("a") == own
    assert "need more images" in auto.describe()["reason"]
    _probe(store, auto, own, "a", PROBE_IMAGES)
    assert auto.sampling_for("a") == first
    _probe(store, auto, first, "a", PROBE_IMAGES)  # 127/128 against 128/128: not worse
    assert auto.sampling_for("a") == first and auto.describe()["state"] == "decided"


def test_tallies_outlive_eviction(open_store: Any) -> None:
    store = open_store(capacity_per_label=50)
    auto = _auto(store)
    _probe(store, auto, auto.own, "a", PROBE_IMAGES)
    _probe(store, auto, auto.own, "a", PROBE_IMAGES, kept=PROBE_IMAGES // 2)
    assert store.stats(PID, ["a"])["a"].fill == 50  # the pool kept 50 of 96 accepted
    assert auto._counts()[auto.own.id]["a"].judged == 2 * PROBE_IMAGES


def test_a_dropped_pool_filled_again_probes_afresh(store: PoolStore) -> None:
    """``genaug pool drop``: nothing of the pool is left (auto's decision and tallies, its
    recipe's spec, its stops), so the pool filled again decides on its own images."""
    auto = _auto(store)
    _probe_all(store, auto, auto.own)
    _probe_all(store, auto, auto.candidates[0])
    assert auto.sampling_for("a") == auto.candidates[0]
    assert auto.describe()["state"] == "decided"
    store.recipe_specs.record(PID, _recipe())
    store.stops.record(PID, "b", "stopped: the judge accepted 0 of 50", auto.judge_key)
    held = sum(store.fill(PID).values())
    assert held > 0 and store.drop_pool(PID) == held
    with store.unit_of_work(write=False) as uow:
        left = {table: int(uow.execute(f"SELECT COUNT(*) FROM {table} WHERE pool_id = ?",
                                       (PID,)).fetchone()[0])
                for table in ("images", *POOL_TABLES)}
    assert set(left.values()) == {0}, left

    again = _auto(store)  # the service started again on the dropped pool
    assert again.sampling_for("a") == again.own and again.describe()["state"] == "probing"
    _probe_all(store, again, again.own)
    assert again.sampling_for("a") == again.candidates[0]  # probed, not inherited
    assert again.describe()["state"] == "probing"
    assert again._counts()[again.own.id]["a"].judged == PROBE_IMAGES


def _undo_v6_sqlite(path: Any) -> None:
    import sqlite3

    conn = sqlite3.connect(path)
    for statement in ("ALTER TABLE images DROP COLUMN speed",
                      "ALTER TABLE images DROP COLUMN sampler", "DROP TABLE samplers",
                      "DROP TABLE sampler_tallies",
                      "UPDATE meta SET value = '5' WHERE key = 'schema_version'"):
        conn.execute(statement)
    conn.commit()
    conn.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_version_5_pool_is_upgraded_in_place(backend: str, target: str) -> None:
    """Schema 6 adds each image's speed and sampler and auto's tables: a version-5 pool keeps
    its images (speed and sampler not recorded: None), and records both from then on."""
    from _postgres import back_to_version, stored_schema_version

    from genaug.service.pool.open import open_pool
    from genaug.service.pool.types import SCHEMA_VERSION

    with open_pool(target, capacity_per_label=100) as store:
        store.add(PID, "a", np.zeros((2, 4, 4, 3), np.uint8), [1, 2], model_hash="m",
                  provenance=Provenance(steps=20, guidance=3.0))
        if backend == "postgresql":
            back_to_version(store, 5)
    if backend == "sqlite":
        _undo_v6_sqlite(target)
    with open_pool(target, capacity_per_label=100) as store:
        before = list(store.reads.iter_records(PID))
        assert [(r.provenance.steps, r.provenance.speed, r.provenance.sampler)
                for r in before] == [(20, None, None)] * 2
        made = Sampling("tcd", 2, 0.0, "turbo")
        store.add(PID, "a", np.zeros((1, 4, 4, 3), np.uint8), [3], model_hash="m",
                  scores=[0.5], keep=[True], provenance=Provenance(
                      steps=2, guidance=0.0, judge_key="j", speed="turbo", sampler=made.id))
        last = list(store.reads.iter_records(PID))[-1].provenance
        assert (last.speed, last.sampler) == ("turbo", "turbo:tcd:2:0")
        assert store.integrity_check() == "ok"
        if backend == "postgresql":
            assert stored_schema_version(store) == str(SCHEMA_VERSION) == "7"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_version_6_pools_samplers_are_named_by_id_and_its_decision_kept(
        backend: str, target: str) -> None:
    """Schema 6 named samplers by their display name, schema 7 by their stable id: a decided
    pool of schema 6 (images, tallies, the decision and its evidence under names, a turbo
    LoRA's sampler among them) is upgraded in place, and ``auto`` reads the same decision."""
    import sqlite3

    from _postgres import back_to_version

    from genaug.service.pool.open import open_pool
    from genaug.service.sampling.records import Evidence, SamplerRow

    lora = Sampling("lcm", 4, 1.0, "turbo", "lcm 1c0f2e3d4a5b6c7d")
    with open_pool(target, capacity_per_label=100) as store:
        auto = _auto(store)
        own, first = auto.own, auto.candidates[0]
        for sampling in (own, first, lora):
            for label in LABELS:
                _probe(store, auto, sampling, label, 8)
        store.samplers.write(PID, SamplerRow(
            auto.basis, "decided", first.name, "decided",
            Evidence(testing=first.name, rejected={lora.name: "worse"},
                     wanted={own.name: {"a": 128}}, since=1.0, decided_at=2.0)))
        # What genaug of schema 6 stored: every sampler by its name.
        renames = [(f"UPDATE {table} SET sampler = ? WHERE sampler = ?", (s.name, s.id))
                   for s in (own, first, lora) for table in ("images", "sampler_tallies")]
        if backend == "postgresql":
            back_to_version(store, 6)
            with store._tx(write=True) as conn:
                for statement, args in renames:
                    store._exec(conn, statement, args)
    if backend == "sqlite":
        conn = sqlite3.connect(target)
        for statement, args in renames:
            conn.execute(statement, args)
        conn.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
        conn.commit()
        conn.close()
    with open_pool(target, capacity_per_label=100) as store:
        drawn = {r.provenance.sampler for r in store.reads.iter_records(PID)}
        assert drawn == {own.id, first.id, lora.id}, drawn
        row = store.samplers.read(PID)
        assert row is not None and row.sampler == first.id
        assert row.evidence == Evidence(testing=first.id, rejected={lora.id: "worse"},
                                        wanted={own.id: {"a": 128}}, since=1.0, decided_at=2.0)
        assert {name for name, *_ in store.samplers.tallies(PID, "j1")} == {
            own.id, first.id, lora.id}
        again = _auto(store)
        assert again.sampling_for("a") == first and again.describe()["state"] == "decided"
        assert Sampling.from_id(lora.id) == lora and lora.id == "turbo:lcm:4:1:lcm:1c0f2e3d4a5b6c7d"


def test_at_the_most_probes_the_estimate_decides(store: PoolStore) -> None:
    """Both arms at the most probes and still not provably within the margin: the estimate
    decides (here 0.03 below: within it), and the reason says so."""
    assert final_test(60, 64, 62, 64) == "pass" and final_test(55, 64, 62, 64) == "fail"
    auto = _auto(store, max_probe=2 * PROBE_IMAGES)
    own, first = auto.own, auto.candidates[0]
    for _ in range(2):
        _probe_all(store, auto, own, kept=PROBE_IMAGES - 1)
        assert auto.sampling_for("a") in (own, first)
        _probe(store, auto, first, "a", PROBE_IMAGES, kept=PROBE_IMAGES - 3)
        _probe(store, auto, first, "b", PROBE_IMAGES, kept=PROBE_IMAGES - 1)
    assert auto.sampling_for("a") == first
    told = auto.describe()
    assert told["state"] == "decided", told
    assert "labels a decided on the estimate at 128 images" in told["reason"]


# -- probes are the asked images; stopped labels; the stop's evidence ------------------------


def test_a_hopeless_candidate_is_rejected_after_a_few_images_not_a_round(
        store: PoolStore) -> None:
    """The probes are the pool's asked-for images: a candidate whose images the judge
    rejects almost all of is rejected from EARLY_IMAGES on, before its round is complete."""
    from genaug.service.sampling.rule import EARLY_IMAGES

    auto = _auto(store)
    own, first = auto.own, auto.candidates[0]
    _probe_all(store, auto, own)
    assert auto.sampling_for("a") == first
    _probe(store, auto, first, "a", EARLY_IMAGES, kept=0)
    assert auto.sampling_for("a") == auto.candidates[1]  # no round of 64 spent on it
    assert "acceptance 0/8" in auto.describe()["candidates"][0]["result"]
    # A candidate merely unproven at a few images is not rejected early.
    _probe(store, auto, auto.candidates[1], "a", EARLY_IMAGES, kept=EARLY_IMAGES - 1)
    assert auto.sampling_for("a") == auto.candidates[1]


def test_a_label_the_judge_stopped_does_not_hold_the_pool_in_probing(
        store: PoolStore) -> None:
    halted: set[str] = set()
    auto = _auto(store, stopped=lambda: halted)
    own, first = auto.own, auto.candidates[0]
    _probe(store, auto, own, "a", PROBE_IMAGES)
    _probe(store, auto, first, "a", PROBE_IMAGES)
    assert auto.sampling_for("a") == first
    assert auto.describe()["state"] == "probing"  # label b has no probes
    assert auto.probe_needs() == {"b": PROBE_IMAGES}
    halted.add("b")  # the judge stopped b: the decision is made over a alone
    assert auto.sampling_for("a") == first
    assert auto.describe()["state"] == "decided"
    # Every label stopped: nothing is drawn, and the reason says why nothing is decided.
    other = AutoSampler(store.samplers, "other-0123456789ab", _recipe(), judge_key="j1",
                        adapters={}, turbo=None, stopped=lambda: {"a", "b"})
    other.sampling_for("a")
    assert other.describe()["state"] == "probing"
    assert "every label is stopped" in other.describe()["reason"]
    assert other.probe_needs() == {}


def test_the_stop_reads_the_drawing_samplers_never_a_candidates_probes(
        store: PoolStore) -> None:
    auto = _auto(store)
    own, first = auto.own, auto.candidates[0]
    _probe(store, auto, own, "a", PROBE_IMAGES, kept=10)
    _probe(store, auto, first, "a", PROBE_IMAGES, kept=0)  # a bad candidate's probes
    assert auto.stop_evidence()["a"] == (PROBE_IMAGES, 10)
    assert auto.stop_evidence()["b"] == (0, 0)


def test_a_restarted_sampler_knows_a_full_pools_probes_before_any_pick(
        store: PoolStore) -> None:
    """After a restart nothing is planned for a full label, so the sampler is never asked
    for one: its probe needs are read from the pool all the same, and the probing goes on."""
    auto = _auto(store)
    _probe_all(store, auto, auto.own)
    auto.sampling_for("a")
    restarted = _auto(store)
    assert restarted.probe_needs() == {"a": PROBE_IMAGES, "b": PROBE_IMAGES}
    told = restarted.describe()
    assert told["state"] == "probing" and told["since"] is not None
