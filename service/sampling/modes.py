"""Speed modes: how an image is drawn, by name (``quality``, ``turbo``; a recipe also ``auto``).

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
  (:mod:`~genaug.service.pool.auto`).

:class:`Sampling` is the one value that names how an image was drawn: the pool keeps its
:attr:`Sampling.name` with every image (provenance) and the key of a batch carries its
``speed``, so two modes never share a UNet call.

A leaf: settings only, no torch. Example::

    turbo = turbo_mode(Settings())           # the embedded model: tcd, 2 steps, no guidance
    turbo.sampling.name                      # 'turbo: tcd 2 steps, guidance 0'
    Sampling("euler", 20, 3.0).cost          # 40: UNet rows per image
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from .batching.items import runs_guidance

__all__ = ["SPEEDS", "TURBO_KINDS", "RecipeSpeed", "Sampling", "Speed", "Turbo", "TurboKind",
           "turbo_mode", "turbo_refusal"]

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


@dataclass(frozen=True)
class Sampling:
    """How an image is drawn: scheduler (a genaug name), steps, guidance and the speed mode
    (``turbo`` runs the turbo UNet when a turbo LoRA is served).

    ``cost`` is the UNet rows one image takes (steps, twice with guidance): what ``auto``
    orders its candidates by. Example::

        Sampling("dpmpp_2m", 2, 3.0).name   # 'dpmpp_2m 2 steps, guidance 3'
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

    def as_dict(self) -> dict[str, Any]:
        return {"speed": self.speed, "scheduler": self.scheduler, "steps": self.steps,
                "guidance": self.guidance, "name": self.name}

    def with_lora(self, lora: str | None) -> Sampling:
        """The same sampler drawn with the turbo LoRA ``lora`` (its kind and hash)."""
        return Sampling(self.scheduler, self.steps, self.guidance, self.speed, lora)


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


def turbo_mode(settings: Any) -> Turbo | None:
    """The turbo mode ``settings`` serve, or None (a model folder without a turbo LoRA)."""
    lora: Path | None = settings.turbo_lora
    if lora is not None:
        kind = TURBO_KINDS[settings.turbo_kind]
        steps = settings.turbo_steps or kind.steps
        return Turbo(Sampling(kind.scheduler, steps, kind.guidance, "turbo"), kind.name, lora)
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
