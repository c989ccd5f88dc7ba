"""The few-shot experiment in PyTorch (:mod:`genaug.experiments.fewshot_torch`): the
TensorFlow child's network, data order and options, and the child run for real (a tiny
service's pool, a DataLoader of 2 workers, genaug.torch's streams and need reports) with
TensorFlow unimportable; then ``genaug demo --trainer torch`` end to end (slow)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.experiments.fewshot import TORCH_UNSUPPORTED, FewShotRun, run_fewshot

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "sklearn")),
    reason="needs torch and scikit-learn")

# Three digits of the tiny model's 64x64 images in 2 steps: the pool fills in seconds.
DIGITS3 = """\
recipes:
  - name: digits3
    height: 64
    width: 64
    steps: 2
    guidance: 3.0
    base_seed: 3
    labels:
      "0": {prompts: [a handwritten zero]}
      "1": {prompts: [a handwritten one]}
      "2": {prompts: [a handwritten two]}
"""


@pytest.mark.parametrize("option", sorted(TORCH_UNSUPPORTED))
def test_an_option_torch_lacks_is_refused_naming_it(option: str) -> None:
    value: Any = [1.0, 1.0] if option == "rebalance" else 0.5
    with pytest.raises(ValueError, match=rf"does not support {option}=.*trainer='tensorflow'"):
        FewShotRun(arm="a", trainer="torch", **{option: value})
    FewShotRun(arm="a", **{option: value})  # TensorFlow's, as before
    with pytest.raises(ValueError, match=r"trainer 'jax': choose one of \['tensorflow', 'torch'\]"):
        FewShotRun(arm="a", trainer="jax")


def test_the_network_is_the_tensorflow_childs() -> None:
    import torch

    from genaug.experiments.fewshot_torch import ShiftRotate, build_cnn

    model = build_cnn(0, classes=10)
    # Keras's model: convolutions 3->32, 32->64, 64->64 (3x3, biases) and Dense(10): 56,970.
    assert sum(p.numel() for p in model.parameters()) == 896 + 18_496 + 36_928 + 650
    assert all(not p.detach().any() for n, p in model.named_parameters() if "bias" in n)
    images = torch.rand(4, 3, 64, 64)
    assert tuple(model(images).shape) == (4, 10)
    same = build_cnn(0, classes=10)  # the seed decides the weights and the draws
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters(),
                                                 strict=True))
    augment = ShiftRotate(seed=1)
    moved = augment(images)
    assert tuple(moved.shape) == (4, 3, 64, 64) and not torch.allclose(moved, images)
    assert torch.equal(ShiftRotate(seed=1)(images), moved)
    assert torch.equal(augment.eval()(images), images)  # the identity when scoring


def test_the_shots_come_in_tf_datas_order() -> None:
    import torch

    from genaug.experiments.fewshot_torch import Shots

    labels = np.arange(10) % 5
    shots = Shots(torch.zeros(10, 3, 2, 2), labels, seed=4, length=25)
    order = shots.order
    assert len(shots) == 25
    for start in (0, 10):  # each pass a permutation of the images, passes back to back
        assert sorted(order[start:start + 10].tolist()) == list(range(10))
    assert sorted(order[20:].tolist()) != list(range(5))  # shuffled, not the first five
    assert shots[3][1] == labels[order[3]]
    assert np.array_equal(Shots(torch.zeros(10, 3, 2, 2), labels, seed=4, length=25).order, order)


@pytest.fixture
def digits3(make_service: Any, tmp_path: Path) -> Any:
    (tmp_path / "recipes.yaml").write_text(DIGITS3)
    live = make_service(recipes=tmp_path / "recipes.yaml", pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=8, max_batch_images=8, max_wait_ms=5)
    return live


@pytest.mark.timeout(240)
def test_the_torch_child_mixes_the_pool_reports_need_and_never_imports_tensorflow(
        digits3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Any import of TensorFlow or Keras in the child fails it (run_fewshot then raises).
    for name in ("tensorflow", "keras"):
        (tmp_path / "blocked" / name).mkdir(parents=True)
        (tmp_path / "blocked" / name / "__init__.py").write_text(
            f"raise ImportError('{name} must not load in the torch child')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "blocked"))
    url = digits3.url
    common: dict[str, Any] = dict(trainer="torch", classes=[0, 1, 2], steps=20, seed=1)
    runs = [
        FewShotRun(arm="real only", service=url, need_recipes=["digits3"], **common),
        FewShotRun(arm="mixed", service=url, recipe="digits3", p=0.5, slots_per_class=8,
                   prefill_per_class=8, pool_per_label=8, prefill_timeout_s=120, **common),
        FewShotRun(arm="perfect pool", p=0.5, slots_per_class=6, reservoir_split="generator",
                   **common),
    ]
    started = time.monotonic()
    real, mixed, perfect = run_fewshot(runs, timeout_s=200, echo=False)
    took = time.monotonic() - started

    for result in (real, mixed, perfect):
        assert result["trainer"] == "torch" and result["train_images"] == 15
        assert 0.0 <= result["test_accuracy"] <= 1.0 and result["validation_images"] > 0
    assert real["mixed_fraction"] == 0.0 and real["feeder"] == 0
    # Need: one report per epoch, the last one taken by the service before the run ended
    # (all zeros would withdraw it: then no client counts).
    assert set(real["need"]) == {"0", "1", "2"}
    detail = httpx.get(f"{url}/v1/recipes/digits3", timeout=30).json()
    assert detail["need_clients"] == int(any(v > 0 for v in real["need"].values())), detail
    # Mixing: both workers drew their own stream under the run's one trainer name, each
    # prefilled with the whole pool before its first batch, so the share is p's.
    clients = [c["client"] for c in httpx.get(f"{url}/v1/clients", timeout=30).json()["clients"]]
    assert {"fewshot-mixed/r0/w0", "fewshot-mixed/r0/w1"} <= set(clients), clients
    assert mixed["reservoir_fill"] == [8, 8, 8] and mixed["feeder"] > 0
    assert 0.35 < mixed["mixed_fraction"] < 0.65, mixed["mixed_fraction"]
    # A perfect generator's pool: real digits of the generator split, no service.
    assert perfect["reservoir_fill"] == [6, 6, 6] and perfect["feeder"] == 0
    assert 0.35 < perfect["mixed_fraction"] < 0.65
    assert took < 150


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_demo_trained_by_torch_feeds_the_mixing_run(tmp_path: Path) -> None:
    """``genaug demo --trainer torch`` as a person runs it: the service, the grid, the pool,
    then both runs trained in the PyTorch child, the mixing run really fed from the pool, and
    the same figures printed as the TensorFlow demo prints."""
    out = tmp_path / "demo.png"
    proc = subprocess.run([sys.executable, "-m", "genaug.cli", "demo", "--trainer", "torch",
                           "--out", str(out)], capture_output=True, text=True, timeout=1100,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "in a separate PyTorch process" in proc.stdout
    assert "TensorFlow process" not in proc.stdout
    fed = re.search(r"\((\d+)% of examples synthetic, (\d+) images fed\)", proc.stdout)
    assert fed is not None, proc.stdout[-3000:]
    assert int(fed.group(1)) >= 20 and int(fed.group(2)) >= 160, fed.group(0)  # 16 per digit
    real = re.search(r"real only .*\s(0\.\d{3})\n", proc.stdout)
    assert real is not None and float(real.group(1)) > 0.5, proc.stdout[-3000:]
    assert "protocol: today's" in proc.stdout and out.is_file()
