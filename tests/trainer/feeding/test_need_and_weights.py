"""The trainer steers the pool and synthetic images may count less (issue 19, parts 3 and 4).

One TensorFlow child (``_need_child.py``, 4 logical CPUs) checks ``mix(...,
synthetic_weight=w)`` example by example against the pixels, fits with the weights under
MirroredStrategy with the audit clean, and reports need through :class:`NeedCallback` (a real
client) and a feeder's ``report_need`` to a real service started here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _tf_env import tf_child_env

from genaug.feeding.class_error import per_class_need, rebalance_weights

HERE = Path(__file__).resolve().parent
MARK = "GENAUG_RESULT "
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def child(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Any, shapes_recipe: str
) -> Iterator[dict[str, Any]]:
    from genaug.service.testing import start_service

    env = tf_child_env()
    folder = tmp_path_factory.mktemp("need")
    (folder / "recipes.yaml").write_text(shapes_recipe)
    with start_service(tiny_model, recipes=folder / "recipes.yaml",
                       pool_path=folder / "pool.db", pool_capacity_per_label=8) as live:
        proc = subprocess.run([sys.executable, str(HERE / "_need_child.py"), live.url],
                              capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
                              cwd=HERE)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"_need_child.py failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n"
                    f"{proc.stderr[-6000:]}")
    yield json.loads(lines[-1][len(MARK):])


def test_synthetic_weight_keeps_labels_and_weights_aligned_with_pixels(
    child: dict[str, Any]
) -> None:
    counts = child["alignment"]  # the child asserted each example; both kinds occurred
    assert counts["replaced"] > 100 and counts["kept"] > 100, counts


def test_fit_with_synthetic_weights_under_mirrored_strategy_keeps_the_audit_clean(
    child: dict[str, Any]
) -> None:
    assert np.isfinite(child["fit"]["loss"]) and 0.2 < child["fit"]["mixed"] < 0.8, child["fit"]


def test_need_callback_reports_per_class_error_to_the_service(child: dict[str, Any]) -> None:
    need = child["need"]
    assert len(need["sent"]) == 3 and set(need["sent"][-1]) == {"circle", "square", "triangle"}
    last = need["sent"][-1]  # per-class loss: above 0 for every label
    assert min(last.values()) > 0, last
    total = sum(last.values())  # the service normalised it: its shares, one client
    for label, value in last.items():
        assert need["detail_need"][label] == pytest.approx(value / total, abs=0.02)
    assert need["clients"] == 1


def test_feeder_posts_reported_need_under_its_identity(child: dict[str, Any]) -> None:
    need = child["need"]
    assert need["feeder_sent"] == {"triangle": 2.0, "circle": 0.0}  # unknown labels left out
    assert need["after_clients"] >= 1 and need["after_need"]["triangle"] > 0.3


def test_per_class_need_error_and_loss() -> None:
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.3, 0.7]])
    labels = np.array([0, 1, 1, 1])
    np.testing.assert_allclose(per_class_need(probs, labels, 2), [0.0, 1 / 3])
    loss = per_class_need(probs, np.eye(2)[labels], 2, measure="loss")
    np.testing.assert_allclose(loss, [-np.log(0.9), -np.mean(np.log([0.4, 0.8, 0.7]))])
    assert per_class_need(probs[:1], labels[:1], 3 - 1)[1] == 0.0  # no examples: no need
    with pytest.raises(ValueError, match="one score per class"):
        per_class_need(probs, labels, 3)


def test_rebalance_weights_follow_the_planners_weights() -> None:
    from genaug.service.pool.choice import label_weight

    label_map = {"3": 0, "5": 1, "8": 2}
    need = {"3": 0.3, "8": 0.1, "unknown": 5.0}  # labels outside the map are ignored
    weights = rebalance_weights(need, label_map)
    np.testing.assert_allclose(weights, [1 + 3 * 0.75, 1.0, 1 + 3 * 0.25])
    # the same weights the pool planner fills by (it gets the need already as shares)
    shares = {"3": 0.75, "8": 0.25}
    np.testing.assert_allclose(weights, [label_weight(list(label_map), k, {}, shares)
                                         for k in label_map])
    assert rebalance_weights(None, label_map) == [1.0, 1.0, 1.0]
    assert rebalance_weights({"3": 0.0}, label_map) == [1.0, 1.0, 1.0]  # nothing needed: even
