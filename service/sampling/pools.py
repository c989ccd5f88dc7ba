"""Which sampler draws each label of each recipe's pool: the recipe's own, turbo, or ``auto``'s.

:class:`PoolSamplers` is the planner's one place to ask
(:mod:`~genaug.service.pool.planner` asks it per batch): a ``speed: quality`` recipe draws
with its own scheduler, steps and guidance, ``speed: turbo`` with the service's turbo
:class:`~genaug.service.sampling.modes.Sampling`, ``speed: auto`` with its pool's
:class:`~genaug.service.sampling.auto.AutoSampler`. An auto pool's probes are the images it
is asked for; on a pre-generating service the probes a full label still lacks are the
planner's background work too (:meth:`PoolSamplers.probe_needs`), and the low-acceptance
stop reads an auto label's evidence here (:meth:`PoolSamplers.stop_evidence`: the samplers
that draw it, never a candidate's).

Example::

    samplers = PoolSamplers(recipes, store.samplers, pool_ids, turbo=None, pregenerate=True,
                            judge_keys={"digits": "3f9c..."}, adapter_hash=hash_of,
                            stopped=planner.stopped)
    samplers.sampling("digits", "7")     # the Sampling label 7's next batch is drawn with
    samplers.describe("digits")          # the recipe detail's ``sampling``
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from ..errors import InvalidRequestError
from .auto import AutoSampler
from .modes import DrawnRecipe, Sampling, Turbo, recipe_sampling, turbo_refusal
from .records import SamplerRecords

__all__ = ["PoolSamplers"]

R = TypeVar("R", bound=DrawnRecipe)


class PoolSamplers:
    """The sampler of every recipe's pool (module doc); ``auto`` for the judged ``auto``
    recipes (``judge_keys``: their judges' keys; ``adapter_hash``: a label's adapter's
    content hash, which its tallies are counted under)."""

    def __init__(self, recipes: Mapping[str, R], records: SamplerRecords,
                 pool_ids: Mapping[str, str], *, turbo: Turbo | None,
                 judge_keys: Mapping[str, str], adapter_hash: Callable[[R, str], str | None],
                 pregenerate: bool = True,
                 stopped: Callable[[str], Collection[str]] | None = None) -> None:
        self.recipes: Mapping[str, DrawnRecipe] = recipes
        self.turbo = turbo
        self.pregenerate = pregenerate

        def stopped_of(name: str) -> Callable[[], Collection[str]]:
            return (lambda: stopped(name)) if stopped is not None else frozenset

        self.auto = {
            name: AutoSampler(records, pool_ids[name], r, judge_key=judge_keys[name],
                              turbo=turbo, stopped=stopped_of(name),
                              adapters={label: adapter_hash(r, label)
                                        for label in r.label_names})
            for name, r in recipes.items() if r.speed == "auto" and name in judge_keys}

    def sampling(self, name: str, label: str) -> Sampling:
        """How ``label`` of recipe ``name`` is drawn now: the recipe's own sampler, the turbo
        setting (``speed: turbo``) or its pool's ``auto`` choice."""
        recipe = self.recipes[name]
        if name in self.auto:
            return self.auto[name].sampling_for(label)
        if recipe.speed == "turbo":
            if self.turbo is None:
                raise InvalidRequestError(turbo_refusal())
            return self.turbo.sampling
        return recipe_sampling(recipe)

    def describe(self, name: str) -> dict[str, Any]:
        """How recipe ``name``'s pool is drawn, for its detail and the status page: the
        recipe's ``speed``, and ``auto``'s state, chosen sampler, reason and candidates, or
        the one sampler (``state`` ``fixed``)."""
        speed = self.recipes[name].speed
        if name in self.auto:
            return {"speed": speed, **self.auto[name].describe()}
        fixed = (self.turbo.sampling if speed == "turbo" and self.turbo is not None
                 else recipe_sampling(self.recipes[name]))
        return {"speed": speed, "state": "fixed", "sampler": fixed.as_dict(),
                "reason": f"the recipe's speed {speed}", "cheaper": None, "candidates": []}

    def stop_evidence(self, name: str) -> dict[str, tuple[int, int]] | None:
        """An ``auto`` recipe's per-label (judged, kept) for the low-acceptance stop: its
        drawing samplers' images only (:meth:`AutoSampler.stop_evidence`); None for any other
        recipe (the stop reads the pool's counters)."""
        auto = self.auto.get(name)
        return None if auto is None else auto.stop_evidence()

    def stored(self, name: str) -> None:
        """Images of ``name``'s pool were stored (the store thread)."""
        if name in self.auto:
            self.auto[name].stored()

    def probe_needs(self) -> dict[str, dict[str, int]]:
        """On a pre-generating service, each ``auto`` recipe's probe images per label
        (:meth:`AutoSampler.probe_needs`): the planner draws them as background work after
        every other, even for a label at its target, since the idle generator would
        otherwise stop while a full pool is still deciding. They are bounded (a round per
        candidate and label, at most :data:`~genaug.service.sampling.rule.MAX_PROBE_IMAGES`
        each) and end with the decision. Without pre-generation, none: the probes are the
        images fills and samples ask for."""
        if not self.pregenerate:
            return {}
        return {name: needs for name, auto in self.auto.items() if (needs := auto.probe_needs())}
