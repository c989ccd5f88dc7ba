"""The PyTorch side: mix a recipe's generated images into a DataLoader with genaug.torch.

    genaug serve --recipes recipes/wound_phases.yaml        # in another terminal
    python examples/torch_trainer.py [URL] [--recipe wound-phases] [--epochs 2] [--steps 4]

Random tensors stand in for your real dataset; swap in yours (a map-style dataset of
``(image [3, H, W] float in [0, 1], label)`` at the recipe's size, labels numbered in the
recipe's order). No TensorFlow. A misconfiguration (no service at URL, no such recipe) ends in
one line and exit status 1; Ctrl-C in one line and 130.
"""

from __future__ import annotations

import argparse
import os
import sys

from genaug.client import GenaugError


def start_stream(worker_id: int) -> None:
    """Each DataLoader worker starts its own stream and waits (60 s at most) for its first
    pool images before its first batch: without it the first batches are all real."""
    from torch.utils.data import get_worker_info

    get_worker_info().dataset.pool.stream().wait_ready(60)


def main(url: str, recipe: str = "wound-phases", epochs: int = 2, steps: int = 4,
         workers: int = 2) -> dict:
    import torch
    from torch.nn import functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from genaug.client import Client
    from genaug.torch import MixedDataset, PoolDataset, class_need, diagnose

    with Client(url) as client:  # the recipe says the labels and the image size (closed
        spec = client.recipe(recipe)  # before the workers fork: nothing of genaug runs here)
    labels, size = spec["labels"], spec["spec"]["output_height"] or spec["spec"]["height"]

    g = torch.Generator().manual_seed(0)  # stand-in for the real dataset and a held-out split
    real = TensorDataset(torch.rand(16 * steps, 3, size, size, generator=g),
                         torch.arange(16 * steps) % len(labels))
    x_val, y_val = torch.rand(24, 3, size, size, generator=g), torch.arange(24) % len(labels)

    # One trainer at the service (its workers are r0/w0, r0/w1 under this name); each worker
    # draws its own stream, and a step never waits on the network.
    pool = PoolDataset(url, recipe, trainer_id="torch-example", seed=0)
    train = MixedDataset(real, pool, p=0.5, seed=0)  # each example's own class, or kept real
    loader = DataLoader(train, batch_size=16, num_workers=workers, worker_init_fn=start_stream,
                        persistent_workers=workers > 0)  # streams kept across epochs

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, len(labels)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(epochs):
        for images, targets in loader:
            loss = F.cross_entropy(model(images), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        # Per-label error on held-out real images: the service fills what this trainer lacks.
        need = class_need(model, [(x_val, y_val)], pool.label_map())
        pool.report_need(need)  # posted by a thread; training does not wait
        print(f"epoch {epoch + 1}: loss {loss.item():.3f}, need {need}")

    for finding in diagnose(loader, steps=4):  # what the streams did, with a fix if needed
        print(finding)
    stats = train.stats()
    print(f"genaug.torch: {stats['synthetic']:.0f} synthetic and {stats['real']:.0f} real "
          f"examples ({stats['share']:.0%} synthetic), {stats['received']:.0f} pool images "
          f"received by {workers} worker(s)")
    return stats


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?",
                        default=os.environ.get("GENAUG_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--recipe", default="wound-phases")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="batches of 16 per epoch")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    args = parser.parse_args()
    try:
        main(args.url, args.recipe, args.epochs, args.steps, args.workers)
    except GenaugError as exc:  # the message says the fix
        sys.exit(f"torch_trainer: {exc}")
    except KeyboardInterrupt:
        print("torch_trainer: interrupted; nothing is saved, run it again", file=sys.stderr)
        sys.exit(130)
