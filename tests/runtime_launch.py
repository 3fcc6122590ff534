"""Helpers for the runtime tests: launch torchrun as a real subprocess, with a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

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


class Launched:
    """A launch whose stderr lines are read as they come, each with its ``time.monotonic()``,
    so a test can wait for a line, act (signal a process), and time what follows."""

    def __init__(self, cmd: list[str], *, env: dict[str, str] | None = None) -> None:
        full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **(env or {}))
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self.lines: list[tuple[float, str]] = []
        self.ended = 0.0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def wait_for(self, text: str, timeout_s: float) -> float:
        """The time of the first output line containing ``text`` (waits for it)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                if text in line:
                    return at
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r} within {timeout_s} s:\n{self.output[-3000:]}")

    def finish(self, timeout_s: float) -> int:
        """Wait for the launch to end (kill it and fail after ``timeout_s``); its exit code."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for pid in descendants(self.proc.pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            raise AssertionError(f"still running after {timeout_s} s:\n{self.output[-3000:]}") from None
        self.ended = time.monotonic()
        self._reader.join(timeout=5)
        return code


def runtime_launched(nproc: int, args: list[str]) -> Launched:
    """torchrun ``-m planner.runtime ARGS`` as ``planner run`` starts it (``python -m
    planner.runtime.launch``: torchrun, leaving through ``os._exit``), as a :class:`Launched`."""
    cmd = [sys.executable, "-m", "planner.runtime.launch", "--nproc-per-node", str(nproc), "--standalone"]
    return Launched([*cmd, "-m", "planner.runtime", *args])


def _parent(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(text[text.rfind(")") + 2 :].split()[1])


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid`` (from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            children.setdefault(_parent(int(entry.name)), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has ended)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rfind(")") + 2 :].split()[0] not in "ZX"


def drive(world: int, cfgs: list[dict[str, Any]], folder: Path) -> list[dict[str, Any]]:
    """``tests/runtime_driver.py`` over ``cfgs`` on ``world`` processes: its results, one per
    config in order (the run must exit 0)."""
    (folder / "configs.json").write_text(json.dumps(cfgs))
    proc = torchrun(world, ["tests/runtime_driver.py", str(folder / "configs.json"), str(folder / "out.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads((folder / "out.json").read_text())
    assert [r["name"] for r in results] == [c["name"] for c in cfgs]
    return results
