"""Service settings: one pydantic-settings class, read from ``GENAUG_*`` variables and CLI flags.

Nothing here is read at import time; ``Settings()`` reads the environment when constructed, and
``create_app(settings)`` receives the instance. This module declares the fields (their order and
descriptions are the flags of ``genaug serve``) and the rules between them; values written as
one string that holds several (warm-up shapes, LoRA lists, comma lists) are parsed in
:mod:`~genaug.service.settings.values`, and :class:`WarmupShape` is importable from both.

Example::

    settings = Settings(device="cpu", max_batch_images=8)
    app = create_app(settings)
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ..batching.names import SchedulerName
from .notify_url import allowed_hosts
from .values import (
    MIN_SECRET_CHARS,
    WarmupShape,
    check_lora_names,
    check_turbo,
    parse_loras,
    parse_warmup_shapes,
    split_commas,
)

TINY_DEFAULTS = {"size": 64, "steps": 4, "guidance": 5.0}
SDXL_DEFAULTS = {"size": 1024, "steps": 30, "guidance": 5.0}
#: What GENAUG_LOG_LEVEL may be (any case): the levels logging and uvicorn both know.
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

# -- digits --
# The built-in models GENAUG_MODEL may name instead of a path. tiny-digits (also: unset) is the
# embedded trained default; its defaults are those of recipes/digits.yaml, what it was trained
# and measured with. tiny-digits-base is the same trained on digits 0-4 only (a base that never
# saw the target classes 5-9; same defaults). tiny-random is the random-weight tiny pipeline the
# tests run.
DEFAULT_MODEL = "tiny-digits"
DIGITS_DEFAULTS = {"size": 64, "steps": 20, "guidance": 3.0}
BUILTIN_MODELS: dict[str, dict[str, float]] = {
    "tiny-digits": DIGITS_DEFAULTS,
    "tiny-digits-base": DIGITS_DEFAULTS,
    "tiny-random": TINY_DEFAULTS,
}


def regional_cuda_graphs_refusal(compile_mode: str) -> str:
    """The one line that refuses ``GENAUG_COMPILE=regional`` with a CUDA-graph mode (the
    settings and the pipeline's acceleration options both say it)."""
    return (
        f"GENAUG_COMPILE=regional cannot replay CUDA graphs (GENAUG_COMPILE_MODE="
        f"{compile_mode}): its one compiled transformer block replays many times within one "
        "UNet call, and each replay overwrites what the one before returned (RuntimeError: "
        "accessing tensor output of CUDAGraphs that has been overwritten); set "
        "GENAUG_COMPILE=unet for CUDA graphs, or GENAUG_COMPILE_MODE=default (or "
        "max-autotune-no-cudagraphs) with regional"
    )


def builtin_model(model: str | Path | None) -> str | None:
    """The built-in model ``model`` names (``None`` means the default), or ``None`` for a path.

    A folder that happens to be called ``tiny-digits`` is reached as ``./tiny-digits``.
    """
    if model is None:
        return DEFAULT_MODEL
    if isinstance(model, str) and model.strip() in BUILTIN_MODELS:
        return model.strip()
    return None


def model_path(model: str | Path | None) -> Path | None:
    """The local path ``model`` names, or ``None`` for a built-in model."""
    if model is None or builtin_model(model) is not None:
        return None
    return Path(model).expanduser()


class Settings(BaseSettings):
    """Everything the service process can be told. Environment prefix ``GENAUG_``."""

    model_config = SettingsConfigDict(env_prefix="GENAUG_", extra="forbid", frozen=True)

    # Model
    # -- digits --
    model: str | None = Field(
        default=None,
        description="tiny-digits (the default when unset: the embedded tiny SDXL pipeline "
        "trained on handwritten digits), tiny-digits-base (the same trained on digits 0-4 "
        "only, a base for adapting to 5-9), tiny-random (random weights, for tests), or a "
        "local diffusers folder or single .safetensors SDXL checkpoint.",
    )
    single_file_config: Path | None = Field(
        default=None,
        description="Local diffusers folder whose configs describe a single-file checkpoint "
        "(needed offline for GENAUG_MODEL=*.safetensors).",
    )
    unet_weights: Path | None = Field(
        default=None,
        description="Fine-tuned UNet weights (.safetensors, or .pt loaded with weights_only=True).",
    )
    device: str = Field(default="cpu", description="cpu, cuda or cuda:N. Never falls back.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="auto: bfloat16 on CUDA, float32 on CPU."
    )
    warmup: bool = Field(default=True, description="Run one batch before reporting ready.")
    torch_threads: int | None = Field(
        default=None, ge=1,
        description="torch intra-op threads. Unset: on the CPU all cores but one (one is left "
        "to the event loop and the pool store); on CUDA torch's own default.",
    )

    # Network
    host: str = Field(default="127.0.0.1", description="Bind address. 0.0.0.0 exposes it.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port to listen on.")
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated API keys. Empty: no authentication.",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated origins allowed by CORS. Empty: none."
    )
    max_body_bytes: int = Field(
        default=64 * 1024, ge=1024, description="Larger JSON bodies get 413 before parsing."
    )
    max_upload_bytes: int = Field(
        default=32 * 1024 * 1024, ge=1024,
        description="Larger uploads to /v1/variants get 413 before parsing.",
    )

    # Batching and admission
    max_batch_images: int = Field(
        default=8, ge=1, le=1024, description="Most images in one pipeline call."
    )
    max_wait_ms: float = Field(
        default=10.0, ge=0, le=60_000,
        description="How long a batch that is not full waits for company.",
    )
    max_queue_images: int = Field(
        default=512, ge=1, description="Images waiting before new requests get 429."
    )
    slice_ms: float = Field(
        default=1000.0, ge=0, le=60_000,
        description="Time slice: a batch yields at the next denoising step to a client served "
        "this much less (0: at every step; larger: fewer switches, coarser sharing).",
    )
    max_n: int = Field(default=64, ge=1, description="Most images one request may ask for.")
    max_variant_sources: int = Field(
        default=16, ge=1, description="Most source images one /v1/variants request may send."
    )
    max_side: int = Field(default=2048, ge=8, description="Largest height or width.")
    max_steps: int = Field(default=150, ge=1, description="Most denoising steps per request.")
    max_prompt_chars: int = Field(default=2000, ge=1, description="Longest prompt.")
    request_timeout_s: float = Field(default=120.0, gt=0, description="Default deadline.")
    max_timeout_s: float = Field(
        default=3600.0, gt=0, description="Largest timeout_s or wait_s a request may ask."
    )

    # Request defaults (None: chosen by the model: tiny-digits(-base) 64 px / 20 steps / 3,
    # tiny-random 64 px / 4 steps / 5, SDXL 1024 px / 30 steps / 5)
    default_size: int | None = Field(
        default=None, ge=8, description="Size when a request omits it (tiny models 64, SDXL 1024)."
    )
    default_steps: int | None = Field(
        default=None, ge=1,
        description="Steps when a request omits them (tiny-digits and tiny-digits-base 20, "
        "tiny-random 4, SDXL 30).",
    )
    default_guidance: float | None = Field(
        default=None, ge=0,
        description="Guidance when a request omits it (tiny-digits and tiny-digits-base 3.0, "
        "others 5.0).",
    )

    # Recipes and pool
    recipes: Path | None = Field(default=None, description="Recipe YAML or JSON file.")
    pool_path: Path = Field(default=Path("genaug-pool.db"), description="SQLite pool file.")
    pool_capacity_per_label: int = Field(
        default=1000, ge=1, description="Images kept per recipe label; most-served go first."
    )
    pregenerate: bool = Field(
        default=True,
        description="Fill pools to capacity while the GPU is idle. Off: generate only what "
        "samples wait for and what `genaug pregenerate` asks.",
    )
    max_sample_n: int = Field(default=1024, ge=1, description="Most images one sample returns.")

    # -- pool --
    pool_url: SecretStr | None = Field(
        default=None,
        description="postgresql://user:password@host:5432/db: a pool shared by replicas in "
        "PostgreSQL (instead of GENAUG_POOL_PATH; setting both is an error).",
    )
    role: Literal["all", "api", "worker"] = Field(
        default="all",
        description="all: one process loads the model and serves every route. api: loads no "
        "model and needs no GPU or torch: samples, verdicts, recipes, fill jobs, the pool page "
        "and /metrics from the shared PostgreSQL pool; /v1/generate and variants go to a live "
        "worker (503 with Retry-After while none runs). worker: loads the model, fills the "
        "shared pool and serves generation, as all does, and tells the api where it listens. "
        "api and worker need GENAUG_POOL_URL.",
    )
    advertise_url: str | None = Field(
        default=None,
        description="The URL an api reaches this worker at (http://HOST:PORT). Unset: "
        "http://HOST:PORT of GENAUG_HOST and GENAUG_PORT, with this machine's name for "
        "0.0.0.0.",
    )
    replica: str | None = Field(
        default=None,
        description="Plan partition i/N for replicas with separate SQLite pools: replica i "
        "makes only plan indices congruent to i mod N, so no two repeat an image.",
    )
    pool_lease_s: float = Field(
        default=60.0, gt=0, le=3600,
        description="Lease of an in-flight pre-generation batch; a stopped replica's batches "
        "are planned again after it.",
    )
    data_root: Path | None = Field(
        default=None,
        description="Folder that recipe label image folders (images: ...) are read from; "
        "never outside it.",
    )

    # -- feedback --
    need_half_life_s: float = Field(
        default=60.0, gt=0, le=86_400, allow_inf_nan=False,
        description="Half-life of a trainer's reported need (POST /v1/recipes/{name}/feedback):"
        " a report not renewed loses half its weight on the planner every this many seconds.",
    )

    # -- jobs --
    webhook_hosts: str = Field(
        default="",
        description="Hosts a fill's notify_url may name, comma-separated host or host:port "
        "(a bare host: any port); empty: webhooks are off and a notify_url is refused.",
    )
    webhook_secret: SecretStr | None = Field(
        default=None,
        description="Key the webhooks are signed with (HMAC-SHA256 of the body in "
        "X-Genaug-Signature), at least 16 characters; needed when GENAUG_WEBHOOK_HOSTS is set.",
    )

    log_level: str = Field(default="info", description="debug, info, warning or error.")

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        level = value.strip().lower()
        if level not in LOG_LEVELS:  # logging and uvicorn would fail at start, in a traceback
            raise ValueError(f"GENAUG_LOG_LEVEL={value!r} is no log level; use "
                             f"{', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]}")
        return level

    @field_validator("model", mode="before")
    @classmethod
    def _model_name_or_path(cls, value: object) -> object:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, str) and not value.strip():
            return None  # GENAUG_MODEL= (empty) means unset
        return value

    @property
    def builtin_model(self) -> str | None:
        """``"tiny-digits"``, ``"tiny-digits-base"`` or ``"tiny-random"`` when one is configured,
        else ``None``."""
        return builtin_model(self.model)

    @property
    def model_path(self) -> Path | None:
        """The configured model's local path; ``None`` for a built-in model."""
        return model_path(self.model)
    # -- engine --
    scheduler: SchedulerName = Field(
        default="default",
        description="Sampler when a recipe or request names none: default (the model's own), "
        "euler, euler_a, dpmpp_2m, dpmpp_2m_karras, unipc, lcm, tcd or euler_trailing.",
    )
    loras: Annotated[dict[str, Path], NoDecode] = Field(
        default_factory=dict,
        description="LoRA adapters loaded at start, name=path[,name=path...] (safetensors, "
        "diffusers/peft format); none is active unless a recipe or request names it.",
    )

    turbo_lora: Path | None = Field(
        default=None, description="A few-step distillation LoRA of the model (LCM-LoRA, "
        "SDXL-Lightning, Hyper-SD or TCD, as published), fused into a second UNet for speed "
        "turbo. Unset: a built-in model's few-step setting; a model folder serves no turbo.")
    turbo_kind: Literal["lcm", "lightning", "hyper-sd", "tcd"] | None = Field(
        default=None,
        description="The kind of GENAUG_TURBO_LORA (its keys do not say it): the scheduler "
        "and guidance turbo draws with (lcm: LCM, no guidance; lightning and hyper-sd: Euler "
        "over trailing timesteps; tcd: TCD).",
    )
    turbo_steps: int | None = Field(default=None, ge=1, le=50, description="Steps of speed "
                                    "turbo (4 with GENAUG_TURBO_LORA, 2 on a built-in model).")

    lora_max_rank: int | None = Field(
        default=None, ge=1, le=1024,
        description="With GENAUG_COMPILE: the rank of the one adapter slot every LoRA is "
        "hotswapped into (switching never recompiles); a larger adapter is refused at start. "
        "Unset: the largest loaded adapter's rank.",
    )

    @field_validator("loras", mode="before")
    @classmethod
    def _parse_loras(cls, value: object) -> object:
        return parse_loras(value)

    @field_validator("loras")
    @classmethod
    def _check_lora_names(cls, value: dict[str, Path]) -> dict[str, Path]:
        check_lora_names(value)
        return value

    # -- acceleration --
    compile: Literal["off", "unet", "regional"] = Field(
        default="off",
        description="torch.compile: off; unet (the whole UNet); regional (only its repeated "
        "transformer blocks: most of the gain, several times shorter warm-up). The batch "
        "dimension is dynamic: each generation size compiles once, whatever the batch sizes "
        "(warm-up compiles in genaug_compiles_total, later ones in genaug_recompiles_total).",
    )
    compile_mode: Literal[
        "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
    ] = Field(
        default="default",
        description="torch.compile's mode for GENAUG_COMPILE: reduce-overhead and "
        "max-autotune replay CUDA graphs, with GENAUG_COMPILE=unet only (a batch is then "
        "padded to the next of a few batch sizes, all compiled at warm-up); max-autotune "
        "also tunes its kernels (longer warm-up).",
    )
    compile_cache: str = Field(
        default="",
        description="Folder that keeps what GENAUG_COMPILE compiled, one entry per model, "
        "options, warm-up shapes, versions and device (empty: ~/.cache/genaug/compile, or "
        "$XDG_CACHE_HOME/genaug/compile; off: keep nothing). A start that finds its entry "
        "warms up without compiling; a spoiled or mismatched entry is skipped in one log line.",
    )
    compile_package: bool = Field(
        default=True,
        description="Keep the compiled UNet in the compile cache's entry as AOTInductor "
        "packages too, and start from them without tracing (GENAUG_COMPILE=unet in the default "
        "mode, without FP8, LoRA adapters or a turbo LoRA; anything else compiles as before).",
    )
    quantize: Literal["none", "fp8", "fp8-conv"] = Field(
        default="none",
        description="fp8: the UNet's large linear layers in float8 with per-row scales "
        "(torchao, the genaug[fp8] extra; CUDA compute capability 8.9 or more); fp8-conv: its "
        "convolutions too, as float8 matrix products (not yet measured on a GPU). Images "
        "drift slightly from bf16.",
    )
    attention: Literal["auto", "default", "flash3", "cudnn", "flash", "efficient", "math"] = Field(
        default="auto",
        description="Attention kernel: auto (the fastest the device has: FlashAttention-3 if "
        "installed, else cuDNN, on Hopper; torch's own choice elsewhere), default (torch's own "
        "choice), or one kernel by name.",
    )
    channels_last: bool = Field(
        default=False, description="UNet and VAE weights in channels_last (NHWC) memory layout."
    )
    fuse_qkv: bool = Field(
        default=False,
        description="Fuse each attention's query/key/value projections into one matrix product.",
    )
    vae_slicing: bool = Field(
        default=False, description="Decode a batch one image at a time (less memory, same images)."
    )
    vae_tiling: bool = Field(
        default=False,
        description="Decode large images in blended tiles (less memory; pixels differ slightly).",
    )
    warmup_shapes: Annotated[tuple[WarmupShape, ...], NoDecode] = Field(
        default=(),
        description="Comma-separated HxW:batch shapes run at warm-up, before /readyz is 200; "
        "with GENAUG_COMPILE also every recipe size and the default size at max_batch_images.",
    )

    @field_validator("warmup_shapes", mode="before")
    @classmethod
    def _parse_warmup_shapes(cls, value: object) -> object:
        return parse_warmup_shapes(value)

    @model_validator(mode="after")
    def _check_compile_mode(self) -> Settings:
        if self.compile_mode != "default" and self.compile == "off":
            raise ValueError(
                f"GENAUG_COMPILE_MODE={self.compile_mode} needs compilation; set "
                "GENAUG_COMPILE=unet or regional, or GENAUG_COMPILE_MODE=default"
            )
        if self.compile == "regional" and self.compile_mode in ("reduce-overhead",
                                                                "max-autotune"):
            raise ValueError(regional_cuda_graphs_refusal(self.compile_mode))
        return self

    @model_validator(mode="after")
    def _check_role(self) -> Settings:
        if self.role != "all" and self.pool_url is None:
            raise ValueError(
                f"GENAUG_ROLE={self.role} splits the service into an api and its workers, "
                "which share one pool in PostgreSQL: set GENAUG_POOL_URL=postgresql://..., "
                "or use GENAUG_ROLE=all with a SQLite pool")
        if self.role == "api" and self.recipes is None:
            raise ValueError(
                "GENAUG_ROLE=api serves the pools of GENAUG_RECIPES and finds its workers "
                "through them: set GENAUG_RECIPES to the workers' recipe file")
        return self

    @model_validator(mode="after")
    def _check_turbo(self) -> Settings:
        check_turbo(self.turbo_lora, self.turbo_kind)
        return self

    @model_validator(mode="after")
    def _check_warmup_shapes(self) -> Settings:
        for shape in self.warmup_shapes:
            if max(shape.height, shape.width) > self.max_side:
                raise ValueError(
                    f"GENAUG_WARMUP_SHAPES entry {shape} exceeds max_side {self.max_side}; "
                    "raise GENAUG_MAX_SIDE or warm up a smaller size"
                )
            if shape.batch > self.max_batch_images:
                raise ValueError(
                    f"GENAUG_WARMUP_SHAPES entry {shape}: batch {shape.batch} exceeds "
                    f"max_batch_images {self.max_batch_images}, so no batch of that size ever "
                    "runs; raise GENAUG_MAX_BATCH_IMAGES or warm up a smaller batch"
                )
        return self

    @field_validator("api_keys", "cors_origins", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        return split_commas(value)

    @model_validator(mode="after")
    def _check_webhooks(self) -> Settings:
        hosts = allowed_hosts(self.webhook_hosts)  # a bad entry: ValueError naming it
        secret = self.webhook_secret.get_secret_value() if self.webhook_secret else ""
        if hosts and len(secret) < MIN_SECRET_CHARS:
            raise ValueError(
                f"GENAUG_WEBHOOK_HOSTS allows {', '.join(hosts)} but GENAUG_WEBHOOK_SECRET is "
                f"{'empty' if not secret else f'{len(secret)} characters'}: webhooks are "
                f"signed, set GENAUG_WEBHOOK_SECRET to at least {MIN_SECRET_CHARS} random "
                "characters (e.g. python -c 'import secrets; print(secrets.token_hex(32))')")
        return self

    @model_validator(mode="after")
    def _check_defaults_within_limits(self) -> Settings:
        if self.default_size is not None and self.default_size % 8:
            raise ValueError(
                f"GENAUG_DEFAULT_SIZE={self.default_size} is not a multiple of 8 (the VAE "
                "downsamples by 8); use e.g. 64 or 1024")
        if self.default_size is not None and self.default_size > self.max_side:
            raise ValueError(
                f"GENAUG_DEFAULT_SIZE={self.default_size} exceeds GENAUG_MAX_SIDE="
                f"{self.max_side}; raise GENAUG_MAX_SIDE or lower GENAUG_DEFAULT_SIZE"
            )
        return self

    def request_defaults(self) -> tuple[int, int, float]:
        """(size, steps, guidance) used when a request leaves them out.

        By the configured model: tiny-digits and tiny-digits-base 64 px / 20 steps / guidance 3
        (the digits recipe's), tiny-random 64 / 4 / 5, a path (SDXL) 1024 / 30 / 5;
        ``GENAUG_DEFAULT_*`` override.
        """
        name = self.builtin_model
        base = BUILTIN_MODELS[name] if name is not None else SDXL_DEFAULTS
        size = self.default_size if self.default_size is not None else int(base["size"])
        steps = self.default_steps if self.default_steps is not None else int(base["steps"])
        guidance = (
            self.default_guidance if self.default_guidance is not None else float(base["guidance"])
        )
        return size, steps, guidance


def configure_logging(level: str) -> None:
    """The service's log lines on stderr at ``level`` (``GENAUG_LOG_LEVEL``), as ``genaug
    serve`` writes them."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
