"""Write a recipe's pool as OUT/<label>/<seed>.png.

The layout ``tf.keras.utils.image_dataset_from_directory`` reads (accepted images only: none
the judge or a person rejected, see docs/curation.md). When the database holds several pools
of the recipe (other prompts or models), the largest is written unless ``--pool`` names one.

Beside the PNGs, ``OUT/manifest.jsonl`` holds one JSON object per PNG, in the order written,
with what made it (:func:`manifest_row`: recipe hash, model and adapter hashes, seed, size,
steps, guidance, scheduler, speed and sampler (its name), the judge's score and settings, a person's
verdict), so an
exported image can be cited and remade; ``OUT/manifest.json`` is the export's header (genaug
version, time, pool, recipe spec). docs/curation.md ("The export's manifest") lists the fields.

Exporting again into the same folder rewrites both files whole from what this export wrote,
overwrites each ``<seed>.png`` (same seed, same pixels) and deletes the PNGs the previous
manifest listed that this export no longer has (an image a person rejected since), so the
folder a trainer reads holds exactly the manifest's images. PNGs no manifest listed are left
alone and counted in a warning.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._pool_args import open_store, pool_arguments, pool_settings

if TYPE_CHECKING:
    from ..pool.store import PoolStore
    from ..pool.types import PoolRecord
    from ..recipes.spec import Recipe
    from ..settings import Settings

#: The manifest's rows (one JSON object per line, one line per PNG) and its header.
ROWS = "manifest.jsonl"
HEADER = "manifest.json"
#: What an image stored before pool schema 4 did not record (``not_recorded`` says so).
PRE_V4 = ("steps", "guidance", "strength", "adapter_hash", "judge")
#: What an image stored before pool schema 6 did not record: the mode and sampler that made it.
PRE_V6 = ("speed", "sampler")
#: A person's verdict as the manifest spells it (the API's ``keep``); the pool's ``restore``.
_VERDICTS = {"reject": "reject", "restore": "keep"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--pool", default=None, help="pool id, when the file holds several")
    pool_arguments(parser)
    parser.epilog = (f"Beside the PNGs it writes OUT/{ROWS} (one row per image: recipe, model "
                     f"and adapter hashes, seed, steps, guidance, scheduler, the judge's score "
                     f"and a person's verdict, enough to remake it) and OUT/{HEADER} (the "
                     "export's header); see docs/curation.md.")


@dataclass
class _Known:
    """What the export can tell beyond the pool's columns, worked out once per model hash:
    the recipe whose spec makes this pool id (so its hash and prompts are facts) and the
    configured model whose weights hash is the pool's (so its name is one)."""

    pool: str
    recipe: Recipe | None
    sources: str | None
    configured: tuple[str, str] | None
    #: ``recipe`` is the pool's own (stored with it): it made every image of the pool.
    matches: bool = False
    recipe_for: dict[str, Recipe | None] = field(default_factory=dict)

    def recipe_of(self, model_hash: str) -> Recipe | None:
        if self.matches:
            return self.recipe
        if model_hash not in self.recipe_for:
            from ..recipes.spec import pool_id

            made: Recipe | None = None
            if self.recipe is not None and model_hash:
                if pool_id(self.recipe, model_hash, sources=self.sources) == self.pool:
                    made = self.recipe
            self.recipe_for[model_hash] = made
        return self.recipe_for[model_hash]

    def model_of(self, model_hash: str) -> str | None:
        # The pool's model hash is "<weights hash>-<dtype>" (pool_model_hash).
        if self.configured is None:
            return None
        name, weights = self.configured
        return name if model_hash.split("-", 1)[0] == weights else None


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def manifest_row(record: PoolRecord, file: str, pool: str, recipe_name: str, *,
                 recipe: Recipe | None, model: str | None) -> dict[str, Any]:
    """One manifest row: ``record`` as written to ``file`` (relative to the export folder).

    ``recipe`` is the recipe whose spec makes ``pool`` (None: not known, so its hash and the
    image's prompt are not either); ``model`` the configured model's name or path when its
    weights are the pool's. A null is a fact unless its field is in ``not_recorded``.
    """
    made = record.provenance
    not_recorded: list[str] = []
    if made.steps is None:  # stored before schema 4, or added without provenance
        not_recorded.extend(PRE_V4)
    elif record.adapter is not None and made.adapter_hash is None:
        not_recorded.append("adapter_hash")
    if made.speed is None:  # stored before schema 6
        not_recorded.extend(PRE_V6)
    prompt = negative = None
    if recipe is not None and record.plan_index is not None:
        prompt, negative, _ = recipe.plan(record.label, record.plan_index)
    else:
        not_recorded.append("prompt")
    if recipe is None:
        not_recorded.append("recipe_hash")
    if model is None:
        not_recorded.append("model")
    from ..sampling.modes import name_of_id  # numpy: not at import (``--help`` stays light)

    height, width, channels = record.image.shape
    return {
        "file": file,
        "recipe": recipe_name,
        "recipe_hash": recipe.spec_hash() if recipe is not None else None,
        "label": record.label,
        "seed": record.seed,
        "seed_str": str(record.seed),  # 63-bit seeds lose digits as JavaScript numbers
        "plan_index": record.plan_index,
        "prompt": prompt,
        "negative_prompt": negative,
        "pool_id": pool,
        "model": model,
        "model_hash": record.model_hash,
        "adapter": record.adapter,
        "adapter_hash": made.adapter_hash,
        "adapter_scale": record.adapter_scale,
        "width": int(width),
        "height": int(height),
        "channels": int(channels),
        "steps": made.steps,
        "guidance": made.guidance,
        "scheduler": record.scheduler,
        "speed": made.speed,
        "sampler": name_of_id(made.sampler) if made.sampler is not None else None,
        "strength": made.strength,
        "source": record.source,
        "score": record.score,
        "judge_keep": record.judge_keep,
        "judge": json.loads(made.judge_settings) if made.judge_settings else None,
        "judge_key": made.judge_key,
        "verdict": _VERDICTS.get(record.verdict or ""),
        "verdict_at": _iso(record.verdict_at),
        "accepted": record.accepted,
        "created": _iso(record.created),
        "not_recorded": not_recorded,
    }


def configured_model(settings: Settings) -> tuple[str, str] | None:
    """(name or path, weights hash) of the model the settings name, or None when it cannot be
    read here. The hash is ``load_model``'s ``weights_hash``: a built-in is built on the CPU
    (small), a folder or file is hashed without loading it (``files_weights_hash``, which
    ``load_model`` hashes with too)."""
    from ..pipeline.load import ModelLoadError, load_model
    from ..pipeline.weights import files_weights_hash

    try:
        builtin = settings.builtin_model
        if builtin is not None:
            model = load_model(source=builtin, unet_weights=settings.unet_weights,
                               device="cpu", dtype="float32")
            return builtin, model.weights_hash
        path = settings.model_path
        if path is None:
            return None
        if not path.exists():
            return None
        return str(path), files_weights_hash(path, settings.unet_weights)
    except (ModelLoadError, OSError):
        return None  # the name stays unknown (null, and said so); the export goes on


def _recipe(args: argparse.Namespace, settings: Settings) -> tuple[Recipe | None, str | None]:
    """The recipe of the recipes file (``--recipes`` or ``GENAUG_RECIPES``) named
    ``--recipe`` and its label images' digest; None when there is none to read (a pool can be
    exported without its recipe file: the manifest then says what it could not know)."""
    from ..recipes.load import load_recipes
    from ..recipes.sources import load_label_sources, sources_digest
    from ..recipes.spec import RecipeError

    path = args.recipes or settings.recipes
    if path is None:
        return None, None
    try:
        recipe = load_recipes(Path(path)).get(args.recipe)  # read by run() already: sound
        if recipe is None:
            return None, None
        digest = sources_digest({label: load_label_sources(recipe, label, settings.data_root)
                                 for label in recipe.label_names})
    except (RecipeError, ValueError, OSError) as exc:
        print(f"genaug export: reading recipe {args.recipe!r} of {path}: {exc}; the manifest "
              "leaves its hash and prompts out", file=sys.stderr)
        return None, None
    return recipe, digest


def _unknown_prompts(store: PoolStore, pool: str, known: _Known, args: argparse.Namespace,
                     settings: Settings) -> str:
    """Why the prompts of ``pool`` (which stores no recipe: written before pool schema 5)
    cannot be written, in one line naming the fix; "" when the recipe file given made it."""
    first = next(iter(store.reads.iter_records(pool)), None)
    if first is None or known.recipe_of(first.model_hash) is not None:
        return ""  # one model per pool id: the first image's hash is every image's
    path = args.recipes or settings.recipes
    why = (f"the recipe {args.recipe!r} of {path} is not the one that made it (changed "
           "since?)" if path is not None else "no recipe file was given")
    return (f"genaug export: pool {pool} stores no recipe (written before pool schema 5) and "
            f"{why}; pass --recipes FILE with the recipe it was made with (or set "
            "GENAUG_RECIPES) so that each image's prompt is written, or serve the pool once "
            "with this genaug, which records it")


def _previous_files(out: Path) -> set[str]:
    """The files the manifest already in ``out`` lists (written by an earlier export)."""
    try:
        lines = (out / ROWS).read_text().splitlines()
    except OSError:
        return set()
    files = set()
    for line in lines:
        try:
            files.add(str(json.loads(line)["file"]))
        except (ValueError, KeyError, TypeError):
            continue  # a damaged line names nothing this export can own
    return files


def _write_whole(path: Path, lines: Iterator[str]) -> None:
    """Write ``path`` through a temporary file: a reader never sees half a manifest."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(line)
    os.replace(tmp, path)


def _out_refusal(out: Path) -> str:
    """Why ``--out`` cannot be the export's folder ("" when it can): a file, or a folder that
    cannot be made or written (it is made here, parents included)."""
    if out.exists() and not out.is_dir():
        return (f"genaug export: --out {out} is a file, not a folder; give a folder (it is "
                "made if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".genaug-export-{os.getpid()}.tmp"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        why = ("a file is in its path" if isinstance(exc, FileExistsError | NotADirectoryError)
               else f"{type(exc).__name__}: {exc.strerror or exc}")
        return (f"genaug export: --out {out} cannot be made or written ({why}); give a "
                "folder you can write")
    return ""


def _recipes_refusal(args: argparse.Namespace, settings: Settings) -> str:
    """Why the recipe file named (``--recipes``, else ``GENAUG_RECIPES``) cannot be read ("" when
    it can, or when none is named): a file named and not read would leave the manifest without
    what it was given to tell."""
    from ..recipes.load import load_recipes
    from ..recipes.spec import RecipeError

    path = args.recipes or settings.recipes
    if path is None:
        return ""
    try:
        load_recipes(Path(path))
    except RecipeError as exc:  # its message names the file, the line and the fix
        return f"genaug export: {' '.join(str(exc).split())}"
    return ""


def run(args: argparse.Namespace) -> int:
    """Write a recipe's pool as ``OUT/<label>/<seed>.png`` with its manifest; exit status 0
    written, 1 no such pool or the writing failed, 2 a flag, setting, recipe file, pool or
    output folder that cannot be used (one line)."""
    store, problem = open_store(args, "export")
    if store is None:
        print(problem, file=sys.stderr)
        return 2
    try:
        refused = _recipes_refusal(args, pool_settings(args))
        if refused:
            print(refused, file=sys.stderr)
            return 2
        return _export(args, store)
    except OSError as exc:  # a disk that fills, a folder removed while writing
        print(f"genaug export: writing to {args.out} failed ({type(exc).__name__}: {exc}); "
              "free the space or fix the folder and export again", file=sys.stderr)
        return 1
    finally:
        store.close()


def _export(args: argparse.Namespace, store: PoolStore) -> int:
    """The export itself: the pool chosen, ``--out`` checked (:func:`_out_refusal`), the
    PNGs and the manifest written."""
    from PIL import Image

    from genaug import __version__

    candidates = [p for p in store.reads.pools() if p.startswith(args.recipe + "-")]
    if args.pool:
        candidates = [p for p in candidates if p == args.pool]
    if not candidates:
        print(f"genaug export: {store.location} holds no pool of recipe "
              f"{args.recipe!r} (pools: {store.reads.pools()})", file=sys.stderr)
        return 1
    sizes = {p: sum(store.fill(p).values()) for p in candidates}
    chosen = max(candidates, key=lambda p: sizes[p])
    if len(candidates) > 1:
        print(f"{len(candidates)} pools of {args.recipe!r} (other prompts or models): "
              f"{sizes}; exporting the largest, {chosen} (choose with --pool)")
    out = Path(args.out)
    refused = _out_refusal(out)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    settings = pool_settings(args)
    stored = store.recipe_specs.read(chosen)
    if stored is not None:  # what made the pool, from the pool: no file can disagree
        known = _Known(chosen, stored, None, None, matches=True)
    else:
        known = _Known(chosen, *_recipe(args, settings), None)
        refused = _unknown_prompts(store, chosen, known, args, settings)
        if refused:
            print(refused, file=sys.stderr)
            return 2
    if sizes[chosen]:
        known.configured = configured_model(settings)
    recipe = known.recipe
    previous = _previous_files(out)
    rows: list[str] = []
    written: set[str] = set()
    model_hashes: dict[str, str | None] = {}
    for record in store.reads.iter_records(chosen):
        file = f"{record.label}/{record.seed}.png"
        folder = out / record.label
        folder.mkdir(parents=True, exist_ok=True)
        image = record.image
        Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(out / file)
        model = known.model_of(record.model_hash)
        model_hashes[record.model_hash] = model
        row = manifest_row(record, file, chosen, args.recipe,
                           recipe=known.recipe_of(record.model_hash), model=model)
        rows.append(json.dumps(row) + "\n")
        written.add(file)
    stale = sorted(previous - written)
    for name in stale:  # an earlier export's image this one no longer has
        (out / name).unlink(missing_ok=True)
    _write_whole(out / ROWS, iter(rows))
    matched = [known.recipe_of(h) for h in model_hashes]
    header = {
        "genaug": __version__,
        "exported_at": _iso(datetime.now(UTC).timestamp()),
        "pool": store.location,
        "pool_id": chosen,
        "recipe": args.recipe,
        "recipe_hash": recipe.spec_hash() if recipe is not None and any(matched) else None,
        "recipe_spec": recipe.spec() if recipe is not None and any(matched) else None,
        "models": [{"model": m, "model_hash": h} for h, m in model_hashes.items()],
        "images": len(rows),
        "rows": ROWS,
    }
    _write_whole(out / HEADER, iter([json.dumps(header, indent=2) + "\n"]))
    others = [p for p in out.glob("*/*.png")
              if p.relative_to(out).as_posix() not in written]
    removed = f"; removed {len(stale)} PNGs of the previous export" if stale else ""
    print(f"wrote {len(rows)} images of pool {chosen} to {out}/<label>/<seed>.png and "
          f"{out / ROWS}{removed}")
    if others:
        print(f"genaug export: {len(others)} PNGs under {out} are not this export's (e.g. "
              f"{others[0].relative_to(out)}) and a folder reader would train on them; "
              "remove them or export into an empty folder", file=sys.stderr)
    return 0
