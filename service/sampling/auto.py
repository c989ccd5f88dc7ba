"""``speed: auto``: the cheapest sampler whose images the judge accepts, decided per pool.

A recipe with ``speed: auto`` (and a judge: the recipe refuses ``auto`` without one) draws
its pool with the first sampler of :func:`candidates`, cheapest first, that passes
:mod:`~genaug.service.sampling.rule` against the recipe's own sampler on every label:
acceptance not lower by more than 0.05 (with evidence), diversity at least 0.9 of it.

**Probing.** The probes are pool images, judged and stored as usual, each with the id of the
sampler that drew it (the image's ``sampler``): they are the images the pool was asked for,
never extra ones made only to decide. :meth:`AutoSampler.sampling_for` hands the planner,
for a label, the sampler that label needs images of next: the recipe's own until it has
:data:`~genaug.service.sampling.rule.PROBE_IMAGES` of them, then the candidate under test. A
fill smaller than the probes is drawn by the recipe's own sampler alone, so a first fill
costs what it costs without ``auto``. A candidate is rejected as soon as one label's images
are worse with evidence (:data:`~genaug.service.sampling.rule.EARLY_IMAGES` of them can show
it), so a hopeless candidate costs a few images, not a round. When every label still drawn
(labels the judge stopped are left out: ``stopped``) has its probes of a candidate, it is
tested: ``pass`` decides, ``fail`` (or diversity below 0.9, or still undecided at
:data:`~genaug.service.sampling.rule.MAX_PROBE_IMAGES`) rejects it and the next is probed,
``more`` adds another round of probes to both arms of the undecided labels. When every
candidate fails, the recipe's own sampler is the decision. Where the pool pre-generates, the
idle generator also draws the probes a full label still lacks
(:meth:`AutoSampler.probe_needs`), so a full pool decides too, after any restart.

**The stop.** The low-acceptance stop (:mod:`~genaug.service.pool.acceptance`) judges an
``auto`` label on the images of the samplers that draw its pool, the recipe's own and the
decided one (:meth:`AutoSampler.stop_evidence`), never on a candidate's probes: probing never
stops a label that the recipe's own sampler fills.

**Where it lives.** The decision, its reason and what was rejected are the ``samplers`` row
of the pool database (one per pool id; :class:`~genaug.service.sampling.records.SamplerRow`,
read and written through the store's
:class:`~genaug.service.sampling.records.SamplerRecords`): it survives restarts and every
replica reads and writes the same row. Samplers are named there by their stable
:attr:`~genaug.service.sampling.modes.Sampling.id`. The evidence is the store's
``sampler_tallies``: each judged image counted by its sampler, judge key and adapter hash,
and its unit judge embedding added to a running sum (diversity needs only that:
:func:`~genaug.service.sampling.rule.diversity_of_sum`), in the transaction that adds it, so
eviction never takes evidence away, whatever the pool's capacity. A decision rests on a
*basis*: the judge's key, the recipe's adapter hashes and the turbo sampler. A start with
another basis (a judge or an adapter changed) probes again, counting only images judged by
this judge with these adapters. The decision is a fact of the pool: the recipe's hash and
pool id do not change.

**Hysteresis.** Once decided, every stored image of the chosen sampler and of the recipe's
keeps counting; the decision is withdrawn only when the chosen sampler is *worse with
evidence* on some label (the upper bound below -0.05), never on noise: the next candidate is
then probed.

Example::

    auto = AutoSampler(store.samplers, pid, recipe, judge_key="3f9c...", adapters={},
                       turbo=None)
    auto.sampling_for("7")        # the Sampling the planner draws label 7's next batch with
    auto.describe()               # {"state": "probing", "sampler": None, "reason": ...}
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from .modes import DrawnRecipe, Sampling, Turbo, recipe_sampling
from .records import Evidence, SamplerRecords, SamplerRow, Tally
from .rule import (
    DIVERSITY_BAND,
    EARLY_IMAGES,
    MARGIN,
    MAX_PROBE_IMAGES,
    MIN_DIVERSITY,
    PROBE_IMAGES,
    acceptance_interval,
    acceptance_test,
    diversity_of_sum,
    final_test,
)

__all__ = ["AutoSampler", "auto_basis", "candidates"]

log = logging.getLogger(__name__)

#: The candidates' schedulers and steps: LCM without guidance, then the fast multistep
#: solvers with the recipe's guidance; the recipe's own scheduler at a fraction of its steps.
_LCM_STEPS = (1, 2, 4)
_SOLVERS = ("dpmpp_2m", "unipc")
_SOLVER_STEPS = (2, 4, 8)
_FRACTIONS = (8, 4, 2)


def candidates(recipe: DrawnRecipe, turbo: Turbo | None) -> list[Sampling]:
    """The samplers ``auto`` tries for ``recipe``, cheapest first (UNet rows per image; the
    listed order among equals), each cheaper than the recipe's own, which comes last."""
    own = recipe_sampling(recipe)
    named = [Sampling("lcm", steps, 0.0) for steps in _LCM_STEPS]
    named += [Sampling(s, steps, recipe.guidance) for s in _SOLVERS for steps in _SOLVER_STEPS]
    named += [Sampling(recipe.scheduler, max(1, recipe.steps // k), recipe.guidance)
              for k in _FRACTIONS]
    if turbo is not None:
        named.append(turbo.sampling)
    seen: set[Sampling] = set()
    cheaper = []
    for sampling in sorted(named, key=lambda s: s.cost):  # stable: listed order among equals
        if sampling.cost < own.cost and sampling not in seen:
            seen.add(sampling)
            cheaper.append(sampling)
    return [*cheaper, own]


def auto_basis(judge_key: str | None, adapter_hashes: Sequence[str | None],
               turbo: Turbo | None) -> str:
    """What a decision rests on, hashed: the judge, the recipe's adapters, the turbo sampler."""
    text = json.dumps([judge_key, sorted(h or "" for h in adapter_hashes),
                       None if turbo is None else [turbo.sampling.name, str(turbo.lora)]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class AutoSampler:
    """One ``auto`` pool's sampler choice (module doc). ``sampling_for``, ``probe_needs``
    and ``stop_evidence`` run in the planner's thread; ``stored`` in the store thread;
    ``describe`` anywhere (cached). ``stopped()``: the labels the judge stopped now (left out
    of the decision)."""

    def __init__(self, records: SamplerRecords, pool_id: str, recipe: DrawnRecipe, *,
                 judge_key: str,
                 adapters: Mapping[str, str | None], turbo: Turbo | None,
                 probe: int = PROBE_IMAGES, max_probe: int = MAX_PROBE_IMAGES,
                 stopped: Callable[[], Collection[str]] = frozenset) -> None:
        self.records = records
        self.pool_id = pool_id
        self.recipe = recipe
        self.judge_key = judge_key
        #: Each label's adapter hash ("" without one): what its tallies are counted under.
        self.adapters = {label: adapters.get(label) or "" for label in recipe.label_names}
        self.basis = auto_basis(judge_key, list(self.adapters.values()), turbo)
        self.candidates = candidates(recipe, turbo)
        self.own = self.candidates[-1]
        self._by_id = {s.id: s for s in self.candidates}
        self.probe = probe
        self.max_probe = max_probe
        self._stopped = stopped
        self._lock = threading.Lock()
        self._row: SamplerRow | None = None
        #: Judged and kept images per sampler id and label under this basis (as last read).
        self._counts_read: dict[str, dict[str, Tally]] = {}
        #: The labels the judge had stopped when last read.
        self._halted: frozenset[str] = frozenset()
        self._dirty = True

    # -- what the planner and the pages ask --------------------------------------------------

    def sampling_for(self, label: str) -> Sampling:
        """The sampler ``label``'s next batch is drawn with (reads the pool when images were
        stored since the last call)."""
        with self._lock:
            return self._pick(self._refresh(), label)

    def _refresh(self) -> SamplerRow:
        """The row, read and advanced again when images were stored or labels stopped since
        the last read (hold the lock)."""
        halted = frozenset(self._stopped())
        if self._dirty or self._row is None or halted != self._halted:
            self._dirty = False
            self._halted = halted
            self._row = self._advance()
        return self._row

    def probe_needs(self) -> dict[str, int]:
        """Probe images each label still drawn needs next (of the one arm it is drawn with
        now: the recipe sampler's, then the candidate's), read now: what the idle generator
        draws for a label already at its target when the pool pre-generates (the probes are
        pool images; the tallies keep their evidence through eviction). Empty once decided."""
        with self._lock:
            row = self._refresh()
            if row.state != "probing":
                return {}
            wanted = row.evidence.wanted
            needs = {}
            for label in self._drawn_labels():
                for name in (self.own.id, self._testing(row)):
                    have = self._judged(name, label)
                    missing = wanted.get(name, {}).get(label, self.probe) - have
                    if missing > 0:
                        needs[label] = missing
                        break
            return needs

    def stop_evidence(self) -> dict[str, tuple[int, int]]:
        """Per label, images judged and kept of the samplers that draw the pool: the recipe's
        own and, once decided, the chosen one (never a candidate's probes). The
        low-acceptance stop judges an ``auto`` label on these, so probing never stops a label
        the recipe's own sampler fills."""
        with self._lock:
            row = self._refresh()
            names = {self.own.id}
            if row.state == "decided" and row.sampler:
                names.add(row.sampler)
            out: dict[str, tuple[int, int]] = {}
            for label in self.recipe.label_names:
                counts = [self._counts_read.get(n, {}).get(label, Tally()) for n in names]
                out[label] = (sum(c.judged for c in counts), sum(c.kept for c in counts))
            return out

    def _testing(self, row: SamplerRow) -> str:
        """The id of the candidate under test (the recipe's own sampler: none is left)."""
        return row.evidence.testing or self.own.id

    def _shown(self, sampler_id: str) -> str:
        """A sampler's name as people read it, by its id."""
        known = self._by_id.get(sampler_id)
        return known.name if known is not None else sampler_id

    def _judged(self, name: str, label: str) -> int:
        return self._counts_read.get(name, {}).get(label, Tally()).judged

    def _drawn_labels(self) -> list[str]:
        """The recipe's labels the judge has not stopped: the ones a decision is made over."""
        return [label for label in self.recipe.label_names if label not in self._halted]

    def stored(self) -> None:
        """Images of this pool were stored: look at the evidence again before the next pick."""
        self._dirty = True

    def describe(self) -> dict[str, Any]:
        """The decision for the recipe detail and the status page: ``state``, ``sampler``
        (the chosen :class:`~genaug.service.sampling.modes.Sampling` as a dict, or None while
        probing), ``reason``, ``cheaper`` (the recipe's UNet rows per image over the
        chosen's), ``candidates`` (each tried one's name and what became of it) and ``since``
        (seconds since the epoch: when this probing began, or when it was decided). Before
        the planner's first pick it reads the pool's row (blocking: call it from a thread)."""
        row = self._row
        if row is None:  # nothing planned yet since the start: the pool's row as stored
            try:
                row = self._read()
            except RuntimeError:  # the pool database unreachable: say what a start says
                row = None
            if row is None or row.basis != self.basis:
                row = SamplerRow(self.basis, "probing", None, "not planned yet")
        chosen = self._by_id.get(row.sampler or "")
        return {
            "state": row.state,
            "sampler": chosen.as_dict() if chosen is not None else None,
            "reason": row.reason,
            "cheaper": round(self.own.cost / chosen.cost, 2) if chosen is not None else None,
            "candidates": [{"name": s.name, "id": s.id, "result": row.evidence.rejected.get(
                s.id, "chosen" if chosen == s else "untried")} for s in self.candidates],
            "since": row.evidence.decided_at if row.state == "decided" else row.evidence.since,
        }

    # -- the decision ----------------------------------------------------------------------

    def _pick(self, row: SamplerRow, label: str) -> Sampling:
        if row.state == "decided" and row.sampler in self._by_id:
            return self._by_id[row.sampler]
        wanted = row.evidence.wanted
        for name in (self.own.id, self._testing(row)):
            if self._judged(name, label) < wanted.get(name, {}).get(label, self.probe):
                return self._by_id[name]
        # Both arms have their probes for this label: other labels are still probing; keep
        # drawing with the candidate under test (more evidence, and it is the cheaper).
        return self._by_id[self._testing(row)]

    def _advance(self) -> SamplerRow:
        """Read the row and the evidence; test, decide, withdraw; write what changed."""
        row = self._read()
        if row is None or row.basis != self.basis:
            why = "new pool" if row is None else "the judge, an adapter or turbo changed"
            row = SamplerRow(self.basis, "probing", None,
                             f"probing the recipe's own sampler ({why})",
                             Evidence(testing=self._first_untried({}), why=why,
                                      since=time.time()))
            self._write(row)
        counts = self._counts()
        self._counts_read = counts
        before = json.dumps([row.state, row.sampler, row.reason, row.evidence.to_json()])
        if row.state == "decided":
            self._recheck(row, counts)
        while row.state == "probing":
            if not self._test(row, counts):
                break
        if json.dumps([row.state, row.sampler, row.reason, row.evidence.to_json()]) != before:
            self._write(row)
        return row

    def _first_untried(self, rejected: dict[str, str]) -> str:
        for sampling in self.candidates[:-1]:
            if sampling.id not in rejected:
                return sampling.id
        return self.own.id

    def _test(self, row: SamplerRow, counts: dict[str, dict[str, Tally]]) -> bool:
        """Test the candidate under test if its probes are in; True when the state moved on
        (decided, or the next candidate is up), so the caller tests again."""
        testing = self._testing(row)
        if testing == self.own.id:
            self._decide(row, self.own, "no cheaper candidate matched the recipe's own sampler "
                         "on every label; it draws the pool")
            return True
        wanted = row.evidence.wanted
        own_counts, cand_counts = counts.get(self.own.id, {}), counts.get(testing, {})
        shown = self._shown(testing)
        labels = self._drawn_labels()
        if not labels:
            row.reason = "every label is stopped by the judge: nothing is drawn to decide on"
            return False
        # Worse with evidence on any label, probes complete or not: rejected now, so a
        # hopeless candidate costs a few images of the fill, not a round of them.
        for label in labels:
            ref, cand = own_counts.get(label, Tally()), cand_counts.get(label, Tally())
            if (cand.judged >= EARLY_IMAGES and ref.judged >= EARLY_IMAGES
                    and acceptance_test(cand.kept, cand.judged, ref.kept, ref.judged) == "fail"):
                return self._reject(row, testing, f"label {label}: acceptance "
                                    f"{cand.kept}/{cand.judged} against {ref.kept}/"
                                    f"{ref.judged}, lower by more than {MARGIN:g}")
        more: list[str] = []
        unmeasured: list[str] = []
        estimated: list[str] = []
        worst = 1.0
        for label in labels:
            ref, cand = own_counts.get(label, Tally()), cand_counts.get(label, Tally())
            need_ref = wanted.get(self.own.id, {}).get(label, self.probe)
            need = wanted.get(testing, {}).get(label, self.probe)
            if ref.judged < need_ref or cand.judged < need:
                if max(need_ref, need) > self.probe:
                    row.reason = f"probing {shown}: label {label} needs more images to tell"
                elif ref.judged >= need_ref:
                    row.reason = f"probing {shown}"
                else:
                    row.reason = f"probing the recipe's own sampler ({row.evidence.why})"
                return False  # probes still being drawn
            verdict = acceptance_test(cand.kept, cand.judged, ref.kept, ref.judged)
            if verdict == "fail":
                return self._reject(row, testing, f"label {label}: acceptance "
                                    f"{cand.kept}/{cand.judged} against {ref.kept}/"
                                    f"{ref.judged}, lower by more than {MARGIN:g}")
            if verdict == "more" and min(cand.judged, ref.judged) >= self.max_probe:
                # The last round: the estimate decides (its standard error is about 0.015).
                verdict = final_test(cand.kept, cand.judged, ref.kept, ref.judged)
                if verdict == "fail":
                    return self._reject(row, testing, f"label {label}: acceptance "
                                        f"{cand.kept}/{cand.judged} against {ref.kept}/"
                                        f"{ref.judged} at the most probes, lower by more "
                                        f"than {MARGIN:g}")
                estimated.append(label)
            if verdict == "more":
                more.append(label)
                continue
            ratio = self._diversity_ratio(counts, testing, label)
            if ratio is None:
                unmeasured.append(label)
                continue
            if ratio < MIN_DIVERSITY - DIVERSITY_BAND or (
                    ratio < MIN_DIVERSITY and cand.judged >= self.max_probe):
                return self._reject(row, testing, f"label {label}: diversity {ratio:.2f} of "
                                    f"the recipe's, below {MIN_DIVERSITY:g}")
            if ratio < MIN_DIVERSITY:  # just below the bar: measure on more images
                more.append(label)
                continue
            worst = min(worst, ratio)
        if more:
            for label in more:
                for name in (self.own.id, testing):
                    have = counts.get(name, {}).get(label, Tally()).judged
                    wanted.setdefault(name, {})[label] = min(self.max_probe, have + self.probe)
            row.reason = (f"probing {shown}: labels {', '.join(more)} need more images to "
                          "tell")
            return False
        chosen = self._by_id[testing]
        unsaid = (f" (not measured on labels {', '.join(unmeasured)}: their images were "
                  "judged without embeddings)" if unmeasured else "")
        if estimated:
            unsaid += (f"; labels {', '.join(estimated)} decided on the estimate at "
                       f"{self.max_probe} images")
        self._decide(row, chosen, (
            f"{chosen.name}: every label's judge acceptance within {MARGIN:g} of the recipe's "
            f"own sampler ({self.own.name}; one-sided 95 %), diversity at least "
            f"{worst:.2f} of it{unsaid}; {self.own.cost / chosen.cost:.1f}x fewer UNet rows "
            "per image"))
        return True

    def _reject(self, row: SamplerRow, sampler_id: str, why: str) -> bool:
        row.evidence.rejected[sampler_id] = why
        nxt = self._first_untried(row.evidence.rejected)
        row.evidence.testing = nxt
        row.reason = f"{self._shown(sampler_id)} rejected ({why}); probing {self._shown(nxt)}"
        log.info("pool %s auto: %s", self.pool_id, row.reason)
        return True

    def _decide(self, row: SamplerRow, chosen: Sampling, reason: str) -> None:
        row.state, row.sampler, row.reason = "decided", chosen.id, reason
        row.evidence.decided_at = time.time()
        log.info("pool %s auto: decided %s", self.pool_id, reason)

    def _recheck(self, row: SamplerRow, counts: dict[str, dict[str, Tally]]) -> None:
        """Hysteresis: withdraw the decision only when the chosen sampler is worse with
        evidence on some label."""
        if row.sampler is None or row.sampler == self.own.id:
            return
        own_counts, cand_counts = counts.get(self.own.id, {}), counts.get(row.sampler, {})
        for label in self.recipe.label_names:
            ref, cand = own_counts.get(label, Tally()), cand_counts.get(label, Tally())
            if not ref.judged or not cand.judged:
                continue
            _, upper = acceptance_interval(cand.kept, cand.judged, ref.kept, ref.judged)
            if upper < -MARGIN:
                name = row.sampler
                row.state, row.sampler = "probing", None
                row.evidence.since = time.time()
                self._reject(row, name, f"withdrawn: label {label}'s acceptance "
                             f"{cand.kept}/{cand.judged} fell below the recipe's "
                             f"{ref.kept}/{ref.judged} by more than {MARGIN:g}")
                return

    def _diversity_ratio(self, counts: dict[str, dict[str, Tally]], name: str,
                         label: str) -> float | None:
        """The candidate's diversity over the recipe sampler's on ``label``, from every
        probe's embedding (the tallies' sums); None when either has no sum (images judged
        before the tallies kept one)."""
        cand = counts.get(name, {}).get(label)
        ref = counts.get(self.own.id, {}).get(label)
        if cand is None or ref is None or cand.embedding is None or ref.embedding is None:
            return None
        mine = diversity_of_sum(cand.judged, cand.embedding)
        theirs = diversity_of_sum(ref.judged, ref.embedding)
        return mine / theirs if theirs > 0 else None

    # -- the pool database ---------------------------------------------------------------------

    def _read(self) -> SamplerRow | None:
        return self.records.read(self.pool_id)

    def _write(self, row: SamplerRow) -> None:
        self.records.write(self.pool_id, row)

    def _counts(self) -> dict[str, dict[str, Tally]]:
        """Judged and kept images per sampler and label, under this judge and each label's
        adapter (the store's tallies)."""
        out: dict[str, dict[str, Tally]] = {}
        for name, label, adapter, tally in self.records.tallies(self.pool_id, self.judge_key):
            if self.adapters.get(label) == adapter:
                out.setdefault(name, {})[label] = tally
        return out
