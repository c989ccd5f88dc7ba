"""Useful images per second per speed mode: quality, turbo and auto on the digits recipe.

One child service through the real CLI (the embedded ``tiny-digits`` model), the shipped
digits recipe twice: ``digits`` (speed quality: 20 Euler steps, guidance 3) and
``digits-auto`` (speed auto), both judged against 20 real digits per label of the fewshot
split (``judge: {shots: fewshot}``, the tiny encoder, min_score 0.9); ``pregenerate=false``,
so the pools grow only when asked.

1. **Pool fill.** ``POST /fill`` raises the auto pool by ``per_label`` accepted images per
   label and waits for that and for its decision (its probes go on past the fill until it
   decides), then the quality pool's; a second round raises both again by ``per_label``,
   the auto pool now drawing with its decision. Rate = images generated / time from the POST
   until the pool holds them.
2. **Samplers through HTTP**, interleaved rounds: each mode draws ``images`` images over the
   ten labels (the recipe's prompts, 63-bit seeds), ``n=16`` per request, 4 in flight:
   quality (the recipe's sampler), turbo (``speed: "turbo"``: the model's few-step setting)
   and auto (the sampler the auto pool decided, asked for by hand). Each mode's images are
   then read by an outside classifier (:func:`genaug.digits.fidelity`'s logistic regression
   on real digits: "read as asked"), their diversity measured (mean pairwise distance of
   same-label images in the 8x8 digit space, averaged over labels) and judged by the
   recipe's judge (built in-process on the same shots): **useful images/s** = images/s x
   the judge's acceptance.

    python -m bench.service.turbo_speed [--quick]

Goals (the turbo issue): turbo reads >= 0.95 as asked, >= 8x the quality images/s, diversity
>= 0.85 of quality's; auto decides a sampler >= 4x cheaper (UNet rows per image) that reads
>= 0.97 of quality's rate with diversity >= 0.9 of it, and its pool fills >= 3x faster than
the quality pool (decided round).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import finish, goal_text, interleave, main, median, parse_args, table
from bench.services import Clients, service

GOAL_TURBO_READ = 0.95
GOAL_TURBO_SPEEDUP = 8.0
GOAL_TURBO_DIVERSITY = 0.85
GOAL_AUTO_CHEAPER = 4.0
GOAL_AUTO_READ = 0.97
GOAL_AUTO_DIVERSITY = 0.9
GOAL_AUTO_FILL = 3.0
SHOTS = 20
BATCH = 16


def write_recipes(root: Path) -> Path:
    """The shipped digits recipe as ``digits`` and ``digits-auto``, judged on real shots."""
    import yaml

    from bench.harness import ROOT
    from genaug.digits import write_split_folders

    write_split_folders(root / "data", ["fewshot"], per_class=SHOTS, seed=0)
    spec = yaml.safe_load((ROOT / "recipes" / "digits.yaml").read_text())["recipes"][0]
    spec["judge"] = {"shots": "fewshot"}
    auto = {**spec, "name": "digits-auto", "speed": "auto"}
    path = root / "recipes.yaml"
    path.write_text(yaml.safe_dump({"recipes": [spec, auto]}))
    return path


def _fill(http: Any, url: str, name: str, per_label: int, timeout: float, *,
          decided: bool = False) -> float:
    """Raise ``name``'s pool to ``per_label`` more accepted images per label than it holds;
    images generated per second until it has them (``decided``: and auto has decided, its
    probes included)."""
    before = http.get(f"{url}/v1/recipes/{name}").json()
    target = min(before["fill"].values()) + per_label
    started = time.perf_counter()
    r = http.post(f"{url}/v1/recipes/{name}/fill", json={"per_label": target})
    r.raise_for_status()
    deadline = started + timeout
    while True:
        detail = http.get(f"{url}/v1/recipes/{name}").json()
        if min(detail["fill"].values()) >= target and (
                not decided or detail["sampling"]["state"] == "decided"):
            break
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{name} did not fill to {target} in {timeout:g} s: {detail}")
        time.sleep(0.2)
    made = detail["totals"]["generated"] - before["totals"]["generated"]
    return float(made / (time.perf_counter() - started))


def _draw(clients: Clients, options: dict[str, Any], images: int,
          recipe: Any) -> tuple[float, np.ndarray, np.ndarray]:
    """``images`` images over the labels with ``options``; (images/s, images, labels)."""
    import asyncio

    labels = recipe.label_names
    per = max(1, images // len(labels))
    jobs = [(label, recipe.plan(label, 10_000 + k).prompt, recipe.plan(label, 10_000 + k).seed)
            for label in labels for k in range(0, per, BATCH)]
    out: dict[int, np.ndarray] = {}

    async def one(i: int, label: str, prompt: str, seed: int) -> None:
        n = min(BATCH, per)
        result = await clients["service"].generate(prompt, n=n, seed=seed, **options)
        out[i] = result.images

    async def all_of() -> None:
        queue = list(enumerate(jobs))

        async def worker() -> None:
            while queue:
                i, (label, prompt, seed) = queue.pop()
                await one(i, label, prompt, seed)

        await asyncio.gather(*(worker() for _ in range(4)))

    started = time.perf_counter()
    clients.run(all_of())
    seconds = time.perf_counter() - started
    stacked = np.concatenate([out[i] for i in range(len(jobs))])
    asked = np.concatenate([np.full(len(out[i]), int(jobs[i][0])) for i in range(len(jobs))])
    return len(stacked) / seconds, stacked, asked


def _diversity(images: np.ndarray, asked: np.ndarray) -> float:
    from genaug.digits import to_digits8

    features = to_digits8(images)
    per_label = []
    for label in np.unique(asked):
        x = features[asked == label]
        d = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
        per_label.append(d[np.triu_indices(len(x), 1)].mean())
    return float(np.mean(per_label))


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    import httpx
    import torch

    from genaug.digits import fidelity
    from genaug.service.judge import build_judge
    from genaug.service.recipes.load import load_recipes

    per_label = 96 if args.quick else 192
    images = 160 if args.quick else 480
    rounds = 1 if args.quick else 3
    result: dict[str, Any] = {"per_label": per_label, "images": images, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="genaug-bench-") as tmp:
        root = Path(tmp)
        recipes_path = write_recipes(root)
        recipes = load_recipes(recipes_path)
        recipe = recipes["digits"]
        with service(threads=args.threads, model="tiny-digits", recipes=recipes_path,
                     pool_path=root / "pool.db", data_root=root / "data",
                     pool_capacity_per_label=100_000, pregenerate=False,
                     max_batch_images=BATCH) as url, httpx.Client(timeout=120) as http:
            fills: dict[str, list[float]] = {"auto (probing)": [], "quality": [],
                                             "auto (decided)": []}
            fills["auto (probing)"].append(
                _fill(http, url, "digits-auto", per_label, 7200, decided=True))
            fills["quality"].append(_fill(http, url, "digits", per_label, 3600))
            decided = http.get(f"{url}/v1/recipes/digits-auto").json()["sampling"]
            fills["auto (decided)"].append(_fill(http, url, "digits-auto", per_label, 3600))
            fills["quality"].append(_fill(http, url, "digits", per_label, 3600))
            chosen = decided["sampler"]
            turbo = http.get(f"{url}/v1/info").json()["turbo"]
            modes = {
                "quality": {"steps": recipe.steps, "guidance": recipe.guidance},
                "turbo": {"speed": "turbo"},
                "auto": {"steps": chosen["steps"], "guidance": chosen["guidance"],
                         "scheduler": chosen["scheduler"]},
            }
            drawn: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            with Clients({"service": url}, timeout=600) as clients:
                def phase(name: str) -> Any:
                    def go() -> float:
                        rate, got, asked = _draw(clients, modes[name], images, recipe)
                        drawn[name] = (got, asked)
                        return rate
                    return go

                speeds = interleave(rounds, {name: phase(name) for name in modes})
        judge = build_judge(recipe, root / "data", torch.device("cpu"))
        rows = []
        measured: dict[str, dict[str, float]] = {}
        for name in modes:
            got, asked = drawn[name]
            scores = np.concatenate([judge.score(got[asked == d], str(d))
                                     for d in np.unique(asked)])
            order = np.concatenate([np.flatnonzero(asked == d) for d in np.unique(asked)])
            accepted = float(judge.keep(scores).mean())
            rate = median(speeds[name])
            measured[name] = {
                "images_s": rate, "read": fidelity(got[order], asked[order]),
                "diversity": _diversity(got, asked), "acceptance": accepted,
                "useful_images_s": rate * accepted}
        base = measured["quality"]
        for name, m in measured.items():
            rows.append([name, f"{m['images_s']:.2f}", f"{m['images_s'] / base['images_s']:.1f}x",
                         f"{m['read']:.3f}", f"{m['diversity'] / base['diversity']:.2f}",
                         f"{m['acceptance']:.3f}", f"{m['useful_images_s']:.2f}",
                         f"{m['useful_images_s'] / base['useful_images_s']:.1f}x"])
        table(f"Speed modes through HTTP (digits recipe, {images} images per mode, "
              f"median of {rounds} interleaved rounds; turbo: {turbo['name']}; auto: "
              f"{chosen['name']})",
              ["mode", "images/s", "vs quality", "read as asked", "diversity vs quality",
               "judge acceptance", "useful images/s", "useful vs quality"], rows)
        fill_rows = [[name, f"{median(v):.2f}", f"{median(v) / median(fills['quality']):.2f}"]
                     for name, v in fills.items()]
        table(f"Pool fill, {per_label} accepted images per label per fill (auto decided: "
              f"{chosen['name']}, {decided['cheaper']}x fewer UNet rows)",
              ["pool", "images/s", "vs quality"], fill_rows)
        turbo_m, auto_m = measured["turbo"], measured["auto"]
        goals = {
            "turbo_read": turbo_m["read"] >= GOAL_TURBO_READ,
            "turbo_speedup": turbo_m["images_s"] / base["images_s"] >= GOAL_TURBO_SPEEDUP,
            "turbo_diversity": turbo_m["diversity"] / base["diversity"] >= GOAL_TURBO_DIVERSITY,
            "auto_cheaper": float(decided["cheaper"] or 0) >= GOAL_AUTO_CHEAPER,
            "auto_read": auto_m["read"] / base["read"] >= GOAL_AUTO_READ,
            "auto_diversity": auto_m["diversity"] / base["diversity"] >= GOAL_AUTO_DIVERSITY,
            "auto_fill": median(fills["auto (decided)"]) / median(fills["quality"])
            >= GOAL_AUTO_FILL,
        }
        for goal, met in goals.items():
            print(f"goal {goal}: {goal_text(met)}")
        result.update(modes=measured, fills=fills, decided=decided, turbo=turbo, goals=goals)
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
