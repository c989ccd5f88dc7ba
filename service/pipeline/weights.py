"""Weight files: the one UNet checkpoint reader and the one file hasher.

Reading a fine-tuned UNet is three steps, shared by the service (``GENAUG_UNET_WEIGHTS``, in
:mod:`~genaug.service.pipeline.load`) and ``genaug convert-unet``:

1. :func:`read_checkpoint` opens a ``.safetensors`` file, or a pickle with
   ``torch.load(weights_only=True)``, which builds tensors and plain containers only; a pickle
   holding anything else is refused (:class:`PickleRefused`) before it is constructed. This
   module never unpickles code: the one ``torch.load(weights_only=False)`` in genaug is in
   ``genaug convert-unet``, behind ``--trust-this-file``
   (:func:`~genaug.service.commands.convert_unet.read_unet_checkpoint`).
2. :func:`find_unet_state` finds the UNet's state dict inside common wrappers (the top level,
   or under :data:`WRAPPER_KEYS`, nested, or a pickled module's ``state_dict()``) and strips
   the training prefixes of :data:`PREFIXES` from its keys.
3. :func:`compare_shapes` lists the keys and shapes that differ from the base UNet.

(:class:`LazyTensors` reads a single-file SDXL checkpoint's tensors one at a time, for
detecting its architecture.)

Errors are :class:`CheckpointError`; each caller words them for its user (the service names
its settings, the command its flags).

Hashing: :func:`hash_files` streams files into a blake2b hash (16 hex chars), for the model's
``weights_hash`` and each LoRA adapter's hash; :func:`hash_pipeline_state` feeds it the tensors
of a pipeline built in memory (the built-in tiny models); :func:`hash_source_files` and
:func:`hash_unet_override` feed it a model path and a UNet override, and
:func:`files_weights_hash` gives ``load_model``'s ``weights_hash`` of a model path without
loading it (``genaug export``). torch is imported only when a function needs it.

Example::

    expected = {k: tuple(v.shape) for k, v in unet.state_dict().items()}
    loaded, unpickled = read_checkpoint(Path("checkpoint.pt"))      # (dict, False)
    found = find_unet_state(loaded, expected)
    found.location, len(found.tensors)                              # ("state_dict", 1680)
    compare_shapes(found.tensors, expected).ok                      # True
    hash_files([Path("lora.safetensors")], sizes=False)             # "1c0f..." (16 hex chars)
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

__all__ = [
    "PREFIXES",
    "WEIGHT_SUFFIXES",
    "WRAPPER_KEYS",
    "CheckpointError",
    "FoundState",
    "LazyTensors",
    "NoUnetState",
    "PickleRefused",
    "ShapeDiff",
    "compare_shapes",
    "files_weights_hash",
    "find_unet_state",
    "hash_files",
    "hash_pipeline_state",
    "hash_source_files",
    "hash_unet_override",
    "read_checkpoint",
    "strip_prefixes",
    "weight_files",
]

log = logging.getLogger(__name__)

WRAPPER_KEYS = ("state_dict", "model_state_dict", "unet", "unet_state_dict", "ema")
"""Keys under which checkpoints commonly keep the UNet's state dict, in preference order."""

PREFIXES = ("module.", "_orig_mod.", "unet.")
"""Key prefixes stripped (repeatedly, in any order): DDP, torch.compile, pipeline dicts."""

WEIGHT_SUFFIXES = (".safetensors", ".bin")
"""The weight files of a diffusers folder that its ``weights_hash`` covers."""

_MAX_DEPTH = 4
_HASH_CHUNK = 8 * 1024 * 1024


class CheckpointError(RuntimeError):
    """A checkpoint could not be read or holds no UNet state dict.

    ``reason`` is the message without the file's name (``"is not a readable safetensors file:
    ..."``), for callers that name the file their own way; ``path`` is the file, if any.
    """

    def __init__(self, reason: str, *, path: Path | None = None) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path} {reason}" if path is not None else reason)


class PickleRefused(CheckpointError):
    """The pickle holds objects other than tensors; reading it would run its code.

    The message is genaug's one line: the file, what it holds and the fix (``genaug
    convert-unet SRC DST --trust-this-file``, or safetensors). ``detail`` names the object
    torch's ``weights_only`` unpickler stopped at (``argparse.Namespace``), and only that:
    torch's own explanation goes on to advise ``weights_only=False`` or allow-listing the
    object, which is exactly the safety genaug keeps on, so none of it is quoted.
    """

    def __init__(self, path: Path, detail: str) -> None:
        self.detail = detail
        dst = path.with_suffix(".safetensors")
        super().__init__(
            f"holds pickled objects other than tensors (first: {detail}), which genaug never "
            "unpickles (unpickling runs code the file carries); if you made or trust it, "
            f"convert it once: genaug convert-unet {shlex.quote(str(path))} "
            f"{shlex.quote(str(dst))} --trust-this-file, or save the weights as .safetensors",
            path=path,
        )


class NoUnetState(CheckpointError):
    """Nothing in a loaded checkpoint (or at the entry asked for) is a state dict of tensors."""


class FoundState(NamedTuple):
    """Where :func:`find_unet_state` found the UNet and what was there.

    ``tensors`` have their prefixes stripped; ``ignored`` are the non-tensor entries next to
    them; ``others`` are other places that held an equally good candidate.
    """

    location: str
    tensors: dict[str, torch.Tensor]
    ignored: list[str]
    others: list[str]


class ShapeDiff(NamedTuple):
    """Keys the base UNet has and the file lacks, the reverse, and ``(key, file shape, base
    shape)`` of keys whose shapes differ; each sorted."""

    missing: list[str]
    unexpected: list[str]
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)


# -- reading -----------------------------------------------------------------------------------


def read_checkpoint(path: Path) -> Any:
    """Load ``path`` without running code: ``.safetensors`` directly, anything else with
    ``torch.load(weights_only=True)``.

    Raises:
        PickleRefused: a pickle holding objects other than tensors and plain containers.
        CheckpointError: a missing or unreadable file.
    """
    import torch

    if not path.is_file():
        raise CheckpointError("does not exist or is not a file", path=path)
    if path.suffix.lower() == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            reason = f"is not a readable safetensors file: {exc}"
            raise CheckpointError(reason, path=path) from exc
    try:
        # weights_only=True unpickles tensors and plain containers only; anything else (a
        # __reduce__ that would run code) is refused before it is constructed.
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # from None: the chained error would print torch's advice to turn the safety off
        raise PickleRefused(path, _refused_object(str(exc))) from None
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise CheckpointError(f"could not be read by torch.load: {exc}", path=path) from exc


_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+?)(?: was|[\s.]*$)", re.MULTILINE)


def _refused_object(message: str) -> str:
    """What torch's ``weights_only`` unpickler stopped at, from its error ``message``: the
    global's name (``argparse.Namespace``), else the first sentence of its
    ``WeightsUnpickler error:`` line, never the advice around them."""
    found = _GLOBAL.search(message)
    if found:
        return found.group(1)
    for line in message.splitlines():
        _, marker, rest = line.partition("WeightsUnpickler error:")
        if marker and rest.strip():
            return rest.strip().split(". ")[0].rstrip(".")[:120]
    return "an object that is not a tensor"


class LazyTensors(Mapping[str, "torch.Tensor"]):
    """Read-only mapping over an open safetensors file that loads a tensor only when indexed
    (detecting a single-file checkpoint's architecture reads a few keys and shapes).

    Example::

        with safe_open("sdxl.safetensors", framework="pt") as handle:
            tensors = LazyTensors(handle)
            "conv_in.weight" in tensors  # True, nothing loaded yet
    """

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._keys: list[str] = list(handle.keys())
        self._key_set = set(self._keys)

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._key_set:
            raise KeyError(key)
        tensor: torch.Tensor = self._handle.get_tensor(key)
        return tensor

    def __contains__(self, key: object) -> bool:
        return key in self._key_set

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def strip_prefixes(key: str) -> str:
    """``module._orig_mod.unet.conv_in.weight`` -> ``conv_in.weight``."""
    changed = True
    while changed:
        changed = False
        for prefix in PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix):]
                changed = True
    return key


def find_unet_state(
    obj: Any, expected: Mapping[str, tuple[int, ...]], *, key: str | None = None
) -> FoundState:
    """Find the UNet state dict in a loaded checkpoint.

    ``key`` (dotted for nested entries) names the entry; without it the chosen candidate is
    the one sharing the most keys with ``expected`` (ties: the order of :data:`WRAPPER_KEYS`,
    the top level first).

    Raises:
        NoUnetState: nothing in ``obj`` (or at ``key``) looks like a state dict of tensors.
    """
    if key is not None:
        selected = _select(obj, key)
        mapping = _as_mapping(selected)
        if mapping is None:
            raise NoUnetState(f"holds {type(selected).__name__}, not a state dict")
        tensors, ignored = _tensor_items(mapping)
        return FoundState(key, tensors, ignored, [])
    scored: list[tuple[int, int, str, dict[str, torch.Tensor], list[str]]] = []
    for order, (where, mapping) in enumerate(_candidates(obj, "<top level>", 0)):
        tensors, ignored = _tensor_items(mapping)
        if tensors:
            scored.append((len(tensors.keys() & expected.keys()), -order, where, tensors, ignored))
    if not scored:
        kind = type(obj).__name__
        keys = sorted(map(str, obj))[:12] if isinstance(obj, Mapping) else []
        raise NoUnetState(
            f"found no state dict of tensors in the checkpoint (a {kind}"
            + (f" with keys {keys}" if keys else "")
            + f"); looked at the top level and under {', '.join(WRAPPER_KEYS)}"
        )
    scored.sort(key=lambda s: (s[0], s[1]), reverse=True)
    best = scored[0]
    others = [s[2] for s in scored[1:] if s[0] == best[0] and s[0] > 0]
    return FoundState(best[2], best[3], best[4], others)


def compare_shapes(
    tensors: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]]
) -> ShapeDiff:
    """What differs between a found state dict and the base UNet's shapes."""
    return ShapeDiff(
        missing=sorted(expected.keys() - tensors.keys()),
        unexpected=sorted(tensors.keys() - expected.keys()),
        mismatched=[
            (k, tuple(tensors[k].shape), tuple(expected[k]))
            for k in sorted(tensors.keys() & expected.keys())
            if tuple(tensors[k].shape) != tuple(expected[k])
        ],
    )


def _as_mapping(obj: Any) -> Mapping[str, Any] | None:
    """A mapping, or a module's ``state_dict()`` (a pickled model or EMA wrapper)."""
    if isinstance(obj, Mapping):
        return obj
    state_dict = getattr(obj, "state_dict", None)
    if callable(state_dict):
        try:
            result = state_dict()
        except Exception:  # an optimizer-like object whose state_dict needs arguments
            return None
        return result if isinstance(result, Mapping) else None
    return None


def _candidates(obj: Any, where: str, depth: int) -> Iterator[tuple[str, Mapping[str, Any]]]:
    mapping = _as_mapping(obj)
    if mapping is None or depth > _MAX_DEPTH:
        return
    yield where, mapping
    for key in WRAPPER_KEYS:
        if key in mapping:
            inner = f"{where}.{key}" if where != "<top level>" else key
            yield from _candidates(mapping[key], inner, depth + 1)


def _tensor_items(mapping: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], list[str]]:
    import torch

    tensors: dict[str, torch.Tensor] = {}
    ignored: list[str] = []
    for key, value in mapping.items():
        if isinstance(value, torch.Tensor):
            tensors[strip_prefixes(str(key))] = value
        else:
            ignored.append(str(key))
    return tensors, ignored


def _select(obj: Any, path: str) -> Any:
    current = obj
    for part in path.split("."):
        mapping = _as_mapping(current)
        if mapping is None or part not in mapping:
            have = sorted(map(str, mapping)) if mapping is not None else []
            raise NoUnetState(
                f"no entry {part!r} there; it has {have[:12]}"
                + (" ..." if len(have) > 12 else "")
            )
        current = mapping[part]
    return current


# -- hashing -----------------------------------------------------------------------------------


def weight_files(folder: Path) -> list[Path]:
    """All weight files under a diffusers folder, in sorted relative-path order."""
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in WEIGHT_SUFFIXES]
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())


def hash_files(
    files: Iterable[Path],
    *,
    root: Path | None = None,
    sizes: bool = True,
    hasher: Any = None,
) -> str:
    """Stream each file's bytes into ``hasher`` (a new 8-byte blake2b when ``None``); return
    its hex digest (16 hex chars for a new one).

    With ``sizes`` each file's size goes in before its bytes; with ``root`` its path relative
    to it goes in first (which file of a folder is which component matters). A lone file is
    hashed by content only, so renaming it changes nothing. The model's ``weights_hash`` feeds
    several parts into one hasher; an adapter's hash is ``hash_files([path], sizes=False)``.
    """
    if hasher is None:
        hasher = hashlib.blake2b(digest_size=8)
    for path in files:
        if root is not None:
            hasher.update(path.relative_to(root).as_posix().encode() + b"\0")
        if sizes:
            hasher.update(str(path.stat().st_size).encode() + b"\0")
        with path.open("rb") as fh:
            while chunk := fh.read(_HASH_CHUNK):
                hasher.update(chunk)
    digest: str = hasher.hexdigest()
    return digest


def hash_pipeline_state(hasher: Any, pipeline: Any) -> None:
    """Feed every component's tensors (name, dtype, shape, bytes) in sorted key order."""
    import torch

    for name in ("text_encoder", "text_encoder_2", "unet", "vae"):
        state = getattr(pipeline, name).state_dict()
        for key in sorted(state):
            tensor = state[key].detach().to("cpu").contiguous().reshape(-1)
            header = f"{name}.{key}|{tensor.dtype}|{tuple(tensor.shape)}\0"
            hasher.update(header.encode())
            hasher.update(tensor.view(torch.uint8).numpy().tobytes())


def hash_source_files(hasher: Any, source: Path) -> None:
    """Feed a folder's weight files (diffusers layout) or a single checkpoint file to
    ``hasher``: the part of ``weights_hash`` a model path contributes."""
    if source.is_dir():
        hash_files(weight_files(source), root=source, hasher=hasher)
    else:
        hash_files([source], hasher=hasher)


def hash_unet_override(hasher: Any, unet_weights: Path) -> None:
    """Feed a fine-tuned UNet (GENAUG_UNET_WEIGHTS) to ``hasher``, after the model's files."""
    hasher.update(b"\0unet-override\0")
    hash_files([unet_weights], hasher=hasher)


def files_weights_hash(source: Path, unet_weights: Path | None = None) -> str:
    """:func:`~genaug.service.pipeline.load.load_model`'s ``weights_hash`` of a model folder or
    file (and a UNet override), read from the files without loading them (``genaug export``
    names a pool's model by it)."""
    hasher = hashlib.blake2b(digest_size=8)
    hash_source_files(hasher, source)
    if unet_weights is not None:
        hash_unet_override(hasher, unet_weights.expanduser())
    return hasher.hexdigest()
