"""Reference-trainer scenarios for tests/trainer/reference/test_train.py, each in its own
interpreter.

Usage: ``python tests/trainer/reference/_train_child.py SCENARIO WORKDIR``; the last stdout
line is ``GENAUG_RESULT {json}``. The trainer configures its own devices (4 logical CPU devices
via ``TrainConfig.cpu_replicas``) before TensorFlow initialises, exactly as ``genaug train
--cpu-replicas 4`` does. The service runs as a separate process (``python -m genaug.service``);
this process never imports torch, which the scenarios check.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

from genaug.feeding.labels import LabelMapError, match_labels
from genaug.local_service import free_port, running_service
from genaug.trainer.checks.instruments import NonFiniteLossError
from genaug.trainer.reference import command
from genaug.trainer.reference.config import TrainConfig
from genaug.trainer.reference.data import DatasetError, make_demo_dataset, scan_image_folder
from genaug.trainer.reference.train import Trainer

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

REPLICAS = 4
RECIPE = "wound-phases"
RECIPES = Path(__file__).resolve().parents[3] / "recipes" / "wound_phases.yaml"
SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {}


def scenario(fn: Callable[[Path], dict[str, Any]]) -> Callable[[Path], dict[str, Any]]:
    SCENARIOS[fn.__name__] = fn
    return fn


def _message(fn: Callable[[], Any], exc_type: type[BaseException]) -> str:
    try:
        fn()
    except exc_type as exc:
        return str(exc)
    raise AssertionError(f"{fn} did not raise {exc_type.__name__}")


# ----------------------------------------------------------------------------- service


@contextlib.contextmanager
def service(port: int, work: Path, tag: str) -> Iterator[Any]:
    """The tiny service on ``port`` with the wound-phase recipe and a pool in ``work``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with running_service(
        port,
        extra_args=["--recipes", str(RECIPES), "--pool-path", str(work / "pool.db"),
                    "--pool-capacity-per-label", "48"],
        env=env,
        log_path=work / f"service-{tag}.log",
    ) as proc:
        yield proc


def wait_pool(url: str, per_label: int, timeout: float = 90.0) -> dict[str, int]:
    from genaug.client import Client
    from genaug.experiments.demo import wait_for_pool

    with Client(url, timeout=10.0) as client:
        client.wait_ready(timeout=timeout)
    return wait_for_pool(url, RECIPE, per_label, timeout=timeout)


# ----------------------------------------------------------------------------- live + kill


@scenario
def live_kill_restart(work: Path) -> dict[str, Any]:
    """Items 2 and 8: fit with 4 replicas and a live service feeding the reservoir; the service
    is SIGKILLed mid-fit and restarted on the same port; the feeder reconnects; fit completes."""
    import keras

    out: dict[str, Any] = {}
    data = make_demo_dataset(work / "data", per_class=32, size=64)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first = service(port, work, "first")
    proc = first.__enter__()
    restarted: contextlib.AbstractContextManager[Any] | None = None
    try:
        out["pool_before"] = wait_pool(url, 8)
        trainer = Trainer(
            TrainConfig(
                data=data, image_size=64, batch_size=16, epochs=1000, cpu_replicas=REPLICAS,
                service=url, recipe=RECIPE, p=0.5, slots_per_class=32, feeder_batch=24,
                feeder_interval_s=0.2, verbose=0,
            )
        )
        trainer.prepare()
        assert trainer.feeder is not None and trainer.reservoir is not None
        feeder, reservoir = trainer.feeder, trainer.reservoir
        feeder.backoff_max_s = 1.0  # reconnect promptly in the test
        state: dict[str, Any] = {"phase": "live", "steps": 0}

        class Chaos(keras.callbacks.Callback):  # type: ignore[misc]
            """Kills the service once the feeder delivered, restarts it, stops on reconnect."""

            def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
                nonlocal restarted
                state["steps"] += 1
                st = feeder.stats
                now = time.monotonic()
                if state["phase"] == "live":
                    if (state["steps"] >= 5 and st.images_received > 0
                            and int(reservoir.mixed_counter.numpy()) > 0):
                        state.update(
                            phase="killed", t_kill=now, step_kill=state["steps"],
                            received_at_kill=st.images_received, errors_at_kill=st.errors,
                            mixed_at_kill=int(reservoir.mixed_counter.numpy()),
                        )
                        proc.kill()  # SIGKILL: no graceful shutdown, connections just drop
                        proc.wait()
                    elif now - state.setdefault("t0", now) > 60:
                        state["phase"] = "no-images"
                        self.model.stop_training = True
                elif state["phase"] == "killed":
                    if st.errors > state["errors_at_kill"] or now - state["t_kill"] > 3:
                        state.update(phase="restarting", t_restart=now,
                                     errors_while_down=st.errors - state["errors_at_kill"],
                                     step_restart=state["steps"])
                        restarted = service(port, work, "second")
                        restarted.__enter__()
                elif state["phase"] == "restarting":
                    if (st.images_received > state["received_at_kill"]
                            and st.consecutive_failures == 0 and st.connected):
                        state.update(phase="reconnected", t_reconnect=now,
                                     step_reconnect=state["steps"])
                        self.model.stop_training = True
                    elif now - state["t_restart"] > 90:
                        state["phase"] = "never-reconnected"
                        self.model.stop_training = True

        t0 = time.perf_counter()
        summary = trainer.fit(callbacks=[Chaos()])
        out["fit_s"] = round(time.perf_counter() - t0, 2)
        trainer.close()
    finally:
        if restarted is not None:
            restarted.__exit__(None, None, None)
        first.__exit__(None, None, None)
    out["state"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in state.items()}
    out["summary"] = summary.as_dict()
    out["summary_text"] = summary.format()
    out["torch_imported"] = "torch" in sys.modules
    return out


# ----------------------------------------------------------------------------- errors, NaN


def _exploding_model(num_classes: int, shape: tuple[int, int, int]) -> Any:
    """A model whose layer 'explode' overflows float32 to Inf on any non-zero input."""
    import keras

    return keras.Sequential(
        [
            keras.Input(shape),
            keras.layers.Rescaling(1.0 / 255.0, name="rescale"),
            keras.layers.Conv2D(4, 3, strides=2, name="conv"),
            keras.layers.Lambda(lambda x: x * 1e30 * 1e30, name="explode"),
            keras.layers.GlobalAveragePooling2D(name="pool"),
            keras.layers.Dense(num_classes, name="logits"),
        ]
    )


@scenario
def errors(work: Path) -> dict[str, Any]:
    """Item 9: every data error before training, the CLI's exit code, and the NaN stop."""
    out: dict[str, Any] = {}
    missing = work / "no-such-folder"
    out["missing"] = _message(lambda: scan_image_folder(missing), DatasetError)
    empty = work / "empty"
    empty.mkdir()
    out["empty"] = _message(lambda: scan_image_folder(empty), DatasetError)
    loose = work / "loose"
    make_demo_dataset(loose, per_class=2, size=16)
    (loose / "I" / "I_0000.png").rename(loose / "stray.png")
    for sub in list(loose.iterdir()):
        if sub.is_dir():
            for f in sub.iterdir():
                f.unlink()
    out["loose"] = _message(lambda: scan_image_folder(loose), DatasetError)
    one_empty = work / "one-empty"
    make_demo_dataset(one_empty, per_class=3, size=16)
    for f in (one_empty / "P").iterdir():
        f.unlink()
    out["class_empty"] = _message(lambda: scan_image_folder(one_empty), DatasetError)
    small = work / "small"
    make_demo_dataset(small, per_class=3, size=16)
    out["too_few"] = _message(lambda: scan_image_folder(small, global_batch=32), DatasetError)
    out["label_missing"] = _message(
        lambda: match_labels(["I", "P", "X"], ["I", "P", "R"], recipe="recipe 'wound-phases'"),
        LabelMapError,
    )
    out["label_case"] = match_labels(["i", "p", "r"], ["I", "P", "R"])

    # The CLI path: nothing trains, exit code 2, the message on stderr.
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        out["cli_code"] = command.run(parser.parse_args(["--data", str(empty)]))
    out["cli_stderr"] = stderr.getvalue()

    data = make_demo_dataset(work / "data", per_class=16, size=32)
    odd = Trainer(TrainConfig(data=data, image_size=32, batch_size=6, cpu_replicas=REPLICAS))
    out["indivisible"] = _message(odd.prepare, DatasetError)

    trainer = Trainer(
        TrainConfig(data=data, image_size=32, batch_size=16, epochs=3, cpu_replicas=REPLICAS,
                    verbose=0),
        build_model=_exploding_model,
    )
    trainer.prepare()
    try:
        trainer.fit()
        raise AssertionError("a NaN loss did not stop training")
    except NonFiniteLossError as exc:
        out["nan"] = {"message": str(exc), "step": exc.step, "culprits": exc.culprits,
                      "steps_run": len(trainer.timer.totals)}
    out["torch_imported"] = "torch" in sys.modules
    return out


def main() -> None:
    name, work = sys.argv[1], Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result = SCENARIOS[name](work)
    result["scenario_s"] = round(time.perf_counter() - t0, 2)
    sys.stdout.write("GENAUG_RESULT " + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
