"""A fill job's progress bar: the terminal side of a wait, kept out of the I/O-free core.

``Client.wait_job`` and ``AsyncClient.wait_job`` (and their ``FillJob.wait``) attach a
:class:`JobBar` to their :class:`~genaug.client._jobs.JobWatch` with :func:`job_bar`: a tqdm
bar on stderr of the images the job's labels hold toward what it asked, the rate and time left
of what the job made while it was watched, and the job's state. ``progress``: ``None`` draws
it where stderr is a terminal and tqdm is installed, ``True`` always (tqdm required),
``False`` never.

Example::

    watch = JobWatch(job_id, timeout=None, poll_s=1.0, on_update=on_update)
    with job_bar(watch, progress=None):   # the bar first, then on_update, at every poll
        while not watch.seen(client.job(job_id)):
            time.sleep(watch.delay())
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._jobs import JobWatch, job_held


class JobBar:
    """One job's tqdm bar, drawn from the polls' answers (:meth:`update`).

    The bar starts where the job stood at the first poll (a ``per_label`` job's labels held
    images before it began), with tqdm's ``initial``: its rate and time left count only what
    came after, the job's own work, never that first jump. One rate per frame; the postfix is
    the job's state.

    Example::

        bar = JobBar("j_0123456789abcdef", tqdm)
        bar.update(client.job("j_0123456789abcdef"))   # at every poll
        bar.close()
    """

    def __init__(self, job_id: str, tqdm: Any) -> None:
        self.job_id = job_id
        self._tqdm = tqdm
        self._bar: Any = None

    def update(self, job: dict[str, Any]) -> None:
        """Draw ``job`` (a ``GET /v1/jobs/{id}`` answer); the first call opens the bar."""
        held, asked = job_held(job)
        if self._bar is None:
            self._bar = self._tqdm(total=asked, initial=min(held, asked), desc=self.job_id,
                                   unit="img", file=sys.stderr, dynamic_ncols=True,
                                   leave=True)
        self._bar.total = asked
        self._bar.n = max(self._bar.initial, min(held, asked))
        self._bar.set_postfix_str(str(job.get("state")), refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


@contextmanager
def job_bar(watch: JobWatch, progress: bool | None) -> Iterator[JobBar | None]:
    """For one wait: a :class:`JobBar` on ``watch`` when ``progress`` wants one (see the module
    doc), updated at every poll before the watch's own ``on_update``, and closed when the wait
    ends, however it ends; ``None`` (nothing attached) when no bar is wanted.

    Raises:
        ImportError: ``progress=True`` without tqdm installed (before anything is polled).
    """
    tqdm = _tqdm_class(progress)
    if tqdm is None:
        yield None
        return
    bar = JobBar(watch.job_id, tqdm)
    then = watch.on_update

    def update(job: dict[str, Any]) -> None:
        bar.update(job)
        if then is not None:
            then(job)

    watch.on_update = update
    try:
        yield bar
    finally:
        watch.on_update = then
        bar.close()


def _tqdm_class(progress: bool | None) -> Any:
    """tqdm's class when a bar is wanted (see the module doc), else None."""
    if progress is False or (progress is None and not _stderr_is_a_terminal()):
        return None
    try:
        from tqdm import tqdm
    except ImportError as exc:
        if progress is None:
            return None  # the bar is a nicety where a terminal shows it; waiting works without
        raise ImportError("wait(progress=True) draws a tqdm bar: pip install tqdm, or pass "
                          "progress=False") from exc
    return tqdm


def _stderr_is_a_terminal() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False
