"""Train a LoRA on DATA/<label>/*.png for the served model.

``genaug adapt``: a LoRA for the served model, from a labelled folder of your own images.

::

    DATA/<label>/*.png      one folder per label of the recipe (png, jpg), any size
    genaug adapt DATA --recipes recipes.yaml --recipe wounds --out wounds.safetensors \\
        [--model M] [--steps N] [--rank 32] [--seed 0] [--lr 1e-3] [--batch-size 4] \\
        [--check-images 50 | --no-check]
    GENAUG_LORAS=wounds=wounds.safetensors genaug serve   # the recipe names adapter: wounds
    genaug adapt --check wounds.safetensors [--model M]   # was it made for this model?

Each image is resized to the recipe's generation size (``height`` x ``width``) and paired
with its label's prompts; :func:`genaug.service.adapt.train.adapt` trains. ``--model``
defaults to ``GENAUG_MODEL`` (else the embedded ``tiny-digits``): the LoRA is made for that
model's weights and records their hash; the service refuses it over any other model. A
missing label folder, an unknown recipe or a bad file gives one line and exit status 2.

**Defaults by the data's size**: ``--steps`` is 1,200 per label of the recipe (at least
1,000, at most 12,000: 6,000 for five labels), ``--rank`` 32
(:func:`~genaug.service.adapt.train.default_steps`). On the embedded ``tiny-digits-base``
and five images per class of digits 5-9 they reach the 80 % goal below in a few minutes on
2 CPU cores (docs/benchmarks.md).

**The final check** (:mod:`genaug.service.adapt.check`; ``--no-check`` skips it):
the new LoRA, loaded as the service loads it, draws ``--check-images`` (50) images of every
label with the recipe's prompts and settings; the judge's ``shots`` rule, fitted on DATA, scores
them; a table per label (drawn as asked, k of N, %) and a one-line verdict with the fix
follow the file's path, e.g.::

    not learned: label 7: 29 of 50 drawn as asked: train longer, --steps 12000

The images it scored are written next to the LoRA as ``OUT.check.png``, one row per label in
the recipe's order with its name at the left, so you can see what "drawn as asked" meant: an
image scored as another label is framed in red, one unsure (its own label under the bar) in
amber (images up to 256 pixels keep their pixels; larger ones are shrunk). The exit status
stays 0 when the file was written (the verdict is information: a LoRA under the goal may
still help, and a script that needs the figures reads the ``check`` the command writes next
to the LoRA, ``OUT.check.json``); 130 when interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

# numpy comes with adapt.data: imported when the command runs (``--help`` stays light)
from ..pipeline.lora_record import DEFAULT_RANK

__all__ = ["add_arguments", "interrupted", "run"]

log = logging.getLogger(__name__)

#: The final check's images per label. At 20 one image moved a label's share by 5 points, and
#: the check's reading and an outside classifier's, on the same images, differed by up to 15
#: on one label; at 50 and 100 they agree within 8 on every label (docs/benchmarks.md).
CHECK_IMAGES = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from genaug.cli import whole_number

    parser.add_argument("data", nargs="?", type=Path, default=None,
                        help="folder with one sub-folder of images per label: DATA/<label>/*.png")
    parser.add_argument("--recipes", type=Path, default=None,
                        help="recipe file (default: GENAUG_RECIPES)")
    parser.add_argument("--recipe", default=None, help="recipe name (labels, prompts, size)")
    parser.add_argument("--out", type=Path, default=None, help="the LoRA file, .safetensors")
    parser.add_argument("--model", default=None,
                        help="the base model, e.g. tiny-digits-base (default: GENAUG_MODEL, "
                        "else tiny-digits)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: "
                        "GENAUG_DEVICE)")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps (default: 1200 per label of the recipe, at least "
                        "1000, at most 12000)")
    parser.add_argument("--rank", type=int, default=DEFAULT_RANK,
                        help=f"LoRA rank (default {DEFAULT_RANK})")
    parser.add_argument("--seed", type=whole_number(0, 2**63 - 1, fix="seeds are 63-bit"),
                        default=0, help="seed of every draw (default 0)")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3; "
                        "1e-4 for SDXL)")
    parser.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant",
                        help="constant, or cosine: 5 %% linear warm-up then decay to 0")
    parser.add_argument("--batch-size", type=int, default=4, help="images per step (default 4)")
    parser.add_argument("--accumulation", type=int, default=1,
                        help="micro-batches per optimizer step (default 1)")
    parser.add_argument("--text-encoder", action="store_true",
                        help="also train LoRA on both text encoders (stronger conditioning)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--check-images", type=int, default=CHECK_IMAGES, metavar="N",
                        help="after training, draw N images of every label and score them "
                        f"against DATA (default {CHECK_IMAGES})")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the final check (no images drawn, no table, no verdict)")
    parser.add_argument("--check", type=Path, default=None, metavar="LORA",
                        help="only say whether LORA was made for --model; exit 1 if not")


def run(args: argparse.Namespace) -> int:
    """``genaug adapt``; one line on stderr and exit 2 for any unusable input."""
    # Before torch loads: OpenMP threads that spin while a sibling is descheduled cost more
    # than they do on a shared CPU (200 tiny steps: 157 s with 2 spinning threads, 11 s with 1).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from pydantic import ValidationError

    from ..adapt.data import AdaptInputError
    from ..pipeline.device import ModelLoadError
    from ..recipes.spec import RecipeError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    try:
        if args.check is not None:
            return _check(args)
        return _adapt(args)
    except (AdaptInputError, RecipeError, ModelLoadError) as exc:
        print(f"genaug adapt: {_one_line(exc)}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # GENAUG_* or --model/--device/--recipes: one line each
        from ..settings.errors import settings_refusal

        given = {field: flag for field, flag in _SETTING_FLAGS.items()
                 if getattr(args, field, None) is not None}
        for line in settings_refusal(exc, flags=given):
            print(f"genaug adapt: {line}", file=sys.stderr)
        return 2


def interrupted(args: argparse.Namespace) -> str:
    """What Ctrl-C before training leaves (during training it is :func:`_adapt`'s own: it saves
    what was learned and says so)."""
    return "nothing was written; run the same command again"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


#: The flags that set a Settings field, by the field.
_SETTING_FLAGS = {"model": "--model", "device": "--device", "recipes": "--recipes"}


def _settings(args: argparse.Namespace) -> Any:
    from ..settings import Settings

    overrides = {field: getattr(args, field) for field in _SETTING_FLAGS
                 if getattr(args, field, None) is not None}
    return Settings(**overrides)


def _load(settings: Any) -> Any:
    from ..pipeline.device import configure_threads
    from ..pipeline.load import load_model

    model = load_model(source=settings.model, unet_weights=settings.unet_weights,
                       device=settings.device, dtype=settings.dtype)
    configure_threads(settings.torch_threads, model.device)  # as the service does
    return model


def _adapt(args: argparse.Namespace) -> int:
    from ..adapt.data import AdaptInputError, read_labelled_folder
    from ..adapt.train import (
        MAX_STEPS,
        MIN_STEPS,
        STEPS_PER_LABEL,
        AdaptConfig,
        AdaptData,
        adapt,
        default_steps,
    )
    from ..pipeline.sampler import prompt_tokens
    from ..recipes.load import load_recipes, long_prompts

    if args.data is None or args.out is None or args.recipe is None:
        raise AdaptInputError("give DATA, --recipe NAME and --out OUT.safetensors (and "
                              "--recipes FILE unless GENAUG_RECIPES is set)")
    if args.out.suffix.lower() != ".safetensors":
        raise AdaptInputError(f"--out {str(args.out)!r} must end in .safetensors (the only "
                              "LoRA format the service loads)")
    for flag in ("steps", "rank", "batch_size", "accumulation", "check_images"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise AdaptInputError(f"--{flag.replace('_', '-')} {getattr(args, flag)} must be "
                                  ">= 1")
    if not 0 < args.lr < float("inf"):
        raise AdaptInputError(f"--lr {args.lr} must be a finite number > 0 (e.g. 1e-3)")
    settings = _settings(args)
    if settings.recipes is None:
        raise AdaptInputError("no recipe file: give --recipes FILE (or set GENAUG_RECIPES)")
    recipes = load_recipes(settings.recipes)
    if args.recipe not in recipes:
        raise AdaptInputError(f"{str(settings.recipes)!r} has no recipe {args.recipe!r}; it "
                              f"has: {', '.join(sorted(recipes))}")
    recipe = recipes[args.recipe]
    labels = {label: list(recipe.labels[label].prompts) for label in recipe.label_names}
    images, prompts, data_hash = read_labelled_folder(args.data, labels,
                                                      (recipe.height, recipe.width))
    log.info("data: %d images in %d labels from %s at %dx%d (hash %s)", len(images),
             len(labels), args.data, recipe.width, recipe.height, data_hash)
    model = _load(settings)
    log.info("base model %s (%s), weights hash %s, on %s", model.source, model.kind,
             model.weights_hash, model.device)
    count, limit = prompt_tokens(model.pipeline)  # said once here, as the service does
    for line in long_prompts({args.recipe: recipe}, count, limit, path=settings.recipes):
        log.warning("%s", line)
    steps = args.steps if args.steps is not None else default_steps(len(labels))
    if args.steps is None:
        log.info("steps: %d (the default for %d labels: %d per label, within %d-%d)", steps,
                 len(labels), STEPS_PER_LABEL, MIN_STEPS, MAX_STEPS)
    config = AdaptConfig(steps=steps, rank=args.rank, seed=args.seed, lr=args.lr,
                         lr_schedule=args.lr_schedule, batch_size=args.batch_size,
                         accumulation=args.accumulation, text_encoder=args.text_encoder,
                         progress=not args.no_progress)
    record = adapt(model, AdaptData(images, prompts, data_hash), args.out, config)
    name = args.out.stem
    print(f"genaug adapt: wrote {args.out} ({record['steps']} steps, rank {record['rank']}, "
          f"final loss {record['final_loss']}, {record['train_s']} s"
          f"{', interrupted' if record['interrupted'] else ''}); serve it on the model it "
          f"was made for with\n  {serve_command(settings, model.source, args.out)}\n"
          f"and name it in the recipe: adapter: {{name: {name}}}")
    if record["interrupted"]:
        return 130
    if not args.no_check:
        del model  # the check draws with a fresh copy, the new file loaded as the service does
        try:
            _final_check(args, settings, recipe, record)
        except KeyboardInterrupt:  # the LoRA is written: say so rather than "nothing"
            print(f"genaug adapt: interrupted during the final check; {args.out} is written "
                  "and kept (the check is information only; --no-check skips it)",
                  file=sys.stderr)
            return 130
    return 0


def _final_check(args: argparse.Namespace, settings: Any, recipe: Any,
                 record: dict[str, Any]) -> None:
    """Draw, score, print the table and the verdict; write them to ``OUT.check.json`` and
    the images scored to ``OUT.check.png`` (one row per label)."""
    import gc
    import json

    from ..adapt.check import check_adapter
    from ..adapt.data import read_shots

    gc.collect()
    model = _load(settings)
    log.info("final check: %d images of each of %d labels with the new LoRA, scored against "
             "DATA", args.check_images, len(recipe.label_names))
    result = check_adapter(model, args.out, recipe, read_shots(args.data, recipe),
                           per_label=args.check_images, scheduler=settings.scheduler)
    verdict = result.verdict(steps=int(record["steps"]), rank=int(record["rank"]))
    path = args.out.with_name(args.out.stem + ".check.json")
    sheet = args.out.with_name(args.out.stem + ".check.png")
    sheet.write_bytes(result.sheet())
    path.write_text(json.dumps({**result.to_dict(), "verdict": verdict, "lora": str(args.out),
                                "steps": record["steps"], "rank": record["rank"],
                                "sheet": str(sheet)}, indent=2) + "\n")
    print(f"final check ({args.check_images} images per label, {result.seconds:.0f} s; "
          f"figures in {path}, the images in {sheet}):\n{result.table()}\n"
          f"{result.judge_line()}\n{verdict}")


def serve_command(settings: Any, model: str, out: Path) -> str:
    """The ``genaug serve`` line that loads the LoRA at ``out`` on ``model`` (the base it was
    adapted on) with the same recipes, UNet weights and device: it works as printed."""
    name = out.stem
    parts = [f"GENAUG_LORAS={shlex.quote(f'{name}={out}')}", "genaug", "serve",
             "--model", shlex.quote(str(model))]
    if settings.unet_weights is not None:
        parts += ["--unet-weights", shlex.quote(str(settings.unet_weights))]
    if settings.device != "cpu":
        parts += ["--device", shlex.quote(str(settings.device))]
    parts += ["--recipes", shlex.quote(str(settings.recipes))]
    return " ".join(parts)


def _check(args: argparse.Namespace) -> int:
    from ..adapt.data import AdaptInputError
    from ..pipeline.lora_record import read_record

    path: Path = args.check
    if not path.is_file():
        raise AdaptInputError(f"--check {str(path)!r} does not exist")
    try:
        record = read_record(path)
    except Exception as exc:  # safetensors raises several types; all mean unreadable
        raise AdaptInputError(f"--check {str(path)!r} is not a readable safetensors file: "
                              f"{exc}") from exc
    model = _load(_settings(args))
    made_for = record.get("base_hash")
    if made_for is None:
        print(f"genaug adapt: {path} records no base model (not made by genaug adapt); "
              "the service loads it unchecked")
        return 0
    if made_for != model.weights_hash:
        print(f"genaug adapt: {path} was adapted on base {made_for} "
              f"({record.get('base_model', '?')}), not on {model.source} ({model.weights_hash})",
              file=sys.stderr)
        return 1
    print(f"genaug adapt: {path} fits {model.source} ({model.weights_hash}): "
          f"{record.get('steps')} steps, rank {record.get('rank')}, data {record.get('data_hash')}")
    return 0
