"""bench/gain/honest_gain.py's pieces that need no service: the judge's bar from the shots at
every k, and the record a run resumes from. The whole protocol runs in
``tests/bench/test_augmentation_gain.py`` (slow, k = 1 only)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bench.gain.honest_gain import Record, judge_bar, kind_recipe, real_key, shots_folder


@pytest.mark.parametrize("k", [1, 2, 5])
def test_the_judges_bar_comes_from_the_shots_at_every_k(tmp_path: Path, k: int) -> None:
    if importlib.util.find_spec("sklearn") is None:
        pytest.skip("needs scikit-learn")
    from genaug.digits import write_split_folders

    write_split_folders(tmp_path / "data" / f"k{k}-s0", ["fewshot"], per_class=k, seed=0)
    assert shots_folder(tmp_path, k, 0).is_dir()
    bar = judge_bar(tmp_path, k, 0)
    if k == 1:
        assert bar == 0.5  # no shot can be held out
    else:  # the held-out shots' 10 % quantile, never above the recipe default
        assert 0.2 < bar <= 0.9
    spec = kind_recipe("lora-var-j-k1-s0", "lora-var-j", k, 0, 20, bar)
    assert spec["judge"] == {"shots": f"k{k}-s0/fewshot", "encoder": "tiny-digits-encoder",
                             "rule": "shots", "min_score": bar}
    assert spec["labels"]["5"]["variants_per_image"] == -(-20 // k)
    assert spec["labels"]["5"]["adapter"]["name"] == f"lora-k{k}-s0"
    assert "judge" not in kind_recipe("base-var-k1-s0", "base-var", k, 0, 20, bar)


def test_the_record_keeps_every_finished_run_across_runs(tmp_path: Path) -> None:
    record = Record(tmp_path / "rows.jsonl")
    record.add([{"key": real_key(1, 0), "test_accuracy": 0.7},
                {"key": real_key(None, 0), "test_accuracy": 0.98}])
    again = Record(tmp_path / "rows.jsonl")
    assert "real-n1-s0" in again and "ceiling-s0" in again and "real-n2-s0" not in again
    assert again.runs["ceiling-s0"]["test_accuracy"] == 0.98
