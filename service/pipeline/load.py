"""Load the SDXL pipeline the service runs: a built-in tiny model, a diffusers folder, a file.

``GENAUG_MODEL`` names one of:

* ``tiny-digits`` (also when unset): the embedded default, the tiny SDXL-architecture
  pipeline of :mod:`genaug.service.pipeline.tiny` with weights trained on scikit-learn's handwritten
  digits (package data, made by ``tools/train_tiny_generator.py``);
* ``tiny-random``: the same architecture with fixed-seed random weights (tests);
* a local diffusers folder (``model_index.json``) or a single ``.safetensors`` SDXL checkpoint.

Everything here is offline (``local_files_only=True``; nothing is fetched from a hub) and
refuses to unpickle arbitrary objects: fine-tuned UNet weights load from safetensors or with
``torch.load(weights_only=True)`` (``genaug convert-unet`` turns any other checkpoint into
safetensors, on the user's say-so). Every failure is a :class:`ModelLoadError` whose message
names what was wrong and the setting that fixes it.

Example::

    from pathlib import Path
    from genaug.service.pipeline.load import load_model

    model = load_model(source=None, unet_weights=None, device="cpu", dtype="auto")
    model.kind, model.weights_hash  # ("tiny-digits", "3f2a...")  (16 hex chars)
    model.trained_on["dataset"]     # "sklearn load_digits"
    model = load_model(
        source=Path("/models/sdxl-base"),  # a diffusers folder (model_index.json)
        unet_weights=Path("/models/finetuned-unet.safetensors"),
        device="cuda:0",
        dtype="auto",  # bfloat16 on CUDA, float32 on the CPU
    )
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import pickle
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..settings import builtin_model

if TYPE_CHECKING:
    from diffusers import StableDiffusionXLPipeline

__all__ = [
    "MODEL_KINDS",
    "LoadedModel",
    "ModelLoadError",
    "load_model",
    "resolve_device",
    "resolve_dtype",
]

log = logging.getLogger(__name__)

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_WEIGHT_SUFFIXES = (".safetensors", ".bin")  # weight files hashed in a diffusers folder
_PICKLE_SUFFIXES = (".pt", ".pth", ".bin")
_HASH_CHUNK = 8 * 1024 * 1024
# Files diffusers itself fetches for a single-file checkpoint's pipeline config (no weights).
_CONFIG_PATTERNS = ["**/*.json", "*.json", "*.txt", "**/*.txt", "**/*.model"]
_TRAINED_ON = "trained_on.json"  # next to model_index.json: what a folder was trained on

MODEL_KINDS = ("tiny-digits", "tiny-random", "diffusers", "single-file")
"""Every value of :attr:`LoadedModel.kind` (``/v1/info`` ``model.kind``)."""


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message says what was wrong and how to fix it."""


@dataclass(frozen=True)
class LoadedModel:
    """A loaded pipeline and what it is.

    Attributes:
        pipeline: the ``StableDiffusionXLPipeline``, on ``device`` in ``dtype``, progress
            bar disabled.
        kind: one of :data:`MODEL_KINDS`: ``"tiny-digits"``, ``"tiny-random"``,
            ``"diffusers"`` (a folder) or ``"single-file"``.
        source: the built-in model's name or the path it was loaded from.
        weights_hash: 16 hex chars, a content hash of the weights, fine-tuned UNet included.
            Equal hashes mean equal weights; use it to key anything cached from this model.
        device: the torch device the pipeline runs on.
        dtype: the floating-point type of its weights.
        trained_on: what the weights were trained on (data set, split, steps, script
            version, seed, ...) for ``tiny-digits`` and for folders written by
            ``tools/train_tiny_generator.py`` (its ``trained_on.json``); ``None`` when
            unknown. A ``unet_weights`` override leaves it as the base's.
    """

    pipeline: StableDiffusionXLPipeline
    kind: str
    source: str
    weights_hash: str
    device: torch.device
    dtype: torch.dtype
    trained_on: dict[str, Any] | None = None


def resolve_device(spec: str) -> torch.device:
    """Turn ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` into a usable :class:`torch.device`.

    ``"cuda"`` means the current CUDA device. A CUDA device that does not exist is an error
    (never a silent fallback to the CPU).

    Raises:
        ModelLoadError: unknown spec, CUDA unavailable, or index out of range.
    """
    text = spec.strip().lower()
    if text == "cpu":
        return torch.device("cpu")
    if text != "cuda" and not text.startswith("cuda:"):
        raise ModelLoadError(
            f"device {spec!r} is not supported; set GENAUG_DEVICE to 'cpu', 'cuda' or 'cuda:N'"
        )
    index: int | None = None
    if text.startswith("cuda:"):
        suffix = text.removeprefix("cuda:")
        if not suffix.isdigit():
            raise ModelLoadError(
                f"device {spec!r} is not a valid CUDA device; set GENAUG_DEVICE to 'cuda' or "
                "'cuda:N' with N a device index such as 0"
            )
        index = int(suffix)
    if not torch.cuda.is_available():
        reason = (
            "this torch build has no CUDA support"
            if torch.version.cuda is None
            else "no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)"
        )
        raise ModelLoadError(
            f"device {spec!r} requested but CUDA is not available: {reason} "
            f"(torch {torch.__version__}); available: cpu. Set GENAUG_DEVICE=cpu to run on "
            "the CPU, or run on a machine with a CUDA GPU"
        )
    count = torch.cuda.device_count()
    if index is None:
        index = torch.cuda.current_device()
    if index >= count:
        available = ", ".join(["cpu", *(f"cuda:{i}" for i in range(count))])
        raise ModelLoadError(
            f"device {spec!r} does not exist: {count} CUDA device(s) visible; available: "
            f"{available}. Set GENAUG_DEVICE to one of those"
        )
    return torch.device("cuda", index)


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """Turn ``"auto"``, ``"float32"``, ``"bfloat16"`` or ``"float16"`` into a torch dtype.

    ``"auto"`` is bfloat16 on CUDA (no fp16 VAE overflow, full speed on Ampere and later)
    and float32 on the CPU. float16 on the CPU is refused: it is slow and poorly supported.

    Raises:
        ModelLoadError: unknown spec or float16 on the CPU.
    """
    text = spec.strip().lower()
    if text == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if text not in _DTYPES:
        raise ModelLoadError(
            f"dtype {spec!r} is not supported; set GENAUG_DTYPE to one of: auto, "
            + ", ".join(_DTYPES)
        )
    dtype = _DTYPES[text]
    if dtype == torch.float16 and device.type == "cpu":
        raise ModelLoadError(
            "dtype 'float16' is not supported on the CPU (slow, and many CPU kernels lack "
            "half precision); set GENAUG_DTYPE=float32 or GENAUG_DTYPE=bfloat16 "
            "(or 'auto'), or use a CUDA device"
        )
    return dtype


def load_model(
    *,
    source: str | Path | None,
    unet_weights: Path | None,
    device: str,
    dtype: str,
    single_file_config: Path | None = None,
) -> LoadedModel:
    """Load the pipeline, apply fine-tuned UNet weights, move it to ``device`` and ``dtype``.

    Args:
        source: ``None`` or ``"tiny-digits"`` for the embedded trained tiny pipeline,
            ``"tiny-random"`` for the random-weight one; else a path: a diffusers folder
            (with ``model_index.json``) or a single ``.safetensors`` SDXL checkpoint. A
            folder named like a built-in is reached as ``./tiny-digits``.
        unet_weights: optional fine-tuned UNet state dict (diffusers key names) as
            ``.safetensors`` or as ``.pt``/``.pth``/``.bin`` holding only tensors (a raw state
            dict, or a dict with a ``"state_dict"`` or ``"unet"`` entry). Loaded strictly.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (see :func:`resolve_device`).
        dtype: ``"auto"``, ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        single_file_config: for a single-file ``source`` only: a local diffusers folder
            providing the pipeline's configs and tokenizers (``model_index.json``,
            ``*/config.json``, ``tokenizer*/``, ``scheduler/``; weights not needed), e.g. a
            copy of stabilityai/stable-diffusion-xl-base-1.0 without its weight files. Without
            it the config of the architecture detected in the checkpoint must already be in
            the local Hugging Face cache.

    Raises:
        ModelLoadError: with what was wrong and how to fix it.
    """
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    hasher = hashlib.blake2b(digest_size=8)
    pipeline: Any  # diffusers is untyped; mypy sees none of the pipeline's attributes
    trained_on: dict[str, Any] | None = None

    builtin = builtin_model(source)
    if builtin == "tiny-random":
        from .tiny import build_tiny_pipeline

        pipeline = build_tiny_pipeline()
        kind = source_name = builtin
        _hash_pipeline_state(hasher, pipeline)
    elif builtin == "tiny-digits":
        from .tiny import TinyWeightsError, build_tiny_digits_pipeline

        try:
            pipeline, trained_on = build_tiny_digits_pipeline()
        except TinyWeightsError as exc:
            raise ModelLoadError(
                f"{exc}; reinstall genaug, or set GENAUG_MODEL=tiny-random (random weights) "
                "or a local model path"
            ) from exc
        kind = source_name = builtin
        _hash_pipeline_state(hasher, pipeline)
        hasher.update(f"scaling_factor={pipeline.vae.config.scaling_factor!r}".encode())
    else:
        assert source is not None  # None is the default built-in
        source = Path(source).expanduser()
        source_name = str(source)
        if source.is_dir():
            kind = "diffusers"
            pipeline = _load_folder(source, torch_dtype)
            _hash_files(hasher, _weight_files(source), root=source)
            trained_on = _read_trained_on(source)
        elif source.is_file():
            kind = "single-file"
            pipeline = _load_single_file(source, torch_dtype, single_file_config)
            _hash_files(hasher, [source])
        else:
            raise ModelLoadError(
                f"model source {source_name!r} does not exist; set GENAUG_MODEL to a local "
                "diffusers folder (with model_index.json) or a single .safetensors SDXL "
                "checkpoint, or leave it unset for the built-in tiny model (tiny-digits; "
                "tiny-random for random weights)"
            )

    if unet_weights is not None:
        unet_weights = unet_weights.expanduser()
        state = _read_unet_weights(unet_weights)
        _apply_unet_weights(pipeline.unet, state, unet_weights)
        hasher.update(b"\0unet-override\0")
        _hash_files(hasher, [unet_weights])

    try:
        # Cast only when needed: diffusers' ModelMixin.to() warns on every dtype argument.
        if pipeline.unet.dtype != torch_dtype:
            pipeline.to(dtype=torch_dtype)
        pipeline.to(torch_device)
    except RuntimeError as exc:  # includes torch.cuda.OutOfMemoryError
        raise ModelLoadError(
            f"could not move the pipeline to {torch_device} as {torch_dtype}: {exc}; check "
            "GENAUG_DEVICE and GENAUG_DTYPE and the free memory on that device"
        ) from exc
    pipeline.set_progress_bar_config(disable=True)
    weights_hash = hasher.hexdigest()
    log.info(
        "loaded %s model from %s on %s as %s (weights %s)",
        kind,
        source_name,
        torch_device,
        torch_dtype,
        weights_hash,
    )
    return LoadedModel(
        pipeline=pipeline,
        kind=kind,
        source=source_name,
        weights_hash=weights_hash,
        device=torch_device,
        dtype=torch_dtype,
        trained_on=trained_on,
    )


def _read_trained_on(folder: Path) -> dict[str, Any] | None:
    """The folder's ``trained_on.json`` (written by the training script), if readable."""
    import json

    path = folder / _TRAINED_ON
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return None
    return record if isinstance(record, dict) else None


def _load_folder(folder: Path, torch_dtype: torch.dtype) -> StableDiffusionXLPipeline:
    """Load a diffusers folder offline."""
    from diffusers import StableDiffusionXLPipeline

    if not (folder / "model_index.json").is_file():
        raise ModelLoadError(
            f"model folder {str(folder)!r} is not a diffusers pipeline folder (no "
            "model_index.json); set GENAUG_MODEL to a folder written by "
            "pipeline.save_pretrained() or downloaded from a diffusers repository, or to a "
            "single .safetensors checkpoint"
        )
    try:
        with _quiet_dtype_deprecation():
            pipeline = StableDiffusionXLPipeline.from_pretrained(  # type: ignore[no-untyped-call]
                str(folder), local_files_only=True, torch_dtype=torch_dtype
            )
    except Exception as exc:  # diffusers raises many types; all mean "cannot load this"
        raise ModelLoadError(
            f"could not load the diffusers folder {str(folder)!r} as an SDXL pipeline: "
            f"{type(exc).__name__}: {exc}. Check that it is a complete "
            "StableDiffusionXLPipeline folder (unet, vae, text_encoder, text_encoder_2, "
            "tokenizer, tokenizer_2, scheduler)"
        ) from exc
    return _check_pipeline(pipeline, str(folder))


def _load_single_file(
    path: Path, torch_dtype: torch.dtype, config: Path | None
) -> StableDiffusionXLPipeline:
    """Load a single-file SDXL checkpoint offline, with a local config folder."""
    from diffusers import StableDiffusionXLPipeline

    if path.suffix.lower() != ".safetensors":
        raise ModelLoadError(
            f"single-file model {str(path)!r} is not a .safetensors file; only safetensors "
            "checkpoints are loaded (pickled .ckpt files can run code). Convert it, or set "
            "GENAUG_MODEL to a diffusers folder"
        )
    if config is None:
        config = _cached_single_file_config(path)
    else:
        config = config.expanduser()
        if not (config / "model_index.json").is_file():
            raise ModelLoadError(
                f"single-file config folder {str(config)!r} has no model_index.json; set "
                "GENAUG_SINGLE_FILE_CONFIG to a diffusers SDXL folder (configs and "
                "tokenizers; weights are not needed)"
            )
    try:
        # A local folder as `config` keeps diffusers from its hub fallback, which would
        # otherwise override local_files_only when nothing is cached.
        with _quiet_dtype_deprecation():
            pipeline = StableDiffusionXLPipeline.from_single_file(
                str(path),
                config=str(config),
                local_files_only=True,
                torch_dtype=torch_dtype,
            )
    except Exception as exc:  # diffusers raises many types; all mean "cannot load this"
        raise ModelLoadError(
            f"could not load the single-file checkpoint {str(path)!r} with the config folder "
            f"{str(config)!r}: {type(exc).__name__}: {exc}. Check that the checkpoint is an "
            "SDXL base checkpoint matching that config (GENAUG_SINGLE_FILE_CONFIG)"
        ) from exc
    return _check_pipeline(pipeline, str(path))


def _cached_single_file_config(path: Path) -> Path:
    """Find the diffusers config for a single-file checkpoint in the local HF cache only."""
    from diffusers.loaders.single_file_utils import fetch_diffusers_config
    from huggingface_hub import snapshot_download
    from safetensors import safe_open

    hint = (
        "set GENAUG_SINGLE_FILE_CONFIG to a local diffusers SDXL folder (model_index.json, "
        "component config.json files and tokenizers; weights are not needed), e.g. "
        "stabilityai/stable-diffusion-xl-base-1.0 without its weight files"
    )
    try:
        with safe_open(str(path), framework="pt") as handle:
            # Detection reads a few keys and shapes; a lazy view avoids loading gigabytes.
            detected = fetch_diffusers_config(_LazyTensors(handle))  # type: ignore[no-untyped-call]
        repo_id = str(detected["pretrained_model_name_or_path"])
    except Exception as exc:
        raise ModelLoadError(
            f"could not read the single-file checkpoint {str(path)!r} to detect its "
            f"architecture: {type(exc).__name__}: {exc}; {hint}"
        ) from exc
    try:
        folder = snapshot_download(repo_id, allow_patterns=_CONFIG_PATTERNS, local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(
            f"the single-file checkpoint {str(path)!r} needs the pipeline config of "
            f"{repo_id!r}, which is not in the local Hugging Face cache and is never "
            f"downloaded; {hint}"
        ) from exc
    return Path(folder)


class _LazyTensors(Mapping[str, torch.Tensor]):
    """Read-only mapping over an open safetensors file that loads a tensor only when indexed."""

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


@contextlib.contextmanager
def _quiet_dtype_deprecation() -> Iterator[None]:
    """Silence diffusers' ``torch_dtype`` -> ``dtype`` rename warning.

    ``torch_dtype`` is kept because it works on every supported diffusers (>=0.31).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
        yield


def _check_pipeline(pipeline: Any, where: str) -> StableDiffusionXLPipeline:
    """Make sure what diffusers returned is an SDXL text-to-image pipeline."""
    from diffusers import StableDiffusionXLPipeline

    if not isinstance(pipeline, StableDiffusionXLPipeline):
        raise ModelLoadError(
            f"{where!r} loaded as {type(pipeline).__name__}, not StableDiffusionXLPipeline; "
            "genaug serves SDXL base models"
        )
    return pipeline


def _read_unet_weights(path: Path) -> dict[str, torch.Tensor]:
    """Read a UNet state dict from safetensors or a tensors-only pickle."""
    if not path.is_file():
        raise ModelLoadError(
            f"UNet weights file {str(path)!r} does not exist; set GENAUG_UNET_WEIGHTS to a "
            ".safetensors or .pt/.pth/.bin file, or leave it unset"
        )
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            loaded: Any = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(
                f"UNet weights {str(path)!r} are not a readable safetensors file: {exc}"
            ) from exc
    elif suffix in _PICKLE_SUFFIXES:
        try:
            # weights_only=True unpickles tensors and plain containers only; anything else
            # (a __reduce__ that would run code) is refused before it is constructed.
            loaded = torch.load(str(path), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise ModelLoadError(
                f"refused to load UNet weights {str(path)!r}: the file holds objects other "
                "than tensors, and arbitrary pickles can run code, so the service only uses "
                "torch.load(weights_only=True). If you made or trust this file, convert it "
                f"once: genaug convert-unet {str(path)!r} unet.safetensors --trust-this-file "
                "(it finds the UNet inside common checkpoint wrappers and checks it against "
                "the base model), then set GENAUG_UNET_WEIGHTS to the .safetensors file. Or "
                "save a plain state dict (torch.save(unet.state_dict(), path)). "
                f"Detail: {str(exc).splitlines()[0]}"
            ) from exc
        except (RuntimeError, OSError, EOFError, ValueError) as exc:
            raise ModelLoadError(
                f"UNet weights {str(path)!r} could not be read by torch.load: {exc}"
            ) from exc
    else:
        raise ModelLoadError(
            f"UNet weights {str(path)!r} have an unknown extension {suffix!r}; use "
            ".safetensors (preferred) or .pt/.pth/.bin (GENAUG_UNET_WEIGHTS)"
        )
    return _tensor_state_dict(loaded, path)


def _tensor_state_dict(loaded: Any, path: Path) -> dict[str, torch.Tensor]:
    """Unwrap ``{"state_dict": ...}`` / ``{"unet": ...}`` and check every value is a tensor."""
    if isinstance(loaded, Mapping):
        for key in ("state_dict", "unet"):
            inner = loaded.get(key)
            if isinstance(inner, Mapping):
                loaded = inner
                break
    if not isinstance(loaded, Mapping) or not loaded:
        raise ModelLoadError(
            f"UNet weights {str(path)!r} hold {type(loaded).__name__}, not a state dict; "
            "expected a mapping of parameter names to tensors (optionally under a "
            "'state_dict' or 'unet' key)"
        )
    bad = [str(k) for k, v in loaded.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ModelLoadError(
            f"UNet weights {str(path)!r} are not a state dict of tensors: {len(bad)} "
            f"non-tensor entries, e.g. {_few(bad)}"
        )
    return {str(k): v for k, v in loaded.items()}


def _apply_unet_weights(unet: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """Load ``state`` into the pipeline's UNet strictly, with a readable error."""
    expected = unet.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ModelLoadError(
            f"UNet weights {str(path)!r} do not match the model's UNet: {len(missing)} "
            f"missing keys (e.g. {_few(missing)}), {len(unexpected)} unexpected keys "
            f"(e.g. {_few(unexpected)}). They must be a diffusers UNet2DConditionModel "
            "state dict for this architecture (GENAUG_UNET_WEIGHTS / GENAUG_MODEL)"
        )
    mismatched = [k for k, v in state.items() if tuple(v.shape) != tuple(expected[k].shape)]
    if mismatched:
        k = mismatched[0]
        raise ModelLoadError(
            f"UNet weights {str(path)!r} do not match the model's UNet: {len(mismatched)} "
            f"tensors have other shapes, e.g. {k} {tuple(state[k].shape)} vs "
            f"{tuple(expected[k].shape)} (GENAUG_UNET_WEIGHTS / GENAUG_MODEL)"
        )
    unet.load_state_dict(state, strict=True)


def _few(names: list[str], limit: int = 4) -> str:
    """Up to ``limit`` names for an error message."""
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown + (", ..." if len(names) > limit else "")


def _weight_files(folder: Path) -> list[Path]:
    """All weight files under a diffusers folder, in sorted relative-path order."""
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in _WEIGHT_SUFFIXES]
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())


def _hash_files(hasher: Any, files: Iterable[Path], *, root: Path | None = None) -> None:
    """Feed each file's size and bytes (streamed in big chunks) to ``hasher``.

    With ``root``, the path relative to it goes in too (which file of a folder is which
    component matters); a lone file is hashed by content only, so renaming it changes nothing.
    """
    for path in files:
        if root is not None:
            hasher.update(path.relative_to(root).as_posix().encode() + b"\0")
        hasher.update(str(path.stat().st_size).encode() + b"\0")
        with path.open("rb") as fh:
            while chunk := fh.read(_HASH_CHUNK):
                hasher.update(chunk)


def _hash_pipeline_state(hasher: Any, pipeline: Any) -> None:
    """Feed every component's tensors (name, dtype, shape, bytes) in sorted key order."""
    for name in ("text_encoder", "text_encoder_2", "unet", "vae"):
        state = getattr(pipeline, name).state_dict()
        for key in sorted(state):
            tensor = state[key].detach().to("cpu").contiguous().reshape(-1)
            header = f"{name}.{key}|{tensor.dtype}|{tuple(tensor.shape)}\0"
            hasher.update(header.encode())
            hasher.update(tensor.view(torch.uint8).numpy().tobytes())
