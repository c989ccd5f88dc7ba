"""The judge's image encoders: the tiny models' embedded one, and a user's transformers model.

An :class:`Encoder` turns uint8 images ``[n, h, w, c]`` (``c`` 1 or 3) into float32
embeddings ``[n, d]`` on its device; one with a text tower (CLIP) also embeds prompts.

* ``tiny-digits-encoder`` (:class:`PixelEncoder`): the image in grey, area-downsampled to
  16x16, 256 numbers. It has no weights, so it never saw any digit, 5-9 included (the same
  story as ``tiny-digits-base``: a stand-in for a foundation encoder that never saw the
  user's classes). Chosen by measurement over a small network trained on digits 0-4 (see
  docs/curation.md): a logistic regression on its embeddings of 5 shots per class (with
  augmented views) labels 90 % of the real ``test`` digits 5-9 right.
* A local folder (:class:`TransformersEncoder`): a CLIP model (``get_image_features``,
  ``get_text_features``: the ``prompts`` rule works) or any transformers vision model whose
  output has a ``pooler_output`` (else its last hidden state averaged), loaded with
  ``local_files_only``; its images are resized and normalised on the device, with the mean,
  std and size of the folder's ``preprocessor_config.json`` (CLIP's when there is none).

Example::

    encoder = load_encoder("tiny-digits-encoder", torch.device("cpu"))
    encoder.images(uint8_images)          # float32 [n, 256]
    clip = load_encoder("/models/clip-vit-b32", torch.device("cuda"))
    clip.texts(["a handwritten seven"])   # float32 [1, 512]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from ..recipes.spec import TINY_ENCODER

__all__ = ["Encoder", "PixelEncoder", "TransformersEncoder", "load_encoder"]

#: CLIP's image normalisation, used when a folder has no ``preprocessor_config.json``.
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PIXEL_SIZE = 16


class Encoder(Protocol):
    """Images (and, with a text tower, prompts) to embeddings on one device."""

    name: str
    device: torch.device
    has_text: bool

    def images(self, images: np.ndarray) -> torch.Tensor:
        """uint8 ``[n, h, w, c]`` -> float32 ``[n, d]`` on :attr:`device`."""
        ...

    def texts(self, prompts: list[str]) -> torch.Tensor:
        """Prompts -> float32 ``[n, d]`` on :attr:`device` (only when :attr:`has_text`)."""
        ...


def _to_tensor(images: np.ndarray, device: torch.device) -> torch.Tensor:
    """uint8 ``[n, h, w, c]`` -> float32 ``[n, c, h, w]`` in 0..1 on ``device``."""
    array = np.asarray(images)
    if array.ndim == 3:
        array = array[..., None]
    if array.ndim != 4 or array.dtype != np.uint8:
        raise ValueError(f"images must be uint8 [n, h, w, c], got {array.dtype} "
                         f"{list(array.shape)}")
    x = torch.from_numpy(np.ascontiguousarray(array)).to(device)
    return x.permute(0, 3, 1, 2).float().div_(255.0)


class PixelEncoder:
    """``tiny-digits-encoder``: grey, area-downsampled to 16x16 (no weights, nothing seen)."""

    name = TINY_ENCODER
    has_text = False

    def __init__(self, device: torch.device, size: int = PIXEL_SIZE) -> None:
        self.device = device
        self.size = size

    def images(self, images: np.ndarray) -> torch.Tensor:
        x = _to_tensor(images, self.device).mean(dim=1, keepdim=True)
        return F.interpolate(x, size=(self.size, self.size), mode="area").flatten(1)

    def texts(self, prompts: list[str]) -> torch.Tensor:
        raise ValueError(f"{TINY_ENCODER!r} has no text tower; use the 'shots' rule")


class TransformersEncoder:
    """A local transformers model folder: CLIP (image and text towers) or a vision model."""

    def __init__(self, folder: str, device: torch.device) -> None:
        from transformers import AutoConfig, AutoModel
        from transformers.utils import logging as hf_logging

        # One model, loaded once: no progress bar in the service log.
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        self.name = folder
        self.device = device
        path = Path(folder).expanduser()
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        self.has_text = hasattr(config, "text_config") and hasattr(config, "vision_config")
        self.model = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
        self.tokenizer: Any = None
        if self.has_text:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        vision = getattr(config, "vision_config", config)
        size, mean, std = getattr(vision, "image_size", 224), _CLIP_MEAN, _CLIP_STD
        processor = path / "preprocessor_config.json"
        if processor.is_file():
            pre = json.loads(processor.read_text(encoding="utf-8"))
            mean = tuple(pre.get("image_mean", mean))
            std = tuple(pre.get("image_std", std))
            crop = pre.get("crop_size") or pre.get("size") or {}
            if isinstance(crop, dict):
                size = crop.get("height") or crop.get("shortest_edge") or size
            elif isinstance(crop, int):
                size = crop
        self.size = int(size if isinstance(size, int) else size[0])
        channels = getattr(vision, "num_channels", 3)
        self.channels = int(channels)
        self.mean = torch.tensor(mean[: self.channels], device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std[: self.channels], device=device).view(1, -1, 1, 1)
        #: CLIP's learned temperature (its logit scale), for the prompts rule.
        scale = getattr(self.model, "logit_scale", None)
        self.logit_scale = float(scale.exp().item()) if scale is not None else 100.0

    def _pixels(self, images: np.ndarray) -> torch.Tensor:
        x = _to_tensor(images, self.device)
        if x.shape[1] != self.channels:
            x = x.mean(dim=1, keepdim=True).expand(-1, self.channels, -1, -1)
        x = F.interpolate(x, size=(self.size, self.size), mode="bicubic", align_corners=False)
        return (x.clamp(0, 1) - self.mean) / self.std

    def images(self, images: np.ndarray) -> torch.Tensor:
        pixels = self._pixels(images)
        with torch.inference_mode():
            if self.has_text:
                return _pooled(self.model.get_image_features(pixel_values=pixels)).float()
            out = self.model(pixel_values=pixels)
            pooled: torch.Tensor | None = getattr(out, "pooler_output", None)
            if pooled is None:
                pooled = out.last_hidden_state.mean(dim=1)
            assert pooled is not None
            return pooled.flatten(1).float()

    def texts(self, prompts: list[str]) -> torch.Tensor:
        if not self.has_text:
            raise ValueError(f"encoder {self.name!r} has no text tower; use the 'shots' rule")
        tokens = self.tokenizer(prompts, padding=True, truncation=True, return_tensors="pt")
        with torch.inference_mode():
            out = self.model.get_text_features(
                input_ids=tokens["input_ids"].to(self.device),
                attention_mask=tokens["attention_mask"].to(self.device))
        return _pooled(out).float()


def _pooled(out: Any) -> torch.Tensor:
    """``get_*_features``' answer: a tensor (transformers 4) or an output (5)."""
    if isinstance(out, torch.Tensor):
        return out
    tensor: torch.Tensor = out.pooler_output
    return tensor


def load_encoder(name: str, device: torch.device) -> Encoder:
    """``tiny-digits-encoder`` or a local transformers model folder, on ``device``."""
    if name == TINY_ENCODER:
        return PixelEncoder(device)
    return TransformersEncoder(name, device)
