"""Schedulers by name: one instance per name, built from the model's own scheduler config.

A key's ``scheduler`` is one of :data:`~genaug.service.batching.items.SCHEDULERS`:
``"default"`` resolves to the service's setting (``GENAUG_SCHEDULER``), which as a setting
means the scheduler the model brought; the other names map to a diffusers class and the
overrides that make the name mean one thing whatever the model's config says
(:data:`SCHEDULER_CLASSES`). The worker builds one :class:`Schedulers` and the sampler asks it
for each key's instance.

Example::

    schedulers = Schedulers(pipeline, default="euler_a")
    schedulers.get("dpmpp_2m")  # a DPMSolverMultistepScheduler, the same one every time
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from ..batching.items import SCHEDULERS

__all__ = ["SCHEDULER_CLASSES", "STEP_KWARGS", "Schedulers", "UnknownSchedulerError"]

log = logging.getLogger(__name__)

# Sigma spacing families: a named scheduler sets all three, so a model config that uses one of
# them (e.g. exponential sigmas) cannot leak into a name that means another.
_PLAIN_SIGMAS = {"use_karras_sigmas": False, "use_exponential_sigmas": False,
                 "use_beta_sigmas": False}
_KARRAS_SIGMAS = {**_PLAIN_SIGMAS, "use_karras_sigmas": True}
_DPMPP_2M = {"algorithm_type": "dpmsolver++", "solver_order": 2}

#: Scheduler name -> (diffusers class, overrides on top of the model's scheduler config).
SCHEDULER_CLASSES: dict[str, tuple[str, dict[str, Any]]] = {
    "euler": ("EulerDiscreteScheduler", _PLAIN_SIGMAS),
    "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    "dpmpp_2m": ("DPMSolverMultistepScheduler", {**_DPMPP_2M, **_PLAIN_SIGMAS}),
    "dpmpp_2m_karras": ("DPMSolverMultistepScheduler", {**_DPMPP_2M, **_KARRAS_SIGMAS}),
    "unipc": ("UniPCMultistepScheduler", _PLAIN_SIGMAS),
    "lcm": ("LCMScheduler", {}),
    # The few-step distillations' own: TCD (its gamma is the step's eta, STEP_KWARGS) and
    # Euler over trailing timesteps (SDXL-Lightning, Hyper-SD).
    "tcd": ("TCDScheduler", {}),
    "euler_trailing": ("EulerDiscreteScheduler",
                       {**_PLAIN_SIGMAS, "timestep_spacing": "trailing"}),
}

#: Arguments of a scheduler class's ``step`` fixed here: TCD's gamma (``eta``) at 0.3, the value
#: TCD's authors publish for few steps (diffusers' pipelines pass 0 unless told, which makes
#: TCD deterministic). Every other scheduler that takes ``eta`` (DDIM's) runs 0.
STEP_KWARGS: dict[str, dict[str, Any]] = {"TCDScheduler": {"eta": 0.3}}
assert set(SCHEDULER_CLASSES) | {"default"} == set(SCHEDULERS)


class UnknownSchedulerError(ValueError):
    """A scheduler name that is not one of :data:`~genaug.service.batching.items.SCHEDULERS`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.known = SCHEDULERS
        super().__init__(
            f"unknown scheduler {name!r}; use one of: {', '.join(SCHEDULERS)} "
            "(GENAUG_SCHEDULER, a recipe's or a request's scheduler)"
        )


class Schedulers:
    """One scheduler instance per name, built from the model's scheduler config, cached.

    ``default`` is the setting (``GENAUG_SCHEDULER``) that a key's ``"default"`` resolves to;
    as a setting, ``"default"`` is the scheduler the model brought. Instances are stateful
    (diffusers keeps step indices and multistep history in them): :meth:`get` belongs to the
    worker thread; :meth:`resolve` and :meth:`describe` are safe from any thread.

    Example::

        schedulers = Schedulers(pipeline, default="euler_a")
        schedulers.resolve("default")  # "euler_a"
        schedulers.get("dpmpp_2m")  # a DPMSolverMultistepScheduler, the same one every time
        schedulers.describe()  # "euler_a (EulerAncestralDiscreteScheduler)"
    """

    def __init__(self, pipeline: Any, *, default: str = "default") -> None:
        if default not in SCHEDULERS:
            raise UnknownSchedulerError(default)
        self.default = default
        self._model_scheduler: Any = pipeline.scheduler
        # Never the pipeline's own instance: its state (step index, multistep history) would
        # be shared by every worker built on this model (two services in one process).
        model_scheduler = pipeline.scheduler
        self._cache: dict[str, Any] = {
            "default": type(model_scheduler).from_config(model_scheduler.config)
        }

    def resolve(self, name: str) -> str:
        """The scheduler a key's ``name`` runs: ``"default"`` is the service's setting."""
        if name not in SCHEDULERS:
            raise UnknownSchedulerError(name)
        return self.default if name == "default" else name

    def get(self, name: str) -> Any:
        """The scheduler instance for a key's ``name`` (built on first use)."""
        resolved = self.resolve(name)
        if resolved not in self._cache:
            self._cache[resolved] = self._build(resolved)
        return self._cache[resolved]

    def describe(self, name: str = "default") -> str:
        """``"<name> (<diffusers class>)"`` of what ``name`` runs, e.g. for ``/v1/info``.
        Builds nothing, so any thread may ask."""
        resolved = self.resolve(name)
        if resolved == "default":
            class_name = type(self._model_scheduler).__name__
        else:
            class_name = SCHEDULER_CLASSES[resolved][0]
        return f"{resolved} ({class_name})"

    def _build(self, name: str) -> Any:
        import diffusers

        class_name, overrides = SCHEDULER_CLASSES[name]
        cls = getattr(diffusers, class_name)
        accepted = inspect.signature(cls.__init__).parameters
        kwargs = {k: v for k, v in overrides.items() if k in accepted}
        config = {k: v for k, v in self._model_scheduler.config.items() if k in accepted}
        scheduler = cls.from_config({**config, **kwargs})
        log.info("scheduler %s: %s from the model's %s config", name, class_name,
                 type(self._model_scheduler).__name__)
        return scheduler
