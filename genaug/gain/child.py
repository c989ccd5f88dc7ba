"""The training side of ``genaug gain``: a child process that trains cells and prints results.

``python -m genaug.gain.child WORK`` reads cell specs (JSON, one per line) on stdin and prints
one ``GENAUG_GAIN_RESULT {...}`` line per finished cell. It loads the run's arrays once
(``WORK/data.npz``: the data at the classifier's size, the test split; ``WORK/sources/*.npz``:
each arm's images), and for each cell: the seed's shots, the arm's images brought to the
shots' domain (:class:`~genaug.match.DomainMatch` fitted on those shots, unless ``match`` is
``none``) and left out when they do not agree with the shots' classes
(:func:`~genaug.match.agreement` under ``floor``: the cell trains on the shots alone and its
result says so), then the classifier: the built-in one of the cell's framework
(:mod:`~genaug.gain.train_torch` or :mod:`~genaug.gain.train_tf`) or the user's function.

The parent runs one child per core it may use; each child uses one CPU thread, so children
never fight over cores. TensorFlow and torch never meet in one process: a child imports only
its framework.

**The user's training function** (``--train module:function``) is called in the child as::

    accuracy = function(x_train, y_train, x_test, y_test, synthetic=mask, seed=seed, share=p)

``x_train`` uint8 ``[N, H, W, C]`` (the real shots, then the arm's images), ``y_train`` int64,
``synthetic`` a bool ``[N]`` (True for the arm's images), ``share`` the default synthetic
share for this ``k`` (:func:`genaug.mixing.default_share`); it returns the test accuracy in
[0, 1]. The same function trains every arm and seed.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

RESULT = "GENAUG_GAIN_RESULT "

__all__ = ["RESULT", "load_train_function", "main", "run_cell"]


def load_train_function(spec: str) -> Callable[..., float]:
    """``module:function`` as a callable; ``ValueError`` naming what is wrong."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--train {spec!r} must be module:function (e.g. mytrain:train)")
    sys.path.insert(0, os.getcwd())  # a module beside the user's data, as python -m finds it
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--train {spec!r}: cannot import {module_name!r} ({exc})") from exc
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ValueError(f"--train {spec!r}: {module_name!r} has no function {attribute!r}")
    return function  # type: ignore[no-any-return]


class Arrays:
    """The run's arrays, loaded once (module doc)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        with np.load(work / "data.npz") as data:
            self.pixels = data["pixels"]
            self.labels = data["labels"]
            self.test = data["test"]
            self.num_classes = int(data["num_classes"])
        self._sources: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def source(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if name not in self._sources:
            with np.load(self.work / "sources" / f"{name}.npz") as kept:
                self._sources[name] = (kept["images"], kept["labels"], kept["shots"])
        return self._sources[name]


def _synthetic(arrays: Arrays, cell: dict[str, Any], shots: np.ndarray
               ) -> tuple[np.ndarray | None, np.ndarray | None, float | None]:
    """The cell's synthetic images at the shots' size and domain, their labels, and their
    :func:`~genaug.match.agreement` with the shots (``match`` ``auto``): below
    ``cell["floor"]`` no images (the cell trains on the shots alone)."""
    name = cell.get("source")
    if name is None:
        return None, None, None
    images, labels, made_of = arrays.source(name)
    per_shot = cell.get("per_shot")
    if per_shot is not None:  # variants: the first per_shot of each of the cell's shots
        keep = np.concatenate([np.flatnonzero(made_of == s)[:per_shot] for s in shots])
        images, labels = images[keep], labels[keep]
    real = arrays.pixels[shots]
    if cell.get("match", "auto") == "auto":
        from genaug.match import DomainMatch, agreement

        matched = DomainMatch.fit(real)(images)
        agreed = agreement(real, arrays.labels[shots], matched, labels)
        if agreed < float(cell.get("floor", float("-inf"))):
            return None, None, agreed
        return matched, labels, agreed
    from .data import fit_image

    fitted = np.stack([fit_image(i, real.shape[1]) for i in images])
    matched = fitted.mean(axis=-1, keepdims=True).astype(np.uint8) \
        if real.shape[-1] == 1 else fitted
    return matched, labels, None


def run_cell(arrays: Arrays, cell: dict[str, Any],
             train: Callable[..., float] | None, framework: str) -> dict[str, Any]:
    """Train one cell (module doc): ``{"accuracy"}``, with ``"agreement"`` (its images' with the
    shots) and ``"mixed"`` (False when that was under the floor) for an arm's cell."""
    shots = np.asarray(cell["shots"], np.int64)
    x_real, y_real = arrays.pixels[shots], arrays.labels[shots]
    test = np.asarray(cell["test"], np.int64) if "test" in cell else arrays.test
    x_test, y_test = arrays.pixels[test], arrays.labels[test]
    x_syn, y_syn, agreed = _synthetic(arrays, cell, shots)
    said: dict[str, Any] = {} if agreed is None else {
        "agreement": None if np.isnan(agreed) else round(agreed, 4), "mixed": x_syn is not None}
    share = float(cell["share"])
    seed = int(cell["seed"])
    if train is not None:
        if x_syn is None or y_syn is None:
            x_train, y_train = x_real, y_real
            mask = np.zeros(len(x_real), bool)
        else:
            x_train = np.concatenate([x_real, x_syn])
            y_train = np.concatenate([y_real, y_syn])
            mask = np.arange(len(x_train)) >= len(x_real)
        accuracy = float(train(x_train, y_train, x_test, y_test, synthetic=mask, seed=seed,
                               share=share))
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"the training function returned {accuracy!r}: an accuracy in "
                             "[0, 1] is expected")
        return {"accuracy": accuracy, **said}
    if framework == "torch":
        from .train_torch import train_and_score
    else:
        from .train_tf import train_and_score
    accuracy = train_and_score(x_real, y_real, x_syn, y_syn, x_test, y_test,
                               num_classes=arrays.num_classes, seed=seed, share=share,
                               steps=int(cell["steps"]))
    return {"accuracy": accuracy, **said}


def _one_thread(framework: str) -> None:
    if framework == "custom":  # the user's function: its own framework, its own threads
        return
    if framework == "torch":
        import torch

        torch.set_num_threads(1)
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    work, framework = Path(args[0]), args[1]
    train_spec = args[2] if len(args) > 2 else ""
    _one_thread(framework)
    train = load_train_function(train_spec) if train_spec else None
    arrays = Arrays(work)
    for line in sys.stdin:
        if not line.strip():
            continue
        cell = json.loads(line)
        result = run_cell(arrays, cell, train, framework)
        print(RESULT + json.dumps({"key": cell["key"], **result}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
