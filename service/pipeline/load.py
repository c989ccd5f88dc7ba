"""Load the SDXL pipeline the service runs: a built-in tiny model, a diffusers folder, a file.

``GENAUG_MODEL`` names one of:

* ``tiny-digits`` (also when unset): the embedded default, the tiny SDXL-architecture
  pipeline of :mod:`genaug.service.pipeline.tiny` with weights trained on scikit-learn's handwritten
  digits (package data, made by ``tools/train_tiny_generator.py``);
* ``tiny-digits-base``: the same, trained on digits 0-4 only (package data too): a base that
  never saw the target classes 5-9, for ``genaug adapt`` to teach them;
* ``tiny-random``: the same architecture with fixed-seed random weights (tests);
* a local diffusers folder (``model_index.json``) or a single ``.safetensors`` SDXL checkpoint.

Everything here is offline (``local_files_only=True``; nothing is fetched from a hub) and
refuses to unpickle arbitrary objects: fine-tuned UNet weights are read by
:mod:`~genaug.service.pipeline.weights` from safetensors or with
``torch.load(weights_only=True)`` (``genaug convert-unet`` turns any other checkpoint into
safetensors, on the user's say-so). The device and dtype come from
:mod:`~genaug.service.pipeline.device`. Every failure is a :class:`ModelLoadError` whose
message names what was wrong and the setting that fixes it.

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

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..settings import builtin_model
from .device import ModelLoadError, resolve_device, resolve_dtype
from .quiet import quiet_dtype_deprecation, quiet_third_party
from .weights import (
    WRAPPER_KEYS,
    CheckpointError,
    LazyTensors,
    NoUnetState,
    PickleRefused,
    compare_shapes,
    find_unet_state,
    hash_pipeline_state,
    hash_source_files,
    hash_unet_override,
    read_checkpoint,
)

if TYPE_CHECKING:
    from diffusers import StableDiffusionXLPipeline

    from .acceleration_options import AccelerationOptions

__all__ = ["MODEL_KINDS", "LoadedModel", "ModelLoadError", "ModelState", "load_model"]

log = logging.getLogger(__name__)

_PICKLE_SUFFIXES = (".pt", ".pth", ".bin")  # GENAUG_UNET_WEIGHTS read with weights_only=True
# Files diffusers itself fetches for a single-file checkpoint's pipeline config (no weights).
_CONFIG_PATTERNS = ["**/*.json", "*.json", "*.txt", "**/*.txt", "**/*.model"]
_TRAINED_ON = "trained_on.json"  # next to model_index.json: what a folder was trained on

MODEL_KINDS = ("tiny-digits", "tiny-digits-base", "tiny-random", "diffusers", "single-file")
"""Every value of :attr:`LoadedModel.kind` (``/v1/info`` ``model.kind``)."""


@dataclass
class ModelState:
    """What genaug made of a loaded pipeline, owned by its :class:`LoadedModel` (nothing is
    hung on the diffusers pipeline itself).

    Attributes:
        turbo_unet: ``GENAUG_TURBO_LORA`` fused into a copy of the UNet
            (:func:`~genaug.service.pipeline.turbo_unet.attach_turbo`), or None: the UNet
            ``speed="turbo"`` batches run.
        acceleration: the acceleration options applied to the pipeline's modules (fused
            projections, layout, FP8, compiled UNets: they cannot be undone), or None
            (:func:`~genaug.service.pipeline.acceleration.apply_acceleration`).
        attention_backend: the attention kernel chosen on this device (``default``: torch's
            own order).
        quantized_layers: the UNet's FP8 linear layers.
    """

    turbo_unet: Any | None = None
    acceleration: AccelerationOptions | None = None
    attention_backend: str = "default"
    quantized_layers: int = 0


@dataclass(frozen=True)
class LoadedModel:
    """A loaded pipeline and what it is.

    Attributes:
        pipeline: the ``StableDiffusionXLPipeline``, on ``device`` in ``dtype``, progress
            bar disabled.
        kind: one of :data:`MODEL_KINDS`: ``"tiny-digits"``, ``"tiny-digits-base"``,
            ``"tiny-random"``, ``"diffusers"`` (a folder) or ``"single-file"``.
        source: the built-in model's name or the path it was loaded from.
        weights_hash: 16 hex chars, a content hash of the weights, fine-tuned UNet included.
            Equal hashes mean equal weights; use it to key anything cached from this model.
        device: the torch device the pipeline runs on.
        dtype: the floating-point type of its weights.
        trained_on: what the weights were trained on (data set, split, steps, script
            version, seed, labels, ...) for ``tiny-digits``, ``tiny-digits-base`` and for
            folders written by ``tools/train_tiny_generator.py`` (its ``trained_on.json``);
            ``None`` when unknown. A ``unet_weights`` override leaves it as the base's.
        state: what genaug made of the pipeline (:class:`ModelState`): its turbo UNet and
            the acceleration applied. A model copied with another pipeline
            (``dataclasses.replace(model, pipeline=...)``) starts with a state of its own.
    """

    pipeline: StableDiffusionXLPipeline
    kind: str
    source: str
    weights_hash: str
    device: torch.device
    dtype: torch.dtype
    trained_on: dict[str, Any] | None = None
    state: ModelState = field(default_factory=ModelState, init=False, compare=False,
                              repr=False)


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
            ``"tiny-digits-base"`` for the one trained on digits 0-4 only,
            ``"tiny-random"`` for the random-weight one; else a path: a diffusers folder
            (with ``model_index.json``) or a single ``.safetensors`` SDXL checkpoint. A
            folder named like a built-in is reached as ``./tiny-digits``.
        unet_weights: optional fine-tuned UNet state dict (diffusers key names) as
            ``.safetensors`` or as ``.pt``/``.pth``/``.bin`` holding only tensors and plain
            containers: found at the top level or under a wrapper key (``"state_dict"``,
            ``"unet"``, ... :data:`~genaug.service.pipeline.weights.WRAPPER_KEYS`), training
            prefixes stripped. Loaded strictly.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``
            (see :func:`~genaug.service.pipeline.device.resolve_device`).
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
    quiet_third_party()  # before diffusers is imported: see quiet.py
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
        hash_pipeline_state(hasher, pipeline)
    elif builtin in ("tiny-digits", "tiny-digits-base"):
        from .tiny import TinyWeightsError, build_tiny_digits_pipeline

        try:
            pipeline, trained_on = build_tiny_digits_pipeline(model=builtin)
        except TinyWeightsError as exc:
            raise ModelLoadError(
                f"{exc}; reinstall genaug, or set GENAUG_MODEL=tiny-random (random weights) "
                "or a local model path"
            ) from exc
        kind = source_name = builtin
        hash_pipeline_state(hasher, pipeline)
        hasher.update(f"scaling_factor={pipeline.vae.config.scaling_factor!r}".encode())
    else:
        assert source is not None  # None is the default built-in
        source = Path(source).expanduser()
        source_name = str(source)
        if source.is_dir():
            kind = "diffusers"
            pipeline = _load_folder(source, torch_dtype)
            hash_source_files(hasher, source)
            trained_on = _read_trained_on(source)
        elif source.is_file():
            kind = "single-file"
            pipeline = _load_single_file(source, torch_dtype, single_file_config)
            hash_source_files(hasher, source)
        else:
            raise ModelLoadError(
                f"model source {source_name!r} does not exist; set GENAUG_MODEL to a local "
                "diffusers folder (with model_index.json) or a single .safetensors SDXL "
                "checkpoint, or leave it unset for the built-in tiny model (tiny-digits; "
                "tiny-digits-base for the one trained on digits 0-4 only; tiny-random for "
                "random weights)"
            )

    if unet_weights is not None:
        unet_weights = unet_weights.expanduser()
        _apply_unet_weights(pipeline.unet, unet_weights)
        hash_unet_override(hasher, unet_weights)

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
        with quiet_dtype_deprecation():
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
        with quiet_dtype_deprecation():
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
            detected = fetch_diffusers_config(LazyTensors(handle))  # type: ignore[no-untyped-call]
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


def _check_pipeline(pipeline: Any, where: str) -> StableDiffusionXLPipeline:
    """Make sure what diffusers returned is an SDXL text-to-image pipeline."""
    from diffusers import StableDiffusionXLPipeline

    if not isinstance(pipeline, StableDiffusionXLPipeline):
        raise ModelLoadError(
            f"{where!r} loaded as {type(pipeline).__name__}, not StableDiffusionXLPipeline; "
            "genaug serves SDXL base models"
        )
    return pipeline


def _read_unet_weights(
    path: Path, expected: Mapping[str, tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    """The UNet state dict in ``path`` (safetensors or a tensors-only pickle), never unpickling
    code; a state dict with anything but tensors next to its tensors is refused."""
    if not path.is_file():
        raise ModelLoadError(
            f"UNet weights file {str(path)!r} does not exist; set GENAUG_UNET_WEIGHTS to a "
            ".safetensors or .pt/.pth/.bin file, or leave it unset"
        )
    suffix = path.suffix.lower()
    if suffix != ".safetensors" and suffix not in _PICKLE_SUFFIXES:
        raise ModelLoadError(
            f"UNet weights {str(path)!r} have an unknown extension {suffix!r}; use "
            ".safetensors (preferred) or .pt/.pth/.bin (GENAUG_UNET_WEIGHTS)"
        )
    try:
        loaded = read_checkpoint(path)  # never unpickles code
    except PickleRefused as exc:
        raise ModelLoadError(
            f"refused to load UNet weights {str(path)!r}: the file holds objects other "
            "than tensors, and arbitrary pickles can run code, so the service only uses "
            "torch.load(weights_only=True). If you made or trust this file, convert it "
            f"once: genaug convert-unet {str(path)!r} unet.safetensors --trust-this-file "
            "(it finds the UNet inside common checkpoint wrappers and checks it against "
            "the base model), then set GENAUG_UNET_WEIGHTS to the .safetensors file. Or "
            "save a plain state dict (torch.save(unet.state_dict(), path)). "
            f"Detail: {exc.detail}"
        ) from exc
    except CheckpointError as exc:
        raise ModelLoadError(f"UNet weights file {str(path)!r} {exc.reason}") from exc
    try:
        found = find_unet_state(loaded, expected)
    except NoUnetState as exc:
        raise ModelLoadError(
            f"UNet weights {str(path)!r} hold {type(loaded).__name__}, not a state dict; "
            "expected a mapping of parameter names to tensors (at the top level or under "
            f"one of: {', '.join(WRAPPER_KEYS)})"
        ) from exc
    if found.ignored:
        raise ModelLoadError(
            f"UNet weights {str(path)!r} are not a state dict of tensors: "
            f"{len(found.ignored)} non-tensor entries, e.g. {_few(found.ignored)}"
        )
    return found.tensors


def _apply_unet_weights(unet: torch.nn.Module, path: Path) -> None:
    """Load the weights in ``path`` into the pipeline's UNet strictly, with a readable error."""
    expected = {k: tuple(v.shape) for k, v in unet.state_dict().items()}
    state = _read_unet_weights(path, expected)
    diff = compare_shapes(state, expected)
    if diff.missing or diff.unexpected:
        raise ModelLoadError(
            f"UNet weights {str(path)!r} do not match the model's UNet: {len(diff.missing)} "
            f"missing keys (e.g. {_few(diff.missing)}), {len(diff.unexpected)} unexpected keys "
            f"(e.g. {_few(diff.unexpected)}). They must be a diffusers UNet2DConditionModel "
            "state dict for this architecture (GENAUG_UNET_WEIGHTS / GENAUG_MODEL)"
        )
    if diff.mismatched:
        k, got, want = diff.mismatched[0]
        raise ModelLoadError(
            f"UNet weights {str(path)!r} do not match the model's UNet: {len(diff.mismatched)} "
            f"tensors have other shapes, e.g. {k} {got} vs {want} "
            "(GENAUG_UNET_WEIGHTS / GENAUG_MODEL)"
        )
    unet.load_state_dict(state, strict=True)


def _few(names: list[str], limit: int = 4) -> str:
    """Up to ``limit`` names for an error message."""
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown + (", ..." if len(names) > limit else "")
