"""One DDP rank (gloo, on this machine) of a trainer that mixes pool images into its data:
prints which examples it drew and what the mix did. Run by test_ranks.py."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from genaug.torch import MixedDataset, PoolDataset


class Numbered(Dataset[tuple[torch.Tensor, int]]):
    """Example ``i``: an image of the recipe's size whose pixels say ``i``, label ``i % 3``."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((3, 32, 32), i / 100.0), i % 3


def main() -> None:
    url, port = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    pool = PoolDataset(url, "shapes", seed=5)  # the trainer's name: the torchrun run id
    mixed = MixedDataset(Numbered(), pool, p=0.0, seed=5)
    loader = DataLoader(mixed, batch_size=5, num_workers=2, persistent_workers=True)
    seen = [round(float(x) * 100) for images, _ in loader for x in images[:, 0, 0, 0]]
    # The workers live on (persistent): wait until each one's stream drew from the pool.
    deadline = time.monotonic() + 60
    while not all(pool.tally.get(worker + 1, "received") > 0 for worker in range(2)):
        assert time.monotonic() < deadline, pool.stats()
        time.sleep(0.05)
    dist.barrier()
    print("RESULT " + json.dumps({"rank": rank, "seen": seen, "len": len(mixed),
                                  "trainer": pool.trainer_id}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
