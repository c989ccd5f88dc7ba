"""What a call sends: the options the clients take, declared once, and the request bodies
built from them.

:class:`GenerationOptions` (with :class:`GenerateOptions` and :class:`VariantOptions`) are the
keywords ``generate``, ``generate_png`` and ``variants`` accept, and :data:`OPTIONS` what each
sends for one left unset (the service's defaults; tests/client pins both to its request
schema). The builders check what the service would refuse before anything is sent, naming the
value and the fix: an unknown option, images of another dtype or shape, a label given as a
number, a need that is not a finite number >= 0.

Example::

    request_body("generate", "a circle", {"n": 4, "seed": None})
    # {"prompt": "a circle", "n": 4, "priority": "interactive"}: None is left to the service
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

import numpy as np

from genaug.wire import SAFETENSORS_MEDIA_TYPE, encode_image_upload

# ``sample``'s defaults, once for both clients: the service's own (``SampleRequest``), which
# tests/client pins them to, so a call that leaves them out means what the service means.
SAMPLE_N = 64
SAMPLE_WAIT_S = 0.0


class GenerationOptions(TypedDict, total=False):
    """The options ``generate``, ``generate_png`` and ``variants`` share, all optional (unset:
    the service's defaults; ``None`` is the same as unset). The service's request schema
    (``GET /openapi.json``) says each one's bounds.

    - ``negative_prompt``: what to avoid;
    - ``output_height`` / ``output_width``: resize the output (one of them keeps the aspect);
    - ``steps``, ``guidance``: denoising steps, classifier-free guidance scale;
    - ``seed``: seed of the first image (image i uses seed + i): reproducible images;
    - ``priority``: ``"interactive"`` (default) or ``"bulk"``;
    - ``timeout_s``: the deadline; past it the service answers 504;
    - ``scheduler``: one of the service's schedulers (``info()``);
    - ``adapter`` / ``adapter_scale``: one of its LoRA adapters (``info()["adapters"]``)
      and its strength (default 1.0);
    - ``speed``: ``"quality"`` (default) or ``"turbo"`` (the service's few-step setting,
      ``info()["turbo"]``; steps, scheduler or guidance given here still win).
    """

    negative_prompt: str | None
    output_height: int | None
    output_width: int | None
    steps: int | None
    guidance: float | None
    seed: int | None
    priority: str
    timeout_s: float | None
    scheduler: str | None
    adapter: str | None
    adapter_scale: float | None
    speed: str | None


class GenerateOptions(GenerationOptions, total=False):
    """``generate``'s options: the shared ones, ``n`` images (default 1) and the generation
    ``height`` / ``width`` (a multiple of 8; default: the service's)."""

    n: int
    height: int | None
    width: int | None


class VariantOptions(GenerationOptions, total=False):
    """``variants``' options: the shared ones, ``strength`` in (0, 1] (default 0.5: how far
    from the source a variant may go; 1 ignores it) and ``n_per_image`` (default 1)."""

    strength: float
    n_per_image: int


#: Per method: the option names it takes, and what it sends for an option left unset (the
#: service's own defaults).
OPTIONS: Mapping[str, tuple[frozenset[str], Mapping[str, Any]]] = {
    "generate": (frozenset(GenerateOptions.__annotations__),
                 {"n": 1, "priority": "interactive"}),
    "variants": (frozenset(VariantOptions.__annotations__),
                 {"strength": 0.5, "n_per_image": 1, "priority": "interactive"}),
}


def request_body(method: str, prompt: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of a ``method`` (``generate`` or ``variants``) request: the prompt, the
    defaults, then the options given (one set to ``None`` is left out: the service's default
    applies).

    Raises:
        TypeError: an option ``method`` does not take (as for any unknown keyword).
    """
    names, defaults = OPTIONS[method]
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(f"{method}() got an unexpected keyword argument {unknown[0]!r} (its "
                        f"options: {', '.join(sorted(names))})")
    body: dict[str, Any] = {"prompt": prompt, **defaults}
    body.update((k, v) for k, v in options.items() if v is not None)
    return body


def source_images(images: Any) -> np.ndarray:
    """``images`` as uint8 ``[N, H, W, 3]`` (one ``[H, W, 3]`` becomes N = 1).

    Raises:
        ValueError: another dtype or shape, or no image (nothing was sent).
    """
    given = np.asarray(images)
    # the message quotes ``given``, not the batch of one made below: a user who passed
    # (2, 64, 64) must read (2, 64, 64), or the shape they are told to fix is not theirs
    arr = given[None] if given.ndim == 3 else given
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3 or arr.shape[0] == 0:
        raise ValueError(
            f"variants() takes uint8 images [N, H, W, 3] or one [H, W, 3]; got {given.dtype} "
            f"{tuple(given.shape)}. {_source_fix(given)}"
        )
    return arr


def _source_fix(given: np.ndarray) -> str:
    """The conversion that turns ``given`` into what ``variants()`` takes."""
    if given.ndim in (3, 4) and given.shape[0] == 0:
        return "Send at least one image"
    fixes: list[str] = []
    if given.dtype != np.uint8:
        fixes.append("np.clip(x * 255, 0, 255).astype(np.uint8) for floats in [0, 1]")
    channels = given.shape[-1] if given.ndim else 0
    if given.ndim == 2 or (given.ndim == 3 and channels not in (1, 3, 4)):
        # [H, W] or [N, H, W]: gray images without a channel axis
        fixes.append("np.repeat(x[..., None], 3, axis=-1) for gray images without a channel "
                     "axis")
    elif given.ndim in (3, 4) and channels == 1:
        fixes.append("np.repeat(x, 3, axis=-1) for one channel")
    elif given.ndim in (3, 4) and channels == 4:
        fixes.append("x[..., :3] to drop the alpha channel")
    if not fixes:
        fixes.append("np.stack(images) for a list of [H, W, 3] images")
    return "Convert with " + ", then ".join(fixes)


Multipart = list[tuple[str, tuple[str | None, bytes, str]]]


def variants_parts(images: Any, params: dict[str, Any]) -> Multipart:
    """``multipart/form-data`` parts: one ``images`` part (a genaug safetensors batch, so
    no image library is needed here) and the ``params`` JSON part."""
    payload = encode_image_upload(source_images(images))
    return [
        ("images", ("images.safetensors", payload, SAFETENSORS_MEDIA_TYPE)),
        ("params", (None, json.dumps(params).encode("utf-8"), "application/json")),
    ]


def need_body(need: Mapping[str, float]) -> dict[str, float]:
    """``need`` as the feedback body's mapping: label names to plain floats.

    Raises:
        ValueError: a value that is not a finite number >= 0 (the service would answer 422).
    """
    out: dict[str, float] = {}
    for label, value in need.items():
        number = float(value)
        if not math.isfinite(number) or number < 0:
            raise ValueError(
                f"need[{label!r}] = {value!r}: give each label a finite number >= 0 (only "
                "proportions count; 0 or leaving the label out means it needs nothing)"
            )
        out[str(label)] = number
    return out


def sample_body(labels: str | Sequence[str] | None, n: int, wait_s: float) -> dict[str, Any]:
    body: dict[str, Any] = {"n": n, "wait_s": wait_s}
    if labels is not None:
        body["labels"] = sample_labels(labels)
    return body


def sample_labels(labels: str | Iterable[str]) -> list[str]:
    """``labels`` as the list of names the service takes; a number (``labels=3``, or one in
    a list) raises ``TypeError`` naming the value and the fix: a recipe's labels are names
    (strings), even where they are digits."""
    if isinstance(labels, str):
        return [labels]
    if not isinstance(labels, Iterable):
        raise TypeError(
            f"labels={labels!r}: give a label name or a list of names, e.g. "
            f"labels={str(labels)!r} or labels=[{str(labels)!r}]; a recipe's labels are "
            "strings, even digits (client.recipe(name)['labels'] lists them)")
    given = list(labels)
    wrong = [x for x in given if not isinstance(x, str)]
    if wrong:
        raise TypeError(
            f"labels={given!r}: {wrong[0]!r} ({type(wrong[0]).__name__}) is not a label "
            f"name; a recipe's labels are strings, even digits: pass "
            f"labels={[str(x) for x in given]!r} (client.recipe(name)['labels'] lists them)")
    return [str(x) for x in given]
