"""Fixtures of the pool tests: every store test runs on both backends.

``target`` is where a fresh pool lives (a new SQLite file, or a new database on a real
PostgreSQL server from ``_postgres.py``, which skips without one and fails under CI);
``open_store`` opens stores on it, closed at the end of the test; ``store`` is one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _postgres import shared_cluster

from genaug.service.pool.open import open_pool
from genaug.service.pool.store import PoolStore

Opener = Callable[..., PoolStore]


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def target(backend: str, tmp_path: Path) -> str:
    """Where a fresh pool lives: a new SQLite file, or a new database on a real server."""
    if backend == "postgresql":
        return shared_cluster().new_database()
    return str(tmp_path / "pool.db")


@pytest.fixture
def open_store(target: str) -> Iterator[Opener]:
    """Open stores on the test's pool (several may be open at once); all closed at the end."""
    opened: list[PoolStore] = []

    def open_(**kwargs: object) -> PoolStore:
        kwargs.setdefault("capacity_per_label", 100)
        # These tests are about what the store does, not about outages: a starved machine
        # (a CPU hog beside the suite) must not turn a slow connect into one.
        kwargs.setdefault("connect_timeout_s", 30.0)
        store = open_pool(target, **kwargs)  # type: ignore[arg-type]
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: Opener) -> PoolStore:
    return open_store()
