"""The shared targets a fill asks for, read and moved inside a feature's unit of work.

A label's row of ``targets`` is the fill every replica's planner generates it up to
(:mod:`~genaug.service.pool.targets` says how it combines with a replica's own). A fill job
(:mod:`genaug.service.jobs`) raises its labels' targets in the same transaction it stores the
job in, reading the counts its progress starts from under the same label locks, and a cancel
lowers them again; these are those reads and writes, on the pool's own tables, for a
:class:`~genaug.service.pool.unit_of_work.UnitOfWork` that holds the labels' locks.

Example::

    with store.unit_of_work(write=True, locks={pid: labels}) as uow:
        start = counts_now(uow, pid, labels)
        raise_targets(uow, pid, {"circle": 500, "square": 500})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .unit_of_work import UnitOfWork

__all__ = ["counts_now", "lower_target", "raise_targets"]


def counts_now(uow: UnitOfWork, pool_id: str, labels: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per label: ``generated``, ``judged_total``, ``accepted_total`` (lifetime), ``fill``
    and the images in flight (``reserved``: live reservations of every replica) now."""
    out = {label: {"generated": 0, "judged_total": 0, "accepted_total": 0, "fill": 0,
                   "reserved": 0} for label in labels}
    for label, generated, judged, kept in uow.execute(
        "SELECT label, generated_total, judged_total, accepted_total FROM counters"
        " WHERE pool_id = ?", (pool_id,),
    ).fetchall():
        if str(label) in out:
            out[str(label)].update(generated=int(generated), judged_total=int(judged),
                                   accepted_total=int(kept))
    for label, fill in uow.execute(
        "SELECT label, COUNT(*) FROM images WHERE pool_id = ? AND accepted = 1"
        " GROUP BY label", (pool_id,),
    ).fetchall():
        if str(label) in out:
            out[str(label)]["fill"] = int(fill)
    for label, count in uow.execute(
        "SELECT label, COALESCE(SUM(count), 0) FROM reservations WHERE pool_id = ?"
        f" AND expires > {uow.now} GROUP BY label", (pool_id,),
    ).fetchall():
        if str(label) in out:
            out[str(label)]["reserved"] = int(count)
    return out


def raise_targets(uow: UnitOfWork, pool_id: str, targets: Mapping[str, int]) -> None:
    """Raise each label's shared target to at least its value (never lowered; 0 is no ask)."""
    for label, target in sorted(targets.items()):
        if int(target) > 0:
            uow.execute(
                "INSERT INTO targets (pool_id, label, target) VALUES (?, ?, ?)"
                " ON CONFLICT (pool_id, label) DO UPDATE SET"
                f" target = {uow.greatest}(targets.target, excluded.target)",
                (pool_id, label, int(target)),
            )


def lower_target(uow: UnitOfWork, pool_id: str, label: str, *, held: int,
                 others: Sequence[int]) -> tuple[int, int] | None:
    """Give back what one ask held of ``label``'s shared target: lower it to the larger of
    ``others`` (what the other live asks still want) and what the label holds and has in
    flight now, so nothing made or being made is wasted, unless someone else raised it beyond
    ``held`` (a waiting sample, an older genaug: then it is left alone). ``(before, after)``
    when it moved, else None. Call it under the label's lock."""
    row = uow.execute("SELECT target FROM targets WHERE pool_id = ? AND label = ?",
                      (pool_id, label)).fetchone()
    if row is None or int(row[0]) > held:
        return None
    fill, reserved = uow.execute(
        "SELECT (SELECT COUNT(*) FROM images WHERE pool_id = ? AND label = ?"
        " AND accepted = 1), (SELECT COALESCE(SUM(count), 0) FROM reservations"
        f" WHERE pool_id = ? AND label = ? AND expires > {uow.now})",
        (pool_id, label, pool_id, label),
    ).fetchone()
    keep = max([int(fill) + int(reserved), *others])
    if keep >= int(row[0]):
        return None
    uow.execute("UPDATE targets SET target = ? WHERE pool_id = ? AND label = ?",
                (keep, pool_id, label))
    return int(row[0]), keep
