"""The honest protocol at k = 1, 2 and 5 shots: does genaug help where few-shot has headroom?

The task is digits **5-9**, which the ``tiny-digits-base`` generator never saw (the stand-in
for SDXL facing a user's wound phases). A 5-way classifier gets k real shots per class from
the ``fewshot`` split (``--shots``, default 1, 2 and 5) and is scored on the 250 ``test``
digits of 5-9. Every row trains the same small CNN (random shifts and rotations as graph ops:
the classic augmentation) under ``MirroredStrategy`` over 2 logical CPUs for the same steps, in
a TensorFlow child (:func:`genaug.experiments.fewshot.run_fewshot`). The generator arms go
through the real path: ``genaug serve`` (``GENAUG_MODEL=tiny-digits-base``, the seed's LoRA in
``GENAUG_LORAS``) fills recipe pools, a ``ReservoirFeeder`` samples them into a
``SyntheticReservoir`` and ``reservoir.mix`` replaces real examples with p = 0.5.

Per k and seed, everything generated comes from the seed's k shots per class only: ``genaug
adapt`` with its defaults (steps chosen by the data's size) trains the seed's LoRA on them,
and the judged arms' recipes carry a ``judge:`` block whose ``shots`` are the same images
(the ``tiny-digits-encoder`` and the ``shots`` rule; ``min_score`` set from the shots alone as
``genaug adapt``'s check sets its bar, :func:`judge_bar`). Rows, per k:

* **1** real only, k shots (the baseline every row is paired with);
* **2** + img2img variants of the shots from the base, no adaptation (Real Guidance);
* **3** + text-to-image from the seed's LoRA;
* **4** + img2img variants of the shots from the seed's LoRA (DA-Fusion);
* **2j, 3j, 4j** the same recipes with the judge: only images it keeps are sampled;
* **4a** row 4j's recipe with ``speed: auto``: its pool drawn with the cheapest sampler the
  judge accepts as often as the recipe's own (the auto pool beside the quality pool);
* **5** the best generated arm with **feedback-guided allocation** at ``--budget`` (60 %) of
  its images: arm 1's trainer reports per-class need (its error on the validation images,
  :class:`~genaug.trainer.NeedCallback` -> ``POST /v1/recipes/{name}/feedback``), then
  ``POST /v1/recipes/{name}/fill {"images": B}`` has the planner spend the budget by it;
* **references**: real only at 2k and 4k shots; **a perfect generator's pool**: the k shots
  mixed at the same p with ``--per-class`` real digits per class of the ``generator`` split
  (never otherwise seen by the classifier) written straight into the reservoir, what the
  mixing can give when every pool image is a new real one; the ceiling, all ~500 real 5-9 of
  the ``generator`` split.

**Settings are fixed once, not tuned per k** (a few-shot user has no labelled validation
set): img2img strength 0.35 and p = 0.5 were chosen on k = 5's validation split in the
2026-11-26 run of the earlier protocol (strength 0.35 of 0.35/0.7; weighting and p = 0.25
scored lower there); each pool holds ``--per-class`` images per label at every k (img2img:
``per-class / k`` variants of each shot). The "best arm" of row 5 and of the summary is the
generated arm with the highest mean validation accuracy **at k = 5** (the ``fewshot`` split's
images of 5-9 that the seed did not draw), the same arm for every k; until k = 5 has run, a k
is judged on its own validation split and its summary says "provisional". Differences are
paired by seed: mean and 95 % confidence interval (Student t over the seeds).

    python -m bench.gain.honest_gain --workdir artifacts/honest --json artifacts/honest/result.json
    python -m bench.gain.honest_gain --workdir artifacts/honest --shots 1   # one k at a time
    python -m bench.gain.honest_gain --workdir artifacts/honest --report  # the tables so far
    python -m bench.gain.honest_gain --quick      # k = 1, 1 seed, short everything: the path
    python -m bench.gain.honest_gain --trainer torch --workdir artifacts/honest-torch

``--trainer torch`` trains every row in PyTorch instead
(:mod:`genaug.experiments.fewshot_torch`: the same network, steps and data; mixing through
``genaug.torch.MixedDataset`` fed by a ``PoolDataset`` in a ``DataLoader`` of 2 workers; need
by ``class_need`` and ``report_need``). A work folder holds one trainer's rows: give the other
trainer its own ``--workdir`` (copy the shots, the LoRAs and ``pool.db`` into it to train on
the same pools).

**It resumes from ``--workdir``**: the shots (``data/k<k>-s<seed>/``), the LoRAs
(``lora-k<k>-s<seed>.safetensors``), the pools (``pool.db``) and every finished row
(``rows.jsonl``, one line per training run, written as each few runs finish) are reused, so a
run stopped at any point continues where it was. Delete a file to redo its part.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from bench.harness import finish, main, make_parser, table

TASK = [5, 6, 7, 8, 9]
WORDS = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
STRENGTH = 0.35  # fixed once on k = 5's validation split (see the module doc)
P = 0.5
#: the generated arms: pool kind -> row name (a kind ending in ``-j`` has the judge)
KINDS = {
    "base-var": "2 base img2img",
    "lora-t2i": "3 LoRA text-to-image",
    "lora-var": "4 LoRA img2img",
    "base-var-j": "2j base img2img + judge",
    "lora-t2i-j": "3j LoRA text-to-image + judge",
    "lora-var-j": "4j LoRA img2img + judge",
    "lora-var-j-auto": "4a LoRA img2img + judge, speed auto",
}
REAL = "1 real only"
CEILING = "ref: ceiling, all real 5-9"
PERFECT = "ref: a perfect generator's pool (real 5-9 it never trained on)"
CHOOSE_ON = 5  # the k whose validation names the best arm for every k


def paired(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and 95 % confidence interval (Student t) of paired differences."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


# -- the record: one JSON line per finished training run -------------------------------------


class Record:
    """``rows.jsonl`` in the work folder: every finished run, keyed by what it measured, all
    of one ``trainer`` (rows written before runs had one were TensorFlow's)."""

    def __init__(self, path: Path, trainer: str = "tensorflow") -> None:
        self.path = path
        self.runs: dict[str, dict[str, Any]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    run = json.loads(line)
                    self.runs[run["key"]] = run
        others = sorted({run.get("trainer", "tensorflow") for run in self.runs.values()}
                        - {trainer})
        if others:
            raise SystemExit(f"{path} holds rows trained by {', '.join(others)}, not {trainer}: "
                             f"give --trainer {trainer} a --workdir of its own (copy data/, "
                             "the lora-*.safetensors and pool.db into it to reuse them)")

    def __contains__(self, key: str) -> bool:
        return key in self.runs

    def add(self, runs: Sequence[dict[str, Any]]) -> None:
        with self.path.open("a") as f:
            for run in runs:
                self.runs[run["key"]] = run
                f.write(json.dumps(run) + "\n")


def real_key(per_class: int | None, seed: int) -> str:
    return f"real-n{per_class}-s{seed}" if per_class is not None else f"ceiling-s{seed}"


def perfect_key(k: int, seed: int) -> str:
    return f"perfect-k{k}-s{seed}"


def arm_key(kind: str, k: int, seed: int) -> str:
    return f"{kind}-k{k}-s{seed}"


# -- adaptation --------------------------------------------------------------------------


def adapt(work: Path, k: int, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The seed's LoRA: ``genaug adapt`` (its defaults unless ``--adapt-steps``) on the k
    shots per class of 5-9 (reused when the file is there)."""
    lora = work / f"lora-k{k}-s{seed}.safetensors"
    if lora.exists():
        return {"lora": str(lora), "reused": True}
    tmp = lora.with_name(lora.stem + ".partial.safetensors")
    cmd = [sys.executable, "-m", "genaug.cli", "adapt", str(shots_folder(work, k, seed)),
           "--recipes", str(work / "adapt.yaml"), "--recipe", "digits-5-9", "--out", str(tmp),
           "--model", "tiny-digits-base", "--seed", str(seed), "--no-progress",
           "--no-check"]  # the judged arms judge its images; the classifier scores them
    if args.adapt_steps:
        cmd += ["--steps", str(args.adapt_steps)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          env={**os.environ, "GENAUG_TORCH_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"genaug adapt failed for k={k} seed {seed}:\n{proc.stderr[-3000:]}")
    tmp.rename(lora)
    wall = time.monotonic() - t0
    print(f"k={k} seed {seed}: adapted in {wall:.0f} s", flush=True)
    return {"lora": str(lora), "reused": False, "wall_s": round(wall, 1)}


def shots_folder(work: Path, k: int, seed: int) -> Path:
    return work / "data" / f"k{k}-s{seed}" / "fewshot"


# -- recipes -----------------------------------------------------------------------------


def label(d: int, **extra: Any) -> dict[str, Any]:
    return {"prompts": [f"a handwritten {WORDS[d]}"], **extra}


def recipe(name: str, labels: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "height": 64, "width": 64, "steps": 20, "guidance": 3.0,
            "base_seed": 1000 + len(name), "labels": labels, **extra}


def judge_bar(work: Path, k: int, seed: int) -> float:
    """The judged arms' ``min_score`` for (k, seed), from the shots alone, as ``genaug
    adapt``'s check sets its bar: the 10 % quantile of the probabilities the leave-one-shot-out
    ``shots`` rule gives held-out shots of their own label, at most the recipe default 0.9.
    At k = 1 no shot can be held out: 0.5 (the asked label more probable than all the others
    together), fixed before any run. An absolute 0.9 would reject nearly every image at k = 1:
    a rule fitted on one shot per label is rarely that sure, even of img2img copies of the
    shot (0.70-0.92 in the first quick run)."""
    if k < 2:
        return 0.5
    import torch

    from genaug.service.adapt.check import calibrated_bar, cross_validate
    from genaug.service.adapt.data import read_shots
    from genaug.service.judge.encoders import load_encoder
    from genaug.service.recipes.spec import TINY_ENCODER, LabelSpec, Recipe

    spec = Recipe(name="digits-5-9", height=64, width=64, steps=20, guidance=3.0,
                  labels={str(d): LabelSpec(prompts=[f"a handwritten {WORDS[d]}"]) for d in TASK})
    shots = read_shots(shots_folder(work, k, seed), spec)
    _, own = cross_validate(load_encoder(TINY_ENCODER, torch.device("cpu")), shots)
    return float(round(min(0.9, calibrated_bar(own)), 4))


def kind_recipe(name: str, kind: str, k: int, seed: int, per_class: int,
                min_score: float) -> dict[str, Any]:
    """One pool kind's recipe for (k, seed); ``need-`` pools use the same spec."""
    folder = f"k{k}-s{seed}/fewshot"
    lora = kind.startswith("lora-")
    variants = "-var" in kind
    labels = {}
    for d in TASK:
        extra: dict[str, Any] = {}
        if variants:
            extra.update(images=f"{folder}/{d}", strength=STRENGTH,
                         variants_per_image=math.ceil(per_class / k))
        if lora:
            extra["adapter"] = {"name": f"lora-k{k}-s{seed}", "scale": 1.0}
        labels[str(d)] = label(d, **extra)
    spec = recipe(name, labels, base_seed=7 + seed + 100 * k)
    if kind.endswith("-auto"):
        spec["speed"] = "auto"  # the cheapest sampler the judge accepts (docs/turbo.md)
    if "-j" in kind:
        spec["judge"] = {"shots": folder, "encoder": "tiny-digits-encoder", "rule": "shots",
                         "min_score": min_score}
    return spec


def write_recipes(work: Path, k: int, seeds: Sequence[int], per_class: int,
                  bars: dict[int, float]) -> Path:
    """k's recipes (``GENAUG_DATA_ROOT`` = ``work/data``): per seed, every kind's pool and
    its ``need-`` twin (row 5), named ``<kind>-k<k>-s<seed>``."""
    recipes = []
    for s in seeds:
        for kind in KINDS:
            for prefix in ("", "need-"):
                name = prefix + arm_key(kind, k, s)
                recipes.append(kind_recipe(name, kind, k, s, per_class, bars[s]))
    path = work / f"recipes-k{k}.yaml"
    path.write_text(yaml.safe_dump({"recipes": recipes}, sort_keys=False))
    return path


# -- the service side --------------------------------------------------------------------


def wait_filled(client: Any, names: Sequence[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Until every label of ``names`` holds its target, or its judge stopped it; returns
    per recipe the fill, the target and the stopped labels."""
    deadline = time.monotonic() + timeout
    while True:
        details = {n: client.recipe(n) for n in names}
        short = {n: d["fill"] for n, d in details.items()
                 if any(d["fill"].get(lb, 0) < t for lb, t in d["target_per_label"].items()
                        if lb not in (d.get("stopped") or {}))}
        if not short:
            return {n: {"fill": d["fill"], "target": d["target_per_label"],
                        "stopped": sorted(d.get("stopped") or {}),
                        "judged": {lb: (c.get("judged_total"), c.get("accepted_total"))
                                   for lb, c in d.get("per_label", {}).items()}}
                    for n, d in details.items()}
        if time.monotonic() > deadline:
            raise TimeoutError(f"pools still short after {timeout:.0f} s: {short}")
        time.sleep(3)


def wait_decided(client: Any, name: str, timeout: float) -> dict[str, Any]:
    """Until ``name``'s ``speed: auto`` pool has decided its sampler; its ``sampling``."""
    deadline = time.monotonic() + timeout
    while True:
        sampling: dict[str, Any] = client.recipe(name)["sampling"]
        if sampling["state"] == "decided":
            return sampling
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} did not decide in {timeout:.0f} s: {sampling['reason']}")
        time.sleep(3)


@contextmanager
def service(work: Path, k: int, recipes: Path, loras: dict[int, str],
            per_class: int) -> Iterator[tuple[str, Any]]:
    """``genaug serve`` with k's recipes and LoRAs over the shared ``pool.db``."""
    from genaug.client import Client
    from genaug.local_service import free_port, running_service

    env = {**os.environ, "GENAUG_MODEL": "tiny-digits-base",
           "GENAUG_LORAS": ",".join(f"lora-k{k}-s{s}={p}" for s, p in loras.items()),
           "GENAUG_DATA_ROOT": str(work / "data"), "GENAUG_PREGENERATE": "false",
           "GENAUG_NEED_HALF_LIFE_S": "86400",
           "GENAUG_POOL_CAPACITY_PER_LABEL": str(per_class)}  # torch threads: its default
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running_service(port, env=env, log_path=work / f"service-k{k}.log", extra_args=[
            "--recipes", str(recipes), "--pool-path", str(work / "pool.db")]):
        client = Client(url, client_id="honest-gain", timeout=60)
        try:
            client.wait_ready(timeout=600)
            yield url, client
        finally:
            client.close()


def run_chunks(record: Record, runs: Sequence[tuple[str, Any]], timeout_per_run: float,
               chunk: int = 6) -> None:
    """Train ``runs`` (key, FewShotRun) not yet in ``record``, ``chunk`` per TensorFlow child,
    recording each chunk as it finishes."""
    from genaug.experiments.fewshot import run_fewshot

    todo = [(key, run) for key, run in runs if key not in record]
    for i in range(0, len(todo), chunk):
        part = todo[i:i + chunk]
        results = run_fewshot([run for _, run in part], timeout_s=timeout_per_run * len(part))
        record.add([{**r, "key": key} for (key, _), r in zip(part, results, strict=True)])


def drop_stale(record: Record, k: int, seeds: Sequence[int]) -> list[str]:
    """Forget the generated rows of ``k`` that trained on another number of real shots than
    ``k`` (until 2026-11-28 they trained on ``FewShotRun``'s default, 5 per class, whatever
    k), so that they are trained again (the new line supersedes the old one in the file);
    returns their keys."""
    keys = [prefix + arm_key(kind, k, s) for kind in KINDS for s in seeds
            for prefix in ("", "need-")]
    stale = [key for key in keys if key in record and record.runs[key].get("per_class") != k]
    for key in stale:
        del record.runs[key]
    return stale


# -- choosing and reporting --------------------------------------------------------------


def mean_of(record: Record, keys: Sequence[str], field: str) -> float | None:
    if not keys or any(key not in record for key in keys):
        return None
    return statistics.fmean(record.runs[key][field] for key in keys)


def best_kind(record: Record, k: int, seeds: Sequence[int],
              choose_seeds: Sequence[int]) -> tuple[str | None, str]:
    """The generated arm with the highest mean validation accuracy at k = 5 (every seed of
    k = 5 run), else at k itself ("provisional"); None until one of them is complete."""
    for at, at_seeds, how in ((CHOOSE_ON, choose_seeds, f"on k = {CHOOSE_ON}'s validation"),
                              (k, seeds, f"provisional: on k = {k}'s own validation, "
                               f"k = {CHOOSE_ON} not complete")):
        scores = {kind: mean_of(record, [arm_key(kind, at, s) for s in at_seeds],
                                "validation_accuracy") for kind in KINDS}
        if at_seeds and all(v is not None for v in scores.values()):
            return max(KINDS, key=lambda kind: scores[kind] or 0.0), how
    return None, "not chosen: the generated arms have not all run"


def k_table(record: Record, k: int, seeds: Sequence[int], best: str | None,
            how: str, budget: int) -> dict[str, Any]:
    """Print k's table; return its rows (test, validation, paired difference to row 1)."""
    rows: dict[str, list[str]] = {f"{REAL}, k={k}": [real_key(k, s) for s in seeds]}
    for kind, name in KINDS.items():
        rows[name + (" *" if kind == best else "")] = [arm_key(kind, k, s) for s in seeds]
    if best is not None:
        rows[f"5 {KINDS[best]}, need-allocated, {budget} images"] = [
            arm_key("need-" + best, k, s) for s in seeds]
    rows[f"ref: real only, k={2 * k}"] = [real_key(2 * k, s) for s in seeds]
    rows[f"ref: real only, k={4 * k}"] = [real_key(4 * k, s) for s in seeds]
    rows[PERFECT] = [perfect_key(k, s) for s in seeds]
    rows[CEILING] = [real_key(None, s) for s in seeds]
    base = [real_key(k, s) for s in seeds]
    summary: dict[str, Any] = {}
    lines = []
    for name, keys in rows.items():
        done = [(s, key, b) for s, key, b in zip(seeds, keys, base, strict=True)
                if key in record and b in record]
        if not done:
            lines.append([name, "", "", "not run yet", ""])
            continue
        test = [record.runs[key]["test_accuracy"] for _, key, _ in done]
        val = [record.runs[key]["validation_accuracy"] for _, key, _ in done]
        diffs = [100 * (record.runs[key]["test_accuracy"] - record.runs[b]["test_accuracy"])
                 for _, key, b in done]
        mean, low, high = paired(diffs)
        summary[name] = {"seeds": [s for s, _, _ in done], "test": test, "validation": val,
                         "mean": statistics.fmean(test),
                         "diff_points": {"mean": mean, "ci95": [low, high]}}
        ci = "" if name.startswith(REAL) else f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]"
        partial = "" if len(done) == len(seeds) else f" ({len(done)} of {len(seeds)} seeds)"
        lines.append([name + partial, f"{100 * statistics.fmean(val):.1f}",
                      f"{100 * statistics.fmean(test):.1f}",
                      " ".join(f"{100 * t:.1f}" for t in test), ci])
    table(f"k = {k}: digits 5-9 from tiny-digits-base, accuracy %, seeds "
          f"{seeds[0]}-{seeds[-1]} (* the best generated arm, {how})",
          ["row", "validation", "test", "test per seed", "vs row 1, points: mean [95 % CI]"],
          lines)
    out: dict[str, Any] = {"rows": summary, "best": best, "best_chosen": how}
    if best is not None:
        name = KINDS[best] + " *"
        if name in summary:
            gain = summary[name]["diff_points"]
            twice = summary.get(f"ref: real only, k={2 * k}", {}).get("mean", float("nan"))
            print(f"k = {k}: the best arm ({KINDS[best]}, {how}) vs real only: "
                  f"{gain['mean']:+.1f} points [{gain['ci95'][0]:+.1f}, "
                  f"{gain['ci95'][1]:+.1f}]; {k} shot(s) + genaug "
                  f"{100 * summary[name]['mean']:.1f} % vs {2 * k} real shots "
                  f"{100 * twice:.1f} %", flush=True)
    return out


# -- one k -------------------------------------------------------------------------------


def one_k(work: Path, record: Record, k: int, seeds: Sequence[int], args: argparse.Namespace,
          choose_seeds: Sequence[int]) -> dict[str, Any]:
    """Everything of one k that is not in the record yet: shots, LoRAs, pools, rows."""
    from genaug.digits import write_split_folders
    from genaug.experiments.fewshot import FewShotRun

    for s in seeds:
        if not shots_folder(work, k, s).is_dir():
            write_split_folders(work / "data" / f"k{k}-s{s}", ["fewshot"], per_class=k, seed=s)
    with ThreadPoolExecutor(max_workers=args.parallel_adapt) as pool:  # 1 torch thread each
        adapted = dict(zip(seeds, pool.map(lambda s: adapt(work, k, s, args), seeds),
                           strict=True))
    bars = {s: args.min_score if args.min_score is not None else judge_bar(work, k, s)
            for s in seeds}
    recipes = write_recipes(work, k, seeds, args.per_class, bars)
    budget = max(len(TASK), round(args.budget * args.per_class * len(TASK)))
    steps = args.steps
    per_run = 120 + 0.5 * steps  # a run's time limit, seconds (pools filled before it starts)

    def real(per_class: int | None, s: int, need: Sequence[str] = ()) -> tuple[str, Any]:
        extra: dict[str, Any] = ({"per_class": per_class} if per_class is not None
                                 else {"per_class": None, "split": "generator"})
        return real_key(per_class, s), FewShotRun(
            arm=f"real n={per_class}", seed=s, steps=steps, classes=TASK, **extra,
            service=url if need else None, need_recipes=list(need), trainer=args.trainer)

    def mixed(name: str, s: int, fill: dict[str, Any]) -> tuple[str, Any]:
        # Training starts once the reservoir holds the pool's smallest label; a label the
        # judge stopped with no image keeps its real examples (the reservoir's rule).
        held = [fill["fill"].get(str(d), 0) for d in TASK]
        least = min([n for n in held if n > 0] or [1])
        return name, FewShotRun(
            arm=name, seed=s, steps=steps, classes=TASK, per_class=k, service=url,
            recipe=name, p=P, slots_per_class=args.per_class, prefill_per_class=least,
            prefill_timeout_s=30.0 if 0 in held else 300.0, trainer=args.trainer)

    def perfect(s: int) -> tuple[str, Any]:
        # The same mixing from a pool a perfect generator would make: per_class real digits
        # of each class from the generator split, which the classifier never sees otherwise.
        return perfect_key(k, s), FewShotRun(
            arm=perfect_key(k, s), seed=s, steps=steps, classes=TASK, per_class=k, p=P,
            slots_per_class=args.per_class, reservoir_split="generator", trainer=args.trainer)

    fills: dict[str, Any] = {}
    with service(work, k, recipes, {s: a["lora"] for s, a in adapted.items()},
                 args.per_class) as (url, client):
        pools = [arm_key(kind, k, s) for kind in KINDS for s in seeds
                 if arm_key(kind, k, s) not in record]
        for name in pools:
            client.fill(name, per_label=args.per_class)
        print(f"k = {k}: filling {len(pools)} pools of {args.per_class} per label; the "
              "real-only rows train meanwhile", flush=True)
        # Row 1's trainer reports its need to every kind's need- pool (row 5 uses the best).
        need_names = {s: ["need-" + arm_key(kind, k, s) for kind in KINDS] for s in seeds}
        reals = [real(k, s, need_names[s]) for s in seeds]
        reals += [real(m, s) for m in (2 * k, 4 * k) for s in seeds]
        reals += [real(None, s) for s in seeds]
        reals += [perfect(s) for s in seeds]
        run_chunks(record, reals, per_run)
        fills = wait_filled(client, pools, 600 + 30.0 * len(pools) * args.per_class)
        # An auto pool trains on what its decision drew: its probes go on past the fill, and
        # its newest images (what a pool of per_class keeps) are the chosen sampler's.
        for name in pools:
            if name.startswith("lora-var-j-auto"):
                decision = wait_decided(client, name, 600 + 60.0 * args.per_class)
                fills[name] = {**fills[name], "sampling": decision}
        run_chunks(record, [mixed(arm_key(kind, k, s), s, fills[arm_key(kind, k, s)])
                            for kind in KINDS for s in seeds
                            if arm_key(kind, k, s) in fills], per_run)
        best, how = best_kind(record, k, seeds, choose_seeds)
        if best is not None:
            need_runs = []
            for s in seeds:
                name = "need-" + arm_key(best, k, s)
                if name in record:
                    continue
                if not any(client.recipe(name)["target_per_label"].values()):
                    # Row 1's report, replayed from the record when this service did not
                    # hear it (a resumed run); then the budget, spent by it.
                    reported = record.runs[real_key(k, s)].get("need")
                    if reported:
                        client.feedback(name, reported)
                    client.fill(name, images=budget)
                fills[name] = wait_filled(client, [name], 600 + 30.0 * budget)[name]
                need_runs.append(mixed(name, s, fills[name]))
            run_chunks(record, need_runs, per_run)
    best, how = best_kind(record, k, seeds, choose_seeds)
    return {"adapted": adapted, "judge_min_score": bars, "pools": fills,
            **k_table(record, k, seeds, best, how, budget)}


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "", threads=False,
                         quick="k = 1, 1 seed, 120 steps, a 60-step LoRA, 4 images per label")
    parser.add_argument("--shots", default=None, help="the k to run, in order (1,2,5)")
    parser.add_argument("--seeds", default=None,
                        help="seeds per k, k:n,... (1:8,2:8,5:5; quick 1:1)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (600; quick 120)")
    parser.add_argument("--adapt-steps", type=int, default=None,
                        help="genaug adapt's --steps (default: its own; quick 60)")
    parser.add_argument("--per-class", type=int, default=None,
                        help="images per label of every pool (20; quick 4)")
    parser.add_argument("--min-score", type=float, default=None,
                        help="the judged arms' judge.min_score (default: calibrated on each "
                        "seed's shots, see judge_bar)")
    parser.add_argument("--budget", type=float, default=0.6,
                        help="row 5's images as a share of a uniform pool's (default 0.6)")
    parser.add_argument("--parallel-adapt", type=int, default=2,
                        help="LoRAs trained at a time, 1 torch thread each (default 2)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--trainer", choices=("tensorflow", "torch"), default="tensorflow",
                        help="who trains every row: tensorflow (MirroredStrategy, the "
                        "default) or torch (genaug.torch; a --workdir of its own)")
    parser.add_argument("--report", action="store_true",
                        help="print the tables of what --workdir holds; run nothing")
    args = parser.parse_args(argv)
    shots = [int(x) for x in (args.shots or ("1" if args.quick else "1,2,5")).split(",")]
    counts: dict[int, int] = {}
    for part in (args.seeds or ("1:1" if args.quick else "1:8,2:8,5:5")).split(","):
        k, n = part.split(":")
        counts[int(k)] = int(n)
    args.steps = args.steps or (120 if args.quick else 600)
    args.adapt_steps = args.adapt_steps or (60 if args.quick else None)
    args.per_class = args.per_class or (4 if args.quick else 20)

    tmp = tempfile.TemporaryDirectory(prefix="genaug-honest-") if args.workdir is None else None
    work = Path(tmp.name) if tmp is not None else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    (work / "adapt.yaml").write_text(yaml.safe_dump({"recipes": [
        recipe("digits-5-9", {str(d): label(d) for d in TASK})]}, sort_keys=False))
    record = Record(work / "rows.jsonl", args.trainer)
    started = time.monotonic()
    choose_seeds = list(range(counts.get(CHOOSE_ON, 0)))
    per_k = {}
    for k in shots:
        seeds = list(range(counts.get(k, 5)))
        stale = drop_stale(record, k, seeds)
        if stale:
            print(f"k = {k}: {len(stale)} generated row(s) of {work} trained on 5 real shots "
                  f"per class, not {k} (recorded before 2026-11-28): "
                  + ("left out of the tables" if args.report else "trained again"), flush=True)
        if args.report:
            budget = max(len(TASK), round(args.budget * args.per_class * len(TASK)))
            per_k[k] = k_table(record, k, seeds, *best_kind(record, k, seeds, choose_seeds),
                               budget)
        else:
            per_k[k] = one_k(work, record, k, seeds, args, choose_seeds)
    result = {"task": TASK, "trainer": args.trainer, "shots": shots, "seeds": counts,
              "steps": args.steps,
              "per_class": args.per_class, "strength": STRENGTH, "p": P,
              "adapt_steps": args.adapt_steps or "genaug adapt's default",
              "min_score": args.min_score, "k": per_k,
              "wall_s": round(time.monotonic() - started, 1),
              "runs": list(record.runs.values())}
    if tmp is not None:
        tmp.cleanup()
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
