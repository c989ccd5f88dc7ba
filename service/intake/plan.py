"""Request -> work: the one place that turns what a client or the pool planner asks for into
a batch's :class:`~genaug.service.batching.items.GroupKey` and its per-image
:class:`~genaug.service.batching.items.Item` list.

``defaults`` is ``(size, steps, guidance)``: what the running configuration fills in for a
field the request leaves out. With ``speed: turbo`` the service's turbo
:class:`~genaug.service.sampling.modes.Sampling` fills in steps, scheduler and guidance instead; a
recipe's batch is drawn with the :class:`~genaug.service.sampling.modes.Sampling` its pool chose
(the recipe's own, turbo, or ``auto``'s decision).

Example::

    key, items = plan_items(GenerateRequest(prompt="a red circle", n=2), (64, 4, 5.0))
    key.height, [item.seed for item in items]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..batching.items import GroupKey, Item
from ..errors import InvalidRequestError
from ..recipes.sources import SourceImage, source_hash
from ..recipes.spec import Recipe
from ..sampling.modes import Sampling, Turbo, recipe_sampling, turbo_refusal
from .schemas import GenerateRequest, GenerationFields
from .uploads import Upload


def plan_items(
    req: GenerateRequest, defaults: tuple[int, int, float], turbo: Turbo | None = None
) -> tuple[GroupKey, list[Item]]:
    """Resolve defaults and seeds: the exact work a request stands for."""
    size, steps, guidance, scheduler, speed = speed_defaults(req, defaults, turbo)
    height = req.height or size
    width = req.width or size
    key = GroupKey(
        height=height,
        width=width,
        steps=req.steps or steps,
        scheduler=req.scheduler or scheduler,
        **adapter_of(req.adapter, req.adapter_scale),
        speed=speed,
    )
    if req.seed is not None:
        seeds = [req.seed + i for i in range(req.n)]
    else:
        seeds = [int(s) for s in np.random.default_rng().integers(0, 2**63 - 1, size=req.n)]
    output_height, output_width = output_size(req.output_height, req.output_width, height, width)
    item_guidance = req.guidance if req.guidance is not None else guidance
    items = [
        Item(
            req.prompt,
            seed=seed,
            guidance=item_guidance,
            output_height=output_height,
            output_width=output_width,
            negative_prompt=req.negative_prompt,
        )
        for seed in seeds
    ]
    return key, items


def speed_defaults(
    req: GenerationFields, defaults: tuple[int, int, float], turbo: Turbo | None
) -> tuple[int, int, float, str, str]:
    """``(size, steps, guidance, scheduler, speed)`` a request's omitted fields take: the
    service defaults, or with ``speed: turbo`` the turbo setting's (the schema admits turbo
    only where the service serves it)."""
    size, steps, guidance = defaults
    if req.speed != "turbo":
        return size, steps, guidance, "default", "quality"
    if turbo is None:
        raise InvalidRequestError(turbo_refusal(), field="speed")
    drawn = turbo.sampling
    return size, drawn.steps, drawn.guidance, drawn.scheduler, "turbo"


def adapter_of(adapter: str | None, scale: float | None) -> dict[str, Any]:
    """The key's adapter and scale: without an adapter the scale means nothing, so it is
    normalised (equal work must have equal keys to share a batch)."""
    if adapter is None:
        return {"adapter": None, "adapter_scale": 1.0}
    return {"adapter": adapter, "adapter_scale": 1.0 if scale is None else scale}


def output_size(
    out_h: int | None, out_w: int | None, height: int, width: int
) -> tuple[int, int]:
    """The output size: as given; one side alone keeps the generated aspect ratio."""
    if out_h is not None and out_w is not None:
        return out_h, out_w
    if out_h is not None:
        return out_h, max(1, round(out_h * width / height))
    if out_w is not None:
        return max(1, round(out_w * height / width)), out_w
    return height, width


def plan_variants(
    upload: Upload, defaults: tuple[int, int, float], turbo: Turbo | None = None
) -> tuple[GroupKey, list[Item], np.ndarray]:
    """The img2img work of an upload: ``n_per_image`` items per source, source-major."""
    params = upload.params
    _, steps, guidance, scheduler, speed = speed_defaults(params, defaults, turbo)
    height, width = upload.size
    key = GroupKey(
        height=height,
        width=width,
        steps=params.steps or steps,
        scheduler=params.scheduler or scheduler,
        **adapter_of(params.adapter, params.adapter_scale),
        mode="img2img",
        strength=params.strength,
        speed=speed,
    )
    count = len(upload.sources) * params.n_per_image
    if params.seed is not None:
        seeds = [params.seed + i for i in range(count)]
    else:
        seeds = [int(s) for s in np.random.default_rng().integers(0, 2**63 - 1, size=count)]
    out_h, out_w = output_size(params.output_height, params.output_width, height, width)
    item_guidance = params.guidance if params.guidance is not None else guidance
    items: list[Item] = []
    for j, source in enumerate(upload.sources):
        digest = source_hash(source)
        for k in range(params.n_per_image):
            items.append(Item(
                params.prompt, seed=seeds[j * params.n_per_image + k], guidance=item_guidance,
                output_height=out_h, output_width=out_w, negative_prompt=params.negative_prompt,
                source=source, source_hash=digest,
            ))
    sources = np.repeat(np.arange(len(upload.sources), dtype=np.int32), params.n_per_image)
    return key, items, sources


def plan_pool_batch(
    recipe: Recipe, label: str, indices: Sequence[int], sources: Sequence[SourceImage],
    sampling: Sampling | None = None,
) -> tuple[GroupKey, list[Item]]:
    """The work of one pool batch: ``recipe``'s ``label`` at plan ``indices`` (the pool
    planner's reservation), drawn with ``sampling`` (default: the recipe's own,
    :func:`recipe_sampling`).

    Each image's prompt and seed come from :meth:`~genaug.service.recipes.spec.Recipe.plan`.
    With ``sources`` (the label's image folder, read once by the planner) the batch is
    img2img: plan index k takes source ``k mod len(sources)`` and keeps its hash; without,
    text-to-image.
    """
    spec = recipe.labels[label]
    adapter = recipe.adapter_for(label)
    drawn = sampling if sampling is not None else recipe_sampling(recipe)
    out_h, out_w = recipe.output_size
    key = GroupKey(
        height=recipe.height,
        width=recipe.width,
        steps=drawn.steps,
        scheduler=drawn.scheduler,
        adapter=adapter.name if adapter is not None else None,
        adapter_scale=adapter.scale if adapter is not None else 1.0,
        mode="img2img" if sources else "text",
        strength=spec.strength if sources else 1.0,
        speed=drawn.speed,
    )
    items = []
    for index in indices:
        plan = recipe.plan(label, index)
        source = sources[index % len(sources)] if sources else None
        items.append(Item(
            plan.prompt,
            seed=plan.seed,
            guidance=drawn.guidance,
            output_height=out_h,
            output_width=out_w,
            negative_prompt=plan.negative_prompt,
            channels=recipe.output_channels,
            source=source.pixels if source is not None else None,
            source_hash=source.hash if source is not None else None,
        ))
    return key, items
