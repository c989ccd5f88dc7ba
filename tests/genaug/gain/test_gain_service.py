"""``genaug gain``'s pool and variants arms through a real service: labels mapped by name,
the pool filled by a job, variants of each seed's shots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from _gain_helpers import gain, mnist, summary, write


def test_pool_and_variants_arms_through_a_real_service(digits: dict[str, Path], tmp_path: Path,
                                                       fill_service: Any) -> None:
    """The pool and variants arms end to end: the recipe's labels mapped by name (three MNIST
    digits as the test recipe's circle, square and triangle), the pool filled by a job and
    sampled, variants of each seed's shots; a recipe lacking DATA's labels is refused."""
    x, y = mnist()
    pick = np.concatenate([np.flatnonzero(y == c)[:24] for c in range(3)])
    data = tmp_path / "shapes-data"
    write(data, x[pick], y[pick], names=["circle", "square", "triangle"])
    out = tmp_path / "report"
    done = gain(str(data), "--recipe", "shapes", "--url", fill_service.url, "--out", str(out),
                 "--arms", "real,pool,variants", "--per-label", "8", "--shots", "1,2",
                 "--seeds", "2", "--steps", "30", "--test-per-label", "10", "--jobs", "2",
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = summary(out)
    assert {(a, k) for a, k in rows} == {(a, k) for a in ("real", "pool", "variants")
                                           for k in (1, 2)}
    assert f"service {fill_service.url}: ready" in done.stderr
    detail = fill_service.recipe("shapes")
    assert all(detail["fill"][label] >= 8 for label in ("circle", "square", "triangle"))
    # A recipe that lacks DATA's labels: named, with the recipe's.
    other = tmp_path / "other-data"
    write(other, x[pick], y[pick], names=["circle", "square", "hexagon"])
    done = gain(str(other), "--recipe", "shapes", "--url", fill_service.url, "--out",
                 str(tmp_path / "other"), "--arms", "real,pool", "--shots", "1",
                 "--test-per-label", "10", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "genaug gain: recipe 'shapes' has no label(s) hexagon (it has circle, square, "
        "triangle); name DATA's folders as the recipe's labels, or give another --recipe")


def test_the_adapted_arm_adapts_on_each_seeds_shots_and_draws_with_it(
        tmp_path: Path, fill_service: Any) -> None:
    """``adapted``: ``genaug adapt`` on each seed's shots (the service's own built-in model, a
    few steps here), every LoRA served by one local service, its images mixed in; a resumed
    run adapts nothing again."""
    x, y = mnist()
    pick = np.concatenate([np.flatnonzero(y == c)[:24] for c in range(3)])
    data = tmp_path / "shapes-data"
    write(data, x[pick], y[pick], names=["circle", "square", "triangle"])
    out = tmp_path / "report"
    args = [str(data), "--recipe", "shapes", "--url", fill_service.url, "--out", str(out),
            "--arms", "real,adapted", "--adapt-steps", "3", "--per-label", "4", "--shots", "1",
            "--seeds", "2", "--steps", "20", "--test-per-label", "10", "--jobs", "2"]
    done = gain(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert {(a, k) for a, k in summary(out)} == {("real", 1), ("adapted", 1)}
    work = out / ".gain"
    loras = sorted(p.name for p in (work / "adapted").glob("*.safetensors"))
    assert loras == ["k1s0.safetensors", "k1s1.safetensors"]
    assert "adapted: genaug adapt on k=1 seed 0's shots (1 of 2), model tiny-random" in done.stderr
    # Each LoRA saw its seed's shots only: one image per label, the seed's.
    shots = sorted(p.name for p in (work / "adapted" / "k1s0" / "data").rglob("*.png"))
    assert len(shots) == 3
    with np.load(work / "sources" / "adapted-k1-s0.npz") as kept:
        assert kept["images"].shape[0] == 3 * 4 and set(kept["labels"].tolist()) == {0, 1, 2}
    again = gain(*args, cwd=tmp_path)
    assert again.returncode == 0 and "genaug adapt on" not in again.stderr
