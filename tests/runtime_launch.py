"""Helpers for the runtime tests: launch torchrun as a real subprocess, with a deadline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def torchrun(nproc: int, args: list[str], *, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --nproc-per-node nproc ARGS`` in the repo root."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--standalone",
        *args,
    ]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def runtime(nproc: int, args: list[str], *, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return torchrun(nproc, ["-m", "planner.runtime", *args], timeout_s=timeout_s)
