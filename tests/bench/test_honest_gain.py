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
    # The auto pool beside it: the same recipe, judged, drawn with speed auto.
    auto = kind_recipe("lora-var-j-auto-k1-s0", "lora-var-j-auto", k, 0, 20, bar)
    assert auto.pop("speed") == "auto" and "speed" not in spec
    assert {**auto, "name": spec["name"]} == spec


def test_the_record_keeps_every_finished_run_across_runs(tmp_path: Path) -> None:
    record = Record(tmp_path / "rows.jsonl")
    record.add([{"key": real_key(1, 0), "test_accuracy": 0.7},
                {"key": real_key(None, 0), "test_accuracy": 0.98}])
    again = Record(tmp_path / "rows.jsonl")
    assert "real-n1-s0" in again and "ceiling-s0" in again and "real-n2-s0" not in again
    assert again.runs["ceiling-s0"]["test_accuracy"] == 0.98


def test_a_work_folder_holds_one_trainers_rows(tmp_path: Path) -> None:
    """``--trainer torch`` on a folder of TensorFlow rows (rows written before runs named
    their trainer count as TensorFlow's) stops before training, naming the fix; the torch
    rows resume in a folder of their own."""
    Record(tmp_path / "rows.jsonl").add([{"key": real_key(1, 0), "test_accuracy": 0.7}])
    with pytest.raises(SystemExit, match="trained by tensorflow, not torch: give --trainer "
                       "torch a --workdir of its own"):
        Record(tmp_path / "rows.jsonl", "torch")
    mine = tmp_path / "torch"
    mine.mkdir()
    Record(mine / "rows.jsonl", "torch").add([{"key": real_key(1, 0), "trainer": "torch"}])
    assert real_key(1, 0) in Record(mine / "rows.jsonl", "torch")
    with pytest.raises(SystemExit, match="trained by torch, not tensorflow"):
        Record(mine / "rows.jsonl")


def test_generated_rows_trained_on_other_shots_than_k_are_trained_again(
        tmp_path: Path) -> None:
    """Until 2026-11-28 the generated arms trained on FewShotRun's default 5 real shots per
    class whatever k: such a row of k = 1 is forgotten (to be trained again), a k = 5 row and
    the real-only rows are kept, and the line that supersedes it wins on the next load."""
    from bench.gain.honest_gain import arm_key, drop_stale

    record = Record(tmp_path / "rows.jsonl")
    record.add([{"key": arm_key("lora-var", 1, 0), "per_class": 5, "recipe": "r"},
                {"key": "need-" + arm_key("lora-var", 1, 0), "per_class": 5, "recipe": "r"},
                {"key": arm_key("lora-var", 1, 1), "per_class": 1, "recipe": "r"},
                {"key": arm_key("lora-var", 5, 0), "per_class": 5, "recipe": "r"},
                {"key": real_key(1, 0), "per_class": 1, "recipe": None}])
    assert drop_stale(record, 5, [0]) == []
    assert sorted(drop_stale(record, 1, [0, 1])) == ["lora-var-k1-s0", "need-lora-var-k1-s0"]
    assert "lora-var-k1-s0" not in record and "lora-var-k1-s1" in record
    assert real_key(1, 0) in record and "lora-var-k5-s0" in record
    record.add([{"key": arm_key("lora-var", 1, 0), "per_class": 1, "recipe": "r"}])
    again = Record(tmp_path / "rows.jsonl")
    assert drop_stale(again, 1, [0, 1]) == ["need-lora-var-k1-s0"]
