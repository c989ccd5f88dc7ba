"""The honest protocol: does genaug help when the generator never saw the classes?

The task is digits **5-9**, which the ``tiny-digits-base`` generator never saw (the stand-in
for SDXL facing a user's wound phases). A classifier gets k = 5 real shots per class from the
``fewshot`` split and is scored on the 250 ``test`` digits of 5-9. Every row trains the same
small CNN (random shifts and rotations as graph ops: the classic augmentation) under
``MirroredStrategy`` over 2 logical CPUs for the same steps, in a TensorFlow child
(:func:`genaug.experiments.fewshot.run_fewshot`), one run per seed. The generator arms go through
the real path: ``genaug serve`` (``GENAUG_MODEL=tiny-digits-base``, one LoRA per seed in
``GENAUG_LORAS``) fills recipe pools, a ``ReservoirFeeder`` samples them into a
``SyntheticReservoir`` and ``reservoir.mix`` replaces real examples with p = 0.5.

Per seed, ``genaug adapt`` trains a LoRA on the seed's 25 shots only (the CLI, 6,000 steps at
rank 32: the settings ``bench.gain.tiny_digits_base`` found to reach the fidelity goal). Rows:

* **1** real only, k = 5 (the baseline every row is paired with);
* **references**: real only at k = 10 and 20; the ceiling, all ~500 real 5-9 of the
  ``generator`` split;
* **2** + img2img variants of the shots from the base, no adaptation (Real Guidance),
  10 per shot, at each strength of ``--strengths``;
* **3** + text-to-image from the seed's LoRA, 50 per class;
* **4** + img2img variants of the shots from the seed's LoRA (DA-Fusion), 10 per shot, at
  each strength;
* **5** the best of 3 and 4 with **feedback-guided allocation** at ``--budget`` (60 %) of
  its images: arm 1's trainer reports per-class need (its error on the validation images,
  :class:`~genaug.trainer.NeedCallback` -> ``POST /v1/recipes/{name}/feedback``), then
  ``POST /v1/recipes/{name}/fill {"images": B}`` has the planner spend the budget by that
  need. With it, the same budget spread evenly (the same fill on a recipe nobody reported
  need for: the control), and the need-allocated pool with replacements drawn by need
  (``mix(rebalance=...)``, weights ``1 + m * need share`` as the planner's);
* **6** the best so far (arms 2-5, on validation) with synthetic examples weighted by each of
  ``--weights``.

Settings (strength, arm 3 vs 4, arm 5's form, the weight) are chosen on **validation**
accuracy: the ``fewshot`` split's 5-9 images that the seed did not draw as shots (125), never
the test digits; the table marks the chosen rows. Each row's difference to arm 1 is paired by
seed; the table gives its mean and 95 % confidence interval (Student t over the seeds), and
the summary the fraction of the gap recovered, (best - arm 1) / (ceiling - arm 1).

    python -m bench.gain.honest_gain --workdir artifacts/honest --json artifacts/honest/result.json
    python -m bench.gain.honest_gain --quick      # 1 seed, short everything: the path, not figures

``--workdir`` keeps the shots, the LoRAs (``lora-s<seed>.safetensors``, reused when there),
the pool and the service log; a second run reuses what is there (the filled pools, and arm
5's budget as first allocated).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.harness import finish, main, make_parser, table

TASK = [5, 6, 7, 8, 9]
WORDS = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
BASELINE = "1 real only, k=5"
REFERENCES: dict[str, dict[str, Any]] = {
    "ref: real only, k=10": {"per_class": 10},
    "ref: real only, k=20": {"per_class": 20},
    "ref: ceiling, all real 5-9": {"per_class": None, "split": "generator"},
}
CEILING = "ref: ceiling, all real 5-9"


def paired(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and 95 % confidence interval (Student t) of paired differences."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def adapt(work: Path, seed: int, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """The seed's LoRA: ``genaug adapt`` on its 25 shots (reused when the file is there)."""
    lora = work / f"lora-s{seed}.safetensors"
    shots = work / "data" / f"fewshot-s{seed}" / "fewshot"
    if lora.exists():
        return lora, {"reused": True}
    tmp = lora.with_name(lora.stem + ".partial.safetensors")
    cmd = [sys.executable, "-m", "genaug.cli", "adapt", str(shots),
           "--recipes", str(work / "adapt.yaml"), "--recipe", "digits-5-9", "--out", str(tmp),
           "--model", "tiny-digits-base", "--steps", str(args.adapt_steps),
           "--rank", str(args.rank), "--lr", "1e-3", "--batch-size", "4", "--seed", str(seed),
           "--no-progress", "--no-check"]  # the arms are judged by the classifier they train
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True,
                   env={**os.environ, "GENAUG_TORCH_THREADS": str(args.threads)})
    tmp.rename(lora)
    print(f"seed {seed}: adapted in {time.monotonic() - t0:.0f} s", flush=True)
    return lora, {"reused": False, "wall_s": round(time.monotonic() - t0, 1)}


def label(d: int, **extra: Any) -> dict[str, Any]:
    return {"prompts": [f"a handwritten {WORDS[d]}"], **extra}


def recipe(name: str, labels: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "height": 64, "width": 64, "steps": 20, "guidance": 3.0,
            "base_seed": 1000 + len(name), "labels": labels, **extra}


def write_recipes(work: Path, seeds: Sequence[int], strengths: Sequence[float],
                  per_image: int) -> dict[str, Any]:
    """Every seed's recipes (``GENAUG_DATA_ROOT`` = ``work/data``); returns the arm -> recipe
    name pattern map. ``need-*`` / ``flat-*`` are arm 5's pools (same spec, two names)."""
    (work / "adapt.yaml").write_text(yaml.safe_dump({"recipes": [
        recipe("digits-5-9", {str(d): label(d) for d in TASK})]}, sort_keys=False))
    recipes = []
    for s in seeds:
        folder = f"fewshot-s{s}/fewshot"
        adapter = {"name": f"lora-s{s}", "scale": 1.0}

        def variants(strength: float, **extra: Any) -> dict[str, Any]:
            return {str(d): label(d, images=f"{folder}/{d}", strength=strength,  # noqa: B023
                                  variants_per_image=per_image, **extra) for d in TASK}

        candidates = {"t2i": recipe("", {str(d): label(d) for d in TASK}, adapter=adapter)}
        for st in strengths:
            tag = f"{round(100 * st)}"
            recipes.append(recipe(f"base-var{tag}-s{s}", variants(st)))
            candidates[f"var{tag}"] = recipe("", variants(st, adapter=adapter))
        for cand, spec in candidates.items():
            for prefix in ("lora", "need", "flat"):
                recipes.append({**spec, "name": f"{prefix}-{cand}-s{s}",
                                "base_seed": 7 + s})
    (work / "recipes.yaml").write_text(yaml.safe_dump({"recipes": recipes}, sort_keys=False))
    return {"recipes": work / "recipes.yaml",
            "need_recipes": lambda s: [f"need-{c}-s{s}" for c in candidates]}


def wait_filled(client: Any, names: Sequence[str], timeout: float) -> dict[str, dict[str, int]]:
    """Wait until every label of ``names`` holds its target; return the fills."""
    deadline = time.monotonic() + timeout
    while True:
        details = {n: client.recipe(n) for n in names}
        short = {n: d["fill"] for n, d in details.items()
                 if any(d["fill"].get(k, 0) < t for k, t in d["target_per_label"].items())}
        if not short:
            return {n: d["fill"] for n, d in details.items()}
        if time.monotonic() > deadline:
            raise TimeoutError(f"pools still short after {timeout:.0f} s: {short}")
        time.sleep(3)


def by_row(results: Sequence[dict[str, Any]], key: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in results:
        out.setdefault(r["arm"], {})[r["seed"]] = r[key]
    return out


def best_of(results: Sequence[dict[str, Any]], rows: Sequence[str]) -> str:
    """The row of ``rows`` with the highest mean validation accuracy (first on ties)."""
    val = by_row(results, "validation_accuracy")
    return max(rows, key=lambda r: statistics.fmean(val[r].values()))


def need_weights(need: dict[str, float] | None) -> list[float]:
    """``mix(rebalance=...)`` weights from a need report: ``1 + m * share``, as the planner."""
    from genaug.trainer.feeding.class_error import rebalance_weights

    return rebalance_weights(need, {str(d): i for i, d in enumerate(TASK)})


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "", threads=False,
                         quick="1 seed, 120 steps, a 60-step LoRA, 2 variants per shot")
    parser.add_argument("--seeds", type=int, default=None, help="default 5 (quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (600; quick 120)")
    parser.add_argument("--adapt-steps", type=int, default=None, help="6000 (quick 60)")
    parser.add_argument("--rank", type=int, default=None, help="LoRA rank (32; quick 4)")
    parser.add_argument("--per-image", type=int, default=None,
                        help="variants per shot (10; quick 2); text-to-image pools hold "
                        "as many per class (5 shots x this)")
    parser.add_argument("--strengths", default="0.35,0.7", help="img2img strengths tried")
    parser.add_argument("--weights", default="0.5,0.25", help="synthetic weights tried (arm 6)")
    parser.add_argument("--budget", type=float, default=0.6,
                        help="arm 5's images as a share of arm 3/4's (default 0.6)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    seeds = list(range(args.seeds or (1 if args.quick else 5)))
    steps = args.steps or (120 if args.quick else 600)
    args.adapt_steps = args.adapt_steps or (60 if args.quick else 6000)
    args.rank = args.rank or (4 if args.quick else 32)
    per_image = args.per_image or (2 if args.quick else 10)
    per_class = 5 * per_image
    strengths = [float(x) for x in args.strengths.split(",")]
    weights = [float(x) for x in args.weights.split(",")]
    budget = max(len(TASK), round(args.budget * per_class * len(TASK)))

    from genaug.client import Client
    from genaug.digits import write_split_folders
    from genaug.experiments.fewshot import FewShotRun, run_fewshot
    from genaug.local_service import free_port, running_service

    tmp = tempfile.TemporaryDirectory(prefix="genaug-honest-") if args.workdir is None else None
    work = Path(tmp.name) if tmp is not None else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    spec = write_recipes(work, seeds, strengths, per_image)
    adapted = {}
    for s in seeds:
        write_split_folders(work / "data" / f"fewshot-s{s}", ["fewshot"], per_class=5, seed=s)
        adapted[s] = adapt(work, s, args)
    loras = ",".join(f"lora-s{s}={adapted[s][0]}" for s in seeds)
    env = {**os.environ, "GENAUG_MODEL": "tiny-digits-base", "GENAUG_LORAS": loras,
           "GENAUG_DATA_ROOT": str(work / "data"), "GENAUG_PREGENERATE": "false",
           "GENAUG_NEED_HALF_LIFE_S": "86400", "GENAUG_POOL_CAPACITY_PER_LABEL": str(per_class),
           "OMP_NUM_THREADS": str(args.threads), "GENAUG_TORCH_THREADS": str(args.threads)}
    timeout = 600 + 60.0 * len(seeds) * steps / 100
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    results: list[dict[str, Any]] = []
    chosen: dict[str, str] = {}

    def mixed(arm: str, pool: str, s: int, prefill: int = per_class, **extra: Any) -> Any:
        """A p = 0.5 run mixing from ``pool``; training starts once the reservoir holds
        ``prefill`` images of every class (the pool's smallest label)."""
        return FewShotRun(arm=arm, seed=s, steps=steps, classes=TASK, service=url,
                          recipe=pool.format(s=s), p=0.5, slots_per_class=per_class,
                          prefill_per_class=prefill, **extra)

    with running_service(port, env=env, log_path=work / "service.log", extra_args=[
            "--recipes", str(spec["recipes"]), "--pool-path", str(work / "pool.db")]):
        client = Client(url, client_id="honest-gain", timeout=60)
        client.wait_ready(timeout=300)
        uniform = {f"2 base img2img s={st}": f"base-var{round(100 * st)}-s{{s}}"
                   for st in strengths}
        uniform["3 LoRA text-to-image"] = "lora-t2i-s{s}"
        uniform |= {f"4 LoRA img2img s={st}": f"lora-var{round(100 * st)}-s{{s}}"
                    for st in strengths}
        for pool in uniform.values():
            for s in seeds:
                client.fill(pool.format(s=s), per_label=per_class)
        print(f"filling {len(uniform) * len(seeds)} pools of {per_class} per class; "
              "the real-only rows train meanwhile", flush=True)
        # Real-only rows need no pool. Arm 1's trainer reports its need to every arm-5 pool.
        real = [FewShotRun(arm=BASELINE, seed=s, steps=steps, classes=TASK, service=url,
                           need_recipes=spec["need_recipes"](s)) for s in seeds]
        real += [FewShotRun(arm=name, seed=s, steps=steps, classes=TASK, **row)
                 for name, row in REFERENCES.items() for s in seeds]
        results += run_fewshot(real, timeout_s=timeout * 2)
        need = {r["seed"]: r["need"] for r in results if r["arm"] == BASELINE}
        wait_filled(client, [p.format(s=s) for p in uniform.values() for s in seeds], 7200)
        print(f"uniform pools filled after {time.monotonic() - started:.0f} s", flush=True)
        results += run_fewshot([mixed(arm, pool, s) for arm, pool in uniform.items()
                                for s in seeds], timeout_s=timeout * len(uniform))

        chosen["2"] = best_of(results, [a for a in uniform if a.startswith("2 ")])
        chosen["4"] = best_of(results, [a for a in uniform if a.startswith("4 ")])
        chosen["3/4"] = best_of(results, ["3 LoRA text-to-image", chosen["4"]])
        cand = uniform[chosen["3/4"]].split("-")[1]  # t2i / var35 / ...
        allocation: dict[int, dict[str, Any]] = {}
        for s in seeds:
            allocation[s] = {"reported_need": need[s]}
            for prefix in ("need", "flat"):
                name = f"{prefix}-{cand}-s{s}"
                if not any(client.recipe(name)["target_per_label"].values()):
                    client.fill(name, images=budget)  # (a reused --workdir spent it already)
                allocation[s][prefix] = client.recipe(name)["target_per_label"]
        wait_filled(client, [f"{p}-{cand}-s{s}" for p in ("need", "flat") for s in seeds], 7200)
        arm5 = {f"5 need-allocated, {budget} images": ("need", False),
                f"5 need-allocated + rebalance by need, {budget} images": ("need", True),
                f"control: even, {budget} images": ("flat", False)}
        runs5 = []
        for arm, (prefix, rebalance) in arm5.items():
            for s in seeds:
                kw = {"rebalance": need_weights(need[s])} if rebalance else {}
                least = min(allocation[s][prefix].values())
                runs5.append(mixed(arm, f"{prefix}-{cand}-s{{s}}", s, least, **kw))
        results += run_fewshot(runs5, timeout_s=timeout * 3)
        chosen["5"] = best_of(results, [a for a in arm5 if a.startswith("5 ")])
        # "the best so far": arms 2-5 (arm 2 included: on digits 5-9 it led)
        chosen["best"] = best_of(results, [chosen["2"], chosen["3/4"], chosen["5"]])
        best_pool = (uniform[chosen["best"]] if chosen["best"] in uniform
                     else f"need-{cand}-s{{s}}")
        rebalanced = "rebalance" in chosen["best"]
        runs6 = []
        for w in weights:
            for s in seeds:
                kw: dict[str, Any] = {"synthetic_weight": w}
                if rebalanced:
                    kw["rebalance"] = need_weights(need[s])
                least = per_class if chosen["best"] in uniform else min(
                    allocation[s]["need"].values())
                runs6.append(mixed(f"6 best + synthetic weight {w}", best_pool, s, least, **kw))
        results += run_fewshot(runs6, timeout_s=timeout * len(weights))
        chosen["6"] = best_of(results, [f"6 best + synthetic weight {w}" for w in weights])
        client.close()

    test = by_row(results, "test_accuracy")
    val = by_row(results, "validation_accuracy")
    base = test[BASELINE]
    summary: dict[str, Any] = {}
    rows = []
    picked = set(chosen.values())
    for name in test:
        diffs = [100 * (test[name][s] - base[s]) for s in seeds]
        mean, low, high = paired(diffs)
        summary[name] = {"test": [test[name][s] for s in seeds],
                         "validation": [val[name][s] for s in seeds],
                         "mean": statistics.fmean(test[name].values()),
                         "diff_points": {"mean": mean, "ci95": [low, high]}}
        ci = "" if name == BASELINE else f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]"
        rows.append([name + (" *" if name in picked else ""),
                     f"{100 * statistics.fmean(val[name].values()):.1f}",
                     f"{100 * statistics.fmean(test[name].values()):.1f}",
                     " ".join(f"{100 * test[name][s]:.1f}" for s in seeds), ci])
    table(f"digits 5-9 from tiny-digits-base, accuracy %, {len(seeds)} seeds, {steps} steps "
          "(* chosen on validation)",
          ["row", "validation", "test", "test per seed", "vs arm 1, points: mean [95 % CI]"],
          rows)
    best = max((chosen["best"], chosen["6"]),
               key=lambda r: statistics.fmean(val[r].values()))
    gap = statistics.fmean(test[CEILING].values()) - statistics.fmean(base.values())
    gain = summary[best]["diff_points"]["mean"]
    print(f"best on validation: {best!r}: {gain:+.1f} points on test, "
          f"{100 * gain / (100 * gap) if gap > 0 else float('nan'):.0f} % of the gap to the "
          f"ceiling ({100 * gap:.1f} points)", flush=True)
    result = {"task": TASK, "seeds": seeds, "steps": steps, "per_class": per_class,
              "budget_images": budget, "strengths": strengths, "weights": weights,
              "adapt": {"steps": args.adapt_steps, "rank": args.rank,
                        "seeds": {s: a[1] for s, a in adapted.items()}},
              "chosen": chosen, "best": best, "allocation": allocation, "rows": summary,
              "wall_s": round(time.monotonic() - started, 1), "runs": results}
    if tmp is not None:
        tmp.cleanup()
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
