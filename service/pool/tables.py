"""The pool database's tables and indexes, each declared once for both backends.

The store is the database: its schema, whatever feature reads or writes a table, is written
here and created by the backends (:mod:`~genaug.service.pool.sqlite`,
:mod:`~genaug.service.pool.postgres`), with their upgrades (the columns an older layout
lacks: each backend's, since only PostgreSQL adds a column ``IF NOT EXISTS``). The core
tables (``images`` and its pixels, ``counters``, ``targets``, ``reservations``) are the
store's own. The features own their queries:
``jobs`` is the fill jobs' (:mod:`genaug.service.jobs.queries`), ``stops`` the judge's
(:mod:`~genaug.service.pool.stop_queries`), ``recipes`` the recipe specs'
(:mod:`~genaug.service.pool.recipe_specs`), ``samplers`` and ``sampler_tallies`` ``auto``'s
(:mod:`~genaug.service.pool.sampler_queries`: every judged image the store adds is counted
there by its sampler, judge and adapter, with the sum of its unit judge embeddings, by a
listener in the add's transaction, so eviction never takes ``auto``'s evidence away).

The dialects differ only where a :class:`Dialect` fills in: the float, wide and narrow
integer and bytes types, the identity key, and what follows a text-keyed table's definition
(SQLite: `` WITHOUT ROWID``).

Example::

    schema_tables(POSTGRES)   # every CREATE TABLE, in PostgreSQL's words
    schema_indexes()          # the indexes, created once the upgrades have run
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["POOL_TABLES", "POSTGRES", "SQLITE", "Dialect", "schema_indexes", "schema_tables"]


@dataclass(frozen=True)
class Dialect:
    """Where the backends' DDL differs: the float type, a wide and a narrow integer, bytes,
    an identity primary key, and ``options`` after a table whose key is text."""

    real: str
    big: str
    small: str
    blob: str
    identity: str
    options: str


#: SQLite: ``INTEGER PRIMARY KEY`` is the rowid; a text key needs no rowid.
SQLITE = Dialect(real="REAL", big="INTEGER", small="INTEGER", blob="BLOB",
                 identity="INTEGER PRIMARY KEY", options=" WITHOUT ROWID")
POSTGRES = Dialect(real="DOUBLE PRECISION", big="BIGINT", small="SMALLINT", blob="BYTEA",
                   identity="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", options="")

POOL_TABLES = ("counters", "targets", "reservations", "stops", "recipes", "samplers",
               "sampler_tallies")
"""Every table whose rows belong to one pool (a ``pool_id`` column): what
:meth:`~genaug.service.pool.store.PoolStore.drop_pool` deletes besides the images (``images``,
with ``image_data`` by image id). ``jobs`` is not here: a dropped pool's jobs stay listed, its
live ones failed. A new per-pool table goes here, or a pool dropped and filled again inherits
its rows (``tests/service/pool/test_pool.py`` reads every backend's schema for this)."""

# The layout of schema 7: the core tables (1, with 2's targets and reservations and the columns
# later versions added), jobs and stops (4), recipes (5), samplers and their tallies (6), the
# workers an api sends generation to (7; pool/workers.py). No semicolons but between
# statements: the text is split on them.
_TABLES = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
){options};
CREATE TABLE IF NOT EXISTS images (
    id             {identity},
    pool_id        TEXT    NOT NULL,
    label          TEXT    NOT NULL,
    seed           {big}   NOT NULL,
    created        {real}  NOT NULL,
    model_hash     TEXT    NOT NULL,
    served         {big}   NOT NULL DEFAULT 0,
    height         INTEGER NOT NULL,
    width          INTEGER NOT NULL,
    channels       {small} NOT NULL DEFAULT 3,
    plan_index     {big},
    source         TEXT,
    scheduler      TEXT    NOT NULL DEFAULT 'default',
    adapter        TEXT,
    adapter_scale  {real},
    score          {real},
    judge_keep     {small} NOT NULL DEFAULT 1,
    verdict        TEXT,
    verdict_at     {real},
    accepted       {small} NOT NULL DEFAULT 1,
    steps          INTEGER,
    guidance       {real},
    strength       {real},
    adapter_hash   TEXT,
    judge_key      TEXT,
    judge_settings TEXT,
    speed          TEXT,
    sampler        TEXT
);
CREATE TABLE IF NOT EXISTS image_data (
    id   {big} PRIMARY KEY REFERENCES images (id),
    data {blob} NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    pool_id         TEXT  NOT NULL,
    label           TEXT  NOT NULL,
    generated_total {big} NOT NULL DEFAULT 0,
    served_total    {big} NOT NULL DEFAULT 0,
    next_index      {big} NOT NULL DEFAULT 0,
    judged_total    {big} NOT NULL DEFAULT 0,
    accepted_total  {big} NOT NULL DEFAULT 0,
    PRIMARY KEY (pool_id, label)
){options};
CREATE TABLE IF NOT EXISTS targets (
    pool_id TEXT  NOT NULL,
    label   TEXT  NOT NULL,
    target  {big} NOT NULL,
    PRIMARY KEY (pool_id, label)
){options};
CREATE TABLE IF NOT EXISTS reservations (
    id          {identity},
    pool_id     TEXT   NOT NULL,
    label       TEXT   NOT NULL,
    owner       TEXT   NOT NULL,
    start_index {big}  NOT NULL,
    stride      {big}  NOT NULL,
    count       {big}  NOT NULL,
    created     {real} NOT NULL,
    expires     {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS workers (
    id       TEXT   PRIMARY KEY,
    url      TEXT   NOT NULL,
    role     TEXT   NOT NULL,
    identity TEXT   NOT NULL,
    started  {real} NOT NULL,
    expires  {real} NOT NULL
){options};
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


#: Every index. Created after the upgrades, on every open: the columns they cover exist by then
#: whatever version the database was.
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS images_pool_label_served ON images (pool_id, label, served)",
    "CREATE UNIQUE INDEX IF NOT EXISTS images_plan_index ON images (pool_id, label, plan_index)",
    "CREATE INDEX IF NOT EXISTS images_pool_label_accepted"
    " ON images (pool_id, label, accepted, served)",
    "CREATE INDEX IF NOT EXISTS reservations_pool_label ON reservations (pool_id, label)",
    "CREATE INDEX IF NOT EXISTS reservations_owner ON reservations (owner)",
    "CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state)",
    "CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created)",
)


def schema_tables(dialect: Dialect) -> list[str]:
    """Every table of the current layout, one ``CREATE TABLE IF NOT EXISTS`` each, in
    ``dialect``'s words (module doc)."""
    script = _TABLES.format(**asdict(dialect))
    return [statement.strip() for statement in script.split(";") if statement.strip()]


def schema_indexes() -> list[str]:
    """Every index, one ``CREATE INDEX IF NOT EXISTS`` each (the same in both dialects)."""
    return list(_INDEXES)
