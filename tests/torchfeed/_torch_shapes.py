"""What the genaug.torch tests share outside fixtures: the user's own small dataset
(:class:`RealShapes`), a wait for the ``shapes`` pool, and the clients a service knows. Its
own module name (not ``conftest``) lets a spawned DataLoader worker import it to unpickle a
:class:`RealShapes` in any run, whatever else the run collected."""

from __future__ import annotations

import httpx
import torch


def wait_for_pool(url: str, recipe: str, *, at_least: int, labels: int = 3,
                  timeout_s: float = 120.0) -> None:
    """Until each of the ``labels`` labels of ``recipe`` holds ``at_least`` images
    (pre-generation fills it)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        fill = httpx.get(f"{url}/v1/recipes/{recipe}", timeout=30).json()["fill"]
        if len(fill) == labels and min(fill.values()) >= at_least:
            return
        assert time.monotonic() < deadline, fill
        time.sleep(0.2)


class RealShapes(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """``n`` images of the recipe's size, class ``i % 3``: a flat grey of the class's level
    with a little noise (what a user's own small dataset looks like to the mix)."""

    def __init__(self, n: int = 60, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = [i % 3 for i in range(n)]
        self.images = torch.stack([
            torch.full((3, 32, 32), 0.2 + 0.3 * label) + 0.01 * torch.rand(3, 32, 32,
                                                                          generator=g)
            for label in self.labels])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], self.labels[i]


def clients_of(url: str) -> list[str]:
    """The client identities the service knows (``GET /v1/clients``)."""
    return [c["client"] for c in httpx.get(f"{url}/v1/clients", timeout=30).json()["clients"]]
