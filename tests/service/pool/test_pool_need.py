"""Trainers steer the pool: ``POST /v1/recipes/{name}/feedback``, the need board, the planner.

Unit tests of :class:`NeedBoard` (with explicit clocks) and of the planner's choice; the rest
against a real service (tiny pipeline, uvicorn on 127.0.0.1, httpx and the genaug client).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from genaug.client import Client, InvalidRequestError
from genaug.service.pool.choice import choose_label
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


def test_the_planner_plans_the_needed_label_first(tmp_path: Path) -> None:
    recipe = Recipe(name="r", labels={k: LabelSpec(prompts=[k]) for k in LABELS},
                    height=8, width=8, steps=1, guidance=0.0)
    store = open_pool(str(tmp_path / "pool.db"), capacity_per_label=16)
    try:
        planner = PoolPlanner({"r": recipe}, store, model_hash="m", pregenerate=True,
                              need_half_life_s=30.0)
        first = planner.next_idle_batch(4)
        assert first is not None and first.items[0].prompt == "circle"  # emptiest first
        planner.report_need("r", "trainer-a", {"triangle": 3.0, "square": 1.0})
        planned = []
        for _ in range(4):
            work = planner.next_idle_batch(4)
            assert work is not None
            planned.append(work.items[0].prompt)
        assert planned.count("triangle") >= 3 and "square" in planned, planned
    finally:
        store.close()


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
