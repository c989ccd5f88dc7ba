"""PyTorch datasets fed from a genaug pool: :class:`PoolDataset` draws synthetic images alone,
:class:`MixedDataset` swaps them into the user's own dataset at a ratio.

Both are ``IterableDataset`` s. Each process that iterates one (the process that trains, or
each DataLoader worker, on every DDP rank) draws from its own stream
(:mod:`~genaug.torch.stream`): a reservoir in its memory that a background thread refills
from the pool. A step never waits on the network: once a stream holds images it keeps drawing
from them when the service is away (the feeder says so once in the log and retries every 2 s
at most), and fresh images flow again within seconds of the service's return.

- :class:`PoolDataset` yields ``(image, label)``: ``image`` float32 ``[C, H, W]`` in [0, 1]
  with the recipe's channels, ``label`` an int64 scalar tensor (the recipe's label index, in
  the recipe's order unless ``label_map`` says otherwise: as the TensorFlow side numbers
  them), classes drawn evenly. Before its first image it waits, at most ``first_fill_s``,
  then raises naming the service.
- :class:`MixedDataset` goes through the user's dataset once per epoch (shuffled, split over
  the workers and the DDP ranks) and replaces each example by a synthetic image **of its own
  class** with probability ``p``; while that class holds no synthetic image yet the real one
  is kept, so the first steps never wait.

A ``transform`` (``torchvision.transforms.v2``, say) is applied to every image handed out,
real or synthetic.

Example::

    from torch.utils.data import DataLoader
    from torchvision.transforms import v2
    from genaug.torch import MixedDataset, PoolDataset

    pool = PoolDataset("http://gen-host:8000", "digits")
    train = MixedDataset(my_digits, pool, p=0.3,
                         transform=v2.Compose([v2.RandomAffine(degrees=10)]))
    loader = DataLoader(train, batch_size=64, num_workers=2, persistent_workers=True)
    for epoch in range(10):
        for images, labels in loader:
            ...
    train.stats()        # {"synthetic": ..., "real": ..., "share": 0.29, ...}
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from genaug.match import DomainMatch
from genaug.mixing import AUTO, default_share, resolve_share
from genaug.urls import url_refusal

from .identity import Place, client_id, default_trainer_id, place
from .stream import Stream, StreamConfig, Tally, layout, stop_stream, stream_for

__all__ = ["MixedDataset", "PoolDataset"]

log = logging.getLogger(__name__)

#: Clients that live on a need poster's thread only (created, used and closed there): a forked
#: worker never touches them, so the fork check of :func:`~genaug.torch.diagnose` skips them.
THREAD_OWNED: weakref.WeakSet[Any] = weakref.WeakSet()

Transform = Callable[[torch.Tensor], torch.Tensor]


def _tensor(image: np.ndarray) -> torch.Tensor:
    """uint8 ``[H, W, K]`` -> float32 ``[K, H, W]`` in [0, 1]."""
    return torch.from_numpy(image).permute(2, 0, 1).to(torch.float32).div_(255.0)


class PoolDataset(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Synthetic ``(image, label)`` pairs from recipe ``recipe``'s pool (module doc).

    Args:
        url: the service (None: ``GENAUG_URL``, else the client's default).
        recipe: the recipe to sample.
        label_map: recipe label name -> class index (default: the recipe's order).
        classes: instead of ``label_map``, the trainer's class names in index order (a
            torchvision ``ImageFolder``'s ``classes``), matched to the recipe's labels as
            ``genaug train`` matches them: the exact name, else one case-insensitive match.
        num_classes: classes of the trainer (default: the largest index + 1).
        length: items per epoch, over every worker of this process (None: endless).
        trainer_id: the trainer's name at the service (default
            :func:`~genaug.torch.identity.default_trainer_id`); its ranks and workers share
            it, as one trainer.
        memory_mb: the reservoirs of this trainer process, all its workers together.
        batch: images per request to the pool; interval_s: pause between requests.
        first_fill_s: how long the first draw may wait for the first image.
        seed: draws reproducible per (rank, worker) where the pool's images are the same.
        transform: applied to each image tensor.
        api_key, client_kwargs: for the clients the streams build.
        match: bring the pool's images to your own images' size, channels, framing and light
            (:class:`~genaug.match.DomainMatch`, docs/gain.md says what it is worth): a
            ``DomainMatch``, or your real training images as uint8 ``[N, H, W, C]`` (``C``
            1 or 3) to fit one from, here, once. Every image handed out then has their
            ``[C, H, W]``, whatever size the recipe makes, so a :class:`MixedDataset` of
            those images replaces each by a pool image of its own size. Each process's feeder
            matches every batch it receives, on its own thread, before writing it.

    Example::

        shots = (real_images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        pool = PoolDataset(url, "digits", match=shots)      # [N, 1, 28, 28] in [0, 1] before
        train = MixedDataset(TensorDataset(real_images, real_labels), pool)
    """

    def __init__(
        self,
        url: str | None = None,
        recipe: str = "",
        *,
        label_map: Mapping[str, int] | None = None,
        classes: Sequence[str] | None = None,
        num_classes: int | None = None,
        length: int | None = None,
        trainer_id: str | None = None,
        memory_mb: float = 256.0,
        batch: int = 32,
        interval_s: float = 0.25,
        first_fill_s: float = 60.0,
        seed: int | None = None,
        transform: Transform | None = None,
        api_key: str | None = None,
        client_kwargs: Mapping[str, Any] | None = None,
        match: DomainMatch | np.ndarray | None = None,
    ) -> None:
        if not recipe:
            raise ValueError("recipe= names the pool to draw from (GET /v1/recipes lists them)")
        if length is not None and length < 1:
            raise ValueError(f"length {length} must be >= 1 (or None: endless)")
        if label_map is not None and classes is not None:
            raise ValueError("pass label_map= or classes=, not both")
        if memory_mb <= 0 or batch < 1 or interval_s < 0 or first_fill_s <= 0:
            raise ValueError("memory_mb and first_fill_s must be > 0, batch >= 1, "
                             "interval_s >= 0")
        # The clients are built later, in the stream's threads: the client's URL rule is
        # said now, not after first_fill_s of "is the service up?".
        refused = url_refusal(url, owner="PoolDataset")
        if refused is not None:
            raise ValueError(refused)
        if match is not None and not isinstance(match, DomainMatch):
            try:  # fitted once, here: the workers get the fitted match with the config
                match = DomainMatch.fit(np.asarray(match))
            except ValueError as exc:
                raise ValueError(
                    f"PoolDataset match=: {exc}; pass a DomainMatch or your real training "
                    "images as uint8 [N, H, W, C] (from float tensors [N, C, H, W] in [0, 1]: "
                    "(x * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy())") from None
        self.config = StreamConfig(
            url=url, recipe=recipe, trainer=trainer_id or default_trainer_id(),
            label_map=dict(label_map) if label_map is not None else None,
            classes=tuple(str(c) for c in classes) if classes is not None else None,
            num_classes=num_classes, budget_bytes=int(memory_mb * 2**20), batch=batch,
            interval_s=interval_s, api_key=api_key, client_kwargs=dict(client_kwargs or {}),
            token=uuid.uuid4().hex, match=match)
        self.length = length
        self.first_fill_s = float(first_fill_s)
        self.seed = seed
        self.transform = transform
        self.tally = Tally()
        self._need = _NeedPoster(self.config)
        self._labels: dict[str, int] | None = None

    @property
    def trainer_id(self) -> str:
        return self.config.trainer

    def label_map(self) -> dict[str, int]:
        """Recipe label name -> class index as this dataset numbers them: ``label_map`` when
        given, else ``classes`` matched to the recipe's labels, else the recipe's labels in
        order (read from the service once)."""
        if self.config.label_map is not None:
            return dict(self.config.label_map)
        if self._labels is None:
            from genaug.client import Client

            with Client(self.config.url, api_key=self.config.api_key,
                        **dict(self.config.client_kwargs)) as client:
                self._labels = layout(self.config, client.recipe(self.config.recipe))[0]
        return dict(self._labels)

    def stream(self) -> Stream:
        """This process's stream (started on first use)."""
        return stream_for(self.config, self.tally)

    def close(self) -> None:
        """Stop this process's stream (its thread and client: a notebook's dataset it no longer
        uses); iterating again starts a new one. DataLoader workers' streams end with them."""
        stop_stream(self.config)

    def __enter__(self) -> PoolDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rng(self, where: Place, iteration: int) -> np.random.Generator:
        """The draws of one process in one epoch: from ``seed``, the rank, the worker."""
        if self.seed is None:
            return np.random.default_rng()
        return np.random.default_rng([self.seed, where.rank, where.worker, iteration])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        stream = self.stream()
        where = stream.where
        iteration = int(self.tally.get(stream.row, "iterations"))
        self.tally.add(stream.row, "iterations")
        count = _share(self.length, where)
        stream.wait_ready(self.first_fill_s)
        assert stream.reservoir is not None
        rng = self.rng(where, iteration)
        handed = 0
        while count is None or handed < count:
            stream.check()
            got = stream.reservoir.draw_any(rng)
            assert got is not None  # a class's fill never shrinks once the first came
            image, label = got
            self.tally.add(stream.row, "synthetic")
            handed += 1
            out = _tensor(image)
            yield (self.transform(out) if self.transform else out,
                   torch.tensor(label, dtype=torch.int64))

    def report_need(self, need: Mapping[str, float]) -> None:
        """Tell the service what this trainer needs (recipe label name -> number >= 0, e.g.
        :func:`~genaug.torch.need.class_need`), without waiting: a thread posts the newest
        report under the trainer's name (its ranks and workers are one trainer there). Never
        raises: labels the recipe lacks, and values that are not finite numbers >= 0, are
        left out, and said once in the log."""
        self._need.post(need)

    @property
    def need_sent(self) -> dict[str, float] | None:
        """The last need report the service took from this process, or None."""
        return self._need.sent

    def stats(self) -> dict[str, float]:
        """What every process of this trainer drew: ``synthetic``, ``received`` (fresh pool
        images), ``failures`` (requests that failed, outages included), ``iterations``,
        ``bytes``, the memory its reservoirs hold (at most ``memory_mb``, however many
        workers), and the mix's counters (:meth:`MixedDataset.stats`)."""
        return self.tally.totals()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_need"] = None  # a thread of the trainer's process: not for workers
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._need = _NeedPoster(self.config)


class MixedDataset(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """The user's ``dataset`` with each example replaced, with probability ``p``, by a
    synthetic image of its class from ``pool`` (module doc).

    ``p``: the share of examples replaced; ``"auto"`` (default) falls as real data grows
    (:func:`genaug.mixing.default_share` of the real images per class: ``real_per_class``
    when given, else ``len(dataset)`` over the recipe's labels: 0.5 at 1 or 2, 0.29 at 5,
    0.17 at 10), measured not to make a few-shot classifier worse than its real images alone
    (docs/gain.md).

    ``dataset``: map-style (``len`` and ``[i]``), each item ``(image, label)``: ``image`` a
    tensor ``[C, H, W]`` (float in [0, 1], or uint8, made float) of the recipe's size,
    ``label`` an int (or a 0-d tensor) of the same numbering as the pool's labels; an
    example whose label is none of the recipe's stays real (said once in the log, counted in
    ``stats()["outside"]``). ``shuffle`` shuffles each epoch (from ``seed`` when given);
    :meth:`set_epoch` is there for the ``DistributedSampler`` habit, but the epoch is counted
    without it.
    """

    def __init__(self, dataset: Any, pool: PoolDataset, p: float | str = "auto", *,
                 real_per_class: float | None = None, shuffle: bool = True,
                 seed: int | None = None, transform: Transform | None = None) -> None:
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError("dataset must be map-style (len(dataset) and dataset[i])")
        if isinstance(p, str):
            if p != AUTO:
                raise ValueError(f"p {p!r} must be a number within [0, 1] or 'auto'")
        elif not 0.0 <= p <= 1.0:
            raise ValueError(f"p {p} must be within [0, 1] (the share of examples replaced)")
        self.dataset = dataset
        self.pool = pool
        #: The share of examples replaced: a number, or ``"auto"`` until the recipe's labels
        #: are known (then :func:`genaug.mixing.default_share` of the real images per class).
        self.p: float | str = float(p) if not isinstance(p, str) else p
        if isinstance(self.p, str) and real_per_class is not None:
            self.p = resolve_share(AUTO, real_per_class=real_per_class)
        self.shuffle = shuffle
        self.seed = seed
        self.transform = transform
        self._epoch: int | None = None
        self._said_outside = False  # this process has said (or heard) that labels fall outside

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration's order (else each process counts its own)."""
        self._epoch = int(epoch)

    def __len__(self) -> int:
        """Examples one epoch hands out on this rank (all its workers together)."""
        where = place()
        return len(range(where.rank, len(self.dataset), where.world))

    def _order(self, where: Place, epoch: int) -> np.ndarray:
        n = len(self.dataset)
        if self.shuffle:
            rng = np.random.default_rng(None if self.seed is None else [self.seed, epoch])
            order = rng.permutation(n)
        else:
            order = np.arange(n)
        order = order[where.rank::where.world]
        return order[where.worker::where.workers] if where.in_worker else order

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        stream = self.pool.stream()
        where, tally, row = stream.where, self.pool.tally, stream.row
        iteration = int(tally.get(row, "iterations"))
        tally.add(row, "iterations")
        epoch = self._epoch if self._epoch is not None else iteration
        rng = (np.random.default_rng() if self.seed is None
               else np.random.default_rng([self.seed, where.rank, where.worker, epoch, 1]))
        drawable: frozenset[int] | None = None  # the recipe's labels, once the stream read them
        for index in self._order(where, epoch):
            stream.check()  # a configuration mistake stops training; an outage never does
            image, label = self.dataset[int(index)]
            label = int(label)
            out: torch.Tensor | None = None
            share = self._share(stream)
            if share > 0 and rng.random() < share:
                tally.add(row, "asked")
                drawn = None
                if stream.reservoir is not None:  # else the stream is still reading the recipe
                    if drawable is None:
                        drawable = frozenset(stream.label_map.values())
                    if label in drawable:
                        drawn = stream.reservoir.draw(label, rng)
                    else:
                        self._say_outside(stream, label)
                        tally.add(row, "outside")
                if drawn is not None:
                    out = _tensor(drawn)
                    _check_shape(out, image)
                    tally.add(row, "synthetic")
            if out is None:
                out = _as_float(image)
                tally.add(row, "real")
            yield (self.transform(out) if self.transform else out,
                   torch.tensor(label, dtype=torch.int64))

    def _share(self, stream: Stream) -> float:
        """``p`` as a number: ``"auto"`` becomes the default share of ``len(dataset)`` over
        the recipe's labels once the stream has read them (0 before: nothing can be drawn
        yet anyway)."""
        if not isinstance(self.p, str):
            return self.p
        if stream.reservoir is None or not stream.label_map:
            return 0.0
        self.p = default_share(len(self.dataset) / len(stream.label_map))
        return self.p

    def _say_outside(self, stream: Stream, label: int) -> None:
        """Say once, for every process of the trainer, that ``label`` (and any other of the
        dataset's outside the recipe's) is never replaced: without it a mix quietly hands out
        fewer synthetic images than ``p`` says."""
        if self._said_outside:
            return
        self._said_outside = True
        if self.pool.tally.totals()["outside"]:  # another worker, or an earlier epoch, said it
            return
        ours = ", ".join(f"{index} {name!r}" for name, index in
                         sorted(stream.label_map.items(), key=lambda item: item[1]))
        log.warning(
            "genaug.torch: the dataset's label %d is none of recipe %r's labels (%s): its "
            "examples, and those of any other label outside them, stay real whatever p is "
            "(stats()['outside'] counts them). To mix them, number the dataset's classes as "
            "the recipe's labels (label_map= or classes= on the PoolDataset), or add the "
            "label to the recipe", label, stream.config.recipe, ours)

    def report_need(self, need: Mapping[str, float]) -> None:
        """:meth:`PoolDataset.report_need`."""
        self.pool.report_need(need)

    def stats(self) -> dict[str, float]:
        """:meth:`PoolDataset.stats` plus ``real`` (examples kept), ``asked`` (examples the
        coin gave to the pool), ``outside`` (of those, the ones whose label is none of the
        recipe's: kept real) and ``share`` (synthetic / all handed out: ``p`` once every
        class holds images and every label is the recipe's)."""
        totals = self.pool.stats()
        handed = totals["synthetic"] + totals["real"]
        return {**totals, "share": totals["synthetic"] / handed if handed else 0.0}


def _as_float(image: Any) -> torch.Tensor:
    tensor = image if isinstance(image, torch.Tensor) else torch.as_tensor(np.asarray(image))
    if tensor.dtype == torch.uint8:
        return tensor.to(torch.float32).div_(255.0)
    return tensor


def _check_shape(synthetic: torch.Tensor, real: Any) -> None:
    shape = tuple(getattr(real, "shape", ()))
    if shape and shape != tuple(synthetic.shape):
        raise ValueError(
            f"the pool's images are {tuple(synthetic.shape)} ([C, H, W]) but the dataset's "
            f"are {shape}: resize the real images to the recipe's size (or set the recipe's "
            "output_height/output_width/output_channels to theirs)")


def _share(length: int | None, where: Place) -> int | None:
    """Items this process hands out of ``length`` per epoch (its share over the workers)."""
    if length is None:
        return None
    if not where.in_worker:
        return length
    base = length // where.workers
    return base + (1 if where.worker < length % where.workers else 0)


class _NeedPoster:
    """Posts the newest need report on a daemon thread, under the trainer's name; never
    raises into training (a failure is logged, the next report tries again)."""

    def __init__(self, config: StreamConfig) -> None:
        self.config = config
        self._said: set[str] = set()  # what was left out, said once each: "values", "labels"
        self._lock = threading.Lock()
        self._pending: dict[str, float] | None = None
        self._thread: threading.Thread | None = None
        #: The last need the service accepted, or None.
        self.sent: dict[str, float] | None = None

    def post(self, need: Mapping[str, float]) -> None:
        if not isinstance(need, Mapping):  # (typed, but called from a training loop)
            self._say_once("values", "genaug.torch: report_need takes a mapping of recipe "
                           "label -> need (a number >= 0), not %s; nothing was reported "
                           "(said once)", type(need).__name__)
            return
        clean: dict[str, float] = {}
        dropped: dict[str, Any] = {}
        for key, value in need.items():
            number = _need_value(value)
            if number is None:
                dropped[str(key)] = value
            else:
                clean[str(key)] = number
        if dropped:
            self._say_once("values", "genaug.torch: report_need left out %s: a need is a "
                           "finite number >= 0 per recipe label, as class_need() gives "
                           "(said once)", _shown(dropped))
        with self._lock:
            self._pending = clean
            if self._thread is None:  # else the running thread takes it next
                self._thread = threading.Thread(target=self._run, name="genaug-torch-need",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        from genaug.client import Client

        while True:
            with self._lock:
                need, self._pending = self._pending, None
                if need is None:
                    self._thread = None
                    return
            try:
                client = Client(self.config.url, api_key=self.config.api_key,
                                client_id=client_id(self.config.trainer, place()),
                                retry_deadline=5.0, **dict(self.config.client_kwargs))
                THREAD_OWNED.add(client)
                with client:
                    known = (self.config.label_map if self.config.label_map is not None
                             else client.recipe(self.config.recipe)["labels"])
                    mine = {k: v for k, v in need.items() if k in known}  # as the feeder does
                    unknown = sorted(set(need) - set(mine))
                    if unknown:
                        self._say_once("labels", "genaug.torch: report_need left out %s, "
                                       "which recipe %r lacks (its labels: %s; said once)",
                                       unknown, self.config.recipe, sorted(known))
                    client.feedback(self.config.recipe, mine)
                self.sent = mine
            except Exception as exc:
                log.warning("genaug.torch: the need report was not taken (%s); the next one "
                            "tries again", exc)

    def _say_once(self, what: str, message: str, *args: Any) -> None:
        if what not in self._said:
            self._said.add(what)
            log.warning(message, *args)


def _need_value(value: Any) -> float | None:
    """``value`` as a need (a finite number >= 0: a float, an int, a 0-d tensor), or None."""
    try:
        number = float(value)
    except Exception:  # a string, None, a tensor of many values...: left out, never raised
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _shown(entries: Mapping[str, Any]) -> str:
    """Left-out entries of a need report, briefly (a value's repr cut to 40 characters)."""
    return "{" + ", ".join(f"{k!r}: {repr(v)[:40]}" for k, v in list(entries.items())[:8]) + (
        ", ...}" if len(entries) > 8 else "}")
