"""What made a pool: its recipe's name and generation spec, stored beside its images.

A pool id is a hash of a recipe's spec, its model and its label images
(:func:`~genaug.service.recipes.spec.pool_id`): it names what made the pool but cannot be read
back. Since schema 5 the planner records the spec itself when it opens a recipe's pool
(``recipes``: one row per pool id, never changed: the same id is the same spec), so that
``genaug export`` writes each image's prompt and the recipe's hash from the pool alone, with no
recipe file at hand, and never from a file edited since. A pool written before schema 5 has no
row until a genaug of schema 5 plans for it again.

Example::

    store.recipe_specs.record(pid, recipe)   # once per start; a second call changes nothing
    store.recipe_specs.read(pid).plan("3", 17)   # the prompt, negative prompt and seed of 17
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..recipes.spec import SPEC_VERSION, Recipe

if TYPE_CHECKING:
    from .unit_of_work import Units

__all__ = ["RecipeSpecs"]

log = logging.getLogger("genaug.service.pool.store")  # the store's messages, one logger

class RecipeSpecs:
    """``record`` and ``read`` over the store's units of work (``store.recipe_specs``; the
    module doc explains them)."""

    def __init__(self, store: Units) -> None:
        self.store = store

    def record(self, pool_id: str, recipe: Recipe) -> None:
        """Store ``recipe``'s name and spec as what made ``pool_id``, unless stored already."""
        spec = json.dumps(recipe.spec(), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False)
        with self.store.unit_of_work(write=True) as uow:
            uow.execute(
                "INSERT INTO recipes (pool_id, recipe, spec, spec_hash, recorded)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (pool_id) DO NOTHING",
                (pool_id, recipe.name, spec, recipe.spec_hash(), time.time()),
            )

    def read(self, pool_id: str) -> Recipe | None:
        """The recipe that made ``pool_id`` as stored (its name and spec; no description), or
        None: not recorded (a pool older than schema 5), or written by a genaug whose spec
        version differs (its seeds would not be this genaug's)."""
        with self.store.unit_of_work(write=False) as uow:
            row = uow.execute("SELECT recipe, spec, spec_hash FROM recipes WHERE pool_id = ?",
                              (pool_id,)).fetchone()
        if row is None:
            return None
        name, spec_text, spec_hash = (str(v) for v in row)
        spec: dict[str, Any] = json.loads(spec_text)
        if spec.pop("spec_version", None) != SPEC_VERSION:
            return None
        try:
            recipe = Recipe.model_validate_json(json.dumps({"name": name, **spec}))
        except ValidationError as exc:  # a spec this genaug cannot read back: say so once
            log.warning("pool %s: its stored recipe does not read back (%s)", pool_id,
                        " ".join(str(exc).split())[:200])
            return None
        return recipe if recipe.spec_hash() == spec_hash else None
