"""Turn a fine-tuned UNet checkpoint you trust into safetensors.

``genaug convert-unet SRC DST [--base MODEL] --trust-this-file``. The service never unpickles
(``GENAUG_UNET_WEIGHTS`` takes safetensors, or a ``.pt`` that
``torch.load(weights_only=True)`` can read). Training code often saves more than tensors: an
``argparse.Namespace`` of its arguments, an optimizer, a scheduler, a whole model object.
Reading such a file means running ``pickle``, which can execute any code the file carries.
This command is the one place genaug does that, and only when told to with
``--trust-this-file``, for a file the user made or trusts. It runs offline, on the local file.

What it does:

Steps 1 to 3 are the service's own UNet checkpoint reader
(:mod:`~genaug.service.pipeline.weights`), with the one difference the flag makes:

1. Reads ``SRC``: safetensors directly; a pickle first with ``weights_only=True`` (safe, no
   flag needed), and only when that fails and ``--trust-this-file`` is given, with
   ``weights_only=False``. Without the flag it refuses and says why.
2. Finds the UNet state dict inside common wrappers: the top level itself, or under
   ``state_dict``, ``model_state_dict``, ``unet``, ``unet_state_dict``, ``ema`` (also nested,
   and a pickled module's ``state_dict()``); ``--key a.b`` picks one explicitly.
3. Strips the prefixes ``module.`` (DataParallel/DDP), ``_orig_mod.`` (``torch.compile``) and
   ``unet.`` (a pipeline-level dict) from every key.
4. Checks keys and shapes against the base model's UNet (``--base``; default
   ``GENAUG_MODEL``, else the embedded ``tiny-digits``; a diffusers folder's UNet is built on
   the ``meta`` device from its config, so no weights are loaded for the check).
5. Prints missing and unexpected keys as a short diff, and writes ``DST`` (safetensors) only
   when every key and shape matches.

Example::

    genaug convert-unet checkpoint_best.pt unet.safetensors \\
        --base /models/sdxl-base --trust-this-file
    GENAUG_MODEL=/models/sdxl-base GENAUG_UNET_WEIGHTS=unet.safetensors genaug serve

Nothing here is imported by the service; torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..pipeline.weights import (
    WRAPPER_KEYS,
    CheckpointError,
    FoundState,
    NoUnetState,
    PickleRefused,
    compare_shapes,
    read_checkpoint,
)
from ..pipeline.weights import find_unet_state as _find_unet_state

__all__ = [
    "ConvertError",
    "ConvertResult",
    "add_arguments",
    "convert_unet",
    "find_unet_state",
    "run",
]

log = logging.getLogger(__name__)

_SHOWN = 8  # keys listed per section of the diff


class ConvertError(RuntimeError):
    """The conversion cannot proceed; the message says why and what to do."""


@dataclass
class ConvertResult:
    """What :func:`convert_unet` found.

    Attributes:
        location: where the state dict was found (``"<top level>"``, ``"ema"``,
            ``"model_state_dict"``, ...).
        unpickled: the file needed ``weights_only=False``.
        tensors: tensors in the state dict found.
        missing / unexpected: keys the base UNet has and the file lacks, and the reverse.
        mismatched: ``(key, file shape, base shape)`` for keys whose shapes differ.
        ignored: non-tensor entries next to the tensors (dropped).
        others: other places that also held a UNet state dict (``--key`` picks one).
        written: ``DST`` when it was written.
    """

    location: str
    unpickled: bool
    tensors: int
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)
    written: Path | None = None

    @property
    def ok(self) -> bool:
        """Every key and shape matches the base UNet."""
        return not (self.missing or self.unexpected or self.mismatched)

    def diff(self) -> str:
        """A short diff: ``- key`` missing from the file, ``+ key`` unexpected,
        ``~ key`` shape differs."""
        lines: list[str] = []
        for sign, title, keys in (("-", "missing (in the base UNet, not in the file)",
                                   self.missing),
                                  ("+", "unexpected (in the file, not in the base UNet)",
                                   self.unexpected)):
            if keys:
                lines.append(f"{len(keys)} {title}:")
                lines += [f"  {sign} {k}" for k in keys[:_SHOWN]]
                if len(keys) > _SHOWN:
                    lines.append(f"  {sign} ... {len(keys) - _SHOWN} more")
        if self.mismatched:
            lines.append(f"{len(self.mismatched)} with other shapes (file vs base):")
            lines += [f"  ~ {k} {tuple(a)} vs {tuple(b)}" for k, a, b in self.mismatched[:_SHOWN]]
            if len(self.mismatched) > _SHOWN:
                lines.append(f"  ~ ... {len(self.mismatched) - _SHOWN} more")
        return "\n".join(lines)


def find_unet_state(
    obj: Any, expected: Mapping[str, tuple[int, ...]], *, key: str | None = None
) -> FoundState:
    """The shared finder (:func:`genaug.service.pipeline.weights.find_unet_state`), its
    errors as :class:`ConvertError` naming ``--key``.

    Returns ``(location, tensors with prefixes stripped, ignored non-tensor keys, other
    locations that also match)``.
    """
    try:
        return _find_unet_state(obj, expected, key=key)
    except NoUnetState as exc:
        if key is not None:
            raise ConvertError(f"--key {key!r}: {exc}") from exc
        raise ConvertError(
            f"{exc}. Pick the entry with --key NAME (dotted for nested entries, e.g. "
            "--key checkpoint.model)"
        ) from exc


def read_unet_checkpoint(src: Path, *, trust: bool) -> tuple[Any, bool]:
    """Load ``src`` with the shared reader; returns ``(object, needed weights_only=False)``.

    A pickle the reader refuses (objects other than tensors) is unpickled here, and only with
    ``trust`` (``--trust-this-file``): the one ``torch.load(weights_only=False)`` in genaug.

    Raises:
        ConvertError: missing file, unreadable file, or a pickle that needs
            ``weights_only=False`` without ``trust``.
    """
    try:
        return read_checkpoint(src), False
    except PickleRefused as exc:
        if not trust:
            raise ConvertError(
                f"refusing to unpickle {src}: it holds objects other than tensors "
                f"({exc.detail}), and reading those means torch.load(weights_only=False), "
                "which runs any code the file carries. If you made this file or trust its "
                "source, run again with --trust-this-file; the result is a .safetensors file "
                "that never needs this again"
            ) from exc
    except CheckpointError as exc:
        raise ConvertError(str(exc)) from exc
    import torch

    log.warning("unpickling %s with weights_only=False (--trust-this-file)", src)
    try:
        return torch.load(str(src), map_location="cpu", weights_only=False), True
    except Exception as exc:  # whatever the pickle's own code raises
        raise ConvertError(
            f"{src} could not be unpickled even with weights_only=False: "
            f"{type(exc).__name__}: {exc}. A class it refers to may need to be importable "
            "(run the command in the environment that saved it)"
        ) from exc


def base_unet_shapes(base: str | None) -> tuple[str, dict[str, tuple[int, ...]]]:
    """The base model's UNet parameter shapes, and a name for it.

    ``base``: ``None`` (``GENAUG_MODEL``, else the embedded default), a built-in name, a
    diffusers folder, or a single-file checkpoint.
    """
    from ..settings import builtin_model, model_path

    if base is None:
        base = os.environ.get("GENAUG_MODEL") or None
    name = builtin_model(base)
    if name is not None:
        from ..pipeline.tiny import build_tiny_pipeline

        pipe: Any = build_tiny_pipeline(batch_invariant=False)  # same UNet for every built-in
        return name, {k: tuple(v.shape) for k, v in pipe.unet.state_dict().items()}
    path = model_path(base)
    assert path is not None
    if path.is_dir():
        return str(path), _folder_unet_shapes(path)
    if path.is_file():
        from ..pipeline.load import ModelLoadError, load_model

        try:
            model = load_model(source=path, unet_weights=None, device="cpu", dtype="float32")
        except ModelLoadError as exc:
            raise ConvertError(f"could not load the base model --base {path}: {exc}") from exc
        pipeline: Any = model.pipeline
        unet: Any = pipeline.unet
        return str(path), {k: tuple(v.shape) for k, v in unet.state_dict().items()}
    raise ConvertError(
        f"base model {str(path)!r} does not exist; pass --base with a local diffusers folder, "
        "a single .safetensors checkpoint, tiny-digits, tiny-digits-base or tiny-random "
        "(default: GENAUG_MODEL, else tiny-digits)"
    )


def _folder_unet_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Build the folder's UNet from its config on the meta device: shapes, no weights."""
    import torch
    from diffusers import UNet2DConditionModel

    config_dir = folder / "unet"
    if not (config_dir / "config.json").is_file():
        raise ConvertError(
            f"base model folder {str(folder)!r} has no unet/config.json; pass --base with a "
            "diffusers SDXL folder"
        )
    config = UNet2DConditionModel.load_config(str(config_dir), local_files_only=True)
    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(config)  # type: ignore[no-untyped-call]
    return {k: tuple(v.shape) for k, v in unet.state_dict().items()}


def convert_unet(
    src: Path, dst: Path, *, base: str | None = None, trust: bool = False,
    key: str | None = None,
) -> ConvertResult:
    """Find, check and write a UNet state dict (see the module docstring).

    Returns the result; ``result.written`` is ``dst`` when every key and shape matched,
    ``None`` otherwise (nothing written).

    Raises:
        ConvertError: unreadable source, refusal to unpickle without ``trust``, no state dict
            found, a bad ``dst``.
    """
    from safetensors.torch import save_file

    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    if dst.suffix.lower() != ".safetensors":
        raise ConvertError(f"DST {dst} must end in .safetensors (that is what it writes)")
    if dst.resolve() == src.resolve():
        raise ConvertError("DST is SRC; write the converted weights to a new file")
    base_name, expected = base_unet_shapes(base)
    loaded, unpickled = read_unet_checkpoint(src, trust=trust)
    location, tensors, ignored, others = find_unet_state(loaded, expected, key=key)
    diff = compare_shapes(tensors, expected)
    result = ConvertResult(location=location, unpickled=unpickled, tensors=len(tensors),
                           missing=diff.missing, unexpected=diff.unexpected,
                           mismatched=diff.mismatched, ignored=ignored, others=others)
    log.info("base %s: %d UNet tensors; %s: %d tensors at %s", base_name, len(expected), src,
             len(tensors), location)
    if result.ok:
        dst.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        save_file(state, str(dst), metadata={"format": "pt", "converted_from": src.name,
                                             "location": location, "base": base_name})
        result.written = dst
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``genaug convert-unet`` arguments."""
    parser.add_argument("src", type=Path, help="your checkpoint (.pt/.pth/.bin/.ckpt or "
                        ".safetensors)")
    parser.add_argument("dst", type=Path, help="where to write the UNet (.safetensors)")
    parser.add_argument("--base", default=None,
                        help="model whose UNet the weights must fit: a diffusers folder, a "
                        ".safetensors checkpoint, tiny-digits, tiny-digits-base or "
                        "tiny-random (default: GENAUG_MODEL, else tiny-digits)")
    parser.add_argument("--key", default=None,
                        help="the checkpoint entry holding the UNet, dotted for nested ones "
                        "(default: found among " + ", ".join(WRAPPER_KEYS) + ", top level)")
    parser.add_argument("--trust-this-file", dest="trust", action="store_true",
                        help="allow torch.load(weights_only=False) on SRC; it runs any code "
                        "in the file: only for a file you made or trust")


def run(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Run the command; print what it found. Exit code 0 written, 1 keys or shapes differ
    (nothing written), 2 refused or unreadable."""
    out = out or sys.stdout
    try:
        result = convert_unet(args.src, args.dst, base=args.base, trust=args.trust,
                              key=args.key)
    except ConvertError as exc:
        print(f"genaug convert-unet: {exc}", file=sys.stderr)
        return 2
    how = ("unpickled with weights_only=False" if result.unpickled
           else "read without unpickling code")
    print(f"{args.src}: {result.tensors} tensors at {result.location} ({how})", file=out)
    if result.ignored:
        print(f"ignored {len(result.ignored)} non-tensor entries there: "
              f"{', '.join(result.ignored[:_SHOWN])}", file=out)
    if result.others:
        print(f"also found a UNet at: {', '.join(result.others)} (choose with --key)",
              file=out)
    if not result.ok:
        print(result.diff(), file=out)
        hint = ""
        if any(k.startswith("model.diffusion_model.") for k in result.unexpected):
            hint = (" The keys look like an original (LDM) Stable Diffusion checkpoint, not a "
                    "diffusers UNet: serve the whole file with GENAUG_MODEL instead.")
        print(f"genaug convert-unet: {args.src} does not match the base UNet; nothing "
              f"written.{hint} Check --base (the model it was fine-tuned from) and --key.",
              file=sys.stderr)
        return 1
    print(f"wrote {result.written}: all {result.tensors} keys and shapes match the base UNet. "
          f"Serve it with GENAUG_UNET_WEIGHTS={result.written} (or --unet-weights).", file=out)
    return 0
