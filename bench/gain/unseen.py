"""The unseen-class protocol: digits 5-9 from a base that never saw them, measured by ``genaug
gain``.

The stand-in for SDXL facing a user's wound phases: ``tiny-digits-base`` learned scikit-learn's
digits 0-4 only (it takes every prompt but draws 0-4), and the user's classes are the digits
5-9. The run writes them as folders and asks ``genaug gain`` what each arm gives:

- ``WORK/digits/user/<5..9>/``: the ``fewshot`` and ``test`` splits of genaug.digits (80 real
  digits per label, none of which any generator trained on): the user's folder;
- ``WORK/digits/perfect/<5..9>/``: the ``generator`` split's 5-9 (about 125 per label, never
  seen by the base nor by the classifier): the arm ``perfect``, what the mixing gives when
  every pool image is a new real one;
- ``pool``: the base's own pool for the labels 5-9 (it draws 0-4: the floor);
- ``variants``: img2img variants of each seed's shots through the base;
- ``adapted`` when asked (``--arms``): a LoRA that ``genaug adapt`` trains on each seed's
  shots (``--adapt-steps``; genaug adapt's default is 1,200 per label: about 15 minutes per
  ``k`` and seed on 2 cores).

Served from ``tiny-digits-base`` with the digits recipe's labels 5-9 (started here unless
``--url``). It prints gain's verdicts and whether any genaug arm falls below real by more than
one point on the mean (the issue's "mixing that never hurts").

    python -m bench.gain.unseen --workdir artifacts/unseen                # k = 1, 2, 5
    python -m bench.gain.unseen --workdir artifacts/unseen-a --arms real,adapted --seeds 4
    python -m bench.gain.unseen --quick
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from bench.gain._protocol import goals, measure
from bench.harness import ROOT, finish, main, make_parser, table

TASK = ("5", "6", "7", "8", "9")


def write_folders(work: Path) -> dict[str, Path]:
    """The user's digits 5-9 (``fewshot`` and ``test``) and the perfect pool's (``generator``),
    as ``<label>/<index>.png``, and the recipe of labels 5-9 (written once)."""
    from PIL import Image

    from genaug.digits import load_split, split_indices

    paths = {"user": work / "digits" / "user", "perfect": work / "digits" / "perfect",
             "recipes": work / "recipes.yaml"}
    if not all(p.exists() for p in paths.values()):
        for split, part in (("fewshot", "user"), ("test", "user"), ("generator", "perfect")):
            images, labels = load_split(split)
            for image, label, index in zip(images, labels, split_indices(split), strict=True):
                if str(int(label)) not in TASK:
                    continue
                folder = paths[part] / str(int(label))
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(image).save(folder / f"{int(index):04d}.png")
        spec = yaml.safe_load((ROOT / "recipes" / "digits.yaml").read_text())["recipes"][0]
        spec["labels"] = {label: spec["labels"][label] for label in TASK}
        paths["recipes"].write_text(yaml.safe_dump({"recipes": [spec]}))
    return paths


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "", threads=False)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="folders, the service's pool and the report (default: a "
                             "temporary folder)")
    parser.add_argument("--url", default=None, help="a running service of tiny-digits-base "
                        "with WORK/recipes.yaml (default: started here)")
    parser.add_argument("--seeds", default="8")
    parser.add_argument("--shots", default="1,2,5")
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
                     "--per-label", args.per_label, "--extra", f"perfect={paths['perfect']}"]
        if args.quick:
            gain_args += ["--steps", "60", "--test-per-label", "20"]
        if args.adapt_steps:
            gain_args += ["--adapt-steps", args.adapt_steps]
        report = measure(work, model="tiny-digits-base", recipes=paths["recipes"],
                         data=paths["user"], gain_args=gain_args, url=args.url)
    rows = goals(report["summary"])
    table(f"unseen-class protocol ({args.framework}, {args.seeds} seeds): goals",
                ["goal", "measured", "verdict"], rows)
    print(f"\n{report['minutes']:.1f} minutes on {os.cpu_count()} CPUs")
    return finish({"summary": report["summary"], "goals": rows, "minutes": report["minutes"]},
                  args.json)


if __name__ == "__main__":
    main(run)
