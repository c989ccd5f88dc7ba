"""The acceleration options (``GENAUG_*`` settings, all off by default): what each does, how
they are written (:meth:`AccelerationOptions.parse`, :meth:`AccelerationOptions.from_settings`)
and which values or combinations are refused, each in one line
(:class:`~genaug.service.pipeline.errors.AccelerationError`). The options:

- ``compile``: ``off``; ``unet`` (``torch.compile`` of the whole UNet); ``regional`` (only the
  UNet's repeated transformer blocks, as diffusers' ``compile_repeated_blocks``: one compiled
  block serves all 70 of SDXL's, so warm-up is several times shorter for most of the gain).
  The batch dimension is dynamic and a UNet batch of 1 is run as 2
  (:class:`~genaug.service.pipeline.compiling.UNetCall`): each generation size compiles once,
  whatever the batch sizes and adapters; what compiling made is kept in
  ``GENAUG_COMPILE_CACHE`` (:mod:`~genaug.service.pipeline.compile_cache`).
- ``compile_mode``: torch.compile's ``mode``. ``reduce-overhead`` and ``max-autotune`` replay
  CUDA graphs (no launch gaps between the kernels of a step; ``max-autotune`` also benchmarks
  kernel choices at compile time), with ``compile=unet`` only: each UNet call is marked a new
  step and its output copied (:class:`~genaug.service.pipeline.compiling.UNetCall`), so nothing
  of one replay is read after the next. With ``regional`` one compiled block replays many
  times inside one UNet call and each replay would overwrite the last one's output: refused at
  start in one line. A graph is recorded per shape and holds its memory, so with them the
  batch sizes are kept to a small set (:func:`~genaug.service.pipeline.warmup.batch_sizes`:
  powers of two up to ``max_batch_images``): a batch is padded to the next size
  (:class:`~genaug.service.pipeline.tracked.PaddedWorker`; the padding rows' images are
  discarded) and warm-up records every size, so serving records nothing new.
- ``quantize``: ``fp8``, the UNet's large linear layers in float8 with per-row scales
  (:mod:`~genaug.service.pipeline.quantize`; torchao, compute capability 8.9 or more);
  ``fp8-conv``, its convolutions too (:mod:`~genaug.service.pipeline.fp8_conv`).
- ``attention``: the ``scaled_dot_product_attention`` kernel
  (:mod:`~genaug.service.pipeline.attention`); ``auto`` is the fastest the device has.
- ``channels_last``: UNet and VAE weights in NHWC memory layout (faster convolutions on
  tensor cores).
- ``fuse_qkv``: one matrix product for the query, key and value projections of each attention
  (key and value for cross-attention), in the UNet and the VAE.
- ``vae_slicing``: decode a batch one image at a time (lower peak memory, same images).
- ``vae_tiling``: decode in overlapping tiles when the latents exceed the VAE's own sample
  size (1024 px for SDXL, 64 px for the tiny model): much lower peak memory for large images;
  tiles are blended, so pixels differ slightly from an untiled decode.

Applying them to a loaded pipeline, the device checks before load and the lifespan's handle are
:mod:`~genaug.service.pipeline.acceleration`. The options are a value apart from that, so that the
benchmarks and the tests can name, parse and compare them without the machinery that changes
a model. Nothing here imports torch.

Example::

    AccelerationOptions.parse("compile=regional,channels_last").label
    # 'compile=regional+channels_last'
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from ..settings import regional_cuda_graphs_refusal
from .attention import ATTENTION_CHOICES, AttentionSetting
from .errors import AccelerationError
from .warmup import uses_cuda_graphs

if TYPE_CHECKING:
    from ..settings import Settings

CompileMode = Literal["off", "unet", "regional"]
COMPILE_MODES: tuple[CompileMode, ...] = ("off", "unet", "regional")
TorchCompileMode = Literal[
    "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
]
#: torch.compile's own ``mode`` names (GENAUG_COMPILE_MODE).
TORCH_COMPILE_MODES: tuple[TorchCompileMode, ...] = (
    "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
)
Quantize = Literal["none", "fp8", "fp8-conv"]
QUANTIZE_CHOICES: tuple[Quantize, ...] = ("none", "fp8", "fp8-conv")
# A bare option name in AccelerationOptions.parse: its value.
_BARE = {"compile": "unet", "compile_mode": "max-autotune", "quantize": "fp8",
         "attention": "auto"}


@dataclass(frozen=True)
class AccelerationOptions:
    """What to do to a loaded pipeline; all off by default.

    Example::

        options = AccelerationOptions(compile="regional", channels_last=True, fuse_qkv=True)
        options.enabled        # ['compile=regional', 'channels_last', 'fuse_qkv']
        AccelerationOptions.from_settings(Settings())  # all off but attention=auto

    ``attention`` defaults to ``default`` here (torch's own kernel order: what the benchmark's
    baseline runs) and to ``auto`` in the settings.
    """

    compile: CompileMode = "off"
    compile_mode: TorchCompileMode = "default"
    quantize: Quantize = "none"
    attention: AttentionSetting = "default"
    channels_last: bool = False
    fuse_qkv: bool = False
    vae_slicing: bool = False
    vae_tiling: bool = False

    def __post_init__(self) -> None:
        if self.compile not in COMPILE_MODES:
            raise AccelerationError(
                f"compile mode {self.compile!r} is not one of {', '.join(COMPILE_MODES)}; "
                "set GENAUG_COMPILE to one of those"
            )
        for value, allowed, setting in (
            (self.compile_mode, TORCH_COMPILE_MODES, "GENAUG_COMPILE_MODE"),
            (self.quantize, QUANTIZE_CHOICES, "GENAUG_QUANTIZE"),
            (self.attention, ATTENTION_CHOICES, "GENAUG_ATTENTION"),
        ):
            if value not in allowed:
                raise AccelerationError(
                    f"{setting}={value} is not one of {', '.join(allowed)}; set {setting} to "
                    "one of those"
                )
        if self.compile_mode != "default" and self.compile == "off":
            raise AccelerationError(
                f"GENAUG_COMPILE_MODE={self.compile_mode} needs compilation; set "
                "GENAUG_COMPILE=unet or regional, or GENAUG_COMPILE_MODE=default"
            )
        if self.compile == "regional" and uses_cuda_graphs(self.compile_mode):
            raise AccelerationError(regional_cuda_graphs_refusal(self.compile_mode))

    @property
    def cuda_graphs(self) -> bool:
        """The compiled UNet replays CUDA graphs (batches are padded to a few sizes)."""
        return self.compile != "off" and uses_cuda_graphs(self.compile_mode)

    @classmethod
    def from_settings(cls, settings: Settings) -> AccelerationOptions:
        """Each option is the setting of its name (``GENAUG_COMPILE``...)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    @classmethod
    def parse(cls, text: str) -> AccelerationOptions:
        """``"compile=regional,channels_last,fuse_qkv"`` (or ``"baseline"``/``""``: all off).
        A bare ``compile`` is ``compile=unet``, ``quantize`` is ``quantize=fp8``,
        ``compile_mode`` is ``compile_mode=max-autotune``, ``attention`` is ``attention=auto``."""
        values: dict[str, Any] = {}
        names = {f.name for f in fields(cls)}
        for raw in text.split(","):
            part = raw.strip()
            if not part or part in ("baseline", "off"):
                continue
            name, _, value = part.partition("=")
            name = name.strip()
            if name not in names:
                known = ", ".join(sorted(names))
                raise AccelerationError(
                    f"unknown acceleration option {name!r} in {text!r}; options: {known}")
            if name in _BARE:
                values[name] = value.strip() or _BARE[name]
            else:
                values[name] = value.strip().lower() not in ("false", "0", "off", "no")
        return cls(**values)

    @property
    def enabled(self) -> list[str]:
        """The options that are on, as short names (``[]`` for the baseline)."""
        defaults = {"compile": "off", "compile_mode": "default", "quantize": "none",
                    "attention": "default"}
        out = [f"{name}={getattr(self, name)}" for name, off in defaults.items()
               if getattr(self, name) != off]
        out += [f.name for f in fields(self) if f.name not in defaults and getattr(self, f.name)]
        return out

    @property
    def label(self) -> str:
        """``"baseline"`` or the enabled options joined by ``+``."""
        return "+".join(self.enabled) or "baseline"

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
