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

Nothing is run twice (:class:`Folder`): both tests work in one folder of the module, and a
command identical to one already run there is not run again unless a command since wrote a file
it names (the README repeats its worked example's ``planner plan``; the slow test finds the fast
test's plans in place). Run alone, each test runs every command it needs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
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


@dataclass
class Folder:
    """A folder the README's commands run in, and what ran there: (what was run, the files it
    wrote) of each command that exited as the README says, in order."""

    path: Path
    ran: list[tuple[tuple[str, int, str], set[str]]] = field(default_factory=list)

    def already_ran(self, cmd: Command, variables: str) -> bool:
        """Whether ``cmd`` (the same line, with these variables set, expecting the same) ran here
        and no command since wrote a file it names (an input it reads or an output it wrote)."""
        key = (variables + cmd.line, cmd.exit_code, cmd.first_output_line)
        for i in range(len(self.ran) - 1, -1, -1):
            if self.ran[i][0] == key:
                names = set(shlex.split(cmd.line.replace("$M", "M")))
                return not any(names & outs for _, outs in self.ran[i + 1:])
        return False

    def record(self, cmd: Command, variables: str) -> None:
        key = (variables + cmd.line, cmd.exit_code, cmd.first_output_line)
        self.ran.append((key, _writes(shlex.split(cmd.line.replace("$M", "M")))))


def _writes(tokens: list[str]) -> set[str]:
    """The files a command writes (its output flags'; ``--report`` of a run, either form)."""
    outs = _outputs(tokens)
    if "--report" in tokens[:-1] and "planner.runtime" in tokens:
        outs.add(tokens[tokens.index("--report") + 1])
    return outs


def run_commands(commands: list[Command], folder: Path | Folder) -> list[str]:
    """Run each command in ``folder`` (skipping what :meth:`Folder.already_ran`); the failures,
    in words."""
    where = folder if isinstance(folder, Folder) else Folder(folder)
    for name in ("profiles", "configs"):
        if not (where.path / name).exists():
            (where.path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PLANNER_PROGRESS": "0", "MPLBACKEND": "Agg"}
    prelude = f'planner() {{ "{sys.executable}" -m planner "$@"; }}\ntorchrun() {{ "{sys.executable}" -m torch.distributed.run "$@"; }}\n'
    failures = []
    variables = ""
    for cmd in commands:
        if re.match(r"^[A-Z]+=", cmd.line):
            variables += cmd.line + "\n"
            continue
        if where.already_ran(cmd, variables):
            continue
        proc = subprocess.run(["bash", "-c", prelude + variables + cmd.line], cwd=where.path, env=env, capture_output=True,
                              text=True, timeout=900)
        if proc.returncode != cmd.exit_code:
            failures.append(f"{cmd.line}: exit {proc.returncode}, expected {cmd.exit_code}: {proc.stderr.strip()[-400:]}")
            continue
        shown = (proc.stdout if cmd.exit_code == 0 else proc.stderr).splitlines()
        if cmd.first_output_line and (not shown or shown[0] != cmd.first_output_line.removeprefix("$ ")):
            failures.append(f"{cmd.line}: first line {shown[:1]}, the README shows {cmd.first_output_line!r}")
            continue
        where.record(cmd, variables)
    return failures


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Folder:
    """The module's one folder: the slow test finds there what the fast test wrote."""
    return Folder(tmp_path_factory.mktemp("readme"))


def test_a_command_is_run_again_only_when_a_file_it_names_was_rewritten(tmp_path: Path) -> None:
    """What :class:`Folder` skips: the same command, variables and expectation, when no command
    since wrote a file it reads or writes."""
    plan = Command("planner plan --devices 2 --out a.json", 0, "")
    run = Command("planner run a.json --model gpt --report r.json", 0, "")
    where = Folder(tmp_path)
    for cmd in (plan, run, Command("planner show a.json", 0, "")):
        where.record(cmd, "")
    assert where.already_ran(plan, "") and where.already_ran(run, "")
    assert not where.already_ran(run, "M=x\n") and not where.already_ran(Command(run.line, 3, ""), "")
    where.record(Command("torchrun -m planner.runtime --plan a.json --report r.json", 0, ""), "")
    assert where.already_ran(plan, "") and not where.already_ran(run, "")  # r.json rewritten
    where.record(Command("planner plan --devices 4 --out a.json", 0, ""), "")
    assert not where.already_ran(plan, "")


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


def test_readme_fast_commands_run_as_written(folder: Folder) -> None:
    """Every README command that needs neither torchrun nor measuring (and reads only what such
    commands write) exits as the README says, in a fresh folder; ``--figures figs`` makes ``figs``."""
    fast, _ = split_fast(readme_commands()[0])
    assert run_commands(fast, folder) == []
    assert sorted(p.name for p in (folder.path / "figs").iterdir()) == ["memory.png", "pareto.png", "timelines.png"]


@pytest.mark.slow
@pytest.mark.hf
def test_readme_every_command_runs_as_written(folder: Folder) -> None:
    """The rest: torchrun runs and the Hugging Face profile (minutes), with the fast commands
    whose files they read (the fast test above runs every fast one: those it ran in the module's
    folder are not run again)."""
    commands = slow_with_inputs(readme_commands()[0])
    assert len(commands) < len(readme_commands()[0])
    assert run_commands(commands, folder) == []
