"""Who is drawing: the trainer, its rank and its DataLoader worker, as the service sees them.

A trainer is one training run, however many processes it has: DDP ranks (``torchrun``) and,
in each, DataLoader workers. Each of those processes draws its own stream with its own client,
under the client id ``<trainer>/r<rank>/w<worker>``; the service counts every id under one
``<trainer>`` as one trainer, for its fair share of the generator and for the need it reports
(``GET /v1/clients`` still lists each). The trainer's name is :func:`default_trainer_id` unless
given: the same on every rank of a ``torchrun`` (its run id), else this host and process.

Importing this module imports nothing but the standard library; torch is asked for the worker
and the rank only where it is already imported.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from dataclasses import dataclass

__all__ = ["Place", "client_id", "default_trainer_id", "place"]

# What X-Client-Id allows (the service's CLIENT_ID_PATTERN): 1-64 of these.
_BAD = re.compile(r"[^A-Za-z0-9._:@-]+")
_MAX = 64


@dataclass(frozen=True)
class Place:
    """Where this process draws: its DDP ``rank`` of ``world`` (0 of 1 without DDP) and its
    DataLoader ``worker`` of ``workers`` (0 of 0 in the process that trains)."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 0

    @property
    def in_worker(self) -> bool:
        return self.workers > 0


def place() -> Place:
    """This process's rank (``torch.distributed`` when initialised, else ``RANK`` /
    ``WORLD_SIZE`` as ``torchrun`` sets them) and DataLoader worker
    (``torch.utils.data.get_worker_info()``)."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    worker, workers = 0, 0
    torch = sys.modules.get("torch")
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world = int(dist.get_rank()), int(dist.get_world_size())
        info = torch.utils.data.get_worker_info()
        if info is not None:
            worker, workers = int(info.id), int(info.num_workers)
    return Place(rank, max(1, world), worker, workers)


def _clean(text: str) -> str:
    return _BAD.sub("-", text).strip("-") or "trainer"


def default_trainer_id() -> str:
    """The trainer's name when none is given: ``torch-<run id>`` under ``torchrun`` (every
    rank the same), else ``torch-<host>-<pid>`` of the process that made the dataset."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run and run != "none":
        return _clean(f"torch-{run}")[:40]
    return _clean(f"torch-{socket.gethostname()[:20]}-{os.getpid()}")[:40]


def client_id(trainer: str, where: Place) -> str:
    """The X-Client-Id of one process of ``trainer``: ``<trainer>/r<rank>/w<worker>``
    (``w-`` for the process that trains, which reports the trainer's need)."""
    worker = f"w{where.worker}" if where.in_worker else "w-"
    tail = f"/r{where.rank}/{worker}"
    return _clean(trainer)[: _MAX - len(tail)] + tail
