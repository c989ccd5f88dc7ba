"""The statistics of ``speed: auto``: is a cheaper sampler's acceptance as good as the recipe's?

Pure functions over counts and embeddings (numpy only), so the decision rule is tested on its
own (:mod:`~genaug.service.sampling.auto` applies it to a pool).

**Acceptance, per label.** A candidate passes a label when its judge acceptance is *not worse*
than the recipe sampler's by more than :data:`MARGIN` (0.05), with evidence: the lower bound of
a one-sided 95 % interval of the difference (Agresti and Caffo's: one success and one failure
added to each arm, which keeps its coverage near 95 % where acceptances are close to 1, as a
judge's are) is above ``-MARGIN``. It fails a label when the *upper* bound is below
``-MARGIN`` (clearly worse). Between the two the evidence is not enough: probe another round
of both arms, up to :data:`MAX_PROBE_IMAGES` (512) each, where the estimate decides
(:func:`final_test`: a true difference of -0.03 would need some 600 images per arm to prove
within the margin; the estimate's standard error at 512 is 0.015). At :data:`PROBE_IMAGES`
(64) per arm and acceptances near 0.98 the interval's half-width is about 0.05; at 32 it is
0.07, and the decision would be noise.

**Hysteresis.** Entering takes "not worse, with evidence"; leaving a chosen sampler takes
"worse, with evidence" (the upper bound below ``-MARGIN``) on everything stored since: a
sampler between the two stays where it is, so the decision does not flip with each batch.

**Diversity, per label.** The root mean square of the pairwise Euclidean distances of the
judge's embeddings (each normalised to length 1) of a label's images. For unit vectors it
needs only their count ``n`` and their sum ``S``: ``sqrt(2 (n^2 - |S|^2) / (n (n - 1)))``, so
the store keeps a running sum per sampler and label (:func:`diversity_of_sum`) and every
probe counts, however many the pool keeps. A candidate keeps at least
:data:`MIN_DIVERSITY` (0.9) of the recipe sampler's on every label. A ratio within
:data:`DIVERSITY_BAND` below the bar is measured again on another round of probes of both
arms (an estimate on 64 images moves by a few hundredths), and rejected only below the band
or at the most probes.

**Early rejection.** A candidate whose acceptance is already worse with evidence on one label
is rejected from :data:`EARLY_IMAGES` images per arm on, without waiting for its round: the
probes are the pool's asked-for images, and a candidate the judge rejects almost always would
otherwise spend a round of them.

Example::

    acceptance_test(kept=62, n=64, ref_kept=63, ref_n=64)   # 'pass'
    acceptance_test(kept=50, n=64, ref_kept=63, ref_n=64)   # 'fail'
    diversity(embeddings)                                   # RMS pairwise distance
    diversity_of_sum(n, embeddings.sum(axis=0))             # the same, from a running sum
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

__all__ = ["DIVERSITY_BAND", "EARLY_IMAGES", "MARGIN", "MAX_PROBE_IMAGES", "MIN_DIVERSITY",
           "PROBE_IMAGES", "Z", "Verdict", "acceptance_interval", "acceptance_test",
           "diversity", "diversity_of_sum", "final_test"]

#: How much lower a candidate's acceptance may be than the recipe sampler's.
MARGIN = 0.05
#: The least share of the recipe sampler's diversity a candidate keeps; a candidate measured
#: less than DIVERSITY_BAND below it is measured again on more images before it is rejected.
MIN_DIVERSITY = 0.9
DIVERSITY_BAND = 0.05
#: One-sided 95 % normal quantile.
Z = 1.6449
#: Images per label a sampler is probed with before its first test, and the most it is
#: probed with: past that, a candidate still undecided is taken as not good enough.
PROBE_IMAGES = 64
MAX_PROBE_IMAGES = 512
#: Images per arm from which a candidate already *worse with evidence* on a label is rejected
#: before its round of probes is complete (the interval is wide at 8: only a candidate far
#: below the recipe's sampler, such as one whose images the judge rejects almost all of,
#: fails that early; looking after every batch only ever rejects sooner, never accepts).
EARLY_IMAGES = 8

Verdict = Literal["pass", "fail", "more"]


def acceptance_interval(kept: int, n: int, ref_kept: int, ref_n: int) -> tuple[float, float]:
    """Agresti-Caffo one-sided 95 % bounds of ``kept/n - ref_kept/ref_n``: (lower, upper)."""
    p = (kept + 1) / (n + 2)
    q = (ref_kept + 1) / (ref_n + 2)
    se = math.sqrt(p * (1 - p) / (n + 2) + q * (1 - q) / (ref_n + 2))
    diff = p - q
    return diff - Z * se, diff + Z * se


def acceptance_test(kept: int, n: int, ref_kept: int, ref_n: int) -> Verdict:
    """``pass`` (not worse than ``MARGIN``, with evidence), ``fail`` (worse, with evidence)
    or ``more`` (probe more)."""
    lower, upper = acceptance_interval(kept, n, ref_kept, ref_n)
    if lower > -MARGIN:
        return "pass"
    if upper < -MARGIN:
        return "fail"
    return "more"


def final_test(kept: int, n: int, ref_kept: int, ref_n: int) -> Verdict:
    """The last round's call (both arms at :data:`MAX_PROBE_IMAGES`, still ``more``): the
    estimate decides, ``pass`` when the candidate's acceptance is not below the recipe
    sampler's by more than :data:`MARGIN`. At 512 images per arm the difference's standard
    error is about 0.015 near acceptances of 0.95: a candidate 0.08 worse passes once in
    thirty."""
    return "pass" if kept / n - ref_kept / ref_n >= -MARGIN else "fail"


def diversity(embeddings: np.ndarray) -> float:
    """Root mean square pairwise Euclidean distance of ``[n, d]`` embeddings, each normalised
    to length 1 (0 for fewer than two): what :func:`diversity_of_sum` computes from a sum."""
    x = np.asarray(embeddings, dtype=np.float64)
    if len(x) < 2:
        return 0.0
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    gram = x @ x.T
    squared = np.clip(2.0 - 2.0 * gram, 0.0, None)
    upper = np.triu_indices(len(x), 1)
    return float(np.sqrt(squared[upper].mean()))


def diversity_of_sum(n: int, total: np.ndarray) -> float:
    """:func:`diversity` of ``n`` unit embeddings whose sum is ``total`` (0 for fewer than
    two): ``sqrt(2 (n^2 - |total|^2) / (n (n - 1)))``."""
    if n < 2:
        return 0.0
    squared = float(np.dot(total, total))
    return float(np.sqrt(max(0.0, 2.0 * (n * n - squared) / (n * (n - 1)))))
