"""A wait that cannot end says so: labels the judge stopped end every waiter.

The stop happens as in the product: the recipe's judge (``shots`` rule, the tiny pixel
encoder) learned ``circle`` from images the tiny model draws and ``square`` from their
negatives, which the model never draws. So the judge accepts most circles and almost no
squares, and after 50 judged squares the planner's low-acceptance stop (under 10 %) ends the
label. Then ``genaug pregenerate`` fills the rest and exits 3, a sample that waits answers at
once naming the label, and ``genaug doctor`` gives the judge's fix, each with the judge's
reason and fix as ``GET /v1/recipes/{name}`` reports it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.client import Client

#: Fill asked for: the circles need about 26 judged images for it, the squares stop at 50.
PER_LABEL = 16
#: What the judge's shots of ``square`` are: no image the tiny model draws looks like them.
SQUARE_FIX = "Fix: give the judge more or better shots (judge.shots: shots/square)"


@pytest.fixture(scope="module")
def judge_root(service: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root with ``shots/circle`` (16 images the tiny model drew for the recipe's
    prompts, other seeds than the pool's) and ``shots/square`` (their negatives)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("judge-root")
    with Client(service.url) as client:
        drawn = np.concatenate([
            client.generate(prompt, n=8, height=32, width=32, steps=2, guidance=3.0,
                            seed=1000 + 8 * k).images
            for k, prompt in enumerate(["a circle", "a square"])])
    for label, shots in (("circle", drawn), ("square", 255 - drawn)):
        (root / "shots" / label).mkdir(parents=True)
        for i, pixels in enumerate(shots):
            Image.fromarray(pixels).save(root / "shots" / label / f"{i}.png")
    return root


def _recipes(folder: Path, shapes_recipe: str) -> Path:
    """The test recipe with two labels (circle, square) and the judge at its default rule."""
    text = shapes_recipe.replace('      triangle: {prompts: ["a triangle"], '
                                 'negative_prompt: "blurry"}\n', "")
    text = text.replace("    labels:", "    judge: {shots: shots, min_score: 0.9}\n    labels:")
    path = folder / "recipes.yaml"
    path.write_text(text)
    return path


def _serve(make_service: Any, tmp_path: Path, shapes_recipe: str, judge_root: Path) -> Any:
    # pregenerate off: only what the test asks for is generated, so the stop is its doing
    return make_service(recipes=_recipes(tmp_path, shapes_recipe),
                        pool_path=tmp_path / "pool.db", pregenerate=False,
                        pool_capacity_per_label=64, max_batch_images=8, data_root=judge_root)


def _detail(live: Any) -> dict[str, Any]:
    r = httpx.get(f"{live.url}/v1/recipes/shapes", timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _run_within(cmd: list[str], env: dict[str, str], limit_s: float) -> tuple[int, str, float]:
    """Run ``cmd`` in its own process group; Ctrl-C to the group when it outlives
    ``limit_s`` (the test then fails, with what it printed)."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"{cmd[3]} still waited after {limit_s:.0f} s:\n{err[-3000:]}")
    return proc.returncode, err, time.monotonic() - started


def test_pregenerate_fills_the_rest_and_exits_3_naming_the_stopped_label(
        make_service: Any, tmp_path: Path, shapes_recipe: str, judge_root: Path) -> None:
    from genaug.doctor import check_pool
    from genaug.service.commands.pregenerate import STOPPED_EXIT

    live = _serve(make_service, tmp_path, shapes_recipe, judge_root)
    env = {**os.environ, "GENAUG_POOL_PATH": str(tmp_path / "pool.db")}
    code, err, took = _run_within(
        [sys.executable, "-m", "genaug.cli", "pregenerate", "--url", live.url, "--recipe",
         "shapes", "--per-label", str(PER_LABEL)], env, limit_s=60)
    detail = _detail(live)
    assert set(detail["stopped"]) == {"square"}, detail["per_label"]
    assert detail["per_label"]["square"]["judged_total"] >= 50
    assert code == STOPPED_EXIT == 3, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    # every label that is not stopped holds its images; the stopped one is named, with the
    # judge's reason and fix as the service reports them, and what it holds
    assert detail["fill"]["circle"] >= PER_LABEL > detail["fill"]["square"], detail["fill"]
    reason = detail["stopped"]["square"]
    assert f"  square ({detail['fill']['square']} of {PER_LABEL}): {reason}" in err, err[-3000:]
    assert SQUARE_FIX in reason and "circle filled" in err, err[-3000:]
    assert "exit status 3" in err and took < 60
    # it followed its job, which the stop ended: the job says so, and `genaug jobs wait` ends
    # with the same status and the same lines
    with Client(live.url) as client:
        (job,) = client.jobs("shapes")
    assert job["state"] == "stopped" and job["labels"]["square"]["stopped"], job
    assert f"label 'square' {reason}" in job["reason"], job["reason"]
    code, waited, _ = _run_within(
        [sys.executable, "-m", "genaug.cli", "jobs", "wait", job["id"], "--url", live.url],
        env, limit_s=60)
    assert code == 3, waited[-3000:]
    assert f"  square ({detail['fill']['square']} of {PER_LABEL}): {reason}" in waited, waited
    assert f"genaug jobs: job {job['id']} (recipe 'shapes') stopped: circle filled" in waited
    # the doctor's advice agrees: the judge's fix, never a pregenerate that cannot finish
    check = check_pool(detail, slots=PER_LABEL, epoch_s=None, pregenerate=False, url=live.url)
    assert check.status == "warn" and "the judge stopped 1 label(s)" in check.message
    assert "square (" in check.message and "accepted" in check.message, check.message
    assert check.fix.startswith("square: give the judge more or better shots "
                                "(judge.shots: shots/square)"), check.fix
    assert "then restart the service; then fill the pool: genaug pregenerate" in check.fix


def test_a_sample_that_waits_answers_once_its_label_is_stopped(
        make_service: Any, tmp_path: Path, shapes_recipe: str, judge_root: Path) -> None:
    live = _serve(make_service, tmp_path, shapes_recipe, judge_root)
    with Client(live.url) as client:
        started = time.monotonic()
        # 32 squares asked for, waiting up to 120 s: the judge stops the label after 50
        result = client.sample("shapes", labels=["square"], n=32, wait_s=120.0)
        took = time.monotonic() - started
        detail = _detail(live)
        assert set(detail["stopped"]) == {"square"}, detail["per_label"]
        assert took < 60, f"the sample waited {took:.0f} s for a stopped label"
        assert result.stopped == {"square": detail["stopped"]["square"]}
        assert SQUARE_FIX in result.stopped["square"]
        assert len(result) == detail["fill"]["square"] < 32  # what it has, at once
        # once stopped, a wait returns at once, with what the other labels hold
        started = time.monotonic()
        mixed = client.sample("shapes", n=8, wait_s=30.0)
        assert time.monotonic() - started < 30
        assert mixed.stopped == {"square": detail["stopped"]["square"]}
    # a browser's PNG answer names it in a header
    r = httpx.post(f"{live.url}/v1/recipes/shapes/sample", headers={"Accept": "image/png"},
                   json={"labels": ["square"], "n": 4, "wait_s": 30.0}, timeout=60)
    assert r.status_code in (200, 204) and r.headers["X-Genaug-Stopped-Labels"] == "square"
    # the demo's and the few-shot runs' pool waits end at once, with the judge's reason
    from genaug.experiments.demo import wait_for_pool
    from genaug.experiments.fewshot import FewShotRun, PoolStoppedError, _wait_for_full_pool

    started = time.monotonic()
    with pytest.raises(PoolStoppedError) as demo:
        wait_for_pool(live.url, "shapes", 32, timeout=60)
    with pytest.raises(PoolStoppedError) as fewshot:
        _wait_for_full_pool(FewShotRun(arm="p=0.5", service=live.url, recipe="shapes",
                                       pool_per_label=32), time.monotonic() + 60)
    assert time.monotonic() - started < 10
    for raised in (demo.value, fewshot.value):
        assert raised.stopped == {"square": detail["stopped"]["square"]}
        assert str(raised).startswith("recipe 'shapes': the judge stopped 1 label(s) short of "
                                      f"32 images (square {detail['fill']['square']} held)")
        assert f"  square: {detail['stopped']['square']}" in str(raised)


def test_pregenerate_in_process_exits_3_naming_the_stopped_label(
        tmp_path: Path, shapes_recipe: str, judge_root: Path) -> None:
    env = {**os.environ, "GENAUG_MODEL": "tiny-random",
           "GENAUG_RECIPES": str(_recipes(tmp_path, shapes_recipe)),
           "GENAUG_DATA_ROOT": str(judge_root), "GENAUG_POOL_PATH": str(tmp_path / "pool.db"),
           "GENAUG_MAX_BATCH_IMAGES": "8", "OMP_NUM_THREADS": "1"}
    code, err, _ = _run_within(
        [sys.executable, "-m", "genaug.cli", "pregenerate", "--recipe", "shapes",
         "--per-label", str(PER_LABEL)], env, limit_s=120)
    assert code == 3, err[-3000:]
    assert "Traceback" not in err and "circle filled" in err, err[-3000:]
    line = next(line for line in err.splitlines() if line.startswith("  square ("))
    assert "stopped: the judge accepted" in line and "of label 'square'" in line, line
    assert SQUARE_FIX in line, line


def test_an_images_budget_refused_because_every_label_with_room_is_stopped_exits_3(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--images B``: the service answers 409 when no label but stopped ones has room; the
    command then names the stopped labels with the judge's reason (exit 3), not a bare 1.
    (A unit test of the command's routing, with a stand-in client: the live stop is above.)"""
    import argparse

    import genaug.client
    from genaug.client import StatusError
    from genaug.service.commands import pregenerate

    reason = f"stopped: the judge accepted 2 of the 50 images of label 'square' ... {SQUARE_FIX}"

    class Refusing:
        def __init__(self, url: str) -> None:
            pass

        def __enter__(self) -> Refusing:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def fill(self, recipe: str, **kwargs: Any) -> dict[str, Any]:
            raise StatusError("no label of recipe 'shapes' has room: square stopped ...",
                              status=409)

        def recipe(self, name: str) -> dict[str, Any]:
            return {"name": name, "fill": {"circle": 64, "square": 3},
                    "stopped": {"square": reason}}

    monkeypatch.setattr(genaug.client, "Client", Refusing)
    args = argparse.Namespace(url="http://127.0.0.1:9", recipe="shapes", per_label=None,
                              images=8)
    assert pregenerate._pregenerate_remote(args) == pregenerate.STOPPED_EXIT
    err = capsys.readouterr().err
    assert f"  square (3 held): {reason}" in err and "exit status 3" in err
