"""``genaug gain``'s built-in classifier in PyTorch: a small CNN, its training and its score.

Three 3x3 convolutions (16, 32, 32 channels, batch norm, ReLU; max-pooling after the first
two), global average pooling and a linear layer; Adam under a one-cycle learning rate (peak
3e-3) for ``steps`` steps of ``batch`` examples drawn with replacement from the real shots,
each replaced with probability ``share`` by a synthetic image of its own class (the mixing of
:class:`genaug.torch.MixedDataset`, while that class holds one); every image, real or not,
randomly rotated (12 degrees), scaled (10 %) and shifted (1/14 of the side) as a graph of
tensor ops. The same seed gives the same initialisation, draws and result on a machine.
:mod:`~genaug.gain.train_tf` is the same network and training in TensorFlow.

Example::

    accuracy = train_and_score(x_real, y_real, x_syn, y_syn, x_test, y_test,
                               num_classes=10, seed=0, share=0.5)
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SmallCNN", "train_and_score"]

STEPS = 300
BATCH = 64
PEAK_LR = 3e-3


class SmallCNN(nn.Module):
    """The built-in classifier (module doc)."""

    def __init__(self, channels: int, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(channels, width, 3, padding=1)
        self.b1 = nn.BatchNorm2d(width)
        self.c2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.b2 = nn.BatchNorm2d(2 * width)
        self.c3 = nn.Conv2d(2 * width, 2 * width, 3, padding=1)
        self.b3 = nn.BatchNorm2d(2 * width)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        x = F.relu(self.b3(self.c3(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))  # type: ignore[no-any-return]


def _augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    b = x.shape[0]
    angle = (torch.rand(b, generator=g) * 2 - 1) * (12 * np.pi / 180)
    scale = 1 + (torch.rand(b, generator=g) * 2 - 1) * 0.1
    tx = (torch.rand(b, generator=g) * 2 - 1) / 7
    ty = (torch.rand(b, generator=g) * 2 - 1) / 7
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, align_corners=False)


def _tensor(pixels: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(pixels)).permute(0, 3, 1, 2).float() / 255.0


def train_and_score(x_real: np.ndarray, y_real: np.ndarray, x_syn: np.ndarray | None,
                    y_syn: np.ndarray | None, x_test: np.ndarray, y_test: np.ndarray, *,
                    num_classes: int, seed: int, share: float, steps: int = STEPS,
                    batch: int = BATCH) -> float:
    """Train :class:`SmallCNN` on the real images mixed with the synthetic ones at ``share``
    (module doc) and return its accuracy on the test images (uint8 ``[N, H, W, C]``)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    net = SmallCNN(x_real.shape[-1], num_classes)
    opt = torch.optim.Adam(net.parameters(), lr=PEAK_LR)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=PEAK_LR, total_steps=steps)
    real, real_y = _tensor(x_real), torch.from_numpy(y_real.astype(np.int64))
    by_class: list[torch.Tensor] = []
    syn = None
    if x_syn is not None and y_syn is not None and len(x_syn) and share > 0:
        syn = _tensor(x_syn)
        labels = torch.from_numpy(y_syn.astype(np.int64))
        by_class = [torch.nonzero(labels == c).flatten() for c in range(num_classes)]
    net.train()
    for _ in range(steps):
        pick = torch.randint(len(real), (batch,), generator=g)
        x, y = real[pick].clone(), real_y[pick]
        if syn is not None:
            replace = torch.rand(batch, generator=g) < share
            for i in torch.nonzero(replace).flatten().tolist():
                mine = by_class[int(y[i])]
                if len(mine):
                    x[i] = syn[mine[torch.randint(len(mine), (1,), generator=g)]]
        loss = F.cross_entropy(net(_augment(x, g)), y)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        schedule.step()
    net.eval()
    test = _tensor(x_test)
    with torch.no_grad():
        predicted = torch.cat([net(test[i:i + 512]).argmax(1) for i in range(0, len(test), 512)])
    return float((predicted.numpy() == y_test).mean())
