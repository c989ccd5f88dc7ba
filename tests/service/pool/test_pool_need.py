"""Trainers steer the pool: ``POST /v1/recipes/{name}/feedback``, the need board, the planner.

Unit tests of :class:`NeedBoard` (with explicit clocks), of the planner's choice and of the
split of an image budget (``/fill`` with ``images``); the rest against a real service (tiny
pipeline, uvicorn on 127.0.0.1, httpx and the genaug client).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from genaug.client import Client, InvalidRequestError
from genaug.service.errors import PoolFullError
from genaug.service.jobs.fill_jobs import FillJobs
from genaug.service.pool.choice import allocate, choose_label, label_score, label_weight
from genaug.service.pool.need import MAX_CLIENTS_PER_RECIPE, NeedBoard
from genaug.service.pool.open import open_pool
from genaug.service.pool.planner import PoolPlanner
from genaug.service.pool.types import LabelStats
from genaug.service.recipes.spec import LabelSpec, Recipe

LABELS = ["circle", "square", "triangle"]


# -- the board ---------------------------------------------------------------------------------


def test_each_report_is_normalised_and_two_clients_average() -> None:
    board = NeedBoard(half_life_s=10.0)
    board.report("r", "a", {"x": 200.0, "y": 200.0}, now=0.0)  # large numbers ...
    board.report("r", "b", {"x": 0.001}, now=0.0)  # ... count no more than small ones
    assert board.combined("r", ["x", "y", "z"], now=0.0) == pytest.approx(
        {"x": 0.75, "y": 0.25, "z": 0.0})
    assert board.clients("r", now=0.0) == 2
    board.report("r", "a", {}, now=0.0)  # withdrawn
    assert board.combined("r", ["x", "y"], now=0.0) == pytest.approx({"x": 1.0, "y": 0.0})
    assert board.combined("other", ["x"], now=0.0) == {"x": 0.0}


def test_need_decays_with_its_half_life_and_is_forgotten() -> None:
    board = NeedBoard(half_life_s=10.0)
    board.report("r", "a", {"x": 1.0}, now=0.0)
    assert board.combined("r", ["x"], now=10.0)["x"] == pytest.approx(0.5)
    assert board.combined("r", ["x"], now=20.0)["x"] == pytest.approx(0.25)
    # a fresh report next to a stale one: the fresh one counts in full, the stale one little
    board.report("r", "b", {"y": 1.0}, now=30.0)
    now = board.combined("r", ["x", "y"], now=30.0)
    assert now["x"] + now["y"] == pytest.approx(1.0) and now["y"] > 0.88
    assert board.clients("r", now=200.0) == 0  # both below 1/1000 of their weight
    assert board.combined("r", ["x", "y"], now=200.0) == {"x": 0.0, "y": 0.0}
    with pytest.raises(ValueError):
        NeedBoard(half_life_s=0)


def test_the_board_keeps_a_bounded_number_of_clients() -> None:
    board = NeedBoard(half_life_s=10.0)
    for i in range(MAX_CLIENTS_PER_RECIPE + 10):
        board.report("r", f"c{i}", {"x": 1.0}, now=0.0)
    assert board.clients("r", now=0.0) == MAX_CLIENTS_PER_RECIPE


# -- the planner's choice ----------------------------------------------------------------------


def test_choose_label_fills_the_needed_label_in_proportion() -> None:
    stats = {label: LabelStats(fill=0) for label in LABELS}
    assert choose_label(stats, 64) == "circle"  # no need: emptiest, ties to the first
    assert choose_label(stats, 64, need={"triangle": 1.0}) == "triangle"
    # Simulate a fill in batches of 8: the needed label fills m + 1 = 4 times faster.
    fill = dict.fromkeys(LABELS, 0)
    while fill["triangle"] < 64:
        label = choose_label({k: LabelStats(fill=v) for k, v in fill.items()}, 64,
                             need={"triangle": 1.0}, batch=8)
        assert label is not None
        fill[label] = min(64, fill[label] + 8)
    others = (fill["circle"] + fill["square"]) / 2
    assert others > 0 and 64 / others >= 3, fill


@contextmanager
def _planner(tmp_path: Path, capacity: int, **kwargs: Any) -> Iterator[PoolPlanner]:
    """A planner over recipe ``r`` (the three shape labels, 8x8 at 1 step) and a fresh
    SQLite pool of ``capacity`` images per label."""
    recipe = Recipe(name="r", labels={k: LabelSpec(prompts=[k]) for k in LABELS},
                    height=8, width=8, steps=1, guidance=0.0)
    store = open_pool(str(tmp_path / "pool.db"), capacity_per_label=capacity)
    try:
        yield PoolPlanner({"r": recipe}, store, model_hash="m", **kwargs)
    finally:
        store.close()


def _outcome(n: int) -> Any:
    import numpy as np

    from genaug.service.batching.items import Outcome

    return Outcome(images=[np.zeros((8, 8, 3), np.uint8)] * n)


def test_the_planner_plans_the_needed_label_first(tmp_path: Path) -> None:
    with _planner(tmp_path, 16, pregenerate=True, need_half_life_s=30.0) as planner:
        first = planner.next_idle_batch(4)
        assert first is not None and first.items[0].prompt == "circle"  # emptiest first
        planner.report_need("r", "trainer-a", {"triangle": 3.0, "square": 1.0})
        planned = []
        for _ in range(4):
            work = planner.next_idle_batch(4)
            assert work is not None
            planned.append(work.items[0].prompt)
        assert planned.count("triangle") >= 3 and "square" in planned, planned


# -- a budget of images split by need ----------------------------------------------------------


def test_label_weight_is_one_plus_shares_of_demand_and_need() -> None:
    assert label_weight(LABELS, "circle", {}, {}) == 1.0
    # demand 3:1:0 of 3 labels, need 0.5: 1 + 3 * 0.75 + 3 * 0.5
    demand = {"circle": 3.0, "square": 1.0}
    assert label_weight(LABELS, "circle", demand, {"circle": 0.5}) == pytest.approx(4.75)
    assert label_weight(LABELS, "triangle", demand, {"circle": 0.5}) == 1.0
    assert label_weight(LABELS, "square", {"square": -5.0}, {"square": -1.0}) == 1.0
    stats = {label: LabelStats(fill=4) for label in LABELS}  # a mapping works too
    assert label_weight(stats, "circle", demand, {}) == label_weight(LABELS, "circle", demand, {})
    # label_score is that weight over the progress after the next batch
    score = label_score(stats, "circle", 16, demand, {"circle": 0.5}, batch=4)
    assert score == pytest.approx(4.75 * 16 / 8)


def test_allocate_splits_by_weight_within_room() -> None:
    weights = {"a": 1.0, "b": 1.0, "c": 2.0}
    assert allocate(8, {"a": 10, "b": 10, "c": 10}, weights) == {"a": 2, "b": 2, "c": 4}
    # b is capped at its room; what it leaves goes to a and c in proportion 1:2
    assert allocate(10, {"a": 10, "b": 2, "c": 10}, weights) == {"a": 3, "b": 2, "c": 5}
    # ties of the remainders go to the first labels in room's order
    assert allocate(4, {"a": 5, "b": 5, "c": 5}, dict.fromkeys("abc", 1.0)) == {
        "a": 2, "b": 1, "c": 1}
    assert allocate(4, {"c": 5, "b": 5, "a": 5}, dict.fromkeys("abc", 1.0)) == {
        "c": 2, "b": 1, "a": 1}
    # more than the room: every label full; no room, or no budget: nothing
    assert allocate(100, {"a": 3, "b": 0, "c": 4}, weights) == {"a": 3, "b": 0, "c": 4}
    assert allocate(0, {"a": 3}, {"a": 1.0}) == {"a": 0}
    assert allocate(5, {"a": -2, "b": 5}, {"a": 9.0, "b": 1.0}) == {"a": 0, "b": 5}
    # weightless (or unweighed) labels get images only once the weighed ones are full
    assert allocate(5, {"a": 3, "b": 3, "c": 3}, {"a": 1.0, "b": 0.0}) == {"a": 3, "b": 1, "c": 1}
    assert allocate(3, {"a": 3, "b": 3}, {}) == {"a": 2, "b": 1}
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number >= 0"):
            allocate(1, {"a": 1}, {"a": bad})
    with pytest.raises(ValueError, match="budget"):
        allocate(-1, {"a": 1}, {"a": 1.0})


def test_allocate_sums_to_the_budget_and_follows_the_weights() -> None:
    import random

    rng = random.Random(19)
    for _ in range(300):
        labels = [f"l{i}" for i in range(rng.randint(1, 6))]
        room = {label: rng.randint(0, 20) for label in labels}
        weights = {label: rng.choice([0.0, 0.5, 1.0, 2.5, 7.0]) for label in labels}
        budget = rng.randint(0, 80)
        out = allocate(budget, room, weights)
        assert list(out) == labels and sum(out.values()) == min(budget, sum(room.values()))
        assert all(0 <= out[k] <= room[k] for k in labels), (room, out)
        # water-filling: before rounding (each share moves by less than one image), no
        # label gets more per unit of weight than one left below its room
        for a in labels:
            for b in labels:
                if weights[a] > 0 and weights[b] > 0 and out[b] < room[b]:
                    assert (out[a] - 1) / weights[a] < (out[b] + 1) / weights[b], (
                        budget, room, weights, out)


def _spend(jobs: FillJobs, images: int) -> dict[str, int]:
    """An ``images`` fill of recipe ``r``: what each label was asked."""
    answer, _ = jobs.budget("r", images)
    return dict(answer["per_label"])


def test_the_planner_spends_a_budget_by_need(tmp_path: Path) -> None:
    with _planner(tmp_path, 12, pregenerate=False, need_half_life_s=3600.0) as planner:
        jobs = FillJobs(planner)
        jobs.fill("r", 2)
        planner.report_need("r", "trainer-a", {"triangle": 1.0})
        # from the targets 2: weights 1, 1, 4 split 21 as 3.5, 3.5, 14 -> triangle capped at
        # its room 12 - 2 = 10; the 11 left split 5.5, 5.5 -> 6, 5 (the tie to circle)
        assert _spend(jobs, 21) == {"circle": 6, "square": 5, "triangle": 10}
        stats = planner.store.stats(planner.pool_ids["r"], LABELS)
        assert {k: s.target for k, s in stats.items()} == {
            "circle": 8, "square": 7, "triangle": 12}
        # more than the room left (4 + 5 + 0): the room is asked for, and the caller says so
        assert _spend(jobs, 10) == {"circle": 4, "square": 5, "triangle": 0}
        # no room at all: 409, naming the field and the fix
        with pytest.raises(PoolFullError, match="no room left") as info:
            _spend(jobs, 1)
        assert info.value.field == "images" and "GENAUG_POOL_CAPACITY_PER_LABEL" in str(
            info.value)


def test_a_budget_on_a_pre_generating_planner_moves_work_forward(tmp_path: Path) -> None:
    # Pre-generating: every label is already headed for the capacity, so a budget cannot
    # add work; it asks for images of the remaining work, which go before the background.
    with _planner(tmp_path, 12, pregenerate=True, need_half_life_s=3600.0) as planner:
        jobs = FillJobs(planner)
        pid = planner.pool_ids["r"]
        work = planner.next_idle_batch(4)  # background: the emptiest first
        assert work is not None and work.items[0].prompt == "circle"
        work.on_done(_outcome(len(work.items)))
        planner.report_need("r", "trainer-a", {"triangle": 1.0})
        # circle holds 4: room 8, 12, 12; weights 1, 1, 4 split 6 as 1, 1, 4
        assert _spend(jobs, 6) == {"circle": 1, "square": 1, "triangle": 4}
        asked = {k: planner.asked("r", k, s.target)
                 for k, s in planner.store.stats(pid, LABELS).items()}
        assert asked == {"circle": 5, "square": 1, "triangle": 4}
        # the asked-for images come first, whatever the background's own order says
        made: list[str] = []
        for _ in range(3):
            work = planner.next_idle_batch(4)
            assert work is not None
            made += [item.prompt for item in work.items]
            work.on_done(_outcome(len(work.items)))
        assert made[:6].count("triangle") == 4 and sorted(made[:6]) == sorted(
            ["triangle"] * 4 + ["circle", "square"]), made
        # then the background carries on to the capacity: nothing is full yet, no 409
        assert sum(_spend(jobs, 100).values()) == 12 * 3 - 10  # all the room left


# -- the route ---------------------------------------------------------------------------------


def _post(live: Any, body: Any, client: str = "a") -> httpx.Response:
    return httpx.post(f"{live.url}/v1/recipes/shapes/feedback", json=body,
                      headers={"X-Client-Id": client}, timeout=30)


def test_feedback_validates_labels_and_bounds(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False)
    r = _post(live, {"need": {"hexagon": 1}})
    assert r.status_code == 422
    message = r.json()["error"]["message"]
    assert "'hexagon'" in message and "'circle'" in message and "0 to 1000000" in message
    for value, bound in ((-1, "greater than or equal to 0"), (1e7, "less than or equal to"),
                         ("x", "valid number"), (True, "valid number")):
        r = _post(live, {"need": {"square": value}})
        assert r.status_code == 422, value
        error = r.json()["error"]
        assert error["field"] == "need" and "need.square" in error["message"], error
        assert bound in error["message"] and "GET /v1/recipes/" in error["message"], error
    assert _post(live, {"need": {"square": 1}, "extra": 1}).status_code == 422
    assert _post(live, {}).json()["error"]["message"].startswith("need is required")
    assert _post(live, {"need": {"square": 1}}, client="not ok!").status_code == 422
    nowhere = httpx.post(f"{live.url}/v1/recipes/none/feedback", json={"need": {}}, timeout=30)
    assert nowhere.status_code == 404
    # the schema says the same: labels an enum, values bounded, the client id a parameter
    doc = httpx.get(live.url + "/openapi.json", timeout=30).json()
    operation = doc["paths"]["/v1/recipes/shapes/feedback"]["post"]
    assert {p["name"] for p in operation["parameters"]} == {"X-Client-Id"}
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    need = doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]["properties"]["need"]
    assert need["propertyNames"] == {"enum": LABELS}
    assert need["additionalProperties"] == {"type": "number", "minimum": 0,
                                            "maximum": 1_000_000.0}
    # the client refuses what the service would, before sending
    with Client(live.url) as client, pytest.raises(ValueError, match="finite number >= 0"):
        client.feedback("shapes", {"square": float("nan")})
    with Client(live.url) as client, pytest.raises(InvalidRequestError, match="hexagon"):
        client.feedback("shapes", {"hexagon": 1.0})


def test_two_trainers_combine_and_need_decays(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False, need_half_life_s=0.5)
    with Client(live.url, client_id="trainer-a") as a, Client(live.url, client_id="trainer-b") as b:
        a.feedback("shapes", {"circle": 1000.0})
        answer = b.feedback("shapes", {"square": 0.5, "triangle": 0.5})
        assert answer["client"] == "trainer-b" and answer["need_clients"] == 2
        need = answer["need"]
        # b's fresh report weighs 1, a's a little less by now (its half-life is 0.5 s): the
        # average of the two normalised reports, whatever a's 1000 says about scale
        assert sum(need.values()) == pytest.approx(1.0, abs=1e-3)
        assert need["square"] == need["triangle"] and 0.2 < need["circle"] <= 0.5, need
        detail = a.recipe("shapes")
        assert detail["need_clients"] == 2 and set(detail["need"]) == set(LABELS)
        status = httpx.get(live.url + "/v1/status", timeout=30).json()
        assert status["recipes"][0]["need"]["circle"] > 0.4
        # not renewed: it fades (half-life 0.5 s) until it no longer counts
        deadline = time.monotonic() + 20
        while sum(a.recipe("shapes")["need"].values()) > 0.1:
            assert time.monotonic() < deadline, a.recipe("shapes")["need"]
            time.sleep(0.1)
        assert b.feedback("shapes", {})["need_clients"] <= 1  # {} withdraws b's need


def test_a_trainer_that_needs_one_label_sees_it_filled_3x_faster(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    # The goal of issue 19, at test size: the real planner, batcher, pipeline and pool. The
    # pipeline's own record of its calls says in which order images were made, so the count
    # at the moment the needed label is full does not depend on when this test polls.
    per_label = 16
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False, max_batch_images=4, max_wait_ms=5)
    with Client(live.url, client_id="trainer-a") as client:
        client.feedback("shapes", {"triangle": 1.0})
        client.fill("shapes", per_label=per_label)
        deadline = time.monotonic() + 60
        while (fill := client.recipe("shapes")["fill"])["triangle"] < per_label:
            assert time.monotonic() < deadline, fill
            time.sleep(0.05)
    made = dict.fromkeys(LABELS, 0)
    for _, items in list(live.worker.calls):
        for item in items:
            made[item.prompt.split()[-1]] += 1
        if made["triangle"] >= per_label:
            break
    others = (made["circle"] + made["square"]) / 2
    assert made["triangle"] == per_label and made["triangle"] >= 3 * others, made


def test_fill_with_images_spends_the_budget_by_need(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    capacity, budget = 12, 21
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False, pool_capacity_per_label=capacity,
                        max_batch_images=4, max_wait_ms=5, need_half_life_s=3600.0)
    url = f"{live.url}/v1/recipes/shapes/fill"
    with Client(live.url, client_id="trainer-a") as client:
        client.feedback("shapes", {"triangle": 1.0})
        # weights 1, 1, 1 + 3 * 1.0 over an empty pool: 3.5, 3.5, 14 -> triangle capped at
        # 12; the 9 left split 4.5, 4.5 -> 5, 4 (the tie to circle, the first label)
        weights = {k: label_weight(LABELS, k, {}, {"triangle": 1.0}) for k in LABELS}
        expected = allocate(budget, dict.fromkeys(LABELS, capacity), weights)
        assert expected == {"circle": 5, "square": 4, "triangle": 12}
        answer = client.fill("shapes", images=budget)
        assert answer["target_per_label"] == expected
        assert answer["budget"]["per_label"] == expected and answer["budget"]["asked"] == budget
        detail = client.recipe("shapes")
        # one target per label: what was asked is the target when nothing pre-generates
        assert {k: v["asked"] for k, v in detail["per_label"].items()} == expected
        assert all("target" not in v for v in detail["per_label"].values()), detail
        deadline = time.monotonic() + 60
        while (fill := client.recipe("shapes")["fill"]) != expected:
            assert time.monotonic() < deadline, fill
            time.sleep(0.05)
        per_label = client.recipe("shapes")["per_label"]
        assert sum(v["generated"] for v in per_label.values()) == budget
        assert all(v["reserved"] == 0 for v in per_label.values()), per_label
        # more than the room left (15 = 7 + 8 + 0 < 16): the room is asked for, and said;
        # then no room at all: 409 (it depends on the pool, not on the body); too many for
        # the schema (3 x 12), both fields, neither: 422 naming the field, bound and fix
        r = httpx.post(url, json={"images": 16}, timeout=30)
        assert r.status_code == 200, r.text
        said = r.json()["budget"]
        assert said["asked"] == 15 and said["requested"] == 16, said
        assert "1 fewer than requested" in said["note"], said
        assert r.json()["target_per_label"] == dict.fromkeys(LABELS, capacity)
        r = httpx.post(url, json={"images": 1}, timeout=30)
        error = r.json()["error"]
        assert r.status_code == 409 and error["field"] == "images", error
        assert error["type"] == "pool_full", error
        assert "no room left" in error["message"] and "GENAUG_POOL_CAPACITY_PER_LABEL" in (
            error["message"])
        deadline = time.monotonic() + 60
        while (fill := client.recipe("shapes")["fill"]) != dict.fromkeys(LABELS, capacity):
            assert time.monotonic() < deadline, fill
            time.sleep(0.05)
        r = httpx.post(url, json={"images": 3 * capacity + 1}, timeout=30)
        error = r.json()["error"]
        assert r.status_code == 422 and error["field"] == "images", error
        assert "less than or equal to 36" in error["message"], error
        r = httpx.post(url, json={"images": 4, "per_label": 4}, timeout=30)
        error = r.json()["error"]
        assert r.status_code == 422 and error["field"] == "images", error
        assert "not both" in error["message"] and "per_label" in error["message"], error
        r = httpx.post(url, json={}, timeout=30)
        error = r.json()["error"]
        assert r.status_code == 422 and error["field"] == "per_label", error
        assert error["message"].startswith("per_label or images is required"), error
        r = httpx.post(url, json={"images": None, "per_label": 2}, timeout=30)  # no nulls
        assert r.status_code == 422 and r.json()["error"]["field"] == "images", r.text
        # the schema says the same: one of the two, each bounded
        doc = httpx.get(live.url + "/openapi.json", timeout=30).json()
        operation = doc["paths"]["/v1/recipes/shapes/fill"]["post"]
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        schema = doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]
        assert schema["oneOf"] == [{"required": ["per_label"]}, {"required": ["images"]}]
        assert schema["properties"]["images"] == {
            "type": "integer", "minimum": 1, "maximum": 3 * capacity, "title": "Images",
            "description": schema["properties"]["images"]["description"]}
        with pytest.raises(InvalidRequestError, match="not both"):
            client.fill("shapes", per_label=2, images=2)
        assert client.recipe("shapes")["fill"] == dict.fromkeys(LABELS, capacity)


def test_a_budget_works_on_a_default_pre_generating_service(
    make_service: Any, tmp_path: Path
) -> None:
    # The README's recipe and fill call, on a service with default pool settings: it
    # pre-generates, so every label is already headed for the capacity. A budget moves images
    # of that work forward; it is never refused while the pool has room.
    import os
    import subprocess
    import sys

    recipes = Path(__file__).resolve().parents[3] / "recipes" / "wound_phases.yaml"
    live = make_service(recipes=recipes, pool_path=tmp_path / "pool.db")
    assert live.settings.pregenerate and live.settings.pool_capacity_per_label == 1000
    with Client(live.url) as client:
        live.wait_until(lambda: sum(client.recipe("wound-phases")["fill"].values()) > 0)
        client.feedback("wound-phases", {"R": 1.0})
        # `genaug pregenerate --images 30 --url ...`: 200, and watched until done
        run = subprocess.run(
            [sys.executable, "-m", "genaug.cli", "pregenerate", "--url", live.url,
             "--recipe", "wound-phases", "--images", "30"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "GENAUG_POOL_PATH": str(tmp_path / "other.db")},
        )
        assert run.returncode == 0, run.stderr
        assert "30 images asked for" in run.stderr, run.stderr
        detail = client.recipe("wound-phases")
        asked = {k: v["asked"] for k, v in detail["per_label"].items()}
        assert all(detail["fill"][k] >= asked[k] for k in asked), (detail["fill"], asked)
        assert detail["target_per_label"] == dict.fromkeys(["I", "P", "R"], 1000)
        # the README's call: more than the room left is all the room left, said so
        answer = client.fill("wound-phases", images=3000)
        budget = answer["budget"]
        left = 3000 - sum(detail["fill"].values())
        assert 0 < budget["asked"] <= left and budget["requested"] == 3000, budget
        assert "fewer than requested" in budget["note"], budget
        # now truly everything is asked for: 409, saying so
        r = httpx.post(f"{live.url}/v1/recipes/wound-phases/fill", json={"images": 1},
                       timeout=30)
        assert r.status_code == 409 and "no room left" in r.json()["error"]["message"], r.text
