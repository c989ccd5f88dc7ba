"""Start a local MultiWorkerMirroredStrategy cluster: N Python processes with TF_CONFIG on
127.0.0.1 ports, each running a script; returns what each printed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run_cluster(
    script: Path, args: Sequence[str], env: dict[str, str], *, workers: int = 2,
    timeout: float = 240, cwd: Path | None = None,
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``script`` as each worker of a local cluster; kill all on timeout."""
    hosts = [f"127.0.0.1:{p}" for p in free_ports(workers)]
    procs = []
    for i in range(workers):
        tf_config = {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}}
        procs.append(subprocess.Popen(
            [sys.executable, str(script), *args], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=cwd,
            env={**env, "TF_CONFIG": json.dumps(tf_config)},
        ))
    results = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        tails = [(p.communicate()[1] or "")[-3000:] for p in procs]
        raise TimeoutError(f"cluster did not finish within {timeout:.0f} s: {tails}") from None
    return results


def results_of(done: list[subprocess.CompletedProcess[str]], mark: str) -> list[dict[str, Any]]:
    out = []
    for proc in done:
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(mark)]
        if proc.returncode != 0 or not lines:
            raise AssertionError(
                f"worker failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n"
                f"{proc.stderr[-6000:]}"
            )
        out.append(json.loads(lines[-1][len(mark):]))
    return out
