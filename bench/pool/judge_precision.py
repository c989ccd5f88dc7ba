"""The judge's precision and recall on an adapted generator's digits 5-9, by an outside classifier.

The unseen-class protocol's generator (bench/gain/unseen.py): ``tiny-digits-base`` (it never
saw digits 5-9) with a LoRA that ``genaug adapt`` trained on 5 shots per class of 5-9
(``--lora``; made by ``python -m bench.gain.tiny_digits_base --steps 6000 --rank 32 --out
DIR``, which also writes the shots it used to ``DIR/data/fewshot/<digit>/``: give that folder
as ``--shots``). It draws ``--per-digit`` images of each digit (seeds from ``--first-seed``, 20
steps, guidance 3, the LoRA at scale 1, as the service loads ``GENAUG_LORAS``); the judge a
recipe with ``judge: {shots: ...}`` gets at start-up (``tiny-digits-encoder``, rule ``shots``,
fitted on those same 5 shots per class) scores each image. Two outside classifiers, fitted on
the ``generator`` split's 997 real digits (never the judge, never the shots), say which images
show their digit: the logistic regression of the fidelity figures (8x8,
:func:`genaug.digits.fidelity_classifier`) and an RBF SVM on the same 8x8 digits. For each
``min_score`` the table gives how many images the judge keeps, the share of the kept ones that
show their label (precision), against the share of all images that do (no judge), and the share
of the correct images it keeps (recall).

    python -m bench.pool.judge_precision --lora DIR/five-to-nine.safetensors \\
        --shots DIR/data/fewshot [--per-digit 100]

Goals (min_score 0.9, the default): precision >= 0.95 where the unjudged images are at
0.85-0.90, recall >= 0.70.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import finish, goal_text, main, make_parser, table

DIGITS = (5, 6, 7, 8, 9)
MIN_SCORES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
DEFAULT_MIN_SCORE = 0.9


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "")
    parser.add_argument("--lora", type=Path, required=True)
    parser.add_argument("--shots", type=Path, required=True,
                        help="the adapter's shots: a folder with one subfolder per digit 5-9")
    parser.add_argument("--per-digit", type=int, default=None, help="default 100 (quick 10)")
    parser.add_argument("--first-seed", type=int, default=30_000)
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep the drawn images here (one .npy per LoRA, seeds and size) "
                        "and reuse them: judge settings compared on the same images")
    args = parser.parse_args(argv)
    per = args.per_digit or (10 if args.quick else 100)

    import numpy as np
    import torch
    from sklearn.svm import SVC

    from bench.gain.tiny_digits_base import sample
    from genaug.digits import PROMPTS, fidelity_classifier, load_split, to_digits8
    from genaug.service.judge import build_judges
    from genaug.service.pipeline.adapters import Adapters
    from genaug.service.pipeline.load import load_model
    from genaug.service.recipes.load import check_recipes, parse_recipes

    torch.set_num_threads(args.threads)
    model = load_model(source="tiny-digits-base", unet_weights=None, device="cpu",
                       dtype="auto")
    adapters = Adapters(model.pipeline, {"five-to-nine": args.lora},
                        base_hash=model.weights_hash)
    adapters.activate("five-to-nine", 1.0)
    started = time.perf_counter()
    cached = None
    if args.cache is not None:
        args.cache.mkdir(parents=True, exist_ok=True)
        cached = args.cache / f"{args.lora.stem}-{model.weights_hash}-{args.first_seed}-{per}.npy"
    if cached is not None and cached.is_file():
        images = np.load(cached)
    else:
        images = sample(model.pipeline, list(DIGITS), per, 20, 3.0, args.first_seed)
        if cached is not None:
            np.save(cached, images)
    sample_s = time.perf_counter() - started
    asked = np.repeat(np.asarray(DIGITS), per)

    text = ("recipes:\n  - name: digits-5-9\n    height: 64\n    width: 64\n    steps: 20\n"
            "    guidance: 3.0\n    judge: {shots: shots}\n    labels:\n"
            + "".join(f'      "{d}": {{prompts: ["{PROMPTS[str(d)]}"]}}\n' for d in DIGITS))
    recipes = parse_recipes(text, path=Path("judge_precision.yaml"))
    with tempfile.TemporaryDirectory(prefix="genaug-bench-") as tmp:
        root = Path(tmp)
        shutil.copytree(args.shots, root / "shots")
        check_recipes(recipes, data_root=root)
        judge = build_judges(recipes, root, model.device)["digits-5-9"]
    started = time.perf_counter()
    scores = np.concatenate([judge.score(images[asked == d], str(d)) for d in DIGITS])
    judge_s = time.perf_counter() - started

    real, labels = load_split("generator")
    svm = SVC(C=10.0, gamma="scale").fit(to_digits8(real), labels)
    outside = {"logreg": fidelity_classifier().predict(to_digits8(images)) == asked,
               "svm": svm.predict(to_digits8(images)) == asked}
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "per_digit": per, "first_seed": args.first_seed,
        "lora": str(args.lora), "sample_s": round(sample_s, 1),
        "judge_s": round(judge_s, 3), "by_min_score": {},
    }
    rows = []
    for name, correct in outside.items():
        result[f"unjudged_{name}"] = round(float(correct.mean()), 4)
        for min_score in MIN_SCORES:
            kept = scores >= min_score
            precision = float(correct[kept].mean()) if kept.any() else float("nan")
            recall = float(kept[correct].mean()) if correct.any() else float("nan")
            per_digit = {str(d): round(float(correct[kept & (asked == d)].mean()), 3)
                         if (kept & (asked == d)).any() else None for d in DIGITS}
            result["by_min_score"].setdefault(str(min_score), {})[name] = {
                "kept": int(kept.sum()), "precision": round(precision, 4),
                "recall": round(recall, 4), "precision_per_digit": per_digit}
            met = precision >= 0.95 and recall >= 0.70
            rows.append([name, min_score, f"{int(kept.sum())} of {len(kept)}",
                         round(float(correct.mean()), 3), round(precision, 3),
                         round(recall, 3),
                         goal_text(met) if min_score == DEFAULT_MIN_SCORE else ""])
    table("The judge on the adapter's digits 5-9 (tiny-digits-encoder, rule shots, 5 shots "
          "per class)",
          ["outside classifier", "min_score", "kept", "correct, no judge",
           "correct among kept", "correct kept", "goal (0.9)"], rows)
    default = result["by_min_score"][str(DEFAULT_MIN_SCORE)]["logreg"]
    result["met"] = default["precision"] >= 0.95 and default["recall"] >= 0.70
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
