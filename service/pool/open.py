"""Opening a pool: the one factory, and the only module that knows both backends.

:func:`open_pool` is the one place a store is built: it opens the store at a target (a
``postgresql://``/``postgres://`` URL: :class:`~genaug.service.pool.postgres.PostgresPoolStore`;
anything else is a SQLite file: :class:`~genaug.service.pool.sqlite.SqlitePoolStore`).
:func:`open_pool_store` calls it with the settings (``GENAUG_POOL_URL`` or
``GENAUG_POOL_PATH``, ``GENAUG_REPLICA``, ``GENAUG_POOL_LEASE_S``);
:func:`check_pool_settings` refuses settings that can never work before anything is opened,
and :func:`replica_info` is the ``replica`` group of ``/v1/info``. Everything else speaks
to :class:`~genaug.service.pool.store.PoolStore`.

Example::

    with open_pool("pool.db", capacity_per_label=1000) as store:
        store.fill(pool_id)
    store = open_pool_store(Settings())  # blocking: from a thread in the service
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .postgres import DEFAULT_CONNECT_TIMEOUT_S, PostgresPoolStore
from .sqlite import SqlitePoolStore
from .store import PoolStore
from .types import DEFAULT_LEASE_S, PG_SCHEMES, PoolConfigError, parse_partition

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["check_pool_settings", "open_pool", "open_pool_store", "replica_info"]


def open_pool(
    target: str | Path,
    *,
    capacity_per_label: int,
    partition: tuple[int, int] | None = None,
    lease_s: float = DEFAULT_LEASE_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> PoolStore:
    """The pool at ``target``: PostgreSQL for a ``postgresql://`` or ``postgres://`` URL, else
    a SQLite file (created if missing). Blocking (it connects, checks and upgrades the schema).
    ``connect_timeout_s``: how long a PostgreSQL connection may take before the pool counts
    as unreachable.

    Raises :class:`~genaug.service.pool.types.PoolError` (its subclasses say why) with one line.
    """
    if isinstance(target, str) and target.startswith(PG_SCHEMES):
        return PostgresPoolStore(target, capacity_per_label=capacity_per_label,
                                 partition=partition, lease_s=lease_s,
                                 connect_timeout_s=connect_timeout_s)
    return SqlitePoolStore(target, capacity_per_label=capacity_per_label,
                           partition=partition, lease_s=lease_s)


def _pool_url(settings: Settings) -> str | None:
    if settings.pool_url is None:
        return None
    return settings.pool_url.get_secret_value() or None


def check_pool_settings(settings: Settings) -> None:
    """Raise :class:`~genaug.service.pool.types.PoolConfigError` (one line) for pool settings
    that can never work."""
    url = _pool_url(settings)
    parse_partition(settings.replica)
    if url is None:
        return
    if not url.startswith(PG_SCHEMES):
        scheme = url.split("://", 1)[0] if "://" in url else url[:20]
        raise PoolConfigError(
            f"GENAUG_POOL_URL has scheme {scheme!r}; only postgresql:// or postgres:// is "
            "supported (e.g. postgresql://genaug:PASSWORD@db:5432/genaug); for a SQLite pool "
            "set GENAUG_POOL_PATH instead"
        )
    if "pool_path" in settings.model_fields_set:
        raise PoolConfigError(
            "both GENAUG_POOL_URL and GENAUG_POOL_PATH are set; the pool lives in one place: "
            "keep GENAUG_POOL_URL for a shared PostgreSQL pool or GENAUG_POOL_PATH for a "
            "SQLite file, not both"
        )


def open_pool_store(settings: Settings, *, capacity_per_label: int | None = None) -> PoolStore:
    """The pool the settings name: PostgreSQL for ``GENAUG_POOL_URL``, else the SQLite file
    ``GENAUG_POOL_PATH``. Raises :class:`~genaug.service.pool.types.PoolError` (its
    subclasses say why) with one line.

    Blocking (it connects, checks and upgrades the schema): call it from a thread.
    """
    check_pool_settings(settings)
    return open_pool(
        _pool_url(settings) or settings.pool_path,
        capacity_per_label=capacity_per_label or settings.pool_capacity_per_label,
        partition=parse_partition(settings.replica),
        lease_s=settings.pool_lease_s,
    )


def replica_info(settings: Settings) -> dict[str, str | bool | None]:
    """The ``replica`` group of ``/v1/info``: the plan partition, the pool backend, whether
    idle pre-generation fills pools to capacity (off: only samples that wait and ``fill``
    targets make pool images, which a feeder wants to know before it waits), and the role."""
    partition = parse_partition(settings.replica)
    return {
        "partition": f"{partition[0]}/{partition[1]}" if partition else None,
        "pool_backend": "postgresql" if _pool_url(settings) else "sqlite",
        "pregenerate": bool(settings.pregenerate),
        "role": settings.role,
    }
