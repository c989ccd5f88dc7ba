"""The pool database's tables of schema 4 and later, one text for both backends.

The store is the database: its schema, whatever feature reads or writes a table, is written
here and created by the backends (:mod:`~genaug.service.pool.sqlite`,
:mod:`~genaug.service.pool.postgres`), with their upgrades. The features own their queries:
``jobs`` is the fill jobs' (:mod:`genaug.service.jobs.queries`), ``stops`` the judge's
(:mod:`~genaug.service.pool.stop_queries`), ``recipes`` the recipe specs'
(:mod:`~genaug.service.pool.recipe_specs`), ``samplers`` and ``sampler_tallies`` ``auto``'s
(:mod:`~genaug.service.pool.sampler_queries`: every judged image the store adds is counted
there by its sampler, judge and adapter, with the sum of its unit judge embeddings, by a
listener in the add's transaction, so eviction never takes ``auto``'s evidence away).

The dialects differ only where filled in: ``real`` is the backend's float type, ``options``
what follows a table's definition (SQLite: `` WITHOUT ROWID``: the keys are text).

Example::

    schema_tables(real="DOUBLE PRECISION")                # PostgreSQL
    schema_tables(real="REAL", options=" WITHOUT ROWID")  # SQLite
"""

from __future__ import annotations

__all__ = ["POOL_TABLES", "schema_tables"]

POOL_TABLES = ("counters", "targets", "reservations", "stops", "recipes", "samplers",
               "sampler_tallies")
"""Every table whose rows belong to one pool (a ``pool_id`` column): what
:meth:`~genaug.service.pool.store.PoolStore.drop_pool` deletes besides the images (``images``,
with ``image_data`` by image id). ``jobs`` is not here: a dropped pool's jobs stay listed, its
live ones failed. A new per-pool table goes here, or a pool dropped and filled again inherits
its rows (``tests/service/pool/test_pool.py`` reads every backend's schema for this)."""

# Version 4 (jobs, stops), 5 (recipes, jobs.webhook_first) and 6 (samplers: auto's
# decisions). No semicolons but between statements: the text is split on them.
_TABLES = """
CREATE TABLE IF NOT EXISTS jobs (
    id               TEXT PRIMARY KEY,
    pool_id          TEXT    NOT NULL,
    recipe           TEXT    NOT NULL,
    kind             TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    asked            TEXT    NOT NULL,
    start            TEXT    NOT NULL,
    notify_url       TEXT,
    reason           TEXT,
    created          {real}  NOT NULL,
    updated          {real}  NOT NULL,
    ended            {real},
    webhook_state    TEXT,
    webhook_claim    TEXT,
    webhook_until    {real},
    webhook_attempts INTEGER NOT NULL DEFAULT 0,
    result           TEXT,
    webhook_first    {real}
){options};
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created);
CREATE TABLE IF NOT EXISTS stops (
    pool_id    TEXT   NOT NULL,
    label      TEXT   NOT NULL,
    reason     TEXT   NOT NULL,
    judge_key  TEXT   NOT NULL,
    stopped_at {real} NOT NULL,
    PRIMARY KEY (pool_id, label)
){options};
CREATE TABLE IF NOT EXISTS recipes (
    pool_id   TEXT    PRIMARY KEY,
    recipe    TEXT    NOT NULL,
    spec      TEXT    NOT NULL,
    spec_hash TEXT    NOT NULL,
    recorded  {real}  NOT NULL
){options};
CREATE TABLE IF NOT EXISTS samplers (
    pool_id  TEXT    PRIMARY KEY,
    basis    TEXT    NOT NULL,
    state    TEXT    NOT NULL,
    sampler  TEXT,
    reason   TEXT    NOT NULL,
    evidence TEXT    NOT NULL,
    decided  {real}  NOT NULL
){options};
CREATE TABLE IF NOT EXISTS sampler_tallies (
    pool_id      TEXT    NOT NULL,
    label        TEXT    NOT NULL,
    sampler      TEXT    NOT NULL,
    judge_key    TEXT    NOT NULL,
    adapter_hash TEXT    NOT NULL,
    judged       BIGINT  NOT NULL,
    kept         BIGINT  NOT NULL,
    embedding    TEXT,
    PRIMARY KEY (pool_id, label, sampler, judge_key, adapter_hash)
){options}
"""


def schema_tables(*, real: str, options: str = "") -> list[str]:
    """The tables and indexes of schema 4 and later, one statement each, in one backend's
    dialect (module doc)."""
    script = _TABLES.format(real=real, options=options)
    return [statement.strip() for statement in script.split(";") if statement.strip()]
