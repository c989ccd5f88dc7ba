"""Where each arm's synthetic images come from, fetched once and kept in the run's folder.

- ``pool``: the recipe's pool on a running service, filled to ``per_label`` (a fill job) and
  sampled, once for the run: every seed and ``k`` mixes the same images.
- ``variants``: img2img variants of each seed's shots (``/v1/variants`` with the label's
  prompt), made once per shot: a shot first used at ``k`` gets ``ceil(per_label / k)``
  variants, and a cell takes that many of each of its shots, so every cell mixes about
  ``per_label`` per label made from its own shots only.
- ``adapted``: a LoRA adapted on each seed's ``k`` shots (``genaug adapt``, on this machine),
  then ``per_label`` images per label drawn with it by a local service: the one arm whose
  generator saw the user's domain (:mod:`~genaug.gain.adapted`).
- ``extra NAME=DIR``: images the user already has, ``DIR/<label>/*``, up to ``per_label``
  per label (a fixed choice).

Every source is a :class:`Source`: RGB images at the size they were made, their labels
(indices into the data's label names) and, for variants, the shot each was made from. Kept as
``<work>/sources/<name>.npz``; a resumed run reads it back instead of asking again.

Example::

    pool = fetch_pool(client, "digits", data.names, per_label=64, work=work)
    pool.images.shape, pool.labels
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .data import GainInputError, Images, fit_image, read_folder, read_images

if TYPE_CHECKING:
    from genaug.client import Client

__all__ = ["Source", "fetch_pool", "load_source", "read_extra", "recipe_prompts",
           "save_source", "variants_per_shot", "fetch_variants"]

log = logging.getLogger(__name__)

Say = Callable[[str], None]


@dataclass(frozen=True)
class Source:
    """Synthetic images of one arm: ``images`` uint8 ``[N, h, w, 3]``, ``labels`` int64
    ``[N]`` (indices into the data's names), ``shots`` int64 ``[N]``: for variants, the data
    index of the shot each was made from (-1 otherwise)."""

    images: np.ndarray
    labels: np.ndarray
    shots: np.ndarray

    @classmethod
    def of(cls, images: np.ndarray, labels: np.ndarray,
           shots: np.ndarray | None = None) -> Source:
        labels = np.asarray(labels, np.int64)
        return cls(np.asarray(images, np.uint8), labels,
                   np.full(len(labels), -1, np.int64) if shots is None
                   else np.asarray(shots, np.int64))


def save_source(path: Path, source: Source) -> None:
    """Write ``source`` whole (a temporary file renamed: a killed run leaves none half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npz")
    np.savez(partial, images=source.images, labels=source.labels, shots=source.shots)
    partial.replace(path)


def load_source(path: Path) -> Source | None:
    """The source kept at ``path``, or None."""
    if not path.is_file():
        return None
    with np.load(path) as kept:
        return Source(kept["images"], kept["labels"], kept["shots"])


def recipe_prompts(detail: Mapping[str, Any], names: Sequence[str], recipe: str) -> dict[str, str]:
    """Each data label's first prompt in the recipe's spec (``GET /v1/recipes/{name}``); a
    :class:`GainInputError` names the labels the recipe lacks."""
    labels = detail.get("spec", {}).get("labels", {})
    lacking = [n for n in names if n not in labels]
    if lacking:
        raise GainInputError(
            f"recipe {recipe!r} has no label(s) {', '.join(lacking)} (it has "
            f"{', '.join(labels)}); name DATA's folders as the recipe's labels, or give "
            "another --recipe")
    return {n: str(labels[n]["prompts"][0]) for n in names}


def fetch_pool(client: Client, recipe: str, names: Sequence[str], *, per_label: int,
               say: Say) -> Source:
    """The recipe's pool, filled to ``per_label`` per label and sampled (module doc)."""
    detail = client.recipe(recipe)
    recipe_prompts(detail, names, recipe)
    fill = detail.get("fill", {})
    if any(fill.get(n, 0) < per_label for n in names):
        say(f"filling recipe {recipe!r}'s pool to {per_label} images per label (a fill job)")
        job = client.fill(recipe, per_label=per_label)
        ended = job.wait(progress=False)
        if ended.get("state") not in ("done", "stopped"):
            raise GainInputError(f"the fill of recipe {recipe!r} ended {ended.get('state')}: "
                                 f"{ended.get('reason')}")
        if ended.get("state") == "stopped":
            say(f"the judge stopped some labels of {recipe!r}: {ended.get('reason')}; their "
                "images are what the pool holds")
    images: list[np.ndarray] = []
    labels: list[int] = []
    for index, name in enumerate(names):
        got = client.sample(recipe, labels=[name], n=per_label, wait_s=0.0)
        _, first = np.unique(got.seeds, return_index=True)
        keep = np.sort(first)[:per_label]
        if len(keep) == 0:
            raise GainInputError(f"recipe {recipe!r}'s pool holds no image of label {name!r}"
                                 " (stopped by its judge?); see GET /v1/recipes/"
                                 f"{recipe}, or leave the pool arm out (--arms)")
        images.append(got.images[keep])
        labels += [index] * len(keep)
    return Source.of(np.concatenate(images), np.asarray(labels))


def variants_per_shot(position: int, shots: Sequence[int], per_label: int) -> int:
    """Variants made of the shot at ``position`` (0-based) in a seed's order of a label: for
    the smallest ``k`` of ``shots`` that holds it, ``ceil(per_label / k)``."""
    first = min(k for k in shots if k > position)
    return math.ceil(per_label / first)


def fetch_variants(client: Client, data: Images, originals: Sequence[Path],
                   shot_order: Mapping[int, np.ndarray], prompts: Mapping[str, str], *,
                   shots: Sequence[int], per_label: int, strength: float, size: int,
                   seed: int, have: Source | None, progress: Callable[[int], None]) -> Source:
    """Variants of one seed's shots (module doc). ``shot_order``: per label index, the data
    indices of its shots in the seed's order (at least ``max(shots)``); ``originals``: every
    data image's file, read again at the recipe's ``size``; ``have``: what an earlier,
    interrupted call kept (its shots are not asked again)."""
    images = [have.images] if have is not None else []
    labels = [have.labels] if have is not None else []
    made = [have.shots] if have is not None else []
    done = set(have.shots.tolist()) if have is not None else set()
    for label, order in shot_order.items():
        name = data.names[label]
        for position, shot in enumerate(order[:max(shots)]):
            if int(shot) in done:
                continue
            count = variants_per_shot(position, shots, per_label)
            read, bad = read_images([originals[int(shot)]])
            if bad:
                raise GainInputError(f"{originals[int(shot)]} can no longer be read")
            source = fit_image(read[0], size)
            out = client.variants(source, prompts[name], strength=strength, n_per_image=count,
                                  seed=(seed * 1_000_003 + int(shot)) % (1 << 62))
            images.append(out.images)
            labels.append(np.full(len(out.images), label, np.int64))
            made.append(np.full(len(out.images), int(shot), np.int64))
            progress(len(out.images))
    return Source.of(np.concatenate(images), np.concatenate(labels), np.concatenate(made))


def read_extra(name: str, folder: str, names: Sequence[str], *, per_label: int) -> Source:
    """The user's own extra images ``folder/<label>/*``, up to ``per_label`` per label (a
    fixed draw), as RGB at their files' size fitted to the first image's."""
    extra = read_folder(folder, size=None, channels=3, names=names, what=f"--extra {name}")
    if extra.skipped:
        log.warning("--extra %s: %d file(s) could not be read and were skipped (%s...)",
                    name, len(extra.skipped), extra.skipped[0])
    keep: list[int] = []
    for index in range(len(names)):
        mine = np.flatnonzero(extra.labels == index)
        order = np.random.default_rng([index, 11]).permutation(len(mine))
        keep += mine[np.sort(order[:per_label])].tolist()
    return Source.of(extra.pixels[keep], extra.labels[keep])
