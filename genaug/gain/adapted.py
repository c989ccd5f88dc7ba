"""The ``adapted`` arm: a LoRA adapted on each seed's ``k`` shots, and the images it draws.

For every ``k`` and seed it writes the seed's shots as ``<work>/adapted/k<k>-s<seed>/data/
<label>/`` (the original files), trains a LoRA on them with ``genaug adapt`` (a child process
on this machine: ``--adapt-model``, default the service's model when it is a built-in one;
``--adapt-steps``, default ``genaug adapt``'s own; ``--device``), then serves every LoRA of the
run from one local service and draws ``per_label`` images per label with each (the label's
prompt, the adapter named, fixed seeds). The LoRAs and the images are kept in the work folder:
a resumed run trains none twice. It costs minutes per ``k`` and seed (genaug adapt's steps),
which is why the arm is not in the default ``--arms``.

Example::

    fetch_adapted(settings, data, split, pending_adapted_cells, work / "sources", say)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from .data import GainInputError, Images
from .plan import Cell, Split
from .sources import Source, load_source, recipe_prompts, save_source

if TYPE_CHECKING:
    from .settings import GainSettings

__all__ = ["BUILT_IN_MODELS", "fetch_adapted"]

#: Models genaug serves by name: ``--adapt-model`` defaults to the service's when it is one.
BUILT_IN_MODELS = ("tiny-digits", "tiny-digits-base", "tiny-random")

Say = Callable[[str], None]


def _recipe_and_model(settings: GainSettings, names: Sequence[str]) -> tuple[dict[str, Any], str]:
    from genaug.client import Client

    url = settings.url or os.environ.get("GENAUG_URL") or "http://127.0.0.1:8000"
    with Client(url, api_key=settings.api_key, client_id="genaug-gain",
                retry_deadline=10.0) as client:
        detail = client.recipe(str(settings.recipe))
        info = client.info()
    recipe_prompts(detail, names, str(settings.recipe))
    model = settings.adapt_model
    if model is None:
        served = str(info.get("model", {}).get("source", ""))
        if served not in BUILT_IN_MODELS:
            raise GainInputError(
                f"the adapted arm trains on this machine: give --adapt-model (the service "
                f"serves {served!r}, which genaug cannot load here by name), e.g. the local "
                "folder of that model")
        model = served
    # The served spec as a recipe file: what drawing needs (labels, prompts, size, steps,
    # guidance), without the judge, the speed, adapters and the spec's own version.
    dropped = ("judge", "speed", "adapter", "spec_version")
    spec = {k: v for k, v in detail["spec"].items() if k not in dropped and v is not None}
    spec["labels"] = {n: {k: v for k, v in spec["labels"][n].items()
                          if k != "adapter" and v is not None} for n in names}
    return {"name": settings.recipe, **spec}, model


def _adapt(settings: GainSettings, model: str, recipes: Path, data: Path, out: Path,
           seed: int, log: Path) -> None:
    from genaug.local_service import start_child, stop_child

    cmd = [sys.executable, "-m", "genaug.cli", "adapt", str(data), "--recipes", str(recipes),
           "--recipe", str(settings.recipe), "--model", model, "--out", str(out),
           "--seed", str(seed), "--device", settings.device, "--no-check", "--no-progress"]
    if settings.adapt_steps is not None:
        cmd += ["--steps", str(settings.adapt_steps)]
    with log.open("w") as sink:
        proc = start_child(cmd, stdout=sink, stderr=subprocess.STDOUT)
        try:
            status = proc.wait()
        finally:
            stop_child(proc, grace_s=5.0)
    if status != 0 or not out.is_file():
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"genaug adapt failed for {data.parent.name} (status {status}): "
                           f"{tail[0]}; its log: {log}")


def _draw(settings: GainSettings, model: str, recipes: Path, loras: dict[str, Path],
          wanted: dict[str, Cell], names: Sequence[str], prompts: dict[str, str],
          folder: Path, work: Path) -> None:
    from genaug.client import Client
    from genaug.local_service import free_port, running_service

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    env.update(GENAUG_MODEL=model, GENAUG_RECIPES=str(recipes), GENAUG_PREGENERATE="false",
               GENAUG_DEVICE=settings.device, GENAUG_POOL_PATH=str(work / "pool.db"),
               GENAUG_LORAS=",".join(f"{n}={p}" for n, p in loras.items()))
    with running_service(port, env=env, log_path=work / "service.log"):
        with Client(f"http://127.0.0.1:{port}", client_id="genaug-gain") as client:
            client.wait_ready(timeout=600.0)
            for name, cell in wanted.items():
                images, labels = [], []
                for index, label in enumerate(names):
                    got = client.generate(prompts[label], n=settings.per_label, adapter=name,
                                          seed=(cell.seed * 7919 + cell.k * 104729
                                                + index * 1_000_003) % (1 << 62))
                    images.append(got.images)
                    labels.append(np.full(len(got.images), index, np.int64))
                save_source(folder / f"adapted-k{cell.k}-s{cell.seed}.npz",
                            Source.of(np.concatenate(images), np.concatenate(labels)))


def fetch_adapted(settings: GainSettings, data: Images, split: Split, pending: Sequence[Cell],
                  folder: Path, say: Say) -> None:
    """Make the images of every pending adapted cell (module doc)."""
    wanted = {f"k{c.k}s{c.seed}": c for c in pending
              if load_source(folder / f"adapted-k{c.k}-s{c.seed}.npz") is None}
    if not wanted:
        return
    work = folder.parent / "adapted"
    work.mkdir(parents=True, exist_ok=True)
    recipe, model = _recipe_and_model(settings, data.names)
    recipes = work / "recipes.yaml"
    recipes.write_text(yaml.safe_dump({"recipes": [recipe]}))
    prompts = {n: str(recipe["labels"][n]["prompts"][0]) for n in data.names}
    loras: dict[str, Path] = {}
    for number, (name, cell) in enumerate(wanted.items(), 1):
        lora = work / f"{name}.safetensors"
        loras[name] = lora
        if lora.is_file():
            continue
        shots = work / name / "data"
        if shots.exists():
            shutil.rmtree(shots)
        for i in split.shots(data, cell.k, cell.seed):
            label = data.names[int(data.labels[i])]
            (shots / label).mkdir(parents=True, exist_ok=True)
            source = Path(settings.data) / data.files[int(i)]
            shutil.copyfile(source, shots / label / source.name)
        started = time.monotonic()
        say(f"adapted: genaug adapt on k={cell.k} seed {cell.seed}'s shots ({number} of "
            f"{len(wanted)}), model {model}")
        _adapt(settings, model, recipes, shots, lora, cell.seed, work / f"{name}.log")
        say(f"adapted: {lora.name} in {time.monotonic() - started:.0f} s")
    say(f"adapted: drawing {settings.per_label} images per label with each of "
        f"{len(wanted)} LoRA(s)")
    _draw(settings, model, recipes, loras, wanted, data.names, prompts, folder, work)
