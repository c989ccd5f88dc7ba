"""Two DDP ranks (gloo, two processes) of one trainer, two DataLoader workers each: every rank
draws its own share of the user's data, every worker its own stream, and the service lists
four streams of one trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from _torch_shapes import clients_of

from genaug.local_service import free_port

HERE = Path(__file__).parent


def test_ranks_split_the_data_and_each_worker_is_a_stream_of_one_trainer(
        pool_service: Any) -> None:
    port = free_port()
    env = {**os.environ, "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "ddp-test"}
    procs = [subprocess.Popen([sys.executable, str(HERE / "_rank_child.py"), pool_service.url,
                               str(port)], env={**env, "RANK": str(rank)}, cwd=HERE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(next(line for line in out.splitlines()
                                       if line.startswith("RESULT "))[7:]))
    by_rank = {r["rank"]: r for r in results}
    zero, one = set(by_rank[0]["seen"]), set(by_rank[1]["seen"])
    assert not zero & one and zero | one == set(range(40))  # each example once, on one rank
    assert by_rank[0]["len"] == by_rank[1]["len"] == 20
    assert by_rank[0]["trainer"] == by_rank[1]["trainer"] == "torch-ddp-test"
    ours = sorted(c for c in clients_of(pool_service.url) if c.startswith("torch-ddp-test/"))
    assert ours == ["torch-ddp-test/r0/w0", "torch-ddp-test/r0/w1", "torch-ddp-test/r1/w0",
                    "torch-ddp-test/r1/w1"]
