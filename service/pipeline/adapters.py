"""LoRA adapters: all loaded at start, one (or none) active per batch, switched without reload.

``GENAUG_LORAS=name=path[,name=path...]`` names safetensors files in the diffusers or peft
LoRA format (what ``StableDiffusionXLPipeline.save_lora_weights`` writes, or kohya-style
files diffusers converts). Each is read once, through diffusers' LoRA loading with the
``peft`` backend. :meth:`Adapters.activate` makes the key's adapter active at the key's scale
before a batch, or none. How depends on whether the UNet is compiled:

- **Resident** (``GENAUG_COMPILE=off``): each adapter is injected into the UNet (and the text
  encoders where the file has weights for them) under its own name; a switch flips flags and
  scales on the injected layers (``set_adapters`` / ``disable_lora``): no copy of any weight.
- **Hotswap** (``GENAUG_COMPILE=unet`` or ``regional``): flags and float scales are constants
  to ``torch.compile``, so each switch would compile the UNet again (12-43 s of SDXL on an
  H100, and past torch's recompile limit it silently runs eagerly). Instead the UNet holds one
  adapter *slot* (:data:`SLOT`), laid out by the adapter with the most layers and padded to a
  fixed rank (``GENAUG_LORA_MAX_RANK``, default the largest adapter's), with its scales as
  tensors (diffusers' ``enable_lora_hotswap``, peft's ``prepare_model_for_compiled_hotswap``).
  At start every adapter is hotswapped into the slot once (``load_lora_weights(...,
  hotswap=True)``: this checks it fits) and the slot's padded weights and per-layer scales are
  kept; a switch copies them back in place and fills the scale tensors (``unit x scale``);
  "no adapter" is the slot at scale 0. The compiled graph reads the same tensors every time,
  so no adapter, no scale and the base model ever compile again. The cost is one copy of the
  slot per switch (docs/benchmarks.md, "Adapter switches") and a padded copy of each adapter
  on the device; the batcher keeps a batch to one adapter (the group key), so a switch comes
  at most once per batch. Adapters stay unmerged.

  What cannot share the slot is refused at start in one line with the fix: a file with
  text-encoder weights (diffusers cannot hotswap text encoders), a rank above
  ``GENAUG_LORA_MAX_RANK``, a file adapting UNet layers the slot's adapter does not.

The file is read with ``safetensors`` (never unpickled); its content hash (16 hex chars of
blake2b over its bytes, :func:`~genaug.service.pipeline.weights.hash_files`, the hasher of the
model's ``weights_hash``) names it in ``/v1/info`` and in pool identity.

Example::

    adapters = Adapters(pipeline, {"wounds": Path("/loras/wounds.safetensors")})
    adapters.names  # frozenset({"wounds"})
    adapters.activate("wounds", 0.8)  # before a batch of key.adapter == "wounds"
    adapters.activate(None, 1.0)  # the base model again
    adapters.info()  # [{"name": "wounds", "hash": "1c0f...", "source": "/loras/...", "rank": 32}]
    adapters.swap_info()  # {"adapter_swap": "resident", "lora_max_rank": None}
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .lora_record import read_record
from .quiet import quiet_diffusers
from .weights import hash_files

__all__ = ["SLOT", "AdapterInfo", "AdapterLoadError", "Adapters", "UnknownAdapterError",
           "lora_rank"]

log = logging.getLogger(__name__)

#: The peft adapter name of the one slot every adapter is hotswapped into (hotswap mode).
SLOT = "genaug_slot"
# Key prefixes of text-encoder LoRA weights: diffusers naming, then kohya's.
_TEXT_PREFIXES = ("text_encoder", "lora_te")


class UnknownAdapterError(ValueError):
    """A key, recipe or request names an adapter that was not loaded.

    ``known`` is the sorted tuple of loaded names (the API answers 422 naming them).
    """

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        self.name = name
        self.known = known
        listed = ", ".join(known) if known else "none (GENAUG_LORAS is empty)"
        super().__init__(
            f"unknown adapter {name!r}; loaded adapters: {listed}. Load it with "
            "GENAUG_LORAS=name=path (or --lora name=path) or name a loaded one"
        )


class AdapterLoadError(RuntimeError):
    """A LoRA file could not be loaded; the message names the file and the setting."""


@dataclass(frozen=True)
class AdapterInfo:
    """One loaded adapter: its name, file, content hash (16 hex chars) and LoRA rank."""

    name: str
    source: str
    hash: str
    rank: int


def lora_rank(state: Mapping[str, Any]) -> int:
    """The largest LoRA rank in a state dict (diffusers, peft or kohya key names): the inner
    dimension of its down (``A``) and up (``B``) projections; 0 when it holds none."""
    rank = 0
    for key, value in state.items():
        shape = tuple(getattr(value, "shape", ()))
        if len(shape) < 2:
            continue
        if any(tag in key for tag in ("lora_B", "lora.up", "lora_up")):
            rank = max(rank, int(shape[1]))
        elif any(tag in key for tag in ("lora_A", "lora.down", "lora_down")):
            rank = max(rank, int(shape[0]))
    return rank


@dataclass
class _Saved:
    """One adapter as the slot holds it: the slot's tensors (padded to the slot's rank,
    zero where the adapter has no layer) and each LoRA layer's scale at adapter scale 1."""

    weights: list[Any]
    units: list[float]


class Adapters:
    """The LoRA adapters of one pipeline (module docstring). Used by the worker thread only.

    ``hotswap`` (with ``GENAUG_COMPILE``) serves them all from one slot of rank ``max_rank``
    (``None``: the largest adapter's), so switching never recompiles a compiled UNet.

    Example::

        adapters = Adapters(pipeline, {"a": Path("a.safetensors"), "b": Path("b.safetensors")},
                            hotswap=True)
        adapters.activate("a", 1.0)    # copies a's weights into the slot
        adapters.activate("a", 0.5)    # fills the scale tensors only
        adapters.hash("a")  # "9e1d5c0a7b3f2e11"
        adapters.switches, adapters.switch_seconds  # 1, 0.0004
    """

    def __init__(
        self, pipeline: Any, loras: Mapping[str, Path], *, base_hash: str | None = None,
        base_name: str | None = None, hotswap: bool = False, max_rank: int | None = None,
    ) -> None:
        self.pipe: Any = pipeline
        # The served model's weights_hash: a file made by `genaug adapt` for another is refused.
        # Its name (`tiny-digits`, a folder) makes the refusal readable.
        self._base_hash = base_hash
        self._base_name = base_name
        self.hotswap = hotswap
        self.max_rank: int | None = None
        self._infos: dict[str, AdapterInfo] = {}
        self._active: tuple[str, float] | None = None
        # Hotswap mode: the slot's tensors, its LoRA layers' scale dicts, each adapter saved,
        # and which adapter's weights the slot holds now (its scale may be 0).
        self._slot_weights: list[Any] = []
        self._slot_scalings: list[dict[str, Any]] = []
        self._saved: dict[str, _Saved] = {}
        self._in_slot: str | None = None
        #: Weight copies into the slot so far (hotswap mode), and the seconds they took.
        self.switches = 0
        self.switch_seconds = 0.0
        states: dict[str, tuple[str, Path, dict[str, Any]]] = {}
        for name, raw in loras.items():
            path = Path(raw).expanduser()
            where = f"LoRA adapter {name!r} ({str(path)!r}, GENAUG_LORAS)"
            states[name] = (where, path, self._read(where, path))
        if hotswap and states:
            self._load_slot(states, max_rank)
        else:
            for name, (where, path, state) in states.items():
                self._inject(where, state, adapter_name=name)
                self._infos[name] = self._info_of(name, where, path, state)
        if self._infos:
            self._switch_off()
            how = f"hotswapped into one slot of rank {self.max_rank}" if hotswap else "resident"
            log.info("loaded %d LoRA adapter(s) (%s): %s; none active", len(self._infos), how,
                     ", ".join(f"{i.name} ({i.hash})" for i in self._infos.values()))

    @property
    def names(self) -> frozenset[str]:
        """The names a key's ``adapter`` may take."""
        return frozenset(self._infos)

    @property
    def active(self) -> tuple[str, float] | None:
        """``(name, scale)`` of the active adapter, ``None`` when the base model runs."""
        return self._active

    def hash(self, name: str) -> str:
        """Content hash of a loaded adapter's file."""
        return self._info(name).hash

    def info(self) -> list[dict[str, Any]]:
        """``[{name, hash, source, rank}]`` in load order, for ``/v1/info``'s ``adapters``."""
        return [{"name": i.name, "hash": i.hash, "source": i.source, "rank": i.rank}
                for i in self._infos.values()]

    def swap_info(self) -> dict[str, Any]:
        """How adapters switch, for ``/v1/info``'s ``acceleration``: ``adapter_swap`` is
        ``hotswap`` (one compiled slot of rank ``lora_max_rank``) or ``resident``."""
        hot = self.hotswap and bool(self._infos)
        return {"adapter_swap": "hotswap" if hot else "resident",
                "lora_max_rank": self.max_rank if hot else None}

    def check(self, name: str | None) -> None:
        """Raise :class:`UnknownAdapterError` unless ``name`` is ``None`` or loaded."""
        if name is not None:
            self._info(name)

    def activate(self, name: str | None, scale: float = 1.0) -> None:
        """Make ``name`` at ``scale`` the only active adapter (``None``: none); a no-op when it
        already is."""
        self.check(name)
        wanted = None if name is None else (name, float(scale))
        if wanted == self._active:
            return
        if self.hotswap:
            self._activate_slot(wanted)
        elif wanted is None:
            self.pipe.disable_lora()
        else:
            if self._active is None:
                self.pipe.enable_lora()  # set_adapters alone does not undo disable_lora
            self.pipe.set_adapters([wanted[0]], adapter_weights=[wanted[1]])
        self._active = wanted

    def _switch_off(self) -> None:
        if self.hotswap:
            self._activate_slot(None)
        else:
            self.pipe.disable_lora()

    # -- hotswap ------------------------------------------------------------------------------

    def _activate_slot(self, wanted: tuple[str, float] | None) -> None:
        """Copy ``wanted``'s weights into the slot (unless it holds them already) and set its
        scales; ``None`` is scale 0. Everything happens in place: the compiled graph's
        tensors keep their identity, shape and dtype, so nothing compiles again."""
        import torch

        if wanted is not None and wanted[0] != self._in_slot:
            started = time.perf_counter()
            with torch.no_grad():
                torch._foreach_copy_(self._slot_weights, self._saved[wanted[0]].weights)
            self._in_slot = wanted[0]
            self.switches += 1
            self.switch_seconds += time.perf_counter() - started
        scale = 0.0 if wanted is None else wanted[1]
        units = self._saved[self._in_slot].units if self._in_slot is not None else None
        with torch.no_grad():
            for i, scaling in enumerate(self._slot_scalings):
                scaling[SLOT].fill_(0.0 if units is None else units[i] * scale)

    def _load_slot(self, states: Mapping[str, tuple[str, Path, dict[str, Any]]],
                   max_rank: int | None) -> None:
        """Lay out the slot with the adapter that adapts the most UNet layers, padded to the
        slot's rank, then hotswap every adapter in once and keep what the slot then holds."""
        ranks = {name: lora_rank(state) for name, (_, _, state) in states.items()}
        largest = max(ranks.values())
        rank = largest if max_rank is None else max_rank
        for name, (where, _, state) in states.items():
            text = sorted(k for k in state if k.startswith(_TEXT_PREFIXES))
            if text:
                raise AdapterLoadError(
                    f"{where} has text-encoder weights ({text[0]}, ...), which cannot be "
                    "hotswapped into the compiled UNet's adapter slot (GENAUG_COMPILE is on); "
                    "adapt it for the UNet only (genaug adapt without --text-encoder), or set "
                    "GENAUG_COMPILE=off to serve it resident"
                )
            if ranks[name] > rank:
                raise AdapterLoadError(
                    f"{where} has LoRA rank {ranks[name]}, above GENAUG_LORA_MAX_RANK={rank} "
                    "(the rank of the compiled adapter slot); set "
                    f"GENAUG_LORA_MAX_RANK={ranks[name]} or unset it (the largest adapter's "
                    "rank)"
                )
        self.max_rank = rank
        order = sorted(states, key=lambda n: -len(states[n][2]))  # stable: load order on ties
        first = order[0]
        # Before the first adapter is injected: the slot is padded to `rank` and its scales
        # become tensors. check_compiled="ignore": Acceleration.setup may have called
        # unet.compile(), which compiles lazily, and nothing has run the UNet yet.
        self.pipe.enable_lora_hotswap(target_rank=rank, check_compiled="ignore")
        where, path, state = states[first]
        self._inject(where, state, adapter_name=SLOT)
        from peft.tuners.lora import LoraLayer

        unet = self.pipe.unet
        self._slot_weights = [p for n, p in unet.named_parameters() if f".{SLOT}." in n]
        self._slot_scalings = [m.scaling for m in unet.modules()
                               if isinstance(m, LoraLayer) and SLOT in m.scaling]
        # `first` is in the slot now: save it first, then swap each other one in and save it
        # (in load order, `first` may come later, when the slot holds another adapter).
        for name in order:
            where, path, state = states[name]
            if name != first:
                self._hotswap(where, state, first)
            self._saved[name] = _Saved(
                weights=[p.detach().clone() for p in self._slot_weights],
                units=[float(s[SLOT]) for s in self._slot_scalings],
            )
            self._in_slot = name
        for name, (where, path, state) in states.items():  # /v1/info lists them in load order
            self._infos[name] = self._info_of(name, where, path, state)

    def _hotswap(self, where: str, state: dict[str, Any], first: str) -> None:
        try:
            with quiet_diffusers():
                self.pipe.load_lora_weights(dict(state), adapter_name=SLOT, hotswap=True)
        except Exception as exc:  # peft raises RuntimeError/ValueError for what does not fit
            raise AdapterLoadError(
                f"{where} cannot share the compiled UNet's adapter slot, laid out by "
                f"{first!r}: {type(exc).__name__}: {str(exc)[:300]}. Adapters served with "
                "GENAUG_COMPILE must adapt the same UNet layers (or fewer) with the same "
                "LoRA options (genaug adapt's defaults do); adapt it again like the others, or "
                "set GENAUG_COMPILE=off"
            ) from exc

    # -- loading ------------------------------------------------------------------------------

    def _info(self, name: str) -> AdapterInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise UnknownAdapterError(name, tuple(sorted(self._infos))) from None

    def _info_of(self, name: str, where: str, path: Path, state: dict[str, Any]) -> AdapterInfo:
        info = AdapterInfo(name=name, source=str(path), hash=hash_files([path], sizes=False),
                           rank=lora_rank(state))
        log.info("loaded %s, hash %s, rank %d", where, info.hash, info.rank)
        return info

    def _read(self, where: str, path: Path) -> dict[str, Any]:
        from safetensors.torch import load_file

        if not path.is_file():
            raise AdapterLoadError(f"{where} does not exist; point GENAUG_LORAS at a file")
        if path.suffix.lower() != ".safetensors":
            raise AdapterLoadError(
                f"{where} is not a .safetensors file; LoRA adapters load from safetensors only "
                "(pickled files can run code)"
            )
        self._check_base(where, path)
        try:
            return dict(load_file(str(path)))
        except Exception as exc:
            raise self._unloadable(where, exc) from exc

    def _inject(self, where: str, state: dict[str, Any], *, adapter_name: str) -> None:
        try:
            with quiet_diffusers(), warnings.catch_warnings():
                # peft warns on every adapter after the first: several are the point here.
                warnings.filterwarnings("ignore", message="Already found a `peft_config`")
                # A copy: diffusers pops keys from the dict it is given.
                self.pipe.load_lora_weights(dict(state), adapter_name=adapter_name)
        except Exception as exc:  # diffusers and peft raise many types; all mean "not loadable"
            raise self._unloadable(where, exc) from exc
        loaded = {a for adapters in self.pipe.get_list_adapters().values() for a in adapters}
        if adapter_name not in loaded:
            raise AdapterLoadError(
                f"{where} holds no LoRA weights that match this model's UNet or text encoders"
            )

    @staticmethod
    def _unloadable(where: str, exc: Exception) -> AdapterLoadError:
        return AdapterLoadError(
            f"{where} could not be loaded: {type(exc).__name__}: {exc}. It must be a "
            "diffusers/peft-format SDXL LoRA for this model's UNet (needs the 'peft' "
            "package)"
        )

    def _check_base(self, where: str, path: Path) -> None:
        """Refuse a file whose header names another base model (``genaug adapt`` records it),
        in one line naming both models and the two ways to fix it."""
        if self._base_hash is None:
            return
        try:
            record = read_record(path)
        except Exception:  # unreadable: the load below says so with the full detail
            return
        made_for = record.get("base_hash")
        if made_for is None or made_for == self._base_hash:
            return
        made_on = record.get("base_model")
        made_on_text = f"{made_on} (weights {made_for})" if made_on else f"weights {made_for}"
        served = self._base_name or "this model"
        fix = (f"serve it with --model {made_on} (GENAUG_MODEL={made_on})" if made_on
               else "serve the model it was made for")
        raise AdapterLoadError(
            f"{where} was adapted on base model {made_on_text}, not on the served model "
            f"{served} (weights {self._base_hash}); {fix}, or adapt it again for this one "
            f"(genaug adapt ... --model {served})"
        )
