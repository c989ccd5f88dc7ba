"""Compiling the UNet once for every batch size: :func:`compile_unet` (whole, or its repeated
blocks), :class:`UNetCall` (the eager wrapper that marks the batch dimension dynamic and runs a
batch of 1 as 2), and dynamo's counters (:func:`compile_counts`).

:func:`~genaug.service.pipeline.acceleration.apply_acceleration` calls :func:`compile_unet` when
``GENAUG_COMPILE`` is not ``off``; the warm-up reads :func:`compile_counts` to say whether a
shape compiled, came from the cache or reused a compile. torch is imported inside functions.

Example::

    raise_recompile_limit()
    compile_unet(pipeline.unet, options)     # options.compile: "unet" or "regional"
    compile_counts().graphs                  # graphs dynamo compiled in this process
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .acceleration_options import AccelerationOptions
from .errors import AccelerationError
from .warmup import CompileCounts

if TYPE_CHECKING:
    import torch

__all__ = ["RECOMPILE_LIMIT", "UNetCall", "compile_counts", "compile_unet",
           "raise_recompile_limit"]

#: torch.compile recompiles a function for each new static shape up to this many times, then
#: silently runs it eagerly. Regional compilation shares one code object among all transformer
#: blocks, and SDXL's two block widths make two graphs per shape: raise torch's default of 8.
RECOMPILE_LIMIT = 64


def raise_recompile_limit() -> None:
    """Let dynamo compile a function for up to :data:`RECOMPILE_LIMIT` shapes."""
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):  # renamed in torch 2.6
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(int(getattr(dynamo_config, name)), RECOMPILE_LIMIT))
            return


def compile_unet(unet: Any, options: AccelerationOptions) -> None:
    """Compile the UNet (``unet``) or its repeated blocks (``regional``) once for every batch
    size.

    The batch dimension is dynamic: the wrappers around the compiled code (:class:`UNetCall`,
    eager, outside the compiled frame) mark it so (``maybe_mark_dynamic``), and dynamo
    specialises a dimension of size 1 whatever it is told, so the UNet's batch of 1 (one image
    without guidance) is padded to 2 and its first row kept: one compile serves every batch
    (on the CPU, inductor's convolution splits batches below and from 16: two). A UNet whose
    forward runs per image (the tiny models, :class:`~genaug.service.pipeline.tiny.PerSample`,
    for batch invariance) has its per-image forward compiled instead: every call it sees is a
    batch of one, so one compile with static shapes serves every batch. Image sizes stay
    static: each size compiles once (the warm-up's plan).
    """
    import torch

    # mode=None is torch's default; reduce-overhead and max-autotune record CUDA graphs.
    mode = None if options.compile_mode == "default" else options.compile_mode
    per_sample = unet.forward if hasattr(unet.forward, "inner") else None
    dynamic = None if per_sample is None else False
    if options.compile == "unet":
        target = per_sample.inner if per_sample is not None else unet.forward
        call = UNetCall(torch.compile(target, dynamic=dynamic, mode=mode),
                        batch_dynamic=per_sample is None, pad_one=per_sample is None,
                        mark_steps=options.cuda_graphs)
        if per_sample is not None:
            per_sample.inner = call
        else:
            unet.forward = call
        return
    blocks = [m for m in unet.modules()
              if type(m).__name__ in (getattr(unet, "_repeated_blocks", None) or ())]
    if not blocks:
        raise AccelerationError(
            f"GENAUG_COMPILE=regional: the UNet ({type(unet).__name__}) declares no repeated "
            "blocks diffusers can compile; set GENAUG_COMPILE=unet")
    for block in blocks:  # one code object: the blocks of a class share their compile
        block.forward = UNetCall(torch.compile(block.forward, dynamic=dynamic, mode=mode),
                                 batch_dynamic=per_sample is None)
    if per_sample is None:
        unet.forward = UNetCall(unet.forward, pad_one=True)  # the blocks never see a batch of 1


class UNetCall:
    """A compiled UNet (or block) forward, called so that one compile serves every batch size.

    Eager, around the compiled code: ``batch_dynamic`` marks the leading dimension of every
    tensor argument that has the batch's size dynamic (``torch._dynamo.maybe_mark_dynamic``);
    ``pad_one`` runs a batch of 1 as 2 (its row twice: dynamo specialises a dimension of size 1)
    and returns the first row; an integer timestep goes in as float32 (one compile for every
    scheduler: :func:`_float_timestep`); ``mark_steps`` begins a CUDA-graph step at each call
    and copies what it returns (:class:`StepMarked`'s contract). ``calls`` counts the calls.

    Example::

        unet.forward = UNetCall(torch.compile(unet.forward), batch_dynamic=True, pad_one=True)
        unet(sample[:1], t, encoder_hidden_states=embeds[:1])   # runs a batch of 2
    """

    def __init__(self, compiled: Callable[..., Any], *, batch_dynamic: bool = False,
                 pad_one: bool = False, mark_steps: bool = False) -> None:
        self.compiled = compiled
        self.batch_dynamic = batch_dynamic
        self.pad_one = pad_one
        self.mark_steps = mark_steps
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch.utils._pytree import tree_map_only

        first = args[0] if args else next(iter(kwargs.values()))
        batch = int(first.shape[0])
        args, kwargs = _float_timestep(args, kwargs)
        padded = self.pad_one and batch == 1
        if padded:
            args, kwargs = tree_map_only(torch.Tensor, lambda t: _rows(t, 1, 2), (args, kwargs))
        if self.batch_dynamic:
            size = 2 if padded else batch
            for tensor in _tensors((args, kwargs)):
                if tensor.dim() > 0 and tensor.shape[0] == size and size > 1:
                    torch._dynamo.maybe_mark_dynamic(tensor, 0)
        if self.mark_steps:
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
        self.calls += 1
        out = self.compiled(*args, **kwargs)
        if self.mark_steps:  # nothing of one replay is read after the next
            out = tree_map_only(torch.Tensor, lambda t: t.clone(), out)
        if padded:
            out = tree_map_only(torch.Tensor, lambda t: _rows(t, 2, 1), out)
        return out


def _float_timestep(args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A UNet's integer timestep (LCM's, TCD's: their schedules are integer tensors) as float32:
    the UNet embeds it as ``timesteps.float()`` anyway (bit for bit the same), and a dtype is
    something dynamo guards on: one compile then serves every scheduler. A block's arguments
    (regional compilation) hold no timestep and pass unchanged."""
    import torch

    def floated(value: Any) -> Any:
        if (isinstance(value, torch.Tensor) and value.dim() <= 1
                and not torch.is_floating_point(value)):
            return value.to(torch.float32)
        return value

    if "timestep" in kwargs:
        return args, {**kwargs, "timestep": floated(kwargs["timestep"])}
    if len(args) > 1:
        return (args[0], floated(args[1]), *args[2:]), kwargs
    return args, kwargs


def _rows(tensor: torch.Tensor, have: int, want: int) -> torch.Tensor:
    """A batch-sized tensor (leading dimension ``have``) with ``want`` rows: the first row
    repeated, or the first ``want`` rows; anything else as it is."""
    if tensor.dim() == 0 or tensor.shape[0] != have:
        return tensor
    return tensor.expand(want, *tensor.shape[1:]).contiguous() if want > have else (
        tensor[:want])


def _tensors(tree: Any) -> list[torch.Tensor]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def compile_counts() -> CompileCounts:
    """dynamo's compiled graphs and inductor's FX graph cache hits and misses so far, in this
    process (:class:`~genaug.service.pipeline.warmup.CompileCounts`)."""
    from torch._dynamo.utils import counters

    return CompileCounts(graphs=int(counters["stats"]["unique_graphs"]),
                         hits=int(counters["inductor"]["fxgraph_cache_hit"]),
                         misses=int(counters["inductor"]["fxgraph_cache_miss"]))
