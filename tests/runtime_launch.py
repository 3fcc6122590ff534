"""Helpers for the runtime tests: launch torchrun as a real subprocess, with a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import re
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


def runtime_watched(nproc: int, args: list[str]) -> Launched:
    """:func:`runtime`'s launch (torchrun ``-m planner.runtime ARGS``) as a :class:`Launched`,
    so that a test can time what follows a line (a fault's) rather than the whole launch, whose
    start (torchrun's and each rank's imports) slows with the machine's load."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone"]
    return Launched([*cmd, "-m", "planner.runtime", *args])


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


class SharedLaunches:
    """One launch of ``tests/runtime_driver.py`` per world size for every driver configuration of
    the session's selected tests (a torchrun launch costs 5.5 s at 2 processes and 8.7 s at 4
    on 2 cores before any configuration runs: torchrun's and each worker's imports).

    Tests marked ``driver`` (``@pytest.mark.driver(configs=f)``, ``f(world)`` the configurations
    they check; ``world`` from the test's ``world`` parameter or the marker's ``world=``) are planned
    at collection (``tests/conftest.py``); the first test to ask for a world size launches every
    planned configuration of it, the others read the results. A configuration the test asks for
    that was not planned is launched on its own. The driver writes its results after every
    configuration, so a launch that fails part-way fails only the tests whose configurations
    did not finish (their message holds the launch's stderr)."""

    def __init__(self) -> None:
        self.folder = Path()  # set by the session's fixture before any launch
        self.planned: dict[int, dict[str, dict[str, Any]]] = {}
        self.done: dict[str, dict[str, Any]] = {}  # by name
        self.launched: dict[int, str] = {}  # world -> "" after a launch that exited 0, else why it failed

    def plan(self, world: int, cfgs: list[dict[str, Any]]) -> None:
        planned = self.planned.setdefault(world, {})
        for cfg in cfgs:
            same = planned.get(cfg["name"], cfg)
            if same != cfg:
                raise ValueError(f"two driver configurations named {cfg['name']!r} differ")
            planned[cfg["name"]] = cfg

    def results(self, world: int, cfgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The driver's results for ``cfgs`` (in their order), launching what has not run; a
        configuration that resumes (``resume_at``) gets a checkpoint folder of its name under
        the launch's, in its result's ``checkpoint_dir``."""
        if world not in self.launched:
            self.plan(world, cfgs)
            self._launch(world, list(self.planned[world].values()))
        missing = [c for c in cfgs if c["name"] not in self.done]
        if missing and not self.launched[world]:
            self._launch(world, missing)  # asked for, not planned
        missing = [c["name"] for c in cfgs if c["name"] not in self.done]
        assert not missing, f"the {world}-process launch did not run {missing}:\n{self.launched[world]}"
        return [self.done[c["name"]] for c in cfgs]

    def _launch(self, world: int, cfgs: list[dict[str, Any]]) -> None:
        folder = self.folder / f"world{world}-{len(self.done)}"
        folder.mkdir(parents=True)
        cfgs = [{**c, "checkpoint_dir": str(folder / c["name"])} if c.get("resume_at") else c for c in cfgs]
        (folder / "configs.json").write_text(json.dumps(cfgs))
        out = folder / "out.json"
        proc = torchrun(world, ["tests/runtime_driver.py", str(folder / "configs.json"), str(out)], timeout_s=1800.0)
        results = json.loads(out.read_text()) if out.exists() else []
        for cfg, result in zip(cfgs, results):
            assert result["name"] == cfg["name"]
            self.done[cfg["name"]] = {**result, "checkpoint_dir": cfg.get("checkpoint_dir", "")}
        if proc.returncode == 0:
            self.launched[world] = ""
            return
        at = cfgs[len(results)]["name"] if len(results) < len(cfgs) else "after the last configuration"
        # the workers' own exception lines first (torchrun's ChildFailedError comes last)
        raised = [ln for ln in proc.stderr.splitlines() if re.search(r"\w(Error|Exception)\b.*:", ln)]
        raised = [ln for ln in raised if ln.startswith("[rank")] or raised
        self.launched[world] = f"exit {proc.returncode} at {at}: {raised[-1] if raised else ''}\n{proc.stderr[-3000:]}"


def step_files(result: dict[str, Any], step: int = 1) -> list[str]:
    """The files of a resumed driver configuration's checkpoint of ``step``, sorted."""
    return sorted(p.name for p in (Path(result["checkpoint_dir"]) / f"step_{step}").iterdir())
