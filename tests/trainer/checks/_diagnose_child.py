"""Reproductions of the seed reports for ``genaug.trainer.checks.diagnose``, in one interpreter.

Usage: ``python tests/trainer/checks/_diagnose_child.py WORKDIR [SCENARIO ...]`` (default: all
but ``cost``, which ``bench/training/diagnose_cost.py`` runs); the last stdout line is
``GENAUG_RESULT {json}`` with one report (``as_dict()``) per scenario.
TensorFlow starts once for all of them (it costs seconds here): 4 logical CPU devices are
configured first, for the MirroredStrategy scenarios. Each reproduction is the smallest
pipeline that shows its seed's failure (``../shared/seeds/``); ``clean`` is the reference
trainer with mixing, its reservoir filled by direct writes instead of a live feeder (the
service side is ``tests/genaug/test_doctor.py``'s).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

from genaug.trainer.hardware.devices import GpuInfo, configure_devices

REPLICAS = 4
CLEAN_RUNS = int(os.environ.get("GENAUG_DIAGNOSE_CLEAN_RUNS", "1"))
"""Diagnoses of the clean pipeline (bench/training/diagnose_cost.py measures the false-alarm goal
with 20)."""
COST_ROUNDS = int(os.environ.get("GENAUG_DIAGNOSE_COST_ROUNDS", "3"))
"""Rounds of (20 plain steps, diagnose) for the cost figures (their medians)."""
DEVICES = configure_devices(cpu_replicas=REPLICAS)  # before TensorFlow initialises

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from genaug.trainer.checks.diagnose import diagnose, diagnose_callback  # noqa: E402
from genaug.trainer.checks.findings import DiagnoseEnv, DiagnoseReport  # noqa: E402

logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
GB = 1e9
NO_SERVICE = DiagnoseEnv()  # no service URL: gpu-overlap is not checked
SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {}


def scenario(fn: Callable[[Path], dict[str, Any]]) -> Callable[[Path], dict[str, Any]]:
    SCENARIOS[fn.__name__] = fn
    return fn


def _images(n: int, size: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.uniform(0, 255, (n, size, size, 3)).astype("float32"),
            (np.arange(n) % 3).astype("int32"))


def _classifier(shape: tuple[int, ...] = (8, 8, 3), *, extra: Any = None, lr: float = 1e-3,
                optimizer: Any = None) -> Any:
    layers = [keras.Input(shape), keras.layers.Rescaling(1 / 255)]
    if extra is not None:
        layers.append(extra)
    layers += [keras.layers.Flatten(), keras.layers.Dense(3)]
    model = keras.Sequential(layers)
    model.compile(optimizer or keras.optimizers.Adam(lr),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    return model


def _report(report: DiagnoseReport) -> dict[str, Any]:
    return report.as_dict()


# ----------------------------------------------------------------------------- seeds


@scenario
def python_op(work: Path) -> dict[str, Any]:
    """Seed 000: a tf.py_function (the SDXL call) in the dataset map, under MirroredStrategy."""
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    x, y = _images(128)

    def _maybe_generate_impl(value: Any) -> Any:
        return np.asarray(value)  # stands in for the generator called from the graph

    def apply_augmentation(image: Any, label: Any) -> tuple[Any, Any]:
        out = tf.py_function(func=_maybe_generate_impl, inp=[image], Tout=tf.float32)
        out.set_shape([8, 8, 3])
        return out, label

    ds = (tf.data.Dataset.from_tensor_slices((x, y)).map(apply_augmentation)
          .batch(16, drop_remainder=True).prefetch(2))
    with strategy.scope():
        model = _classifier()
    return _report(diagnose(ds, model, steps=6, env=NO_SERVICE))


@scenario
def retracing(work: Path) -> dict[str, Any]:
    """Seed 002: variable-length batches (no fixed padding) retrace the step."""
    lengths = tf.constant([12, 12, 12, 12, 12, 17, 17, 17, 17, 17, 17, 21] * 4)
    ds = tf.data.Dataset.from_tensor_slices((lengths, tf.range(48) % 3)).map(
        lambda n, label: (tf.fill([n], n % 50), label))
    ds = ds.padded_batch(4)  # padded to the longest of each batch: the shape varies
    model = keras.Sequential([keras.Input((None,), dtype="int32"),
                              keras.layers.Embedding(50, 4),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    return _report(diagnose(ds, model, steps=8, env=NO_SERVICE))


@scenario
def input_bound(work: Path) -> dict[str, Any]:
    """Seed 004: a slow tf.numpy_function in the map, no parallelism, no prefetch."""
    x, y = _images(256)

    def load_sample(image: Any) -> Any:
        time.sleep(0.004)  # librosa / file reading in Python
        return image

    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(
        lambda i, lab: (tf.ensure_shape(tf.numpy_function(load_sample, [i], tf.float32),
                                        [8, 8, 3]), lab)).batch(8, drop_remainder=True)
    return _report(diagnose(ds, _classifier(), steps=8, env=NO_SERVICE))


@scenario
def nan(work: Path) -> dict[str, Any]:
    """Seed 001: NaN losses from a learning rate far too high (inputs are finite)."""
    x, y = _images(256)
    ds = tf.data.Dataset.from_tensor_slices((x * 1e3, y)).batch(16, drop_remainder=True)
    model = _classifier(optimizer=keras.optimizers.SGD(1e30))
    return _report(diagnose(ds, model, steps=8, env=NO_SERVICE))


@scenario
def nan_input(work: Path) -> dict[str, Any]:
    """Seed 001, the other way: NaN in the inputs themselves (a normalization by zero)."""
    x, y = _images(256)
    x[40, 0, 0, 0] = np.nan
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    return _report(diagnose(ds, _classifier(), steps=8, env=NO_SERVICE))


@scenario
def empty_class(work: Path) -> dict[str, Any]:
    """Seed 001's "Cache preloaded: 0 items": class 2 has no real example and the reservoir
    holds no synthetic one (its recipe label was never mapped)."""
    from genaug.trainer.mixing.reservoir import SyntheticReservoir

    x, y = _images(256)
    keep = y != 2
    reservoir = SyntheticReservoir(3, 16, (8, 8, 3))
    for label in (0, 1):
        reservoir.write(label, np.full([16, 8, 8, 3], 50 * label, np.uint8))
    ds = (tf.data.Dataset.from_tensor_slices((x[keep], y[keep])).batch(16, drop_remainder=True)
          .map(reservoir.mix(p=0.5, scale=1.0)))
    return _report(diagnose(ds, _classifier(), steps=8, reservoir=reservoir, env=NO_SERVICE))


class FakeMemory:
    """Seed 003's laptop GPU: 6.16 GB; the model's weights and optimizer take 1 GB and each
    384x384 example 0.4 GB. The step runs for real; its peak is computed from its batch."""

    name = "GPU:0 (RTX 4060 Laptop, simulated)"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def capacity(self) -> int:
        return int(6.16 * GB)

    def measure(self, run: Callable[[], int]) -> int:
        batch = run()
        self.calls.append(batch)
        return int(1.0 * GB + 0.4 * GB * batch)


@scenario
def oom_risk(work: Path) -> dict[str, Any]:
    """Seed 003: batch 16 needs more than the 6.16 GB of the GPU."""
    x, y = _images(256)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    memory = FakeMemory()
    out = _report(diagnose(ds, _classifier(), steps=6, env=DiagnoseEnv(memory=memory)))
    out["memory_calls"] = memory.calls
    return out


class SerializeToString(keras.layers.Layer):  # type: ignore[misc]
    """A string round trip in the model: runs in TensorFlow, has no XLA kernel."""

    def call(self, x: Any) -> Any:
        return tf.strings.to_number(tf.strings.as_string(x))


@scenario
def xla(work: Path) -> dict[str, Any]:
    """Seed 003: a layer XLA cannot compile, found by compiling one step with XLA."""
    x, y = _images(256)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    model = _classifier(extra=SerializeToString())
    return _report(diagnose(ds, model, steps=4, jit_compile=True, env=NO_SERVICE))


@scenario
def gpu_overlap(work: Path) -> dict[str, Any]:
    """Seed 000: TensorFlow sees GPU 0, where the generator runs (NVML table and service
    answer injected: no GPU needed)."""
    table = [GpuInfo(0, "GPU-aaaa1111-0000-0000-0000-000000000000", "00000000:01:00.0",
                     "NVIDIA GeForce RTX 4090"),
             GpuInfo(1, "GPU-bbbb2222-0000-0000-0000-000000000000", "00000000:02:00.0",
                     "NVIDIA GeForce RTX 4090")]
    info = {"device": {"type": "cuda", "name": "cuda:0", "cuda_uuid": table[0].uuid,
                       "pci_bus_id": table[0].pci_bus_id}}
    env = DiagnoseEnv(service_url="http://127.0.0.1:8000", service_info=info, gpu_table=table,
                      environ={}, visible_gpus=[0, 1])
    x, y = _images(64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    return _report(diagnose(ds, _classifier(), steps=3, env=env))


# ----------------------------------------------------------------------------- clean


_TRAINERS: dict[str, Any] = {}


def _reference_trainer(work: Path, per_class: int) -> Any:
    """The reference trainer with mixing on 4 replicas; the reservoir filled directly. Built
    once per process (``clean`` and ``cost`` share it: preparing it is most of their time)."""
    if "reference" in _TRAINERS:
        return _TRAINERS["reference"]
    from genaug.trainer.reference.config import TrainConfig
    from genaug.trainer.reference.data import DEMO_CLASSES, demo_image, make_demo_dataset
    from genaug.trainer.reference.train import Trainer

    data = make_demo_dataset(work / "data", per_class=per_class, size=64)
    trainer = Trainer(TrainConfig(
        data=data, image_size=64, batch_size=32, epochs=1, cpu_replicas=REPLICAS,
        service="http://127.0.0.1:9", hide_service_gpu=False, strict=False,
        prompts={c: f"a wound in phase {c}" for c in DEMO_CLASSES}, p=0.5, slots_per_class=32,
        verbose=0))
    trainer.prepare()
    rng = np.random.default_rng(1)
    for k, name in enumerate(DEMO_CLASSES):
        trainer.reservoir.write(k, np.stack([demo_image(name, rng) for _ in range(32)]))
    _TRAINERS["reference"] = trainer
    return trainer


@scenario
def clean(work: Path) -> dict[str, Any]:
    """The reference trainer with mixing: diagnose (20 steps) ``CLEAN_RUNS`` times (each run
    judges its own timings), then the callback on a real fit."""
    trainer = _reference_trainer(work, per_class=64)
    out: dict[str, Any] = {}
    before = trainer.model.get_weights()
    out["diagnose"] = _report(diagnose(trainer.dataset, trainer.model, steps=20,
                                       reservoir=trainer.reservoir, env=NO_SERVICE))
    out["weights_restored"] = all(np.array_equal(a, b) for a, b in
                                  zip(before, trainer.model.get_weights(), strict=True))
    out["runs"] = [out["diagnose"]["figures"]["problems"]] + [
        diagnose(trainer.dataset, trainer.model, steps=20, reservoir=trainer.reservoir,
                 env=NO_SERVICE, show=False).codes
        for _ in range(CLEAN_RUNS - 1)]
    check = diagnose_callback(dataset=trainer.dataset, reservoir=trainer.reservoir,
                              env=NO_SERVICE)
    trainer.model.fit(trainer.dataset, epochs=2, callbacks=[check], verbose=0)
    out["callback"] = _report(check.report)
    out["trainer_timer_steps"] = len(trainer.timer.totals)
    return out


@scenario
def cost(work: Path) -> dict[str, Any]:
    """The cost goal: ``diagnose`` with 20 steps against the same 20 steps run as ``fit``
    runs them (the reference trainer's ``train_function``, already traced), and against one
    more trace of the train step. Both sides make and drop one iterator (as each epoch of
    ``fit`` does; dropping it stops its prefetch threads, which takes seconds on a loaded
    machine). Medians of ``COST_ROUNDS`` alternating rounds; nothing is asserted here."""
    trainer = _reference_trainer(work, per_class=64)
    model, strategy = trainer.model, trainer.strategy
    dataset = trainer.dataset.repeat()  # both sides read one endless stream
    distributed = strategy.experimental_distribute_dataset(dataset)
    step = model.train_function

    def plain() -> float:
        t0 = time.perf_counter()
        iterator = iter(distributed)  # fit makes one per epoch, and drops it at its end
        for _ in range(20):
            step(iterator)
        del iterator  # stops its prefetch threads: up to seconds on a loaded machine
        return time.perf_counter() - t0

    def diagnosed() -> tuple[float, float]:
        t0 = time.perf_counter()
        report = diagnose(dataset, model, steps=20, reservoir=trainer.reservoir,
                          env=NO_SERVICE, show=False)
        return time.perf_counter() - t0, float(report.figures["steps_s"])

    def one_trace() -> float:
        batch = next(iter(distributed))
        t0 = time.perf_counter()
        tf.function(lambda data: strategy.run(model.train_step, args=(data,))
                    ).get_concrete_function(batch)
        return time.perf_counter() - t0

    plain()  # warm: the input pipeline's cache and the first batches
    plains, diags, diag_steps, traces = [], [], [], [one_trace()]
    for _ in range(COST_ROUNDS):
        plains.append(plain())
        total, steps_s = diagnosed()
        diags.append(total)
        diag_steps.append(steps_s)
    med = statistics.median
    plain_s, diag_s, trace_s = med(plains), med(diags), med(traces)
    return {"plain_s": plains, "diagnose_s": diags, "diagnose_steps_s": diag_steps,
            "trace_s": traces, "ratio": round(diag_s / plain_s, 3),
            "budget_s": round(1.1 * plain_s + trace_s, 4),
            "within_budget": diag_s <= 1.1 * plain_s + trace_s,
            "overhead_s": round(diag_s - plain_s, 4)}


@contextlib.contextmanager
def _wound_service(work: Path) -> Iterator[str]:
    """The tiny service in its own process with the wound-phase recipe; yields its URL.
    ``main`` starts it before the first scenario, so it loads while the others run."""
    from genaug.local_service import free_port, running_service

    root = Path(__file__).resolve().parents[3]
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    work.mkdir(parents=True, exist_ok=True)
    with running_service(port, extra_args=[
            "--recipes", str(root / "recipes" / "wound_phases.yaml"), "--pool-path",
            str(work / "pool.db"), "--pool-capacity-per-label", "16"],
            env=env, log_path=work / "service.log"):
        yield f"http://127.0.0.1:{port}"


_SERVICES: dict[str, str] = {}


@scenario
def train_doctor(work: Path) -> dict[str, Any]:
    """``genaug train --doctor`` end to end: the tiny service in its own process with the
    wound-phase recipe, the reference trainer with mixing and its feeder; the table is
    printed, no problem is found and training goes on (exit 0). Then a run whose learning
    rate is NaN (a loss that is NaN from the second step, whatever the data): the doctor
    stops it before training (exit 4)."""
    import io

    from genaug.client import Client
    from genaug.experiments.demo import wait_for_pool
    from genaug.trainer.reference.command import main as train_main

    common = ["--cpu-replicas", str(REPLICAS), "--demo-per-class", "16", "--batch-size", "16",
              "--epochs", "1", "--verbose", "0", "--doctor"]
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        url = _SERVICES.get("wound") or stack.enter_context(_wound_service(work / "service"))
        with Client(url, timeout=10.0) as client:
            client.wait_ready(timeout=120)
        out["pool"] = wait_for_pool(url, "wound-phases", 4, timeout=120)
        out["pool_s"] = round(time.perf_counter() - t0, 2)
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            out["exit"] = train_main([*common, "--service", url, "--recipe", "wound-phases",
                                      "--slots-per-class", "16", "--no-hide-service-gpu"])
        out["stdout"] = stdout.getvalue()
        out["train_s"] = round(time.perf_counter() - t0 - out["pool_s"], 2)
    tf.distribute.MirroredStrategy._collective_key_base += 100  # a second trainer, strategy
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        out["exploding_exit"] = train_main([*common, "--learning-rate", "1e38",
                                            "--image-size", "32"])
    out["exploding_stdout"] = stdout.getvalue()
    return out


@scenario
def callback_retracing(work: Path) -> dict[str, Any]:
    """The callback on a real fit finds seed 002's retracing in the first epoch."""
    lengths = tf.constant([6, 6, 6, 9, 9, 9, 11, 11] * 2)
    ds = tf.data.Dataset.from_tensor_slices((lengths, tf.range(16) % 3)).map(
        lambda n, label: (tf.ones([n], tf.int32), label)).padded_batch(2)
    model = keras.Sequential([keras.Input((None,), dtype="int32"), keras.layers.Embedding(4, 2),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    check = diagnose_callback(env=NO_SERVICE, show=False)
    model.fit(ds, epochs=2, callbacks=[check], verbose=0)
    return _report(check.report)


def main() -> None:
    work = Path(sys.argv[1])
    names = sys.argv[2:] or [name for name in SCENARIOS if name != "cost"]
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        if "train_doctor" in names:  # loads (torch, the tiny model, the pool) meanwhile
            _SERVICES["wound"] = stack.enter_context(_wound_service(work / "service"))
        run(work, names, results)
    print("GENAUG_RESULT " + json.dumps(results, default=str))


def run(work: Path, names: list[str], results: dict[str, Any]) -> None:
    for k, name in enumerate(names):
        # Every MirroredStrategy in one process starts its collective group keys at the same
        # number, and TensorFlow caches a collective's shapes by key: a second strategy's
        # all-reduce would meet the first one's ("Shape mismatch in the collective
        # instance"). The attribute TensorFlow keeps for tests gives each scenario its own.
        tf.distribute.MirroredStrategy._collective_key_base = 1000 * k
        t0 = time.perf_counter()
        results[name] = SCENARIOS[name](work / name)
        results[name]["scenario_s"] = round(time.perf_counter() - t0, 2)
    for trainer in _TRAINERS.values():
        trainer.close()


if __name__ == "__main__":
    main()
