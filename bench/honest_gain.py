"""Issue 19's honest protocol, the rows that need no generator: what real data alone buys.

The task is digits **5-9**, which the ``tiny-digits-base`` generator never saw; a classifier
gets k real shots per class from the ``fewshot`` split and is scored on the 250 ``test``
digits of 5-9. Every row trains the same small CNN (random shifts and rotations as graph ops:
the classic augmentation) under ``MirroredStrategy`` over 2 logical CPUs for the same steps,
in a TensorFlow child (:func:`genaug.trainer.fewshot.run_fewshot`), one run per seed:

* **arm 1**: real only, k = 5 (the baseline every generator arm is compared with);
* **k = 10, k = 20**: real only with more shots (to read "5 shots + genaug is worth N real
  shots" once the generator arms exist);
* **ceiling**: all ~500 real digits 5-9 of the ``generator`` split (so "fraction of the gap
  recovered" = (best - arm 1) / (ceiling - arm 1)).

Each row's difference to arm 1 is paired by seed (same seed: same initialisation and, for
k = 10 and 20, a superset drawn by the same generator); the table gives its mean and 95 %
confidence interval (Student t over the seeds).

The generator arms of the protocol (img2img from the base, text-to-image and img2img from a
LoRA adapted on the 5 shots, feedback-guided allocation, synthetic weighting) are not built
yet (issue 19, part 5): ``trainer/fewshot.py`` now takes ``classes`` (the task's digits,
remapped to outputs) and ``synthetic_weight``, and ``bench/tiny_digits_base.py`` adapts a
LoRA on a seed's shots, which is what they need.

    python bench/honest_gain.py --seeds 5 --steps 600 [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])

from _common import finish, table  # noqa: E402

TASK = [5, 6, 7, 8, 9]
ROWS: dict[str, dict[str, Any]] = {
    "arm 1: real only, k=5": {"per_class": 5},
    "real only, k=10": {"per_class": 10},
    "real only, k=20": {"per_class": 20},
    "ceiling: all real 5-9 (generator split)": {"per_class": None, "split": "generator"},
}
BASELINE = "arm 1: real only, k=5"


def paired(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and 95 % confidence interval (Student t) of paired differences."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from genaug.trainer.fewshot import FewShotRun, run_fewshot

    seeds = list(range(args.seeds))
    runs = [FewShotRun(arm=name, seed=s, steps=args.steps, classes=TASK, **spec)
            for name, spec in ROWS.items() for s in seeds]
    started = time.monotonic()
    results = run_fewshot(runs, timeout_s=600 + 20.0 * len(runs) * args.steps / 100)
    accuracy: dict[str, dict[int, float]] = {}
    for r in results:
        accuracy.setdefault(r["arm"], {})[r["seed"]] = r["test_accuracy"]
    base = accuracy[BASELINE]
    rows = []
    summary: dict[str, Any] = {}
    for name in ROWS:
        acc = accuracy[name]
        diffs = [100 * (acc[s] - base[s]) for s in seeds]
        mean, low, high = paired(diffs)
        summary[name] = {"accuracy": [acc[s] for s in seeds],
                         "mean": statistics.fmean(acc.values()),
                         "diff_points": {"mean": mean, "ci95": [low, high]}}
        ci = "" if name == BASELINE else f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]"
        rows.append([name, f"{100 * statistics.fmean(acc.values()):.1f}",
                     " ".join(f"{100 * acc[s]:.1f}" for s in seeds), ci])
    table(f"digits 5-9, test accuracy %, {len(seeds)} seeds, {args.steps} steps",
                ["row", "mean", "per seed", "vs arm 1, points: mean [95 % CI]"], rows)
    result = {"task": TASK, "seeds": seeds, "steps": args.steps, "rows": summary,
              "wall_s": round(time.monotonic() - started, 1),
              "runs": results}
    return finish(result, args.json)


if __name__ == "__main__":
    run()
