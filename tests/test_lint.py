"""The code style and types the project enforces with tools, not prose: ruff over the package,
tests and benchmarks (rules in pyproject.toml), and mypy strict on the torch-free core
(artifacts, cost, schedule, simulation, solve). Both come with the ``test`` extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ("planner/artifacts", "planner/cost", "planner/schedule", "planner/simulation", "planner/solve")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean() -> None:
    proc = _run("ruff", "check", "--no-cache", "planner", "tests", "benchmarks")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_on_the_core() -> None:
    proc = _run("mypy", *CORE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
