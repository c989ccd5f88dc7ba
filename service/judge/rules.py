"""The judge's rules: what an image's embedding says about its label.

* :class:`ShotsRule` (``rule: shots``): a multinomial logistic regression fitted once on the
  shots' embeddings, each shot also seen in ``views`` augmented views (shifted by up to 1/16 of
  its size, edges repeated), as DIAGen's few-shot head; scikit-learn fits it, the device
  applies it (one matrix product and a softmax).
* :class:`PromptsRule` (``rule: prompts``): zero-shot agreement (He et al., ICLR'23): the
  softmax, over the recipe's labels, of the cosine similarity between the image and each
  label's prompts (their text embeddings averaged), at the encoder's logit scale.

Both give, per image, the probability of each label; the judge keeps the column of the label
the image was made for. Embeddings are centred and L2-normalised per image before either rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .encoders import Encoder

__all__ = ["PromptsRule", "Rule", "ShotsRule", "augmented_views", "normalise"]

#: Augmented views per shot, and the logistic regression's inverse regularisation (chosen by
#: measurement on real digits 5-9, see docs/curation.md).
VIEWS = 8
C = 10.0


def normalise(x: torch.Tensor) -> torch.Tensor:
    """Each row centred and scaled to unit length."""
    x = x - x.mean(dim=1, keepdim=True)
    out: torch.Tensor = x / x.norm(dim=1, keepdim=True).clamp_min(1e-6)
    return out


def augmented_views(images: np.ndarray, views: int, seed: int = 0) -> np.ndarray:
    """``images`` followed by ``views`` shifted copies of each (up to 1/16 of the size each
    way, edges repeated): uint8 ``[n * (views + 1), h, w, c]``."""
    rng = np.random.default_rng(seed)
    n, h, w = images.shape[:3]
    pad_h, pad_w = max(1, h // 16), max(1, w // 16)
    padded = np.pad(images, ((0, 0), (pad_h, pad_h), (pad_w, pad_w), (0, 0)), mode="edge")
    out = [images]
    for _ in range(views):
        dy = rng.integers(0, 2 * pad_h + 1, size=n)
        dx = rng.integers(0, 2 * pad_w + 1, size=n)
        out.append(np.stack([padded[i, dy[i]:dy[i] + h, dx[i]:dx[i] + w]
                             for i in range(n)]))
    return np.concatenate(out)


class Rule:
    """Label probabilities ``[n, labels]`` from embeddings, on the encoder's device."""

    labels: list[str]

    def probabilities(self, embeddings: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class ShotsRule(Rule):
    """A logistic regression fitted on the shots' embeddings (with augmented views)."""

    def __init__(self, encoder: Encoder, shots: Mapping[str, np.ndarray], *,
                 views: int = VIEWS, seed: int = 0) -> None:
        from sklearn.linear_model import LogisticRegression

        self.labels = list(shots)
        xs, ys = [], []
        for k, label in enumerate(self.labels):
            images = augmented_views(shots[label], views, seed=seed + k)
            xs.append(normalise(encoder.images(images)).cpu().numpy())
            ys.append(np.full(len(images), k))
        clf = LogisticRegression(C=C, max_iter=5000)
        clf.fit(np.concatenate(xs), np.concatenate(ys))
        coef, intercept = clf.coef_, clf.intercept_
        if len(self.labels) == 2:  # binary: one row, the logit of label 1 against label 0
            coef = np.concatenate([-coef / 2, coef / 2])
            intercept = np.concatenate([-intercept / 2, intercept / 2])
        device = encoder.device
        self.weight = torch.tensor(coef, dtype=torch.float32, device=device)
        self.bias = torch.tensor(intercept, dtype=torch.float32, device=device)
        self.shots = {label: len(shots[label]) for label in self.labels}

    def probabilities(self, embeddings: torch.Tensor) -> torch.Tensor:
        return torch.softmax(normalise(embeddings) @ self.weight.T + self.bias, dim=1)


class PromptsRule(Rule):
    """Zero-shot: softmax over labels of the image's cosine similarity to their prompts."""

    def __init__(self, encoder: Encoder, prompts: Mapping[str, Sequence[str]],
                 logit_scale: float = 100.0) -> None:
        self.labels = list(prompts)
        rows = []
        for label in self.labels:
            text = normalise(encoder.texts(list(prompts[label]))).mean(dim=0, keepdim=True)
            rows.append(text / text.norm(dim=1, keepdim=True).clamp_min(1e-6))
        self.text = torch.cat(rows)
        self.logit_scale = logit_scale

    def probabilities(self, embeddings: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logit_scale * normalise(embeddings) @ self.text.T, dim=1)
