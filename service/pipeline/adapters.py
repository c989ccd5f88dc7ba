"""LoRA adapters: all loaded at start, one (or none) active per batch, switched without reload.

``GENAUG_LORAS=name=path[,name=path...]`` names safetensors files in the diffusers or peft
LoRA format (what ``StableDiffusionXLPipeline.save_lora_weights`` writes, or kohya-style
files diffusers converts). Each is loaded once, through diffusers' LoRA loading with the
``peft`` backend, into the pipeline's UNet (and text encoders where the file has weights for
them) under its name. None is active by default; :meth:`Adapters.activate` turns on the key's
adapter at the key's scale before a batch (``set_adapters``) or turns all off
(``disable_lora``), which only flips flags and scales on the injected layers: switching
costs no reload and no copy of any weight.

The file is read with ``safetensors`` (never unpickled); its content hash (16 hex chars of
blake2b over its bytes, :func:`~genaug.service.pipeline.weights.hash_files`, the hasher of the
model's ``weights_hash``) names it in ``/v1/info`` and in pool identity.

Example::

    adapters = Adapters(pipeline, {"wounds": Path("/loras/wounds.safetensors")})
    adapters.names  # frozenset({"wounds"})
    adapters.activate("wounds", 0.8)  # before a batch of key.adapter == "wounds"
    adapters.activate(None, 1.0)  # the base model again
    adapters.info()  # [{"name": "wounds", "hash": "1c0f...", "source": "/loras/..."}]
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .adapt import read_record
from .quiet import quiet_diffusers
from .weights import hash_files

__all__ = ["AdapterInfo", "AdapterLoadError", "Adapters", "UnknownAdapterError"]

log = logging.getLogger(__name__)


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
    """One loaded adapter: its name, file and content hash (16 hex chars)."""

    name: str
    source: str
    hash: str


class Adapters:
    """The LoRA adapters of one pipeline (module docstring). Used by the worker thread only.

    Example::

        adapters = Adapters(pipeline, {"a": Path("a.safetensors"), "b": Path("b.safetensors")})
        adapters.activate("a", 1.0)
        adapters.hash("a")  # "9e1d5c0a7b3f2e11"
    """

    def __init__(
        self, pipeline: Any, loras: Mapping[str, Path], *, base_hash: str | None = None,
        base_name: str | None = None,
    ) -> None:
        self.pipe: Any = pipeline
        # The served model's weights_hash: a file made by `genaug adapt` for another is refused.
        # Its name (`tiny-digits`, a folder) makes the refusal readable.
        self._base_hash = base_hash
        self._base_name = base_name
        self._infos: dict[str, AdapterInfo] = {}
        self._active: tuple[str, float] | None = None
        for name, path in loras.items():
            self._infos[name] = self._load(name, Path(path).expanduser())
        if self._infos:
            self.pipe.disable_lora()
            log.info("loaded %d LoRA adapter(s): %s; none active", len(self._infos),
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

    def info(self) -> list[dict[str, str]]:
        """``[{name, hash, source}]`` in load order, for ``/v1/info``'s ``adapters``."""
        return [{"name": i.name, "hash": i.hash, "source": i.source} for i in self._infos.values()]

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
        if wanted is None:
            self.pipe.disable_lora()
        else:
            if self._active is None:
                self.pipe.enable_lora()  # set_adapters alone does not undo disable_lora
            self.pipe.set_adapters([wanted[0]], adapter_weights=[wanted[1]])
        self._active = wanted

    def _info(self, name: str) -> AdapterInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise UnknownAdapterError(name, tuple(sorted(self._infos))) from None

    def _load(self, name: str, path: Path) -> AdapterInfo:
        from safetensors.torch import load_file

        where = f"LoRA adapter {name!r} ({str(path)!r}, GENAUG_LORAS)"
        if not path.is_file():
            raise AdapterLoadError(f"{where} does not exist; point GENAUG_LORAS at a file")
        if path.suffix.lower() != ".safetensors":
            raise AdapterLoadError(
                f"{where} is not a .safetensors file; LoRA adapters load from safetensors only "
                "(pickled files can run code)"
            )
        self._check_base(where, path)
        try:
            state = load_file(str(path))
            with quiet_diffusers(), warnings.catch_warnings():
                # peft warns on every adapter after the first: several are the point here.
                warnings.filterwarnings("ignore", message="Already found a `peft_config`")
                self.pipe.load_lora_weights(state, adapter_name=name)
        except Exception as exc:  # diffusers and peft raise many types; all mean "not loadable"
            raise AdapterLoadError(
                f"{where} could not be loaded: {type(exc).__name__}: {exc}. It must be a "
                "diffusers/peft-format SDXL LoRA for this model's UNet (needs the 'peft' "
                "package)"
            ) from exc
        loaded = {a for adapters in self.pipe.get_list_adapters().values() for a in adapters}
        if name not in loaded:
            raise AdapterLoadError(
                f"{where} holds no LoRA weights that match this model's UNet or text encoders"
            )
        info = AdapterInfo(name=name, source=str(path), hash=hash_files([path], sizes=False))
        log.info("loaded %s, hash %s", where, info.hash)
        return info

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
