"""``genaug pregenerate`` and ``genaug export``: fill a recipe's pool, and write it to disk.

``pregenerate --url URL`` asks a running service to fill the pool (``POST
/v1/recipes/{name}/fill``) and shows its progress; without ``--url`` it loads the model in
this process and fills the same SQLite file the service would use (stop the service first,
or give it another ``--pool-path``). Both resume from what exists and stop cleanly on Ctrl-C:
every finished batch is committed, so nothing already made is lost.

``export`` writes ``OUT/<label>/<seed>.png``, the layout
``tf.keras.utils.image_dataset_from_directory`` reads.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _bars(labels: list[str], total: int) -> dict[str, Any]:
    from tqdm import tqdm

    width = max(len(label) for label in labels)
    return {
        label: tqdm(total=total, desc=label.ljust(width), position=i, unit="img",
                    dynamic_ncols=True, leave=True)
        for i, label in enumerate(labels)
    }


def _update(bars: dict[str, Any], fill: dict[str, int]) -> None:
    for label, bar in bars.items():
        bar.n = min(fill.get(label, 0), bar.total)
        bar.refresh()


def run_pregenerate(args: argparse.Namespace) -> int:
    """Fill each label of ``args.recipe`` to ``args.per_label`` images."""
    if args.url:
        return _pregenerate_remote(args)
    return _pregenerate_local(args)


def _pregenerate_remote(args: argparse.Namespace) -> int:
    from genaug.client import Client, GenaugError

    with Client(args.url) as client:
        try:
            detail = client.fill(args.recipe, per_label=args.per_label)
        except GenaugError as exc:
            print(f"genaug pregenerate: {exc}", file=sys.stderr)  # noqa: T201
            return 1
        bars = _bars(detail["labels"], args.per_label)
        try:
            while True:
                _update(bars, detail["fill"])
                if all(detail["fill"].get(label, 0) >= args.per_label for label in bars):
                    break
                time.sleep(0.5)
                detail = client.recipe(args.recipe)
        except KeyboardInterrupt:
            print("\nstopped watching; the service keeps filling in the background",  # noqa: T201
                  file=sys.stderr)
            return 130
        except GenaugError as exc:
            print(f"genaug pregenerate: {exc}", file=sys.stderr)  # noqa: T201
            return 1
        finally:
            for bar in bars.values():
                bar.close()
    return 0


def _pregenerate_local(args: argparse.Namespace) -> int:
    from .generator import PipelineWorker
    from .model import load_model
    from .pool import PoolStore
    from .pregen import PoolManager, pool_model_hash
    from .recipes import load_recipes
    from .settings import Settings

    settings = Settings()
    recipes_path = args.recipes or settings.recipes
    if recipes_path is None:
        print("genaug pregenerate: give --recipes FILE or set GENAUG_RECIPES",  # noqa: T201
              file=sys.stderr)
        return 2
    recipes = load_recipes(recipes_path)
    if args.recipe not in recipes:
        print(f"genaug pregenerate: no recipe {args.recipe!r} in {recipes_path}; "  # noqa: T201
              f"it has {sorted(recipes)}", file=sys.stderr)
        return 2
    capacity = max(settings.pool_capacity_per_label, args.per_label)
    model = load_model(source=settings.model, unet_weights=settings.unet_weights,
                       device=settings.device, dtype=settings.dtype,
                       single_file_config=settings.single_file_config)
    generator = PipelineWorker(model)
    store = PoolStore(args.pool_path or settings.pool_path, capacity_per_label=capacity)
    recipe = recipes[args.recipe]
    manager = PoolManager({args.recipe: recipe}, store, model_hash=pool_model_hash(model),
                          pregenerate=False)
    manager.raise_target(args.recipe, args.per_label)
    pid = manager.pool_ids[args.recipe]
    bars = _bars(recipe.label_names, args.per_label)
    try:
        while True:
            _update(bars, store.fill(pid))
            work = manager.next_idle_batch(settings.max_batch_images)
            if work is None:
                break
            work.on_done(generator.run(work.key, work.items))
    except KeyboardInterrupt:
        print("\nstopped; every finished batch is kept", file=sys.stderr)  # noqa: T201
        return 130
    finally:
        for bar in bars.values():
            bar.close()
        store.close()
    return 0


def run_export(args: argparse.Namespace) -> int:
    """Write a recipe's pool as ``OUT/<label>/<seed>.png``."""
    from PIL import Image

    from .pool import PoolStore
    from .settings import Settings

    settings = Settings()
    path = args.pool_path or settings.pool_path
    if not Path(path).exists():
        print(f"genaug export: no pool database at {path}; pass --pool-path or set "  # noqa: T201
              "GENAUG_POOL_PATH", file=sys.stderr)
        return 2
    store = PoolStore(path, capacity_per_label=settings.pool_capacity_per_label)
    try:
        candidates = [p for p in store.pools() if p.startswith(args.recipe + "-")]
        if args.pool:
            candidates = [p for p in candidates if p == args.pool]
        if not candidates:
            print(f"genaug export: {path} holds no pool of recipe {args.recipe!r} "  # noqa: T201
                  f"(pools: {store.pools()})", file=sys.stderr)
            return 1
        sizes = {p: sum(store.fill(p).values()) for p in candidates}
        chosen = max(candidates, key=lambda p: sizes[p])
        if len(candidates) > 1:
            print(f"{len(candidates)} pools of {args.recipe!r} (other prompts or models): "  # noqa: T201
                  f"{sizes}; exporting the largest, {chosen} (choose with --pool)")
        out = Path(args.out)
        count = 0
        for label, seed, image in store.iter_images(chosen):
            folder = out / label
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{seed}.png")
            count += 1
        print(f"wrote {count} images of pool {chosen} to {out}/<label>/<seed>.png")  # noqa: T201
    finally:
        store.close()
    return 0
