"""What names a service's pools, without its model: :class:`PoolIdentity`.

A process that loads the model computes it (the model's hash, each recipe's label images, its
judge, the adapters' files) and announces it with itself (:mod:`~genaug.service.pool.workers`);
an api that loads no model reads it back and serves the same pools: the same pool ids, the
same judge keys stored with images and the same stop keys.

Example::

    identity = planner.identity            # a worker's, computed at start
    PoolIdentity.from_dict(identity.as_dict()) == identity   # True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PoolIdentity"]


@dataclass(frozen=True)
class PoolIdentity:
    """A service's pools as named by its model: ``model_hash`` (weights and dtype), each
    recipe's ``pool_ids``, each judged recipe's ``judges`` (its key and settings JSON), each
    label's ``stop_keys`` and the loaded adapters' content hashes by name."""

    model_hash: str
    pool_ids: dict[str, str]
    judges: dict[str, tuple[str, str]]
    stop_keys: dict[str, dict[str, str]]
    adapter_hashes: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {"model_hash": self.model_hash, "pool_ids": self.pool_ids,
                "judges": {k: list(v) for k, v in self.judges.items()},
                "stop_keys": self.stop_keys, "adapter_hashes": self.adapter_hashes}

    @classmethod
    def from_dict(cls, got: dict[str, Any]) -> PoolIdentity:
        return cls(model_hash=str(got["model_hash"]), pool_ids=dict(got["pool_ids"]),
                   judges={k: (str(v[0]), str(v[1])) for k, v in got["judges"].items()},
                   stop_keys={k: dict(v) for k, v in got["stop_keys"].items()},
                   adapter_hashes=dict(got["adapter_hashes"]))
