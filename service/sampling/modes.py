"""Speed modes and samplers: how an image is drawn (``quality``, ``turbo``; a recipe also ``auto``).

A request's ``speed`` and a recipe's say how many denoising steps, which scheduler and which
guidance an image is drawn with:

- ``quality`` (the default) is today's behaviour: the request's or recipe's own steps,
  scheduler and guidance; the same seed draws the same image it always did.
- ``turbo`` is the model's few-step setting (:func:`turbo_mode`). With ``GENAUG_TURBO_LORA``
  a published few-step distillation of SDXL (LCM-LoRA, SDXL-Lightning, Hyper-SD or TCD; the
  kind in ``GENAUG_TURBO_KIND``, since the file's keys do not say it) is fused into a second
  copy of the UNet (:mod:`~genaug.service.pipeline.turbo_lora`) and drawn with the scheduler
  and guidance its kind needs (:data:`TURBO_KINDS`), ``GENAUG_TURBO_STEPS`` steps (default 4).
  Without one, a built-in model draws with the few-step setting measured best for it
  (docs/turbo.md: on the embedded digits model TCD at 2 steps without guidance reads 0.970
  as asked against 0.998, keeps 0.92 of the diversity, at a tenth of the time); a model folder
  without a turbo LoRA serves no turbo (SDXL draws no usable image in a few plain steps).
- ``auto`` (recipes with a judge only) is the cheapest of a named candidate set whose images
  the judge accepts as often as the recipe's own sampler's, decided per pool
  (:mod:`~genaug.service.sampling.auto`).

:class:`Sampling` is the one value that names how an image was drawn: the pool keeps its
:attr:`Sampling.id` with every image (provenance), in ``auto``'s tallies and decisions, and
the key of a batch carries its ``speed``, so two modes never share a UNet call. The id is
stable and read back by :meth:`Sampling.from_id`; :attr:`Sampling.name` is what people read.

The turbo mode is resolved once per service (:func:`turbo_mode`, at the app's start, with
the turbo LoRA's content hash): the same :class:`Turbo` draws ``/v1/generate``'s turbo
requests, the pools' and ``auto``'s candidates.

A leaf: settings only, no torch. Example::

    turbo = turbo_mode(Settings())           # the embedded model: tcd, 2 steps, no guidance
    turbo.sampling.name                      # 'turbo: tcd 2 steps, guidance 0'
    turbo.sampling.id                        # 'turbo:tcd:2:0'
    Sampling("euler", 20, 3.0).cost          # 40: UNet rows per image
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

from ..batching.items import runs_guidance

__all__ = ["SPEEDS", "TURBO_KINDS", "DrawnRecipe", "RecipeSpeed", "Sampling", "Speed", "Turbo",
           "TurboKind", "id_of_name", "name_of_id", "recipe_sampling", "turbo_mode",
           "turbo_refusal"]

Speed = Literal["quality", "turbo"]
RecipeSpeed = Literal["quality", "turbo", "auto"]
#: A request's speeds (a recipe's are :data:`RecipeSpeed`: also ``auto``).
SPEEDS: tuple[str, ...] = get_args(Speed)


@dataclass(frozen=True)
class TurboKind:
    """What a kind of few-step distillation needs to draw: its scheduler (a genaug scheduler
    name), the guidance it draws with (1 or less: none) and its usual steps."""

    name: str
    scheduler: str
    guidance: float
    steps: int
    published: str


#: The published SDXL distillations genaug serves as a turbo LoRA, by ``GENAUG_TURBO_KIND``.
TURBO_KINDS: dict[str, TurboKind] = {
    "lcm": TurboKind("lcm", "lcm", 1.0, 4, "latent-consistency/lcm-lora-sdxl"),
    "lightning": TurboKind("lightning", "euler_trailing", 0.0, 4,
                           "ByteDance/SDXL-Lightning sdxl_lightning_4step_lora"),
    "hyper-sd": TurboKind("hyper-sd", "euler_trailing", 0.0, 4,
                          "ByteDance/Hyper-SD Hyper-SDXL-4steps-lora"),
    "tcd": TurboKind("tcd", "tcd", 0.0, 4, "h1t/TCD-SDXL-LoRA"),
}

#: The few-step setting measured best for each built-in model without a turbo LoRA
#: (bench/service/turbo_speed.py; docs/turbo.md).
BUILTIN_TURBO: dict[str, tuple[str, int, float]] = {
    "tiny-digits": ("tcd", 2, 0.0),
    "tiny-digits-base": ("tcd", 2, 0.0),
    "tiny-random": ("tcd", 2, 0.0),
}


class DrawnRecipe(Protocol):
    """What choosing a recipe's sampler reads of it (:class:`~genaug.service.recipes.spec.
    Recipe` is one): its speed, its own sampler and its labels."""

    @property
    def speed(self) -> str: ...
    @property
    def scheduler(self) -> str: ...
    @property
    def steps(self) -> int: ...
    @property
    def guidance(self) -> float: ...
    @property
    def label_names(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class Sampling:
    """How an image is drawn: scheduler (a genaug name), steps, guidance and the speed mode
    (``turbo`` runs the turbo UNet when a turbo LoRA is served).

    ``cost`` is the UNet rows one image takes (steps, twice with guidance): what ``auto``
    orders its candidates by. Example::

        Sampling("dpmpp_2m", 2, 3.0).name   # 'dpmpp_2m 2 steps, guidance 3'
        Sampling("dpmpp_2m", 2, 3.0).id     # 'quality:dpmpp_2m:2:3'
    """

    scheduler: str
    steps: int
    guidance: float
    speed: Speed = "quality"
    #: The turbo LoRA's kind and content hash (``"lcm 1c0f..."``), when one draws it.
    lora: str | None = None

    @property
    def guided(self) -> bool:
        """Whether this sampler runs classifier-free guidance
        (:func:`~genaug.service.batching.items.runs_guidance`)."""
        return runs_guidance(self.guidance)

    @property
    def cost(self) -> int:
        return self.steps * (2 if self.guided else 1)

    @property
    def name(self) -> str:
        head = "turbo: " if self.speed == "turbo" else ""
        lora = f" with the {self.lora} LoRA" if self.lora else ""
        return f"{head}{self.scheduler} {self.steps} steps, guidance {self.guidance:g}{lora}"

    @property
    def id(self) -> str:
        """The stable id the pool stores: ``speed:scheduler:steps:guidance``, then the turbo
        LoRA's kind and hash when one draws it (``turbo:lcm:4:1:lcm:1c0f...``)."""
        lora = ":" + ":".join(self.lora.split(" ", 1)) if self.lora else ""
        return f"{self.speed}:{self.scheduler}:{self.steps}:{self.guidance:g}{lora}"

    @classmethod
    def from_id(cls, sampler_id: str) -> Sampling:
        """The sampler an :attr:`id` names. Raises ValueError for a text that is not one."""
        parts = sampler_id.split(":")
        if len(parts) not in (4, 6) or parts[0] not in SPEEDS:
            raise ValueError(f"{sampler_id!r} is not a sampler id (speed:scheduler:steps:"
                             "guidance[:kind:hash])")
        speed: Speed = "turbo" if parts[0] == "turbo" else "quality"
        lora = f"{parts[4]} {parts[5]}" if len(parts) == 6 else None
        return cls(parts[1], int(parts[2]), float(parts[3]), speed, lora)

    def as_dict(self) -> dict[str, Any]:
        return {"speed": self.speed, "scheduler": self.scheduler, "steps": self.steps,
                "guidance": self.guidance, "name": self.name, "id": self.id}


@dataclass(frozen=True)
class Turbo:
    """The turbo mode a service serves: its :class:`Sampling`, and the LoRA's kind and file
    (None: the built-in model's own few-step setting)."""

    sampling: Sampling
    kind: str | None = None
    lora: Path | None = None

    def describe(self) -> dict[str, Any]:
        """``/v1/info``'s ``turbo``: steps, scheduler, guidance, kind and LoRA file."""
        return {**self.sampling.as_dict(), "kind": self.kind,
                "lora_file": str(self.lora) if self.lora is not None else None}


_NAME = re.compile(r"(?P<turbo>turbo: )?(?P<scheduler>\S+) (?P<steps>\d+) steps, guidance "
                   r"(?P<guidance>\S+?)(?: with the (?P<lora>.+) LoRA)?")


def id_of_name(name: str) -> str | None:
    """The :attr:`Sampling.id` of a :attr:`Sampling.name` (what pools of schema 6 stored), or
    None for a text that is not a sampler's name."""
    got = _NAME.fullmatch(name)
    if got is None:
        return None
    return Sampling(got["scheduler"], int(got["steps"]), float(got["guidance"]),
                    "turbo" if got["turbo"] else "quality", got["lora"]).id


def name_of_id(sampler_id: str) -> str:
    """The :attr:`Sampling.name` of a stored sampler id (a text that is not one, as it is)."""
    try:
        return Sampling.from_id(sampler_id).name
    except ValueError:
        return sampler_id


def recipe_sampling(recipe: DrawnRecipe) -> Sampling:
    """The recipe's own sampler: its scheduler, steps and guidance (speed ``quality``)."""
    return Sampling(recipe.scheduler, recipe.steps, recipe.guidance)


def turbo_mode(settings: Any, *, lora_hash: str | None = None) -> Turbo | None:
    """The turbo mode ``settings`` serve, or None (a model folder without a turbo LoRA).
    ``lora_hash``: the turbo LoRA file's content hash, named in its sampler (the app resolves
    the service's turbo once, with it)."""
    lora: Path | None = settings.turbo_lora
    if lora is not None:
        kind = TURBO_KINDS[settings.turbo_kind]
        steps = settings.turbo_steps or kind.steps
        sampling = Sampling(kind.scheduler, steps, kind.guidance, "turbo",
                            f"{kind.name} {lora_hash}" if lora_hash else None)
        return Turbo(sampling, kind.name, lora)
    builtin = settings.builtin_model
    if builtin is None or builtin not in BUILTIN_TURBO:
        return None
    scheduler, steps, guidance = BUILTIN_TURBO[builtin]
    steps = settings.turbo_steps or steps
    return Turbo(Sampling(scheduler, steps, guidance, "turbo"))


def turbo_refusal() -> str:
    """Why a request or recipe cannot have turbo here, and the fix (one line)."""
    kinds = ", ".join(TURBO_KINDS)
    return ("speed 'turbo' needs a few-step distillation for this model: set "
            "GENAUG_TURBO_LORA to a turbo LoRA file and GENAUG_TURBO_KIND to its kind "
            f"({kinds}), or use speed 'quality'")
