"""A worker ready without tracing: the compiled UNet kept as AOTInductor packages in the
compile cache's entry, and loaded from there by the next start instead of compiling.

``torch.compile`` traces the UNet with Dynamo at every start, even when inductor's kernels
come from the compile cache (:mod:`~genaug.service.pipeline.compile_cache`): a cached start
still spends seconds per shape in tracing and guard building. An AOTInductor package
(``torch.export`` + ``torch._inductor.aoti_compile_and_package``; a prototype API of torch 2.x)
is the compiled code itself, loaded with ``aoti_load_package`` and run without Dynamo.

- **Built after a warm-up that compiled** (:class:`Recorder`): the first UNet call of each
  latent size is kept as the example to export, the UNet is exported (a dynamic batch of 2 to
  63 rows for a whole UNet: its calls are padded from 1 to 2; a batch of exactly 1 for a UNet
  whose forward runs per image, the tiny models') and compiled into one package per size, with
  an example input and the eager output beside it. The packages go into the cache's working
  folder, so the entry that :meth:`~genaug.service.pipeline.compile_cache.CompileCache.save`
  writes holds them: keyed as the entry is (weights, options, shapes, versions, device),
  written whole, its files' SHA-256 checked before any use (a spoiled file makes the whole
  entry skipped, with one line, and the start compiles as today).
- **Loaded before the warm-up** (:func:`load_packages`) when the entry holds a package for
  every latent size of the plan: each is loaded with the UNet's own weights (the package
  holds code only, so no weights are copied), run once on its example and compared with
  the eager output it was built with (a package for another instruction set, or one that
  draws something else, is refused in one line and the start compiles as today), and
  :class:`PackagedForward` takes the place of the compiled UNet in its
  :class:`~genaug.service.pipeline.compiling.UNetCall`. A call the packages do not cover
  (another latent size, more than 63 rows, other arguments) goes to the compiled path.
- **Only where it serves the same UNet**: ``GENAUG_COMPILE=unet`` in the default mode, no CUDA
  graphs, no FP8, no LoRA adapters (a package holds its weights: hotswapping into it is not
  done here), no turbo UNet; anything else compiles as before (:func:`packaging_refusal`).

Example::

    recorder = Recorder.install(unet)                  # before a compiling warm-up
    ...                                                # warm up
    build_packages(unet, recorder, cache.workdir)      # then cache.save()
    installed = load_packages(unet, cache.workdir, sizes=[(8, 8)])   # a later start
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .compiling import UNetCall

if TYPE_CHECKING:
    import torch

    from .acceleration_options import AccelerationOptions

__all__ = ["FOLDER", "PackagedForward", "Recorder", "build_packages", "load_packages",
           "packaging_refusal", "unet_call"]

log = logging.getLogger(__name__)

#: The packages' folder inside the compile cache's working folder (and so in its entry).
FOLDER = "unet-packages"
#: The most rows a package takes: diffusers' upsampler branches on a batch of 64.
MAX_ROWS = 63
#: How far a package's output may be from the eager UNet's on its example, at float32, and
#: in units of the dtype's epsilon below it (bf16 and fp16 round more); relative to the
#: output's largest value. A package for another instruction set draws something else by far.
TOLERANCE = 1e-3
EPSILONS = 8
#: A package of code only: the UNet's weights (every one a replaceable constant) are the
#: loaded UNet's own tensors, handed to it at load (no second copy of the weights).
_WEIGHTLESS = {"always_keep_tensor_constants": True,
               "aot_inductor.package_constants_in_so": False}


def packaging_refusal(options: AccelerationOptions, *, adapters: bool, turbo: bool) -> str | None:
    """Why the UNet is not kept as a package with these options (None: it is)."""
    if options.compile != "unet":
        return f"GENAUG_COMPILE={options.compile} (packages need unet)"
    if options.compile_mode != "default" or options.cuda_graphs:
        return f"GENAUG_COMPILE_MODE={options.compile_mode}"
    if options.quantize != "none":
        return f"GENAUG_QUANTIZE={options.quantize}"
    if adapters:
        return "LoRA adapters are loaded (they are swapped into the compiled UNet)"
    if turbo:
        return "a turbo LoRA's UNet is served beside the first"
    return None


def unet_call(unet: Any) -> UNetCall | None:
    """The :class:`UNetCall` that runs the compiled UNet (``compile_unet``'s, whole or per
    image), or None (not compiled whole)."""
    forward = unet.forward
    if isinstance(forward, UNetCall):
        return forward
    inner = getattr(forward, "inner", None)
    return inner if isinstance(inner, UNetCall) else None


def _size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int]:
    sample = args[0] if args else kwargs["sample"]
    return int(sample.shape[-2]), int(sample.shape[-1])


def _plain(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The call as the package's five tensors (sample, timestep, encoder hidden states, text
    embeds, time ids), or None for a call a package does not take."""
    import torch

    rest = dict(kwargs)
    sample, timestep = (args + (None, None))[:2] if args else (None, None)
    sample = rest.pop("sample", sample)
    timestep = rest.pop("timestep", timestep)
    hidden = rest.pop("encoder_hidden_states", args[2] if len(args) > 2 else None)
    added = rest.pop("added_cond_kwargs", None)
    if rest.pop("return_dict", True) or rest.pop("timestep_cond", None) is not None:
        return None
    if any(value is not None for value in rest.values()) or len(args) > 3:
        return None
    if not isinstance(added, dict) or set(added) != {"text_embeds", "time_ids"}:
        return None
    if not isinstance(timestep, torch.Tensor) or timestep.dim() != 0:
        return None
    return (sample, timestep.float(), hidden, added["text_embeds"], added["time_ids"])


class Recorder:
    """The compiled UNet's calls during a warm-up, recorded: the first call of each latent
    size, as the package's five tensors (cloned). Wraps ``UNetCall.compiled``."""

    def __init__(self, call: UNetCall) -> None:
        self.call = call
        self.compiled = call.compiled
        self.examples: dict[tuple[int, int], tuple[Any, ...]] = {}
        call.compiled = self

    @classmethod
    def install(cls, unet: Any) -> Recorder | None:
        call = unet_call(unet)
        return None if call is None else cls(call)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        size = _size(args, kwargs)
        if size not in self.examples:
            plain = _plain(args, kwargs)
            if plain is not None:
                self.examples[size] = tuple(t.detach().clone() for t in plain)
        return self.compiled(*args, **kwargs)

    def remove(self) -> None:
        self.call.compiled = self.compiled


def _module(unet: Any) -> torch.nn.Module:
    """The UNet as a module of the package's five tensors, returning the noise. It calls the
    class's forward, past the instance's wrappers (``UNetCall``, per-image)."""
    import torch

    class UNetTensors(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = unet

        def forward(self, sample: torch.Tensor, timestep: torch.Tensor,
                    hidden: torch.Tensor, text_embeds: torch.Tensor,
                    time_ids: torch.Tensor) -> torch.Tensor:
            out = type(self.unet).forward(
                self.unet, sample, timestep, encoder_hidden_states=hidden,
                added_cond_kwargs={"text_embeds": text_embeds, "time_ids": time_ids},
                return_dict=False)
            return out[0]  # type: ignore[no-any-return]

    return UNetTensors().eval()


def build_packages(unet: Any, recorder: Recorder, workdir: Path) -> list[Path]:
    """One package per latent size the warm-up called, into ``workdir``/:data:`FOLDER`
    (module doc); the packages written. A size that cannot be exported or compiled is logged
    and left out (its start compiles it)."""
    import torch

    folder = workdir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    module = _module(unet)
    per_image = recorder.call is not unet.forward  # the per-image forward's call
    written = []
    for (height, width), example in sorted(recorder.examples.items()):
        started = time.monotonic()
        path = folder / f"unet-{height}x{width}.pt2"
        try:
            rows = None
            if not per_image:
                rows = torch.export.Dim("rows", min=2, max=MAX_ROWS)
            dynamic = None if rows is None else ({0: rows}, None, {0: rows}, {0: rows},
                                                  {0: rows})
            with torch.no_grad():
                exported = torch.export.export(module, example, dynamic_shapes=dynamic)
                torch._inductor.aoti_compile_and_package(
                    exported, package_path=str(path), inductor_configs=_WEIGHTLESS)
                expected = module(*example)
            torch.save({"example": example, "expected": expected, "per_image": per_image},
                       folder / f"unet-{height}x{width}.check.pt")
        except Exception as exc:  # a prototype API: any failure leaves the size compiled
            log.warning("UNet package for %dx%d latents not built (%s: %s); that size "
                        "compiles at each start", height, width, type(exc).__name__,
                        str(exc).splitlines()[0] if str(exc) else "")
            path.unlink(missing_ok=True)
            continue
        written.append(path)
        log.info("UNet package for %dx%d latents built in %.1f s (%s)", height, width,
                 time.monotonic() - started, path.name)
    return written


class PackagedForward:
    """The compiled UNet's place in its :class:`UNetCall`, served from packages by latent
    size; a call they do not take goes to ``fallback`` (the compiled path). ``calls`` and
    ``fallbacks`` count them."""

    def __init__(self, runners: dict[tuple[int, int], Callable[..., Any]],
                 fallback: Callable[..., Any], *, per_image: bool) -> None:
        self.runners = runners
        self.fallback = fallback
        self.per_image = per_image
        self.calls = 0
        self.fallbacks = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        runner = self.runners.get(_size(args, kwargs))
        plain = _plain(args, kwargs) if runner is not None else None
        rows = 0 if plain is None else int(plain[0].shape[0])
        fits = rows == 1 if self.per_image else 2 <= rows <= MAX_ROWS
        if runner is None or plain is None or not fits:
            self.fallbacks += 1
            return self.fallback(*args, **kwargs)
        self.calls += 1
        return (runner(*plain),)


def load_packages(unet: Any, workdir: Path, sizes: Iterable[tuple[int, int]]) -> str:
    """Serve the compiled UNet from ``workdir``'s packages when there is one for every latent
    size of ``sizes``; what happened, in a few words (``"loaded 2 packages"``, or why not)."""
    import torch

    call = unet_call(unet)
    folder = workdir / FOLDER
    wanted = sorted(set(sizes))
    if call is None or not wanted:
        return "not used: the UNet is not compiled whole"
    paths = {size: folder / f"unet-{size[0]}x{size[1]}.pt2" for size in wanted}
    missing = [f"{h}x{w}" for (h, w), path in paths.items() if not path.is_file()]
    if missing:
        return f"none for latent size {', '.join(missing)} yet"
    runners: dict[tuple[int, int], Callable[..., Any]] = {}
    per_image = False
    weights = _module(unet).state_dict()
    for size, path in paths.items():
        try:
            runner = torch._inductor.aoti_load_package(str(path))
            names = runner.get_constant_fqns()
            unknown = sorted(set(names) - set(weights))
            if unknown:
                raise ValueError(f"it names weights this UNet lacks ({unknown[0]}, ...)")
            runner.load_constants({name: weights[name] for name in names},
                                  check_full_update=True, user_managed=True)
            check = torch.load(path.with_name(path.stem + ".check.pt"), weights_only=True)
            per_image = bool(check["per_image"])
            with torch.no_grad():
                got = runner(*check["example"])
            expected = check["expected"]
            error = float((got - expected).abs().max())
            limit = (max(TOLERANCE, EPSILONS * torch.finfo(expected.dtype).eps)
                     * max(1.0, float(expected.abs().max())))
        except Exception as exc:  # unreadable, another instruction set, a prototype API
            log.warning("UNet package %s skipped (%s: %s); the UNet compiles as without one",
                        path.name, type(exc).__name__, str(exc).splitlines()[0] if str(exc)
                        else "")
            return f"skipped: {path.name} did not load"
        if not error <= limit:
            log.warning("UNet package %s skipped: it draws %.2g away from the UNet it was "
                        "built from on its own example; the UNet compiles as without one",
                        path.name, error)
            return f"skipped: {path.name} draws another UNet"
        runners[size] = runner
    call.compiled = PackagedForward(runners, call.compiled, per_image=per_image)
    return f"loaded {len(runners)} package{'s' if len(runners) != 1 else ''}"
