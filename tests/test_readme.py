"""The README's commands run as written.

Every ``bash`` block of README.md, line by line (``planner`` is ``python -m planner``, run in a
fresh folder holding the repository's ``profiles/`` and ``configs/``, blocks in order, so that
later blocks find the files earlier ones wrote), the ``$ planner ...`` lines of its output
blocks, and its inline ``planner show`` / ``planner simulate`` commands. The fast test runs
every command that needs no torchrun and no measuring and reads only what such commands
write; the slow one (torchrun, a Hugging Face profile) runs the others, with the fast commands
that write what they read. The set-up lines
(``python3 -m venv``, ``pip``) and the multi-node torchrun line (``--master-addr HOST``) are the
only ones left out, and the test says which. A plan's first output line (model, cluster,
devices, solver) must be the README's.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: a command needs minutes or torchrun when it contains one of these
SLOW = ("planner run ", "torchrun ", "planner profile --model")
#: the flags after which a token names a file the command writes
OUTPUT_FLAGS = ("--out", "--cluster-out", "--csv", "--figures", "--timeline", "--memory")


@dataclass(frozen=True)
class Command:
    line: str  # as in the README
    exit_code: int  # expected
    first_output_line: str  # the README's output's first line, when it shows one ("" otherwise)


def _blocks() -> list[tuple[str, str, str]]:
    """(language, body, the text after the block up to the next block) of every fenced block."""
    found = list(re.finditer(r"```(\w*)\n(.*?)```", README, re.S))
    out = []
    for i, m in enumerate(found):
        after = README[m.end(): found[i + 1].start()] if i + 1 < len(found) else ""
        nxt = found[i + 1] if i + 1 < len(found) and not after.strip() else None
        out.append((m.group(1), m.group(2), nxt.group(2) if nxt and nxt.group(1) == "" else ""))
    return out


def readme_commands() -> tuple[list[Command], list[str]]:
    """(the commands to run, in order; the lines left out, with why)."""
    commands: list[Command] = []
    left_out: list[str] = []
    for lang, body, output in _blocks():
        if lang == "bash":
            lines = [ln.strip() for ln in body.splitlines() if ln.strip()]
            for ln in lines:
                if ln.startswith("python3 -m venv"):
                    tail = ln.rsplit("&&", 1)[-1].strip()
                    if tail.startswith(".venv/bin/planner "):
                        commands.append(Command(tail.removeprefix(".venv/bin/"), 0, _first(output)))
                    left_out.append(f"{ln[:60]}... (set-up: a new virtual environment)")
                elif ln.startswith(".venv/bin/python -m pytest"):
                    left_out.append(f"{ln} (the test suite itself)")
                elif "--master-addr HOST" in ln:
                    left_out.append(f"{ln[:60]}... (two nodes, placeholders)")
                else:
                    plan_line = _first(output) if ln.startswith("planner plan") and len(lines) <= 2 else ""
                    commands.append(Command(ln, 0, plan_line))
        elif lang == "":
            lines = body.splitlines()
            for i, ln in enumerate(lines):
                if ln.startswith("$ planner "):
                    commands.append(Command(ln[2:], 3 if "error: no plan fits" in body else 0, lines[i + 1] if i + 1 < len(lines) else ""))
    for m in re.finditer(r"`(planner (?:show|simulate) [^`]+)`", README):
        commands.append(Command(m.group(1), 0, ""))
    return commands, left_out


def _first(output: str) -> str:
    first = output.strip().splitlines()[0] if output.strip() else ""
    return first if first.startswith("plan for ") else ""


def split_fast(commands: list[Command]) -> tuple[list[Command], list[Command]]:
    """(fast, slow): slow commands, and those reading what a slow command writes."""
    slow_outputs: set[str] = set()
    fast, slow = [], []
    for cmd in commands:
        tokens = shlex.split(cmd.line.replace("$M", "M"))
        is_slow = any(s in cmd.line + " " for s in SLOW) or any(t in slow_outputs for t in tokens)
        if is_slow:
            slow_outputs |= _outputs(tokens)
            slow.append(cmd)
        else:
            fast.append(cmd)
    return fast, slow


def _outputs(tokens: list[str]) -> set[str]:
    outs = {tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t in OUTPUT_FLAGS}
    if tokens[:2] == ["planner", "run"] and "--report" in tokens:
        outs.add(tokens[tokens.index("--report") + 1])
    return outs


def slow_with_inputs(commands: list[Command]) -> list[Command]:
    """The slow commands, in order, with the variables and the fast commands that write what a
    kept command after them reads (the fast test runs every fast command)."""
    _, slow = split_fast(commands)
    kept: list[Command] = []
    read: set[str] = set()
    for cmd in reversed(commands):
        tokens = shlex.split(cmd.line.replace("$M", "M"))
        if cmd in slow or re.match(r"^[A-Z]+=", cmd.line) or _outputs(tokens) & read:
            kept.append(cmd)
            read |= set(tokens)
    return kept[::-1]


def run_commands(commands: list[Command], folder: Path) -> list[str]:
    """Run each command in ``folder``; the failures, in words."""
    for name in ("profiles", "configs"):
        if not (folder / name).exists():
            (folder / name).symlink_to(ROOT / name)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PLANNER_PROGRESS": "0", "MPLBACKEND": "Agg"}
    prelude = f'planner() {{ "{sys.executable}" -m planner "$@"; }}\ntorchrun() {{ "{sys.executable}" -m torch.distributed.run "$@"; }}\n'
    failures = []
    variables = ""
    for cmd in commands:
        if re.match(r"^[A-Z]+=", cmd.line):
            variables += cmd.line + "\n"
            continue
        proc = subprocess.run(["bash", "-c", prelude + variables + cmd.line], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=900)
        if proc.returncode != cmd.exit_code:
            failures.append(f"{cmd.line}: exit {proc.returncode}, expected {cmd.exit_code}: {proc.stderr.strip()[-400:]}")
            continue
        shown = (proc.stdout if cmd.exit_code == 0 else proc.stderr).splitlines()
        if cmd.first_output_line and (not shown or shown[0] != cmd.first_output_line.removeprefix("$ ")):
            failures.append(f"{cmd.line}: first line {shown[:1]}, the README shows {cmd.first_output_line!r}")
    return failures


def test_readme_commands_are_found() -> None:
    commands, left_out = readme_commands()
    fast, slow = split_fast(commands)
    lines = [c.line for c in commands]
    assert "planner plan" in lines  # the first command of the README
    assert any(c.startswith("planner compare ours.json --baselines") for c in lines)
    assert any(c.startswith("planner show") for c in lines) and any(c.startswith("planner simulate") for c in lines)
    assert any(c.exit_code == 3 for c in commands)  # the Llama-3-70B refusal
    assert len(fast) >= 8 and len(slow) >= 8
    assert len(left_out) == 4, left_out  # two set-ups, the suite, the two-node torchrun


def test_readme_fast_commands_run_as_written(tmp_path: Path) -> None:
    """Every README command that needs neither torchrun nor measuring (and reads only what such
    commands write) exits as the README says, in a fresh folder; ``--figures figs`` makes ``figs``."""
    fast, _ = split_fast(readme_commands()[0])
    assert run_commands(fast, tmp_path) == []
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["memory.png", "pareto.png", "timelines.png"]


@pytest.mark.slow
@pytest.mark.hf
def test_readme_every_command_runs_as_written(tmp_path: Path) -> None:
    """The rest: torchrun runs and the Hugging Face profile (minutes), with the fast commands
    whose files they read (the fast test above runs every fast one)."""
    commands = slow_with_inputs(readme_commands()[0])
    assert len(commands) < len(readme_commands()[0])
    assert run_commands(commands, tmp_path) == []
