"""``genaug demo``: the whole round trip on the embedded default, no GPU, no download.

Starts ``genaug serve`` (the ``tiny-digits`` generator) as a child process on 127.0.0.1,
waits for readiness, asks the client for a column of images per digit and writes them as one
labelled grid PNG, then (unless ``--no-train``) trains a small CNN on 5 real digits per class
in a separate TensorFlow process, with and without pool images mixed in through the
reservoir, prints both test accuracies, and stops everything; the orchestration is
:func:`genaug.trainer.demo.run_full_demo`. With ``--no-train`` it waits for the recipe pool
to fill instead.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["run_demo"]


def run_demo(*, out: str = "genaug-demo.png", port: int = 0, train: bool = True) -> int:
    """The README's main job: service, a labelled grid through the client, then (with
    ``train``) few-shot training with and without genaug mixing under MirroredStrategy."""
    from genaug.trainer.demo import run_full_demo

    code: int = run_full_demo(port=port, grid_out=Path(out), train=train)
    return code
