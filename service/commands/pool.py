"""``genaug pregenerate``, ``genaug export`` and ``genaug pool``: fill a recipe's pool, write
it to disk, list and drop pools.

``pregenerate --url URL`` asks a running service to fill the pool (``POST
/v1/recipes/{name}/fill``: ``--per-label N`` fills every label to N, ``--images B`` spends B
more images split over the labels by the trainers' need and recent demand) and shows its
progress; without ``--url`` it loads the model in
this process and fills the pool the service would use (``--pool-path``/``GENAUG_POOL_PATH``
or ``--pool-url``/``GENAUG_POOL_URL``; a shared PostgreSQL pool may be filled beside running
replicas, a SQLite file is best filled with the service stopped). Both resume from what
exists. Ctrl-C in process: the batch being made is finished and stored, then the command
exits 130 ("every finished batch is kept"); a second Ctrl-C stops at once.

A label the recipe's judge stopped (it accepted under 10 % of the label's images: the
planner's low-acceptance stop, ``stopped`` in ``GET /v1/recipes/{name}``) gets no more
images, so no wait would fill it: ``pregenerate`` fills every other label, then exits
:data:`STOPPED_EXIT` (3), naming each stopped label with the judge's reason and fix. Its exit
statuses (``genaug pregenerate --help`` lists them): 0 filled; 1 the service refused or
failed; 2 bad arguments, recipe file or pool; 3 a label the judge stopped; 130 Ctrl-C.

``export`` writes ``OUT/<label>/<seed>.png``, the layout
``tf.keras.utils.image_dataset_from_directory`` reads (accepted images only: none the judge or
a person rejected, see docs/curation.md). ``pool list`` shows the pools in the
database with their image counts; ``pool drop POOL_ID`` deletes one (pools of an old spec or
model, or one whose images differ in shape).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..pool.store import PoolStore
    from ..settings import Settings

log = logging.getLogger(__name__)

#: ``pregenerate``'s exit status when the judge stopped a label it was asked to fill: every
#: other label is filled; the stopped ones are named with the judge's reason and fix.
STOPPED_EXIT = 3


def _bars(totals: dict[str, int]) -> dict[str, Any]:
    """One progress bar per label, each to its own total."""
    from tqdm import tqdm

    width = max(len(label) for label in totals)
    return {
        label: tqdm(total=total, desc=label.ljust(width), position=i, unit="img",
                    dynamic_ncols=True, leave=True)
        for i, (label, total) in enumerate(totals.items())
    }


def _update(bars: dict[str, Any], fill: dict[str, int],
            stopped: dict[str, str] | None = None) -> None:
    for label, bar in bars.items():
        bar.n = min(fill.get(label, 0), bar.total)
        if stopped and label in stopped and bar.n < bar.total:
            bar.set_postfix_str("stopped by the judge", refresh=False)
        bar.refresh()


def _short_and_stopped(fill: dict[str, int], targets: dict[str, int],
                       stopped: dict[str, str]) -> dict[str, str]:
    """The labels below their target that the judge stopped: no wait fills them."""
    return {label: why for label, why in stopped.items()
            if label in targets and fill.get(label, 0) < targets[label]}


def _say_stopped(recipe: str, fill: dict[str, int], targets: dict[str, int],
                 stopped: dict[str, str]) -> int:
    """Name each stopped label with the judge's reason and fix; :data:`STOPPED_EXIT`."""
    filled = [label for label in targets if label not in stopped]
    print(f"\ngenaug pregenerate: recipe {recipe!r}: "  # noqa: T201
          + (f"{', '.join(filled)} filled; " if filled else "")
          + f"{len(stopped)} label(s) cannot be: the judge stopped them, so no more of their "
            "images are made", file=sys.stderr)
    for label, why in stopped.items():
        held = (f"{fill.get(label, 0)} of {targets[label]}" if label in targets
                else f"{fill.get(label, 0)} held")
        print(f"  {label} ({held}): {why}", file=sys.stderr)  # noqa: T201
    print(f"genaug pregenerate: exit status {STOPPED_EXIT} (a label the judge stopped); after "  # noqa: T201
          "the fix, restart the service and run this again", file=sys.stderr)
    return STOPPED_EXIT


def run_pregenerate(args: argparse.Namespace) -> int:
    """Fill each label of ``args.recipe`` to ``args.per_label`` images, or (with a service)
    spend ``args.images`` more split by need."""
    if args.url:
        return _pregenerate_remote(args)
    if getattr(args, "images", None) is not None:
        print("genaug pregenerate: --images splits by the trainers' need, which a running "  # noqa: T201
              "service holds; add --url URL, or use --per-label N", file=sys.stderr)
        return 2
    return _pregenerate_local(args)


def _pregenerate_remote(args: argparse.Namespace) -> int:
    from genaug.client import Client, GenaugError

    with Client(args.url) as client:
        try:
            detail = client.fill(args.recipe, per_label=args.per_label, images=args.images)
        except GenaugError as exc:
            print(f"genaug pregenerate: {exc}", file=sys.stderr)  # noqa: T201
            # 409: no label has room for the budget but those the judge stopped
            return _refused_for_stopped(client, args.recipe) if getattr(
                exc, "status", None) == 409 else 1
        if args.images is None:
            targets = {label: args.per_label for label in detail["labels"]}
        else:  # the labels the budget went to, each to the fill it was asked up to
            budget = detail["budget"]
            print(f"genaug pregenerate: {budget['note']}", file=sys.stderr)  # noqa: T201
            targets = {label: detail["per_label"][label]["asked"]
                       for label, share in budget["per_label"].items() if share > 0}
        bars = _bars(targets)
        try:
            while True:
                # The replica's stopped labels (its judge's low-acceptance stop): they get no
                # more images, so the wait ends once every other label is filled.
                stopped = _short_and_stopped(detail["fill"], targets,
                                             dict(detail.get("stopped") or {}))
                _update(bars, detail["fill"], stopped)
                if all(detail["fill"].get(label, 0) >= targets[label]
                       for label in bars if label not in stopped):
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
    if stopped:
        return _say_stopped(args.recipe, detail["fill"], targets, stopped)
    return 0


def _refused_for_stopped(client: Any, recipe: str) -> int:
    """After a refused fill: :data:`STOPPED_EXIT` naming each label the judge stopped, with
    its reason and fix, when the recipe has such labels; else 1."""
    from genaug.client import GenaugError

    try:
        detail = client.recipe(recipe)
    except GenaugError:
        return 1
    stopped = dict(detail.get("stopped") or {})
    if not stopped:
        return 1
    return _say_stopped(recipe, detail.get("fill") or {}, {}, stopped)


def _settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with the command's pool flags over them."""
    from ..settings import Settings

    overrides: dict[str, Any] = {}
    if getattr(args, "pool_path", None) is not None:
        overrides["pool_path"] = args.pool_path
    if getattr(args, "pool_url", None) is not None:
        overrides["pool_url"] = args.pool_url
    return Settings(**overrides)


def _open_store(args: argparse.Namespace, command: str,
                capacity: int | None = None) -> tuple[PoolStore | None, str]:
    """The pool the flags and settings name, or None and a one-line reason."""
    from ..pool.open import open_pool_store
    from ..pool.types import PoolError

    settings = _settings(args)
    if settings.pool_url is None and not Path(settings.pool_path).exists() and capacity is None:
        return None, (f"genaug {command}: no pool database at {settings.pool_path}; pass "
                      "--pool-path or --pool-url (or set GENAUG_POOL_PATH / GENAUG_POOL_URL)")
    try:
        return open_pool_store(settings, capacity_per_label=capacity), ""
    except PoolError as exc:
        return None, f"genaug {command}: {exc}"


class _StopFlag:
    """SIGINT sets a flag; the loop finishes and stores the batch it is making, then stops.
    A second Ctrl-C raises KeyboardInterrupt at once (the default behaviour)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous: Any = None

    def __enter__(self) -> _StopFlag:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.event.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\nstopping after the batch in progress is stored (Ctrl-C again to abort)",  # noqa: T201
              file=sys.stderr)

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)


KEPT = "stopped; every finished batch is kept (run the same command again to resume)"


def _pregenerate_local(args: argparse.Namespace) -> int:
    from ..recipes.load import check_recipes, load_recipes
    from ..recipes.spec import RecipeError

    with _StopFlag() as stop:
        settings = _settings(args)
        recipes_path = args.recipes or settings.recipes
        if recipes_path is None:
            print("genaug pregenerate: give --recipes FILE or set GENAUG_RECIPES",  # noqa: T201
                  file=sys.stderr)
            return 2
        try:
            recipes = load_recipes(recipes_path)
            if args.recipe in recipes:
                check_recipes({args.recipe: recipes[args.recipe]}, path=Path(recipes_path),
                              data_root=settings.data_root,
                              adapters=_adapter_names(settings))
        except RecipeError as exc:
            print(f"genaug pregenerate: {exc}", file=sys.stderr)  # noqa: T201
            return 2
        if args.recipe not in recipes:
            print(f"genaug pregenerate: no recipe {args.recipe!r} in {recipes_path}; "  # noqa: T201
                  f"it has {sorted(recipes)}", file=sys.stderr)
            return 2
        capacity = max(settings.pool_capacity_per_label, args.per_label)
        store, problem = _open_store(args, "pregenerate", capacity)
        if store is None:
            print(problem, file=sys.stderr)  # noqa: T201
            return 2
        try:
            return _fill_in_process(args, settings, recipes[args.recipe], store, stop.event)
        finally:
            store.close()


def _adapter_names(settings: Settings) -> set[str]:
    loras = getattr(settings, "loras", None) or {}
    if isinstance(loras, dict):
        return set(loras)
    return {str(getattr(x, "name", x)) for x in loras}


def _fill_in_process(args: argparse.Namespace, settings: Settings, recipe: Any,
                     store: PoolStore, stop: threading.Event) -> int:
    from ..batching.items import to_end
    from ..judge import build_judges
    from ..pipeline.load import load_model
    from ..pipeline.worker import PipelineWorker
    from ..pool.planner import PoolPlanner, pool_model_hash

    if stop.is_set():
        print(f"\n{KEPT}", file=sys.stderr)  # noqa: T201
        return 130
    model = load_model(source=settings.model, unet_weights=settings.unet_weights,
                       device=settings.device, dtype=settings.dtype,
                       single_file_config=settings.single_file_config)
    generator = PipelineWorker(model)
    recipes = {args.recipe: recipe}
    planner = PoolPlanner(recipes, store, model_hash=pool_model_hash(model),
                          pregenerate=False, data_root=settings.data_root,
                          judges=build_judges(recipes, settings.data_root, model.device))
    planner.raise_target(args.recipe, args.per_label, shared=False)
    pid = planner.pool_ids[args.recipe]
    targets = dict.fromkeys(recipe.label_names, args.per_label)
    bars = _bars(targets)
    fill: dict[str, int] = {}
    try:
        while not stop.is_set():
            fill = _fill_or_empty(store, pid)
            _update(bars, fill, planner.stopped(args.recipe))
            # the planner plans no batch of a label its judge stopped: None then means every
            # other label is filled
            work = planner.next_idle_batch(settings.max_batch_images)
            if work is None:
                if planner.paused:  # the database is unreachable: wait, it resumes by itself
                    stop.wait(2.0)
                    continue
                break
            try:
                outcome = to_end(generator.run(work.key, work.items))
            except Exception as exc:
                if work.on_failed is not None:
                    work.on_failed(exc)
                raise
            work.on_done(outcome)  # stored before the stop flag is looked at again
        fill = _fill_or_empty(store, pid) or fill
        stopped = _short_and_stopped(fill, targets, planner.stopped(args.recipe))
        _update(bars, fill, stopped)
    finally:
        for bar in bars.values():
            bar.close()
    if stop.is_set():  # after the bars, which redraw as they close: the last line says it
        print(f"\n{KEPT}", file=sys.stderr)  # noqa: T201
        return 130
    if stopped:
        return _say_stopped(args.recipe, fill, targets, stopped)
    return 0


def _fill_or_empty(store: PoolStore, pid: str) -> dict[str, int]:
    from ..pool.types import PoolConnectionError

    try:
        return store.fill(pid)
    except PoolConnectionError:
        return {}


def run_export(args: argparse.Namespace) -> int:
    """Write a recipe's pool as ``OUT/<label>/<seed>.png``."""
    from PIL import Image

    store, problem = _open_store(args, "export")
    if store is None:
        print(problem, file=sys.stderr)  # noqa: T201
        return 2
    try:
        candidates = [p for p in store.pools() if p.startswith(args.recipe + "-")]
        if args.pool:
            candidates = [p for p in candidates if p == args.pool]
        if not candidates:
            print(f"genaug export: {store.location} holds no pool of recipe "  # noqa: T201
                  f"{args.recipe!r} (pools: {store.pools()})", file=sys.stderr)
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
            Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(
                folder / f"{seed}.png")
            count += 1
        print(f"wrote {count} images of pool {chosen} to {out}/<label>/<seed>.png")  # noqa: T201
    finally:
        store.close()
    return 0


def run_pool(args: argparse.Namespace) -> int:
    """``genaug pool list`` and ``genaug pool drop POOL_ID``."""
    store, problem = _open_store(args, f"pool {args.pool_command}")
    if store is None:
        print(problem, file=sys.stderr)  # noqa: T201
        return 2
    try:
        pools = store.pools()
        if args.pool_command == "list":
            for pid in pools:
                stats = store.stats(pid)
                fill = {label: s.fill for label, s in stats.items()}
                print(f"{pid}  {sum(fill.values())} images  {fill}")  # noqa: T201
            if not pools:
                print(f"no pools in {store.location}")  # noqa: T201
            return 0
        if args.pool_id not in pools:
            print(f"genaug pool drop: no pool {args.pool_id!r} in {store.location}; "  # noqa: T201
                  f"it has: {', '.join(pools) or 'none'} (exact ids, see `genaug pool list`)",
                  file=sys.stderr)
            return 1
        gone = store.drop_pool(args.pool_id)
        print(f"dropped pool {args.pool_id}: {gone} images deleted")  # noqa: T201
        return 0
    finally:
        store.close()
