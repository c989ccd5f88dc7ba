"""TensorFlow scenarios for tests/trainer, each run in its own subprocess.

Logical devices cannot change once TensorFlow has initialized, so every scenario starts a
fresh interpreter that splits the host CPU into 4 logical devices before anything else touches
TensorFlow. Usage: ``python tests/trainer/_tf_child.py SCENARIO``; the last stdout line is
``GENAUG_RESULT {json}``. Assertions fail the child (non-zero exit, traceback on stderr).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import tensorflow as tf

from genaug.trainer.hardware.devices import configure_devices

configure_devices(cpu_replicas=4)  # before anything initialises TensorFlow's devices

import keras  # noqa: E402
from _standins import ClosedPortClient, FakeAsyncClient, class_value, closed_port  # noqa: E402

from genaug.trainer import (  # noqa: E402
    PythonInGraphError,
    ReservoirFeeder,
    SyntheticReservoir,
    assert_no_python_ops,
    python_ops_in_dataset,
    python_ops_in_model,
    tracing_counts,
)

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
tf.get_logger().setLevel("ERROR")

H = W = 8
SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {}


def scenario(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    SCENARIOS[fn.__name__] = fn
    return fn


def filled(value: int, n: int) -> np.ndarray:
    return np.full([n, H, W, 3], value, np.uint8)


# ----------------------------------------------------------------------------- mixing


def _mixed_fraction_check(out: dict[str, Any]) -> None:
    """Item 6: over 10,000 examples the mixed fraction is within 3 sigma of p; 0 if empty."""
    tf.random.set_seed(1)
    p, n, classes = 0.3, 10_000, 4
    res = SyntheticReservoir(classes, 16, (H, W, 3))
    res.write(0, filled(class_value(0), 16))
    res.write(1, filled(class_value(1), 3))  # partially filled still mixes
    labels = np.arange(n, dtype=np.int32) % classes
    ds = (
        tf.data.Dataset.from_tensor_slices((np.zeros([n, H, W, 3], np.float32), labels))
        .batch(250, drop_remainder=True)
        .map(res.mix(p=p), num_parallel_calls=2)
    )
    mixed = np.zeros(classes)
    seen = np.zeros(classes)
    for x, y in ds.as_numpy_iterator():
        is_mixed = x.reshape(len(x), -1).max(axis=1) > 0
        np.add.at(mixed, y, is_mixed)
        np.add.at(seen, y, 1)
    frac = mixed / seen
    sigma = np.sqrt(p * (1 - p) / seen[:2])
    total_filled = mixed[:2].sum() / seen[:2].sum()
    sigma_total = np.sqrt(p * (1 - p) / seen[:2].sum())
    assert seen.sum() == n
    assert np.all(np.abs(frac[:2] - p) < 3 * sigma), (frac, sigma)
    assert abs(total_filled - p) < 3 * sigma_total, (total_filled, sigma_total)
    assert frac[2] == 0 and frac[3] == 0, frac
    assert int(res.mixed_counter.numpy()) == int(mixed.sum())
    assert int(res.seen_counter.numpy()) == n
    out["fraction"] = {"per_class": frac.tolist(), "filled_classes": total_filled, "p": p}
    out["counter_fraction"] = res.mixed_fraction()


def _default_share_check(out: dict[str, Any]) -> None:
    """The default p ("auto") falls with the real images per class: 1/6 at 10 per class,
    measured over 6,000 examples; without real_per_class it says what it needs."""
    tf.random.set_seed(2)
    res = SyntheticReservoir(2, 4, (H, W, 3))
    res.write(0, filled(class_value(0), 4))
    res.write(1, filled(class_value(1), 4))
    try:
        res.mix()
    except ValueError as exc:
        out["auto_refusal"] = str(exc)
    n = 6000
    ds = (tf.data.Dataset.from_tensor_slices(
        (np.zeros([n, H, W, 3], np.float32), np.arange(n, dtype=np.int32) % 2))
        .batch(200).map(res.mix(real_per_class=10)))
    mixed = sum(int((x.reshape(len(x), -1).max(axis=1) > 0).sum())
                for x, _ in ds.as_numpy_iterator())
    out["auto_fraction"] = mixed / n


def _tearing_check(out: dict[str, Any]) -> None:
    """Item 5: a writer thread hammers the reservoir; labels always match pixels."""
    classes, slots, n, p = 4, 8, 10_000, 0.5
    res = SyntheticReservoir(classes, slots, (H, W, 3))

    def image(c: int, gen: int, k: int) -> np.ndarray:
        img = np.empty([k, H, W, 3], np.uint8)
        img[..., 0] = class_value(c)  # the class
        img[..., 1] = gen % 256  # which write: a torn image would mix generations
        img[..., 2] = gen % 256
        return img

    for c in range(classes):
        res.write(c, image(c, 0, 1))
    stop = threading.Event()
    writes = [0]

    def writer() -> None:
        rng = np.random.default_rng(0)
        gen = 1
        while not stop.is_set():
            c = int(rng.integers(classes))
            res.write(c, image(c, gen, int(rng.integers(1, slots + 1))))
            gen += 1
            writes[0] += 1

    labels = np.random.default_rng(1).integers(0, classes, n).astype(np.int32)
    ds = (
        tf.data.Dataset.from_tensor_slices((np.full([n, H, W, 3], 255, np.uint8), labels))
        .batch(100)
        .map(res.mix(p=p), num_parallel_calls=2)
        .prefetch(2)
    )
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    mixed = mismatched = torn = 0
    generations: set[int] = set()
    try:
        for x, y in ds.as_numpy_iterator():
            is_mixed = x[:, 0, 0, 0] != 255
            for img, label in zip(x[is_mixed], y[is_mixed], strict=True):
                mixed += 1
                if not np.all(img[..., 0] == class_value(int(label))):
                    mismatched += 1
                if not (
                    np.all(img[..., 1] == img[0, 0, 1]) and np.all(img[..., 2] == img[0, 0, 1])
                ):
                    torn += 1
                generations.add(int(img[0, 0, 1]))
            # untouched examples keep their real pixels exactly
            assert np.all(x[~is_mixed] == 255)
    finally:
        stop.set()
        thread.join()
    assert mismatched == 0 and torn == 0, (mismatched, torn)
    assert mixed > 4000, mixed
    assert writes[0] > 20 and len(generations) > 5, (writes[0], len(generations))
    out["tearing"] = {
        "examples": n,
        "mixed": mixed,
        "mismatched": mismatched,
        "torn": torn,
        "writes_during_iteration": writes[0],
        "generations_seen": len(generations),
    }


def _refresh_check(out: dict[str, Any]) -> None:
    """Item 4: after a refresh, batches contain the new images (same running iterator)."""
    res = SyntheticReservoir(2, 4, (H, W, 3))
    res.write(0, filled(11, 4))
    res.write(1, filled(12, 4))
    labels = np.arange(64, dtype=np.int32) % 2
    base = tf.data.Dataset.from_tensor_slices((np.zeros([64, H, W, 3], np.uint8), labels))
    # No prefetch anywhere (tf.data would inject one): the next batch is computed on demand.
    sync = tf.data.Options()
    sync.experimental_optimization.inject_prefetch = False
    ds = base.repeat().batch(8).map(res.mix(p=1.0)).with_options(sync)
    it = iter(ds)
    x, y = next(it)
    before = sorted(set(np.unique(x.numpy()).tolist()))
    assert before == [11, 12], before
    res.write(0, filled(21, 4))  # replaces every slot of both classes
    res.write(1, filled(22, 4))
    x, y = next(it)
    after = sorted(set(np.unique(x.numpy()).tolist()))
    assert after == [21, 22], after
    # With prefetching the new images arrive within the prefetch depth.
    ds_pf = base.repeat().batch(8).map(res.mix(p=1.0)).prefetch(2)
    it = iter(ds_pf)
    next(it)
    res.write(0, filled(31, 4))
    res.write(1, filled(32, 4))
    seen_new_after = None
    for i in range(1, 6):
        x, _ = next(it)
        if set(np.unique(x.numpy()).tolist()) == {31, 32}:
            seen_new_after = i
            break
    assert seen_new_after is not None and seen_new_after <= 4, seen_new_after
    out["refresh"] = {
        "before": before,
        "after": after,
        "prefetched_batches_until_new": seen_new_after,
    }


def _dict_and_formats_check(out: dict[str, Any]) -> None:
    """Item 7 (dict: only the named key changes) plus unbatched, one-hot, dtype handling."""
    res = SyntheticReservoir(3, 4, (H, W, 3))
    res.write(1, filled(51, 4))
    n = 32
    feats = {
        "depth_rgb": np.zeros([n, H, W, 3], np.float32),
        "thermal_map": np.full([n, H, W, 3], 0.25, np.float32),
        "metadata": np.arange(n * 4, dtype=np.float32).reshape(n, 4),
    }
    labels = np.ones([n], np.int32)
    ds = (
        tf.data.Dataset.from_tensor_slices((feats, labels))
        .batch(8)
        .map(res.mix(p=1.0, key="depth_rgb"))
    )
    got = list(ds.as_numpy_iterator())
    depth = np.concatenate([f["depth_rgb"] for f, _ in got])
    thermal = np.concatenate([f["thermal_map"] for f, _ in got])
    meta = np.concatenate([f["metadata"] for f, _ in got])
    assert np.allclose(depth, 51 / 255.0), np.unique(depth)
    assert np.array_equal(thermal, feats["thermal_map"])
    assert np.array_equal(meta, feats["metadata"])
    assert set(got[0][0]) == set(feats)
    try:
        tf.data.Dataset.from_tensor_slices((feats, labels)).map(res.mix(p=1.0))
        raise AssertionError("a dict without key= must be refused")
    except ValueError as e:
        dict_error = str(e)

    # unbatched examples, one-hot labels, float in [-1, 1], sample weights pass through
    onehot = np.eye(3, dtype=np.float32)[np.ones([n], np.int32)]
    ds = tf.data.Dataset.from_tensor_slices(
        (np.zeros([n, H, W, 3], np.float32), onehot, np.ones([n], np.float32))
    ).map(res.mix(p=1.0, scale=2 / 255, offset=-1.0))
    x, y, w = next(iter(ds.batch(n)))
    assert np.allclose(x.numpy(), 51 * 2 / 255 - 1, atol=1e-6)
    assert np.array_equal(y.numpy(), onehot) and np.all(w.numpy() == 1)
    # uint8 real images stay uint8; labels of an empty class or out of range never mix
    ds = (
        tf.data.Dataset.from_tensor_slices(
            (np.zeros([6, H, W, 3], np.uint8), np.array([1, 0, 2, 7, -1, 1], np.int32))
        )
        .batch(6)
        .map(res.mix(p=1.0))
    )
    x, _ = next(iter(ds))
    assert x.dtype == tf.uint8
    assert x.numpy()[:, 0, 0, 0].tolist() == [51, 0, 0, 0, 0, 51]
    try:
        res.write(0, np.zeros([2, H + 1, W, 3], np.uint8))
        raise AssertionError("a wrong image size must be refused")
    except ValueError as e:
        size_error = str(e)
    out["dict"] = {"dict_error": dict_error, "size_error": size_error}


def _rebalance_check(out: dict[str, Any]) -> None:
    """Issue 12: per-class p and rebalance over 10,000 examples; labels follow pixels."""
    tf.random.set_seed(2)
    classes, n = 4, 10_000
    p = [0.2, 0.4, 0.6, 0.8]
    weights = [1.0, 1.0, 4.0, 2.0]  # class 3 stays empty: its weight is shared by the others
    res = SyntheticReservoir(classes, 8, (H, W, 3))
    for c in range(3):
        res.write(c, filled(class_value(c), 8))
    own = np.random.default_rng(3).integers(0, classes, n).astype(np.int32)
    ds = (
        tf.data.Dataset.from_tensor_slices((np.full([n, H, W, 3], 255, np.uint8), own, own))
        .batch(200, drop_remainder=True)
        .map(res.mix(p=p, rebalance=weights), num_parallel_calls=2)
    )
    replaced_by_own = np.zeros(classes)
    seen_by_own = np.zeros(classes)
    new_classes = np.zeros(classes)
    disagree = 0
    for x, y, y_own in ds.as_numpy_iterator():
        pixel = x[:, 0, 0, 0].astype(np.int64)
        is_replaced = pixel != 255
        # a label never disagrees with its pixels: replaced -> the pixels' class, else own
        pixel_class = (pixel - 10) // 20
        disagree += int(np.sum(is_replaced & (y != pixel_class)))
        disagree += int(np.sum(~is_replaced & (y != y_own)))
        disagree += int(np.sum(is_replaced & ~np.all(x == x[:, :1, :1, :1], axis=(1, 2, 3))))
        np.add.at(replaced_by_own, y_own, is_replaced)
        np.add.at(seen_by_own, y_own, 1)
        np.add.at(new_classes, y[is_replaced], 1)
    assert seen_by_own.sum() == n
    share = replaced_by_own / seen_by_own
    sigma = np.sqrt(np.array(p) * (1 - np.array(p)) / seen_by_own)
    assert np.all(np.abs(share - p) < 3 * sigma), (share, sigma)
    total = new_classes.sum()
    expected = np.array([1.0, 1.0, 4.0, 0.0]) / 6.0
    hist = new_classes / total
    hist_sigma = np.sqrt(expected * (1 - expected) / total)
    assert np.all(np.abs(hist - expected) <= 3 * hist_sigma), (hist, expected, hist_sigma)
    assert new_classes[3] == 0 and disagree == 0, (new_classes, disagree)
    counter = res.replaced_per_class.numpy().tolist()
    assert counter == new_classes.astype(int).tolist(), (counter, new_classes)

    # one-hot labels become the new class's one-hot; [B, 1] labels stay [B, 1]; unbatched
    tf.random.set_seed(4)
    onehot = np.eye(classes, dtype=np.float32)[own[:400]]
    ds = tf.data.Dataset.from_tensor_slices((np.full([400, H, W, 3], 255, np.uint8), onehot))
    x, y = next(iter(ds.batch(400).map(res.mix(p=1.0, rebalance=[0, 0, 1, 0]))))
    x, y = x.numpy(), y.numpy()
    assert np.all(x[:, 0, 0, 0] == class_value(2)) and np.all(y == np.eye(classes)[2]), y[:3]
    col = own[:64, None].astype(np.int64)
    x, y = next(iter(
        tf.data.Dataset.from_tensor_slices((np.zeros([64, H, W, 3], np.float32), col))
        .batch(64).map(res.mix(p=1.0, rebalance=[1, 0, 0, 0]))
    ))
    assert y.shape == (64, 1) and y.dtype == tf.int64 and np.all(y.numpy() == 0)
    x, y = next(iter(
        tf.data.Dataset.from_tensor_slices((np.zeros([8, H, W, 3], np.float32), own[:8]))
        .map(res.mix(p=1.0, rebalance=[0, 1, 0, 0])).batch(8)
    ))
    assert np.all(y.numpy() == 1) and np.allclose(x.numpy(), class_value(1) / 255.0)

    # nothing filled: rebalancing replaces nothing, labels unchanged
    empty = SyntheticReservoir(classes, 4, (H, W, 3))
    x, y = next(iter(
        tf.data.Dataset.from_tensor_slices((np.zeros([64, H, W, 3], np.uint8), own[:64]))
        .batch(64).map(empty.mix(p=1.0, rebalance=weights))
    ))
    assert np.all(x.numpy() == 0) and np.array_equal(y.numpy(), own[:64])

    # multimodal: key= replaces one input; other_inputs="zero" zeroes the rest of those rows
    gray = SyntheticReservoir(classes, 4, (H, W, 1))  # one channel (output_channels: 1)
    gray.write(3, np.full([4, H, W, 1], 77, np.uint8))
    feats = {
        "depth_rgb": np.zeros([64, H, W, 1], np.float32),
        "metadata": np.ones([64, 5], np.float32),
        "thermal_map": np.ones([64, H, W, 3], np.float32),
    }
    tf.random.set_seed(5)
    f, y = next(iter(
        tf.data.Dataset.from_tensor_slices((feats, own[:64])).batch(64)
        .map(gray.mix(p=0.5, key="depth_rgb", rebalance=[0, 0, 0, 1], other_inputs="zero"))
    ))
    rep = f["depth_rgb"].numpy()[:, 0, 0, 0] > 0
    assert 0 < rep.sum() < 64 and np.all(y.numpy()[rep] == 3)
    assert np.allclose(f["depth_rgb"].numpy()[rep], 77 / 255.0)
    assert np.all(f["metadata"].numpy()[rep] == 0) and np.all(f["metadata"].numpy()[~rep] == 1)
    assert np.all(f["thermal_map"].numpy()[rep] == 0)
    assert np.array_equal(y.numpy()[~rep], own[:64][~rep])
    errors = {}
    for name, kwargs in {
        "p_length": {"p": [0.5, 0.5]},
        "p_range": {"p": 1.5},
        "rebalance_zero": {"p": 0.5, "rebalance": [0, 0, 0, 0]},
        "rebalance_negative": {"p": 0.5, "rebalance": [1, -1, 0, 0]},
    }.items():
        try:
            res.mix(**kwargs)
            raise AssertionError(f"{name} must be refused")
        except ValueError as e:
            errors[name] = str(e)
    out["rebalance"] = {
        "examples": n,
        "share_by_own_class": share.tolist(),
        "p": p,
        "replacement_histogram": hist.tolist(),
        "expected_histogram": expected.tolist(),
        "disagreements": disagree,
        "errors": errors,
    }


def _dataset_audit_check(out: dict[str, Any]) -> None:
    """Item 1 (dataset half): a planted py_function / generator is found, the mix is clean."""
    res = SyntheticReservoir(2, 4, (H, W, 3))
    base = tf.data.Dataset.from_tensor_slices(
        (np.zeros([16, H, W, 3], np.float32), np.zeros([16], np.int32))
    )
    clean = (
        base.batch(4).map(res.mix(p=0.5)).map(res.mix(p=[0.1, 0.9], rebalance=[1, 3])).prefetch(2)
    )
    assert python_ops_in_dataset(clean) == []
    assert_no_python_ops(dataset=clean)

    def planted_fn(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x = tf.py_function(lambda a: a, [x], tf.float32)
        x.set_shape([None, H, W, 3])
        return x, y

    # nested: the py_function sits inside an interleave's inner map
    planted = (
        base.batch(4)
        .interleave(
            lambda x, y: tf.data.Dataset.from_tensors((x, y)).map(planted_fn), cycle_length=1
        )
        .map(res.mix(p=0.5))
    )
    found = python_ops_in_dataset(planted)
    assert [f.op_type for f in found] == ["EagerPyFunc"], found
    try:
        assert_no_python_ops(dataset=planted)
        raise AssertionError("planted py_function not reported")
    except PythonInGraphError as e:
        planted_message = str(e)
    assert "EagerPyFunc" in planted_message and found[0].function in planted_message

    numpy_ds = base.map(lambda x, y: (tf.numpy_function(lambda a: a, [x], tf.float32), y))
    gen = tf.data.Dataset.from_generator(
        lambda: iter(range(3)), output_signature=tf.TensorSpec([], tf.int32)
    )
    out["dataset_audit"] = {
        "planted": [str(f) for f in found],
        "planted_message": planted_message,
        "numpy_function": sorted({f.op_type for f in python_ops_in_dataset(numpy_ds)}),
        "from_generator": sorted({f.op_type for f in python_ops_in_dataset(gen)}),
    }


@scenario
def mixing() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for check in (
        _refresh_check,
        _dict_and_formats_check,
        _mixed_fraction_check,
        _default_share_check,
        _tearing_check,
        _rebalance_check,
        _dataset_audit_check,
    ):
        t0 = time.perf_counter()
        check(out)
        out[f"{check.__name__}_s"] = round(time.perf_counter() - t0, 2)
    return out


# ----------------------------------------------------------------------------- fit


def _model(num_classes: int) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((H, W, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(num_classes),
        ]
    )


class PlantedModel(keras.Model):
    """A train step that calls Python: what the audit must catch."""

    def train_step(self, data: Any) -> Any:
        x, y = data
        tf.py_function(lambda: None, [], [])
        return super().train_step((x, y))


@scenario
def fit() -> dict[str, Any]:
    """Items 1 (step half), 2 and 3 under MirroredStrategy with 4 replicas."""
    out: dict[str, Any] = {}
    classes, global_batch, steps = 3, 16, 4
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    assert strategy.num_replicas_in_sync == 4
    out["replicas"] = strategy.num_replicas_in_sync

    res = SyntheticReservoir(classes, 8, (H, W, 3))  # outside strategy.scope(), on purpose
    try:
        with strategy.scope():
            SyntheticReservoir(classes, 8, (H, W, 3))
        raise AssertionError("a reservoir inside strategy.scope() must be refused")
    except RuntimeError as e:
        out["scope_error"] = str(e)

    n = global_batch * steps
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, [n, H, W, 3]).astype(np.uint8)
    y = (np.arange(n) % classes).astype(np.int32)
    ds = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .map(lambda a, b: (tf.cast(a, tf.float32) / 255.0, b))
        .batch(global_batch, drop_remainder=True)
        .map(res.mix(p=0.5))
        .prefetch(2)
    )
    with strategy.scope():
        model = _model(classes)
        model.compile(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )

    # Audit before training: traces the step on ds (nothing runs), no Python anywhere.
    assert_no_python_ops(dataset=ds, model=model)
    assert python_ops_in_model(model) == []
    assert python_ops_in_model(model, dataset=ds, steps=("train", "test", "predict")) == []

    # Empty reservoir, service absent (closed port): fit finishes, feeder only counts errors.
    absent = ReservoirFeeder(
        res,
        client=ClosedPortClient(closed_port()),
        recipe="demo",
        label_map={"a": 0, "b": 1, "c": 2},
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )
    t0 = time.perf_counter()
    model.fit(ds, epochs=2, verbose=0, callbacks=[absent.callback()])
    out["fit_absent_s"] = round(time.perf_counter() - t0, 2)
    stats = absent.stats
    assert not stats.running and stats.images_received == 0 and stats.errors >= 1, stats
    assert "ConnectionRefusedError" in (stats.last_error or ""), stats
    assert res.mixed_counter.numpy() == 0
    out["absent_feeder"] = {"errors": stats.errors, "last_error": stats.last_error}
    counts_1 = tracing_counts(model)
    assert counts_1 and all(c == 1 for c in counts_1.values()), counts_1

    # The real client (if it has landed) pointed at a closed port behaves the same.
    try:
        from genaug.client import AsyncClient  # noqa: F401

        has_client = True
    except ImportError:
        has_client = False
    if has_client:
        url_feeder = ReservoirFeeder(
            res,
            url=f"http://127.0.0.1:{closed_port()}",
            recipe="demo",
            label_map={"a": 0},
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
            client_kwargs={"retry_deadline": 0.2, "timeout": 2.0},
        )
        url_feeder.start()
        deadline = time.monotonic() + 10
        while url_feeder.stats.errors == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.perf_counter()
        model.fit(ds, epochs=1, verbose=0, callbacks=[url_feeder.callback()])
        out["fit_absent_real_client_s"] = round(time.perf_counter() - t0, 2)
        assert url_feeder.running  # the callback leaves a feeder it did not start running
        url_feeder.stop()
        s = url_feeder.stats
        assert s.images_received == 0 and not s.running and s.errors >= 1, s
        assert "TransportError" in (s.last_error or ""), s
        out["absent_real_client"] = {"errors": s.errors, "last_error": s.last_error}
    out["real_client_available"] = has_client

    # Refresh (a stand-in service feeding the reservoir), second fit: no retrace, and the
    # replicas' input pipeline sees the host variable's new contents.
    fake = FakeAsyncClient(["a", "b", "c"], (H, W))
    live = ReservoirFeeder(
        res,
        client=fake,
        recipe="demo",
        label_map={"a": 0, "b": 1, "c": 2},
        batch=12,
        interval_s=0.01,
    )
    live.start()
    deadline = time.monotonic() + 10
    while res.fill_counts().min() < 8 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert res.fill_counts().min() == 8, res.fill_counts()
    t0 = time.perf_counter()
    model.fit(ds, epochs=2, verbose=0, callbacks=[live.callback()])  # already running: kept
    out["fit_live_s"] = round(time.perf_counter() - t0, 2)
    assert live.running
    live.stop()
    assert not live.running and live.stats.images_received >= 24, live.stats
    counts_2 = tracing_counts(model)
    assert counts_2 == counts_1, (counts_1, counts_2)
    mixed = int(res.mixed_counter.numpy())
    seen = int(res.seen_counter.numpy())
    assert mixed > 0, "the distributed input pipeline did not see the refreshed reservoir"
    out["tracing_counts"] = counts_2
    out["mixed_fraction_in_fit"] = mixed / seen
    out["live_feeder"] = {"images_received": live.stats.images_received}

    # A planted py_function in a train step is found (traced on ds, never executed).
    with strategy.scope():
        inputs = keras.Input((H, W, 3))
        planted = PlantedModel(inputs, keras.layers.Dense(classes)(keras.layers.Flatten()(inputs)))
        planted.compile(
            optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    found = python_ops_in_model(planted, dataset=ds)
    assert found and {f.op_type for f in found} == {"EagerPyFunc"}, found
    assert all(f.where == "train step" for f in found)
    try:
        assert_no_python_ops(model=planted)
        raise AssertionError("planted py_function in the train step not reported")
    except PythonInGraphError as e:
        out["planted_step_message"] = str(e)
    return out


# ----------------------------------------------------------------------------- main


def main() -> None:
    name = sys.argv[1]
    t0 = time.perf_counter()
    result = SCENARIOS[name]()
    result["scenario_s"] = round(time.perf_counter() - t0, 2)
    sys.stdout.write("GENAUG_RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
