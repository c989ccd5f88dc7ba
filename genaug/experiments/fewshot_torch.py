"""Few-shot training on the digits in a PyTorch child process: the TensorFlow child's twin
(:mod:`genaug.experiments.fewshot`), fed from the pool through :mod:`genaug.torch`.

:func:`~genaug.experiments.fewshot.run_fewshot` starts ``python -m
genaug.experiments.fewshot_torch`` for the runs whose ``trainer`` is ``"torch"``; it prints the
TensorFlow child's progress and result lines, with the same fields. What it mirrors, and how:

* **data**: the same shots (:func:`genaug.digits.subset` with the run's seed, then the task's
  classes), validation and test images; the shots in ``tf.data``'s order (each pass over them
  shuffled with the seed, passes back to back, ``batch`` at a time across the passes), for
  ``5 * (steps // 5)`` steps in 5 epochs (the need reports' rhythm).
* **network**: the same layers: random shifts of up to 8 % of the side and rotations of up to
  0.04 of a turn (bilinear, zeros outside, drawn per image on the batch in training only, as
  Keras's ``RandomTranslation`` and ``RandomRotation`` do), 2x2 average pooling, three 3x3
  convolutions (32, 64, 64, ReLU) with max pooling after the first two, global average
  pooling, dropout 0.3, a linear layer; Glorot-uniform weights and zero biases, as Keras
  initialises them. ``Adam(learning_rate, eps=1e-7)`` (Keras's epsilon), the mean
  cross-entropy of the logits.
* **mixing**: :class:`genaug.torch.MixedDataset` over the shots with a
  :class:`genaug.torch.PoolDataset` of the run's recipe (``p``; each stream's feeder asks for
  32 images every 0.2 s and keeps ``slots_per_class`` per class), in a ``DataLoader`` of
  ``loader_workers`` persistent workers, each with its own stream. Training starts once every
  worker's reservoir holds ``prefill_per_class`` images per class (or at
  ``prefill_timeout_s``), after the ``pool_per_label`` wait. ``reservoir_split`` (a perfect
  generator's pool) mixes that split's real images, drawn as the TensorFlow child draws them,
  without a service.
* **need**: :func:`genaug.torch.class_need` on the validation images after every epoch, sent
  to each of ``need_recipes`` by :meth:`genaug.torch.PoolDataset.report_need`.
* **scores**: accuracy (the logits' argmax) on the test and validation images, in eval mode.

``cpu_replicas`` does not apply (one process; ``MirroredStrategy`` splits the same global
batch and averages the same loss). ``rebalance`` and ``synthetic_weight`` are refused when the
run is made (:data:`~genaug.experiments.fewshot.TORCH_UNSUPPORTED`). TensorFlow is never
imported here.

Example::

    from genaug.experiments.fewshot import FewShotRun, run_fewshot
    real, mixed = run_fewshot([
        FewShotRun(arm="real only", trainer="torch"),
        FewShotRun(arm="p=0.5", trainer="torch", service=url, recipe="digits", p=0.5)])
"""

from __future__ import annotations

import functools
import logging
import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, get_worker_info

from genaug.experiments.fewshot import (
    _PROGRESS,
    FewShotRun,
    _client_id,
    _validation,
    _wait_for_full_pool,
    child_main,
    print_result,
)

__all__ = ["EPOCHS", "BankMix", "ShiftRotate", "Shots", "accuracy", "build_cnn",
           "fewshot_torch_child", "make_optimizer", "prefill_worker", "to_tensor", "train_step"]

log = logging.getLogger(__name__)

#: Epochs of every run (the TensorFlow child's ``fit(epochs=5)``): need is reported after each.
EPOCHS = 5
#: The digits' images, real (:func:`genaug.digits.load_split`) and generated (their recipes).
IMAGE_SHAPE = (64, 64, 3)


# -- the network -------------------------------------------------------------------------


class ShiftRotate(nn.Module):
    """Keras's ``RandomTranslation(shift, shift, fill_mode="constant")`` then
    ``RandomRotation(turn, fill_mode="constant")`` on a batch ``[N, C, H, W]``: per image a
    shift of up to ``shift`` of the side along each axis, then a rotation of up to ``turn`` of
    a full turn about the centre, each bilinear with zeros outside; the identity in eval mode.
    Its draws come from a generator of its own, seeded with ``seed``.

    Example::

        augment = ShiftRotate(seed=0)
        moved = augment(images)       # training mode: every image shifted and rotated
    """

    def __init__(self, shift: float = 0.08, turn: float = 0.04, *, seed: int = 0) -> None:
        super().__init__()
        self.shift, self.turn = float(shift), float(turn)
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        n = x.shape[0]
        # affine_grid's coordinates span 2 per side: a shift of f of the side is 2f there.
        shifts = (2 * torch.rand(n, 2, generator=self.generator) - 1) * self.shift
        move = torch.cat([torch.eye(2).expand(n, 2, 2), -2 * shifts[:, :, None]], dim=2)
        x = _warp(x, move)
        angles = (2 * torch.rand(n, generator=self.generator) - 1) * self.turn * 2 * math.pi
        cos, sin, zero = torch.cos(angles), torch.sin(angles), torch.zeros(n)
        turn = torch.stack([torch.stack([cos, -sin, zero], 1),
                            torch.stack([sin, cos, zero], 1)], 1)
        return _warp(x, turn)


def _warp(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def build_cnn(seed: int, classes: int = 10) -> nn.Sequential:
    """The TensorFlow child's small CNN for float ``[N, 3, 64, 64]`` images in [0, 1] (its
    ``Rescaling(1/255)`` is the input's scale here), initialised from ``seed``."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        ShiftRotate(seed=seed),
        nn.AvgPool2d(2),  # 32x32 holds all a digit has (8x8 at source)
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Dropout(0.3),
        nn.Linear(64, classes),
    )
    for layer in model:
        if isinstance(layer, nn.Conv2d | nn.Linear):  # Keras's glorot_uniform and zeros
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    return model


def make_optimizer(model: nn.Module, learning_rate: float) -> torch.optim.Optimizer:
    """Keras's ``Adam(learning_rate)``: its epsilon is 1e-7, torch's 1e-8."""
    return torch.optim.Adam(model.parameters(), lr=learning_rate, eps=1e-7)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
               labels: torch.Tensor) -> torch.Tensor:
    """One step on a batch: the mean cross-entropy of the logits; returns the loss."""
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    return loss.detach()


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
             batch: int = 100) -> float:
    """Share of ``images`` whose logits' argmax is the label, in eval mode (then back)."""
    was_training = model.training
    model.eval()
    right = 0
    try:
        for i in range(0, len(labels), batch):
            right += int((model(images[i:i + batch]).argmax(1) == labels[i:i + batch]).sum())
    finally:
        model.train(was_training)
    return right / max(1, len(labels))


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 (or float 0..255) ``[N, H, W, 3]`` -> float32 ``[N, 3, H, W]`` in [0, 1]."""
    out = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
    return out.permute(0, 3, 1, 2).contiguous().div_(255.0)


# -- the data ----------------------------------------------------------------------------


class Shots(Dataset[tuple[torch.Tensor, int]]):
    """The few-shot images in ``tf.data``'s order: ``length`` items, each pass over the
    images shuffled with ``seed`` and the passes back to back (``shuffle(n, seed,
    reshuffle_each_iteration=True).repeat()``), so consecutive items make the batches.

    Example::

        shots = Shots(images, labels, seed=0, length=300 * 32)
        image, label = shots[0]      # float32 [3, 64, 64] in [0, 1], int
    """

    def __init__(self, images: torch.Tensor, labels: np.ndarray, *, seed: int,
                 length: int) -> None:
        if len(labels) == 0:
            raise ValueError("no training images: the run's classes have none in its split")
        rng = np.random.default_rng(seed)
        passes = -(-length // len(labels))
        self.order = np.concatenate([rng.permutation(len(labels)) for _ in range(passes)])
        self.order = self.order[:length]
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        j = int(self.order[i])
        return self.images[j], int(self.labels[j])


class BankMix(Dataset[tuple[torch.Tensor, int]]):
    """``shots`` with each item replaced, with probability ``p``, by an image of its class
    from a fixed ``bank`` (class index -> float32 ``[M, 3, H, W]``): the TensorFlow child's
    reservoir written once (``reservoir_split``) and mixed, coins and slots drawn from
    ``seed`` per item, whatever the workers."""

    def __init__(self, shots: Shots, bank: dict[int, torch.Tensor], p: float, *,
                 seed: int) -> None:
        rng = np.random.default_rng([seed, 2])
        self.shots, self.bank = shots, bank
        held = np.asarray([len(bank.get(int(label), ())) > 0
                           for label in shots.labels[shots.order]], dtype=bool)
        self.coin = (rng.random(len(shots)) < p) & held
        self.slot = rng.random(len(shots))

    def __len__(self) -> int:
        return len(self.shots)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, label = self.shots[i]
        if self.coin[i]:
            held = self.bank[label]
            return held[int(self.slot[i] * len(held))], label
        return image, label


# -- one run -----------------------------------------------------------------------------


def _prefill(stream: Any, want: int, deadline: float, classes: int) -> list[int]:
    """Until ``stream``'s reservoir holds ``want`` images of every class, or ``deadline``
    (``time.monotonic()``); its fill then. A configuration mistake raises at once."""
    while True:
        stream.check()
        reservoir = stream.reservoir
        fill = reservoir.fill_counts() if reservoir is not None else np.zeros(classes, int)
        if fill.min() >= want or time.monotonic() >= deadline:
            return [int(n) for n in fill]
        time.sleep(0.05)


def prefill_worker(worker_id: int, *, want: int, deadline: float, classes: int,
                    fills: Any) -> None:
    """A DataLoader worker's ``worker_init_fn`` (bound with ``functools.partial``) for a
    :class:`~genaug.torch.MixedDataset`: the worker's stream started and holding ``want``
    images of each of ``classes`` classes (or ``deadline`` passed) before the worker hands out
    a batch; its fill written to row ``worker_id`` of ``fills`` (a shared
    ``multiprocessing.RawArray("i", workers * classes)``)."""
    info = get_worker_info()
    assert info is not None
    dataset: Any = info.dataset  # this worker's copy of the MixedDataset
    fill = _prefill(dataset.pool.stream(), want, deadline, classes)
    fills[worker_id * classes:(worker_id + 1) * classes] = fill


def _mixing(run: FewShotRun, shots: Shots, label_map: dict[str, int], classes: int,
            deadline: float) -> tuple[Any, Callable[[], list[int]], Any]:
    """The mixed dataset, a function giving the prefill's fill (per class, the least over the
    workers: read it once every worker has handed out a batch), and the worker init that
    prefills."""
    from genaug.torch import MixedDataset, PoolDataset

    assert run.service is not None and run.recipe is not None
    workers = max(1, run.loader_workers)
    # The budget that gives each worker's stream slots_per_class slots (as the TensorFlow
    # reservoir has); half a byte more, so that int(memory_mb * 2**20) loses none.
    budget = run.slots_per_class * classes * math.prod(IMAGE_SHAPE) * workers
    pool = PoolDataset(run.service, run.recipe, label_map=label_map, num_classes=classes,
                       trainer_id=_client_id(run.arm), memory_mb=(budget + 0.5) / 2**20,
                       batch=32, interval_s=0.2, seed=run.seed,
                       client_kwargs={"timeout": 30.0})
    mixed = MixedDataset(shots, pool, p=run.p, shuffle=False, seed=run.seed)
    want = min(run.prefill_per_class, run.slots_per_class)
    if run.loader_workers == 0:
        fill = _prefill(pool.stream(), want, deadline, classes)
        return mixed, lambda: fill, None
    fills = multiprocessing.RawArray("i", workers * classes)
    init = functools.partial(prefill_worker, want=want, deadline=deadline, classes=classes,
                             fills=fills)

    def least() -> list[int]:
        rows = np.asarray(fills[:], dtype=np.int64).reshape(workers, classes)
        return [int(n) for n in rows.min(axis=0)]

    return mixed, least, init


def _bank(run: FewShotRun, classes: list[int], index: dict[int, int]) -> dict[int, torch.Tensor]:
    """Up to ``slots_per_class`` images per class of ``run.reservoir_split``, drawn as the
    TensorFlow child draws them into its reservoir."""
    from genaug.digits import load_split

    assert run.reservoir_split is not None
    images, labels = load_split(run.reservoir_split)
    rng = np.random.default_rng(run.seed)
    bank = {}
    for digit in classes:
        own = np.flatnonzero(labels == digit)
        pick = rng.choice(own, min(len(own), run.slots_per_class), replace=False)
        bank[index[digit]] = to_tensor(images[pick])
    return bank


def _need_reporters(run: FewShotRun, label_map: dict[str, int], classes: int) -> list[Any]:
    """A :class:`~genaug.torch.PoolDataset` per recipe of ``run.need_recipes`` (only its
    ``report_need`` is used: nothing is drawn), under the run's one trainer name."""
    if not run.need_recipes or run.service is None:
        return []
    from genaug.torch import PoolDataset

    return [PoolDataset(run.service, recipe, label_map=label_map, num_classes=classes,
                        trainer_id=_client_id(run.arm), client_kwargs={"timeout": 30.0})
            for recipe in run.need_recipes]


def _wait_sent(reporters: Sequence[Any], need: dict[str, float] | None,
               timeout_s: float = 30.0) -> None:
    """Until the service took the last report from every reporter (its thread posts it),
    so that the next run, or the bench's fill, finds it there; a warning after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    for reporter in reporters:
        while need is not None and reporter.need_sent != need:
            if time.monotonic() > deadline:
                log.warning("the need report to recipe %r was not taken within %.0f s",
                            reporter.config.recipe, timeout_s)
                break
            time.sleep(0.05)


def _one_run(run: FewShotRun, test: tuple[torch.Tensor, np.ndarray]) -> dict[str, Any]:
    from genaug.digits import load_split, subset

    classes = run.classes or list(range(10))
    index = {digit: i for i, digit in enumerate(classes)}
    label_map = {str(d): index[d] for d in classes}
    images, labels = load_split(run.split)
    # The subset is drawn over the whole split (the same shots as every other user of seed
    # ``run.seed``), then the task's classes are kept.
    keep = (np.arange(len(labels)) if run.per_class is None
            else subset(labels, run.per_class, seed=run.seed))
    keep = keep[np.isin(labels[keep], classes)]
    y = np.asarray([index[int(d)] for d in labels[keep]], dtype=np.int64)
    if run.split == "fewshot":  # validate on the split's images this run did not train on
        x_val, y_val = _validation(images, labels, index, trained=keep)
    else:
        x_val, y_val = _validation(*load_split("fewshot"), index)
    val = (to_tensor(x_val), torch.from_numpy(y_val.astype(np.int64)))
    per_epoch = max(1, run.steps // EPOCHS)
    steps = per_epoch * EPOCHS
    workers = run.loader_workers
    # Every worker gets whole batches of its share (an iterable dataset is split per item).
    length = -(-steps // max(1, workers)) * max(1, workers) * run.batch
    shots = Shots(to_tensor(images[keep]), y, seed=run.seed, length=length)

    deadline = time.monotonic() + run.prefill_timeout_s
    mixing = run.p > 0 and run.recipe is not None and run.service is not None
    dataset: Any = shots
    mixed: Any = None
    bank: BankMix | None = None
    least: Callable[[], list[int]] | None = None
    init = None
    if run.p > 0 and run.reservoir_split is not None:
        dataset = bank = BankMix(shots, _bank(run, classes, index), run.p, seed=run.seed)
    elif mixing:
        if run.pool_per_label > 0:
            waited = time.monotonic()
            held = _wait_for_full_pool(run, deadline)
            print(f"{_PROGRESS}  {run.arm:<24} seed {run.seed}: the pool {held} "
                  f"(waited {time.monotonic() - waited:.0f} s)", flush=True)
        mixed, least, init = _mixing(run, shots, label_map, len(classes), deadline)
        dataset = mixed
    loader = DataLoader(dataset, batch_size=run.batch, num_workers=workers,
                        persistent_workers=workers > 0, drop_last=True, worker_init_fn=init)

    model = build_cnn(run.seed, len(classes))
    optimizer = make_optimizer(model, run.learning_rate)
    reporters = _need_reporters(run, label_map, len(classes))
    val_batches = [(val[0][i:i + 100], val[1][i:i + 100]) for i in range(0, len(y_val), 100)]
    need: dict[str, float] | None = None
    iterator = iter(loader)
    try:
        batch = next(iterator)  # the workers start, and prefill their streams, here
        t0 = time.perf_counter()
        for step in range(steps):
            if step:
                batch = next(iterator)
            train_step(model, optimizer, *batch)
            if reporters and (step + 1) % per_epoch == 0:
                from genaug.torch import class_need

                need = class_need(model, val_batches, label_map)
                for reporter in reporters:
                    reporter.report_need(need)
        fit_s = time.perf_counter() - t0
    finally:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:  # persistent workers, and their streams, end with the run
            shutdown()
        if mixed is not None:
            mixed.pool.close()  # the stream in this process, with 0 workers
    _wait_sent(reporters, need)
    if mixed is not None and least is not None:
        stats = mixed.stats()
        mixed_fraction, fed, fill = float(stats["share"]), int(stats["received"]), least()
    elif bank is not None:
        mixed_fraction, fed = float(bank.coin[:steps * run.batch].mean()), 0
        fill = [len(bank.bank[i]) for i in range(len(classes))]
    else:
        mixed_fraction, fed, fill = 0.0, 0, []
    in_task = np.isin(test[1], classes)
    test_y = torch.as_tensor([index[int(d)] for d in test[1][in_task]], dtype=torch.int64)
    result = asdict(run)
    result.update(
        test_accuracy=accuracy(model, test[0][torch.from_numpy(in_task)], test_y),
        validation_accuracy=accuracy(model, *val), validation_images=int(len(y_val)),
        need=need, fit_s=round(fit_s, 1), train_images=int(len(y)),
        mixed_fraction=mixed_fraction, feeder=fed, reservoir_fill=fill,
    )
    return result


def fewshot_torch_child(runs: list[FewShotRun]) -> list[dict[str, Any]]:
    """In the PyTorch process: run each run, print one result line per run (read by
    :func:`~genaug.experiments.fewshot.run_fewshot`)."""
    from genaug.digits import load_split

    others = sorted({run.trainer for run in runs} - {"torch"})
    if others:
        raise ValueError(f"the PyTorch child got runs of trainer {others}: run_fewshot sends "
                         "those to their own child")
    test_images, test_labels = load_split("test")
    test = (to_tensor(test_images), test_labels)
    results = []
    for run in runs:
        result = _one_run(run, test)
        print_result(run, result)
        results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """The PyTorch child of :func:`~genaug.experiments.fewshot.run_fewshot`
    (:func:`~genaug.experiments.fewshot.child_main`)."""
    return child_main("torch", fewshot_torch_child, argv)


if __name__ == "__main__":
    raise SystemExit(main())
