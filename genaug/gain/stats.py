"""Paired differences, their 95 % interval and the verdict of an arm at one ``k``.

Every arm of a seed trains on the same shots with the same initialisation as ``real`` does, so
an arm's effect is measured per seed as its accuracy minus ``real``'s (points), and summarised
by the mean of those differences and its two-sided 95 % confidence interval (Student's t over
the seeds). The verdict reads the interval, never the mean alone:

- ``helps``: the whole interval is above 0;
- ``hurts``: the whole interval is below 0;
- ``no measurable gain``: it holds 0 (or there are fewer than two seeds).

Example::

    mean, low, high = paired_interval([3.0, 5.5, 1.0, 4.0])
    verdict(low, high)                        # "helps"
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["HELPS", "HURTS", "NO_GAIN", "VERDICTS", "mean_interval", "paired_interval",
           "t_quantile", "verdict"]

HELPS = "helps"
NO_GAIN = "no measurable gain"
HURTS = "hurts"
VERDICTS = (HELPS, NO_GAIN, HURTS)

#: Student's t, two-sided 95 % (the 0.975 quantile), for 1 to 30 degrees of freedom.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (a table to 30,
    then the series in ``1/df`` that meets the normal's 1.960)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and two-sided 95 % t interval of ``values``; (mean, nan, nan) for one value."""
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def paired_interval(differences: Sequence[float]) -> tuple[float, float, float]:
    """Mean and 95 % interval of per-seed differences (points): :func:`mean_interval`."""
    return mean_interval(differences)


def verdict(low: float, high: float) -> str:
    """``helps`` / ``hurts`` when the interval is wholly above / below 0, else
    ``no measurable gain`` (also for an interval not known: fewer than two seeds)."""
    if math.isnan(low) or math.isnan(high):
        return NO_GAIN
    if low > 0:
        return HELPS
    if high < 0:
        return HURTS
    return NO_GAIN
