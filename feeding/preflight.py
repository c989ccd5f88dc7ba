"""A strict feeder's first-contact checks: what it refuses before the first training step.

A training run that quietly goes on without synthetic images because of a typo is worse than
one that stops. At its first contact with the service a strict
:class:`~genaug.feeding.feeder.Feeder` reads ``/v1/info`` and
``/v1/recipes/{name}`` (:func:`first_contact_answers`) and checks them
(:func:`first_contact_problems`): a rejected API key, an unknown recipe, a ``label_map`` name
the recipe lacks, images of another size or channel count than the reservoir's, or a pool that
is empty with nothing to fill it each raise :class:`FeederConfigError`, one sentence per
problem with its fix. A feeder with a ``match`` (:class:`~genaug.match.DomainMatch`) brings
every image to the real shots' size and channels before it writes them, so there the shape
compared with the reservoir's is the match's (:func:`match_shape_refusal`), whatever the
recipe makes. Outages (connection refused, 503, 429, timeouts) are not mistakes
(:func:`is_outage`): the check runs again at the first contact that gets an answer.

Importing this module imports neither TensorFlow nor torch, nor ``genaug.client``: errors are
recognised by their class names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

__all__ = [
    "FeederConfigError",
    "first_contact_answers",
    "first_contact_problems",
    "is_outage",
    "match_shape_refusal",
]

log = logging.getLogger(__name__)


class FeederConfigError(RuntimeError):
    """A strict feeder's first contact found a configuration mistake; the message lists each
    one with its fix. Raised by :meth:`~genaug.feeding.feeder.Feeder.start` (and so
    by ``fit`` through the callback) before any training step."""


# Errors that mean "the service is not answering now", never "the configuration is wrong".
_OUTAGE_NAMES = {
    "TransportError", "UnavailableError", "RateLimitedError", "DeadlineExceededError",
    "ServerError", "DecodeError",
}


def is_outage(exc: BaseException) -> bool:
    """The service is not answering now (a transport error, 503, 429, a timeout...): never
    "the configuration is wrong"."""
    if isinstance(exc, OSError | asyncio.TimeoutError | TimeoutError):
        return True
    return any(t.__name__ in _OUTAGE_NAMES for t in type(exc).__mro__)


def _is_config_status(exc: BaseException) -> bool:
    """401/403 (AuthenticationError) or 404 (NotFoundError) from the client."""
    return any(t.__name__ in {"AuthenticationError", "NotFoundError"} for t in type(exc).__mro__)


def _output_size(spec: Mapping[str, Any], info: Mapping[str, Any]) -> tuple[int, int] | None:
    limits = info.get("limits") if isinstance(info.get("limits"), Mapping) else {}
    default = limits.get("default_size") if isinstance(limits, Mapping) else None
    h = spec.get("output_height") or spec.get("height") or default
    w = spec.get("output_width") or spec.get("width") or default
    return (int(h), int(w)) if isinstance(h, int) and isinstance(w, int) else None


def match_shape_refusal(image_shape: tuple[int, int, int],
                        matched_shape: tuple[int, int, int]) -> str | None:
    """The one line that refuses a reservoir whose ``image_shape`` is not the
    ``matched_shape`` (the ``(H, W, C)`` a feeder's ``match`` brings every image to), or
    ``None`` when they agree."""
    if tuple(image_shape) == tuple(matched_shape):
        return None
    mh, mw, mc = matched_shape
    return (f"the reservoir's image_shape {tuple(image_shape)} is not the match's "
            f"{tuple(matched_shape)} (the real shots' height, width and channels, which every "
            f"matched image has); build the reservoir with image_shape=({mh}, {mw}, {mc})")


def first_contact_problems(
    *,
    info: Mapping[str, Any],
    recipe_detail: Mapping[str, Any] | None,
    recipe: str | None,
    label_map: Mapping[str, int],
    image_shape: tuple[int, int, int],
    wait_s: float = 0.0,
    matched_shape: tuple[int, int, int] | None = None,
) -> list[str]:
    """What a strict feeder refuses, from ``/v1/info`` and ``/v1/recipes/{name}`` answers.

    Each problem is one sentence naming the value found, the value expected and the fix.
    Pure: no I/O (unit-testable on recorded answers). ``matched_shape``: the ``(H, W, C)``
    the feeder's ``match`` brings every image to; with it, that shape (not the recipe's size
    and channels, nor ``generate``'s RGB) is what must equal ``image_shape``.

    Example::

        first_contact_problems(info=client.info(), recipe_detail=client.recipe("digits"),
                               recipe="digits", label_map={"3": 0},
                               image_shape=(64, 64, 1))
        # ['recipe digits makes 3-channel images; the reservoir holds 1 ...']
    """
    h, w, c = image_shape
    problems: list[str] = []
    if matched_shape is not None:
        refused = match_shape_refusal(image_shape, matched_shape)
        if refused is not None:
            problems.append(refused)
    if recipe is None or recipe_detail is None:
        if matched_shape is not None:  # generate at the service's size, matched afterwards
            return problems
        limits = info.get("limits") if isinstance(info.get("limits"), Mapping) else {}
        max_side = limits.get("max_side") if isinstance(limits, Mapping) else None
        if isinstance(max_side, int) and max(h, w) > max_side:
            problems.append(
                f"the reservoir holds {h}x{w} images but the service makes at most "
                f"{max_side} px (max_side); build a smaller reservoir or set GENAUG_MAX_SIDE"
            )
        if c != 3:
            problems.append(
                f"the reservoir holds {c}-channel images but generate makes RGB; sample a "
                "recipe with output_channels: 1 instead of prompts="
            )
        return problems
    labels = [str(x) for x in recipe_detail.get("labels") or []]
    unknown = sorted(set(label_map) - set(labels))
    if unknown:
        problems.append(
            f"label_map names {unknown}, which recipe {recipe!r} lacks (its labels: {labels}); "
            "fix the label_map keys (recipe label -> class index)"
        )
    spec = recipe_detail.get("spec") if isinstance(recipe_detail.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    size = _output_size(spec, info)
    if matched_shape is None and size is not None and size != (h, w):
        problems.append(
            f"recipe {recipe!r} makes {size[0]}x{size[1]} images but the reservoir holds "
            f"{h}x{w}; build the reservoir with image_shape=({size[0]}, {size[1]}, {c}) and "
            f"resize the real images to match, set the recipe's output_height/output_width "
            f"to {h}/{w}, or pass match= your real images (uint8 [N, {h}, {w}, {c}]) to bring "
            "the pool's images to them"
        )
    channels = int(spec.get("output_channels") or 3)
    if matched_shape is None and channels != c:
        problems.append(
            f"recipe {recipe!r} makes {channels}-channel images but the reservoir holds {c}; "
            f"build the reservoir with image_shape=({h}, {w}, {channels}), set the recipe's "
            f"output_channels: {c}, or pass match= your real images (uint8 [N, {h}, {w}, {c}])"
        )
    fill = recipe_detail.get("fill") if isinstance(recipe_detail.get("fill"), Mapping) else {}
    targets = recipe_detail.get("target_per_label")
    if isinstance(fill, Mapping) and isinstance(targets, Mapping) and wait_s <= 0:
        starved = sorted(
            name for name in label_map
            if name in labels and not fill.get(name) and not targets.get(name)
        )
        if starved:
            problems.append(
                f"recipe {recipe!r} holds no image for labels {starved} and nothing will "
                "make any: pre-generation is off (GENAUG_PREGENERATE=false) and no fill "
                f"target is set. Fill it first (genaug pregenerate --recipe {recipe} "
                f"--per-label N, or client.fill({recipe!r}, per_label=N)), turn "
                "pre-generation on, or give the feeder wait_s > 0 so samples ask for images"
            )
    return problems


async def first_contact_answers(
    client: Any, *, recipe: str | None, where: str
) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    """The answers a strict feeder checks: ``client.info()`` and, with ``recipe``,
    ``client.recipe(recipe)``.

    Raises :class:`FeederConfigError` for a refused API key (401/403) or an unknown recipe
    (404), naming ``where`` (the service's URLs) and the fix; an outage raises the client's
    own error (the feeder backs off and asks again).
    """
    try:
        info = await client.info()
        detail = await client.recipe(recipe) if recipe is not None else None
    except Exception as exc:
        if _is_config_status(exc) and not is_outage(exc):
            status = getattr(exc, "status", None)
            if status in (401, 403):
                raise FeederConfigError(
                    f"the genaug service at {where} refused the API key ({exc}); pass "
                    "api_key= (or set GENAUG_API_KEY) to one of its keys"
                ) from exc
            raise FeederConfigError(
                f"recipe {recipe!r} is unknown to the genaug service at {where} "
                f"({exc}); check recipe= or start the service with --recipes FILE"
            ) from exc
        raise
    return info, detail
