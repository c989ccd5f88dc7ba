"""The names a setting and a request share with the batcher, without numpy: the scheduler names.

``genaug serve --help`` builds its flags from the settings, which name the schedulers; this
module lets them do so without importing numpy (:mod:`~genaug.service.batching.items`, which
needs it, re-exports :data:`SchedulerName`).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["SchedulerName"]

#: Scheduler names (see :data:`~genaug.service.batching.items.SCHEDULERS`), as a type for
#: settings and schemas.
SchedulerName = Literal[
    "default", "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_karras", "unipc", "lcm", "tcd",
    "euler_trailing",
]
