"""Matching dataset classes to a recipe's labels, and reading a recipe's labels from the service.

Synthetic images must come from the class they replace, so before mixing, the reference
trainer maps each dataset class to one recipe label (:func:`match_labels`: an explicit
``--label-map`` entry, else the exact name, else a unique case-insensitive match) and fails
with :class:`LabelMapError` on a class with no label. :func:`recipe_status` asks the service
for a recipe's label names, pool fill and output size; :func:`recipe_description` reads them
from a ``GET /v1/recipes/{name}`` answer, wherever the service puts them.

Example::

    match_labels(["I", "P", "R"], ["i", "p", "r"])   # {'i': 0, 'p': 1, 'r': 2}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "LabelMapError",
    "RecipeDescription",
    "match_labels",
    "recipe_description",
    "recipe_status",
]


class LabelMapError(ValueError):
    """A dataset class has no matching label in the recipe (or the mapping is ambiguous)."""


def match_labels(
    class_names: Sequence[str],
    recipe_labels: Sequence[str],
    *,
    explicit: Mapping[str, str] | None = None,
    recipe: str = "the recipe",
) -> dict[str, int]:
    """Map recipe label name -> dataset class index (the feeder's ``label_map``).

    Each class is matched by ``explicit[class]``, else the exact name, else a unique
    case-insensitive match. Recipe labels matched by no class are ignored (never sampled).

    Raises:
        LabelMapError: a class with no label (naming the class, the labels and the fix), an
            explicit mapping to an unknown label, or two classes on one label.
    """
    explicit = dict(explicit or {})
    unknown_keys = sorted(set(explicit) - set(class_names))
    if unknown_keys:
        raise LabelMapError(
            f"--label-map names class(es) {unknown_keys} that are not in the dataset "
            f"(classes: {list(class_names)})"
        )
    lower: dict[str, list[str]] = {}
    for label in recipe_labels:
        lower.setdefault(label.lower(), []).append(label)
    out: dict[str, int] = {}
    missing: list[str] = []
    for index, name in enumerate(class_names):
        if name in explicit:
            label = explicit[name]
            if label not in recipe_labels:
                raise LabelMapError(
                    f"--label-map {name}={label}: {recipe} has no label {label!r} "
                    f"(labels: {list(recipe_labels)})"
                )
        elif name in recipe_labels:
            label = name
        elif len(lower.get(name.lower(), [])) == 1:
            label = lower[name.lower()][0]
        else:
            missing.append(name)
            continue
        if label in out:
            raise LabelMapError(
                f"classes {class_names[out[label]]!r} and {name!r} both map to label {label!r} "
                f"of {recipe}; each class needs its own label"
            )
        out[label] = index
    if missing:
        raise LabelMapError(
            f"dataset class(es) {missing} have no label in {recipe} (its labels: "
            f"{list(recipe_labels)}; dataset classes: {list(class_names)}). Synthetic images "
            "must come from the class they replace: rename the class folder, pass "
            "--label-map CLASS=LABEL, or train without mixing (--p 0)"
        )
    return out


RecipeDescription = tuple[list[str], dict[str, int], tuple[int, int] | None]


def recipe_description(info: Mapping[str, Any]) -> RecipeDescription:
    """(label names, pool fill per label, output size) from ``GET /v1/recipes/{name}``.

    Tolerant of where the service puts them (``label_names``, ``labels`` as a list or a dict,
    ``spec.labels``; ``fill`` at the top, in ``pool`` or per label).
    """
    raw_spec = info.get("spec")
    spec: Mapping[str, Any] = raw_spec if isinstance(raw_spec, Mapping) else {}
    labels: list[str] = []
    fill: dict[str, int] = {}
    for source in (info.get("label_names"), info.get("labels"), spec.get("labels")):
        if isinstance(source, Mapping) and source:
            labels = [str(k) for k in source]
            for k, v in source.items():
                if isinstance(v, Mapping) and isinstance(v.get("fill"), int):
                    fill[str(k)] = int(v["fill"])
            break
        if isinstance(source, list) and source:
            labels = [str(x["name"]) if isinstance(x, Mapping) else str(x) for x in source]
            for x in source:
                if isinstance(x, Mapping) and isinstance(x.get("fill"), int):
                    fill[str(x["name"])] = int(x["fill"])
            break
    raw_pool = info.get("pool")
    pool: Mapping[str, Any] = raw_pool if isinstance(raw_pool, Mapping) else {}
    for candidate in (info.get("fill"), pool.get("fill"), info.get("stats"), pool.get("stats")):
        if isinstance(candidate, Mapping):
            for k, v in candidate.items():
                if isinstance(v, int):
                    fill[str(k)] = v
                elif isinstance(v, Mapping) and isinstance(v.get("fill"), int):
                    fill[str(k)] = int(v["fill"])
    size: tuple[int, int] | None = None
    holder: Mapping[str, Any]
    for holder in (info, spec):
        h = holder.get("output_height") or holder.get("height")
        w = holder.get("output_width") or holder.get("width")
        if isinstance(h, int) and isinstance(w, int):
            size = (h, w)
            break
    return labels, fill, size


def recipe_status(url: str, recipe: str, *, timeout: float = 10.0) -> RecipeDescription:
    """Label names, pool fill per label and output size of ``recipe`` on the service at ``url``.

    Raises the client's errors (``NotFoundError`` for an unknown recipe or a service without
    recipe endpoints, ``TransportError`` when unreachable).
    """
    from genaug.client import Client

    with Client(url, client_id="genaug-train", timeout=timeout, retry_deadline=timeout) as client:
        info = client.recipe(recipe)
    return recipe_description(info)
