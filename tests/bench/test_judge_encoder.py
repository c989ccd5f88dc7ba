"""bench/pool/judge_encoder.py, run as a user runs it: it names the encoder it chose, and it
chose on the ``fewshot`` split's digits 5-9 alone (shots and validation images apart in every
draw), reading the ``test`` split only for the report."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_encoder_is_chosen_on_validation_digits_never_on_the_test_split(
        tmp_path: Path) -> None:
    if importlib.util.find_spec("sklearn") is None:
        pytest.skip("needs scikit-learn")
    from sklearn.datasets import load_digits

    from genaug.digits import split_indices

    out = tmp_path / "judge_encoder.json"
    subprocess.run(
        [sys.executable, "-m", "bench.pool.judge_encoder", "--quick", "--shots", "1,5",
         "--json", str(out)],
        cwd=ROOT, check=True, capture_output=True, text=True, timeout=300,
    )
    result = json.loads(out.read_text())
    assert result["chosen"] in result["candidates"]
    assert result["today"] in result["candidates"]
    assert result["chosen_is_today"] == (result["chosen"] == result["today"])
    assert len(result["candidates"]) == 6

    target = np.asarray(load_digits().target)
    task = np.flatnonzero(np.isin(target, [5, 6, 7, 8, 9]))
    test, fewshot = split_indices("test"), split_indices("fewshot")
    chosen_on = np.asarray(result["chosen_on"])
    assert np.intersect1d(chosen_on, test).size == 0, "chose on test-split images"
    assert np.setdiff1d(chosen_on, np.intersect1d(fewshot, task)).size == 0
    for draw in result["draws"]:
        shots, validation = np.asarray(draw["shots"]), np.asarray(draw["validation"])
        assert np.intersect1d(shots, validation).size == 0, draw["seed"]
        assert len(shots) == 5 * draw["k"] and len(validation) == 5 * (30 - draw["k"])
    assert {(d["k"], d["seed"]) for d in result["draws"]} == {(1, 0), (1, 1), (5, 0), (5, 1)}
    # The report reads the whole test split of 5-9 (250 digits), and only after choosing.
    assert sorted(result["test_indices"]) == sorted(np.intersect1d(test, task).tolist())
    splits = {(s["candidate"], s["k"], s["split"]) for s in result["summary"]}
    assert splits == {(c, k, split) for c in result["candidates"] for k in (1, 5, "mean")
                      for split in ("validation", "test")}
