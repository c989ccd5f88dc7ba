"""The workers table on both backends: a worker announced is alive while its lease runs,
renewed by the store's heartbeat, marked gone (not deleted) when its store closes, and the
newest one's identity is what an api serves, alive or not."""

from __future__ import annotations

import time
from typing import Any

from genaug.service.pool.identity import PoolIdentity

IDENTITY = PoolIdentity(
    model_hash="152650e951a813f0-float32", pool_ids={"shapes": "shapes-0123456789ab"},
    judges={"shapes": ("3f9c0a1b2c3d4e5f", '{"rule": "shots"}')},
    stop_keys={"shapes": {"circle": "3f9c0a1b2c3d4e5f", "square": "3f9c0a1b2c3d4e5f/1c0f"}},
    adapter_hashes={"ink": "1c0f"})


def test_a_worker_is_alive_while_its_lease_runs_and_its_identity_outlives_it(
        open_store: Any) -> None:
    api = open_store()
    assert api.workers.newest() is None and api.workers.alive() == []
    worker = open_store(lease_s=0.6)  # renewed every 0.2 s by the store's heartbeat
    worker.workers.announce("w-1", "http://127.0.0.1:9", "worker", IDENTITY.as_dict())
    time.sleep(1.5)  # past two leases: only the heartbeat keeps it alive
    assert [w.id for w in api.workers.alive()] == ["w-1"]
    newest = api.workers.newest()
    assert newest is not None and newest.url == "http://127.0.0.1:9"
    assert PoolIdentity.from_dict(newest.identity) == IDENTITY
    worker.close()  # a stop: gone at once, its identity kept for the api
    assert api.workers.alive() == []
    kept = api.workers.newest()
    assert kept is not None and PoolIdentity.from_dict(kept.identity) == IDENTITY


def test_a_killed_worker_stops_counting_one_lease_later(open_store: Any) -> None:
    api = open_store()
    worker = open_store(lease_s=0.6)
    worker.workers.announce("w-2", "http://127.0.0.1:9", "worker", IDENTITY.as_dict())
    worker._stop_heartbeat.set()  # what SIGKILL leaves: no renewal, no goodbye
    worker._heartbeat.join()
    assert [w.id for w in api.workers.alive()] == ["w-2"]
    time.sleep(0.8)
    assert api.workers.alive() == [] and api.workers.newest() is not None
