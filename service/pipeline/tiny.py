"""The tiny SDXL-architecture pipeline, built fully offline: random weights or trained ones.

It is the real :class:`diffusers.StableDiffusionXLPipeline` code path (two CLIP text encoders,
pooled projection and ``text_time`` micro-conditioning, Euler scheduler, an 8x-downsampling
VAE), only with layer widths small enough that a batch of eight 64x64 images with
classifier-free guidance takes a fraction of a second on one CPU core. Three models share it:

* ``tiny-random`` (:func:`build_tiny_pipeline`): fixed-seed random weights. Its images are
  meaningless but a deterministic function of (seed, prompt, generation parameters): what
  tests need (``genaug.service.testing.load_tiny``).
* ``tiny-digits`` (:func:`build_tiny_digits_pipeline`, the service's default): the same
  modules with the weights shipped as package data (``weights/tiny_digits.safetensors``),
  trained by ``tools/train_tiny_generator.py`` on scikit-learn's handwritten digits; it draws
  the digit its prompt names (``recipes/digits.yaml``: "a handwritten three").
* ``tiny-digits-base`` (``build_tiny_digits_pipeline(model="tiny-digits-base")``): the same,
  trained the same way on digits 0-4 only (``weights/tiny_digits_base.safetensors``): a
  stand-in for a foundation model that has never seen the target classes 5-9, the base that
  ``genaug adapt`` teaches them to. Its text encoders take every prompt; it draws 0-4.

Example::

    import torch
    from genaug.service.pipeline.tiny import build_tiny_pipeline

    pipe = build_tiny_pipeline()
    out = pipe(
        ["a cat", "a dog"],
        num_inference_steps=4,
        guidance_scale=5.0,
        generator=[torch.Generator().manual_seed(s) for s in (1, 2)],
        output_type="np",
    )
    out.images.shape  # (2, 64, 64, 3)
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .quiet import quiet_third_party

if TYPE_CHECKING:
    import torch
    from diffusers import StableDiffusionXLPipeline

__all__ = [
    "TINY_IMAGE_SIZE",
    "TINY_WEIGHT_FILES",
    "TinyWeightsError",
    "assemble_sdxl",
    "build_tiny_digits_pipeline",
    "build_tiny_pipeline",
    "tiny_digits_weights",
    "tiny_tokenizer_dir",
]

log = logging.getLogger(__name__)

#: Default (and intended) generation size of the tiny pipeline: 64x64 pixels, 8x8 latents.
TINY_IMAGE_SIZE = 64

# Text encoder widths differ on purpose, like SDXL's 768 + 1280: the UNet's cross-attention
# width is their concatenation, so a wiring mistake fails loudly instead of by coincidence.
_TEXT_HIDDEN_1 = 32
_TEXT_HIDDEN_2 = 64
_TEXT_PROJECTION_DIM = 32  # text_encoder_2's pooled projection (SDXL: 1280)
_ADDITION_TIME_EMBED_DIM = 8  # SDXL: 256; six micro-conditioning numbers each get this width
_VOCAB_SIZE = 514  # 256 bytes + 256 end-of-word bytes + <|startoftext|> + <|endoftext|>
_MAX_TOKENS = 77  # CLIP context length, as in SDXL (prompt truncation behaves the same)
TINY_WEIGHT_FILES = {
    "tiny-digits": "tiny_digits.safetensors",
    "tiny-digits-base": "tiny_digits_base.safetensors",
}
"""The built-in models with packaged trained weights, and their files under ``weights/``
(each with its training record next to it as ``<stem>.json``)."""


def tiny_tokenizer_dir() -> str:
    """Return the filesystem path of the byte-level CLIP tokenizer files shipped as package data.

    The folder holds ``vocab.json`` (every byte, with and without the ``</w>`` end-of-word
    suffix, plus the two CLIP special tokens), an empty ``merges.txt`` and a
    ``tokenizer_config.json``; :class:`transformers.CLIPTokenizer` loads it with no network.
    """
    folder = resources.files("genaug.service").joinpath("tiny_tokenizer")
    # The package is installed as plain files (wheel or editable), never zipped: the
    # Traversable is a real directory that transformers can open by path.
    return str(folder)


class TinyWeightsError(RuntimeError):
    """The packaged tiny-digits weights are missing or do not fit the tiny architecture."""


_COMPONENTS = ("unet", "vae", "text_encoder", "text_encoder_2")


def tiny_digits_weights(model: str = "tiny-digits") -> Path:
    """Path of a built-in model's packaged weights (``tiny-digits``:
    ``weights/tiny_digits.safetensors``; ``tiny-digits-base``: ``tiny_digits_base.safetensors``).

    One safetensors file with every component's state dict (keys prefixed ``unet.``,
    ``vae.``, ``text_encoder.``, ``text_encoder_2.``) and, in its header, the VAE's
    ``scaling_factor`` and the training record (``trained_on``, JSON).
    """
    if model not in TINY_WEIGHT_FILES:
        raise ValueError(f"no packaged weights for {model!r}; built-ins with trained weights: "
                         f"{sorted(TINY_WEIGHT_FILES)}")
    files = resources.files("genaug.service").joinpath("weights", TINY_WEIGHT_FILES[model])
    return Path(str(files))


def build_tiny_digits_pipeline(
    *, batch_invariant: bool = True, weights: Path | None = None, model: str = "tiny-digits"
) -> tuple[StableDiffusionXLPipeline, dict[str, Any]]:
    """The ``tiny-digits`` pipeline: :func:`build_tiny_pipeline`'s modules, trained weights.

    Args:
        batch_invariant: as for :func:`build_tiny_pipeline`.
        weights: a file in the format of :func:`tiny_digits_weights` (default: that of
            ``model``), e.g. ``OUT/tiny_digits.safetensors`` of a training run.
        model: the built-in whose packaged weights to load when ``weights`` is ``None``
            (``"tiny-digits"`` or ``"tiny-digits-base"``, :data:`TINY_WEIGHT_FILES`); also
            the name error messages use.

    Returns:
        The pipeline and its training record (data set, split, labels, steps, seed, script
        version).

    Raises:
        TinyWeightsError: the file is missing, unreadable, or does not fit the architecture.
    """
    from safetensors import SafetensorError, safe_open

    path = weights or tiny_digits_weights(model)
    if not path.is_file():
        raise TinyWeightsError(f"the {model} weights {str(path)!r} are missing")
    pipeline: Any = build_tiny_pipeline(batch_invariant=batch_invariant)
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
            state = {key: handle.get_tensor(key) for key in handle.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise TinyWeightsError(
            f"the {model} weights {str(path)!r} are unreadable: {exc}"
        ) from exc
    for name in _COMPONENTS:
        prefix = name + "."
        part = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        try:
            getattr(pipeline, name).load_state_dict(part, strict=True)
        except RuntimeError as exc:
            raise TinyWeightsError(
                f"the {model} weights {str(path)!r} do not fit the tiny {name}: "
                f"{str(exc).splitlines()[0]}"
            ) from exc
    try:
        scaling = float(meta["scaling_factor"])
        trained_on = json.loads(meta.get("trained_on", "{}"))
    except (KeyError, ValueError) as exc:
        raise TinyWeightsError(
            f"the {model} weights {str(path)!r} lack a valid scaling_factor/trained_on "
            f"header: {exc!r}"
        ) from exc
    pipeline.vae.register_to_config(scaling_factor=scaling)
    log.debug("loaded %s weights from %s (scaling factor %g)", model, path, scaling)
    return pipeline, trained_on


def build_tiny_pipeline(
    seed: int = 0, *, batch_invariant: bool = True
) -> StableDiffusionXLPipeline:
    """Build the tiny SDXL-architecture pipeline on the CPU in float32, offline.

    Weights are drawn from a private RNG seeded with ``seed`` (the caller's global torch RNG
    state is left untouched), so two builds with the same seed have bit-identical weights.
    Components: ``UNet2DConditionModel`` (``addition_embed_type="text_time"``),
    ``AutoencoderKL`` (4 blocks, 8x downsampling), ``CLIPTextModel`` +
    ``CLIPTextModelWithProjection``, two ``CLIPTokenizer`` loaded from
    :func:`tiny_tokenizer_dir`, and ``EulerDiscreteScheduler`` with SDXL's schedule.

    Batch invariance: on the CPU, oneDNN convolutions and MKL GEMMs pick different kernels
    for different batch sizes (a 2-D ``Linear`` with 1-3 rows, such as the UNet's timestep
    and ``text_time`` embeddings or CLIP's pooled projection, and a batch-1 convolution differ
    from the batched result by about 1e-7), so an image generated alone and the same seed in
    a batch of eight differ by ~1e-6 and occasionally by one uint8 level. With
    ``batch_invariant=True`` (the default) the UNet, both text encoders, VAE encoder and decoder
    evaluate each batch element separately, with identical shapes, so an image is a
    bit-identical function of its own seed and prompt, never of its batch mates. The
    pipeline's ``__call__`` path is unchanged; only these modules' calls are wrapped.

    Args:
        seed: seed of the random weight initialization.
        batch_invariant: evaluate the modules per batch element (see above).

    Returns:
        A ``StableDiffusionXLPipeline`` whose default generation size is 64x64.
    """
    quiet_third_party()  # before diffusers is imported: see quiet.py
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, UNet2DConditionModel
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        CLIPTextModelWithProjection,
        CLIPTokenizer,
    )

    # The token ids the text encoders are built for (assemble_sdxl loads the pipeline's own).
    tokenizer = CLIPTokenizer.from_pretrained(tiny_tokenizer_dir(), local_files_only=True)

    def text_config(hidden: int, heads: int) -> CLIPTextConfig:
        return CLIPTextConfig(
            vocab_size=_VOCAB_SIZE,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=3,  # SDXL reads the penultimate layer: needs at least 2
            num_attention_heads=heads,
            max_position_embeddings=_MAX_TOKENS,
            hidden_act="gelu",
            layer_norm_eps=1e-5,
            projection_dim=_TEXT_PROJECTION_DIM,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = CLIPTextModel(text_config(_TEXT_HIDDEN_1, heads=2))
        text_encoder_2 = CLIPTextModelWithProjection(text_config(_TEXT_HIDDEN_2, heads=4))
        unet = UNet2DConditionModel(  # type: ignore[no-untyped-call]
            sample_size=TINY_IMAGE_SIZE // 8,
            in_channels=4,
            out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            block_out_channels=(16, 32),
            layers_per_block=1,
            norm_num_groups=8,
            attention_head_dim=(2, 4),  # diffusers' name for the number of heads
            transformer_layers_per_block=(1, 1),
            use_linear_projection=True,
            cross_attention_dim=_TEXT_HIDDEN_1 + _TEXT_HIDDEN_2,
            addition_embed_type="text_time",
            addition_time_embed_dim=_ADDITION_TIME_EMBED_DIM,
            projection_class_embeddings_input_dim=(
                _TEXT_PROJECTION_DIM + 6 * _ADDITION_TIME_EMBED_DIM
            ),
        )
        vae = AutoencoderKL(  # type: ignore[no-untyped-call]
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            block_out_channels=(8, 8, 16, 16),
            layers_per_block=1,
            norm_num_groups=4,
            latent_channels=4,
            sample_size=TINY_IMAGE_SIZE,
            scaling_factor=0.13025,  # SDXL's VAE scaling factor
        )

    scheduler = EulerDiscreteScheduler(  # type: ignore[no-untyped-call]
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        prediction_type="epsilon",
        timestep_spacing="leading",
        steps_offset=1,
    )
    pipeline = assemble_sdxl(unet, vae, text_encoder, text_encoder_2, scheduler)
    if batch_invariant:
        # Instance attributes shadow the bound methods; save_pretrained/state dicts and
        # .to(device, dtype) are unaffected.
        for module in (pipeline.unet, pipeline.text_encoder, pipeline.text_encoder_2):
            module.forward = _per_sample(module.forward)
        pipeline.vae.decode = _per_sample(pipeline.vae.decode)
        pipeline.vae.encode = _per_sample(pipeline.vae.encode)  # img2img sources (engine)
    log.debug("built tiny SDXL pipeline (seed=%d, batch_invariant=%s)", seed, batch_invariant)
    result: StableDiffusionXLPipeline = pipeline
    return result


def assemble_sdxl(
    unet: Any,
    vae: Any,
    text_encoder: Any,
    text_encoder_2: Any,
    scheduler: Any,
    *,
    force_zeros_for_empty_prompt: bool = True,
) -> Any:
    """An SDXL pipeline of these modules, ready to run: both tokenizers loaded from
    :func:`tiny_tokenizer_dir` (SDXL's CLIP vocabulary), no watermarker, every module in eval
    mode, no progress bar. The tiny pipeline is put together here, and so is the GPU
    benchmark's random-weight SDXL base (``bench/gpu/gpu_sdxl.py``).

    Returns ``Any``: diffusers is untyped, mypy would see none of the pipeline's component
    attributes.
    """
    from diffusers import StableDiffusionXLPipeline
    from transformers import CLIPTokenizer

    tokenizer_dir = tiny_tokenizer_dir()
    pipeline: Any = StableDiffusionXLPipeline(  # type: ignore[no-untyped-call]
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=CLIPTokenizer.from_pretrained(tokenizer_dir, local_files_only=True),
        tokenizer_2=CLIPTokenizer.from_pretrained(tokenizer_dir, local_files_only=True),
        unet=unet,
        scheduler=scheduler,
        force_zeros_for_empty_prompt=force_zeros_for_empty_prompt,
        add_watermarker=False,
    )
    for module in (pipeline.unet, pipeline.vae, pipeline.text_encoder, pipeline.text_encoder_2):
        module.eval()
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


class PerSample:
    """``inner(batch, *args, **kwargs)`` run once per element of ``batch``, concatenated.

    Every tensor argument (also inside dicts, lists and tuples) whose leading dimension equals
    the batch size of the first argument is sliced to that element and copied to fresh,
    aligned memory, so each call sees exactly the shapes and alignment it would see alone.
    ``inner`` may be replaced (the acceleration options compile it: every call it sees is a batch of
    one, so one compile serves every batch size).
    """

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner
        functools.update_wrapper(self, inner)

    def __call__(self, batch: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        n = int(batch.shape[0])
        parts = [
            self.inner(
                _take(batch, i, n),
                *(_take(a, i, n) for a in args),
                **{k: _take(v, i, n) for k, v in kwargs.items()},
            )
            for i in range(n)
        ]
        return _concat(parts)


def _per_sample(fn: Callable[..., Any]) -> PerSample:
    """``fn`` run per element of its first argument's batch (:class:`PerSample`)."""
    return PerSample(fn)


def _take(obj: Any, i: int, n: int) -> Any:
    """Return element ``i`` of ``obj`` if it is batched with batch size ``n``, else ``obj``."""
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.dim() > 0 and obj.shape[0] == n:
            return obj[i : i + 1].clone(memory_format=torch.contiguous_format)
        return obj
    if isinstance(obj, dict):
        return {k: _take(v, i, n) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_take(v, i, n) for v in obj)
    return obj


def _concat(parts: list[Any]) -> Any:
    """Concatenate per-element outputs (tensors, tuples, ``ModelOutput``/``BaseOutput``)."""
    import torch
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    first = parts[0]
    if isinstance(first, DiagonalGaussianDistribution):  # vae.encode's posterior (engine)
        params = torch.cat([p.parameters for p in parts])
        return DiagonalGaussianDistribution(params, deterministic=first.deterministic)
    if isinstance(first, torch.Tensor):
        return torch.cat(parts) if first.dim() > 0 else first
    if isinstance(first, dict):  # transformers ModelOutput and diffusers BaseOutput included
        return type(first)(**{k: _concat([p[k] for p in parts]) for k in first})
    if isinstance(first, list | tuple):
        return type(first)(_concat(list(group)) for group in zip(*parts, strict=True))
    return first
