"""The README's and docs/'s commands run as written, and print what they show.

Every ``bash`` block of README.md and of each ``docs/*.md`` (README first, then the docs by name),
line by line (``planner`` is ``python -m planner``, ``python`` this interpreter), every ``python``
block (run as a script), the ``$ planner ...`` lines of a ``console`` or plain block, and the inline
``planner show`` / ``planner simulate`` commands, run in one fresh folder holding the repository's
``profiles/``, ``configs/`` and ``tests/data/``, in order, so that later blocks find the files earlier ones wrote.
A ``NAME=value`` line of a bash block holds for the rest of its file (for the commands that use it). The fast test runs every
command that needs no torchrun and no measuring and reads only what such commands write; the slow
one (torchrun, a measured profile) runs the others, with the fast commands that write what they
read. The set-up lines (``python3 -m venv``), the suite's own command and the multi-node torchrun
line (``--master-addr HOST``) are the only ones left out, and the test says which.

**Outputs.** A block fenced as ``output`` is what the nearest ``bash`` or ``python`` block above it
prints (its commands' stdout, in order; a command that exits non-zero, its stderr; a block none of
whose lines runs, as the suite's, is passed over); the lines after
a ``$ planner ...`` line, up to the next ``$``, are what that command prints. Each shown line must
appear in what the commands printed, in the order shown (a line ``...`` or a shown line ending in
``...`` marks an elision; runs of spaces count as one; blank lines are not compared). Lines are
compared as they are, so a changed plan, layout or refusal fails the test; numbers are compared only
where they are not measured: in an output of a block that measures (a run, a measured profile, or
what reads their files) every number is read as ``#`` except on the lines that matter there (the
plan's first lines, the run's layout and losses, refusals: :data:`MATTERS`), and CPU or wall times
(:data:`TIMING`) are read as ``#`` everywhere.

Nothing is run twice (:class:`Folder`): both tests work in one folder of the module, and a
command identical to one already run there is not run again unless a command since wrote a file
it names (the docs repeat the plans they start from; the slow test finds the fast test's plans in
place); its output is kept for every block that shows it. Run alone, each test runs every command
it needs.

**Refreshing.** With ``PLANNER_DOCS_REFRESH=1`` the tests rewrite, in the file, each shown line
that differs from a printed line of the same shape (the same words, numbers aside) with that
printed line, in order; an output shown whole (no ``...``) whose lines no longer all match is
shown anew as printed; an elided one that still does not match is left as it was, and fails, for
a person to fix. Run them so after a change that moves plans,
then read the diff (``git diff README.md docs/``): it is the change's effect on every example.
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
#: the files whose examples run: README first, then docs/ by name
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a command needs minutes or torchrun when it contains one of these
SLOW = ("planner run ", "torchrun ", "planner profile --model")
#: the flags after which a token names a file the command writes
OUTPUT_FLAGS = ("--out", "--cluster-out", "--csv", "--figures", "--timeline", "--memory")
#: in a measured output, the lines compared with their numbers: a plan's header and layout, a run's
#: layout and losses, refusals and what would fit
MATTERS = re.compile(r"^(plan for |ran |losses per step|T=\d|CP=\d|P=\d|\d+ stages on |.*\berror: |- )")
#: lines whose numbers are times this machine took
TIMING = re.compile(r"\bCPU\b|\bwall\b|\btook\b")
NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?%?")


@dataclass(frozen=True)
class Command:
    line: str  # as in the file (a python block: a bash heredoc running it)
    exit_code: int  # expected
    variables: str = ""  # the NAME=value lines of its file before it
    doc: str = ""  # where it is, for messages

    @property
    def key(self) -> tuple[str, int]:
        return (self.variables + self.line, self.exit_code)


@dataclass(frozen=True)
class Example:
    """An output a file shows (``expected``) and the commands that print it."""

    doc: str
    commands: tuple[Command, ...]
    expected: tuple[str, ...]


def _tokens(line: str) -> list[str]:
    if line.startswith("python - <<"):  # a python block: its words, quotes kept
        return line.split()
    try:
        return shlex.split(line.replace("$M", "M"))
    except ValueError:  # a python block's quotes
        return line.split()


def _blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, body, line number) of every fenced block."""
    return [(m.group(1), m.group(2), text[: m.start()].count("\n") + 1) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S)]


def _used(variables: str, line: str) -> str:
    """The ``NAME=value`` lines of ``variables`` whose name ``line`` uses."""
    return "".join(v + "\n" for v in variables.splitlines() if f"${v.split('=', 1)[0]}" in line)


def _exit_code(output: str) -> int:
    return 3 if "error: no plan fits" in output else 2 if "error:" in output else 0


def parse(path: Path) -> tuple[list[Command], list[Example], list[str]]:
    """(the commands to run, in order; the outputs shown; the lines left out, with why) of one file."""
    text = path.read_text()
    doc = str(path.relative_to(ROOT))
    commands: list[Command] = []
    examples: list[Example] = []
    left_out: list[str] = []
    variables = ""
    last: list[Command] = []
    for lang, body, where in _blocks(text):
        at = f"{doc}:{where}"
        if lang == "bash":
            block: list[Command] = []
            for ln in (ln.strip() for ln in body.splitlines()):
                if not ln:
                    continue
                if ln.startswith("python3 -m venv"):
                    tail = ln.rsplit("&&", 1)[-1].strip()
                    if tail.startswith(".venv/bin/planner "):
                        block.append(Command(tail.removeprefix(".venv/bin/"), 0, _used(variables, tail), at))
                    left_out.append(f"{ln[:60]}... (set-up: a new virtual environment)")
                elif ln.startswith(".venv/bin/python -m pytest"):
                    left_out.append(f"{ln} (the test suite itself)")
                elif "--master-addr HOST" in ln:
                    left_out.append(f"{ln[:60]}... (two nodes, placeholders)")
                elif re.match(r"^[A-Z]+=\S+$", ln):
                    variables += ln + "\n"
                else:
                    block.append(Command(ln, 0, _used(variables, ln), at))
            commands += block
            last = block or last  # a block that runs nothing (the suite's) is passed over
        elif lang == "python":
            last = [Command(f"python - <<'PY'\n{body}PY", 0, "", at)]
            commands += last
        elif lang == "output":
            assert last, f"{at}: an output block with no bash or python block above it"
            examples.append(Example(at, tuple(last), tuple(body.splitlines())))
        elif lang in ("", "console"):
            lines = body.splitlines()
            starts = [i for i, ln in enumerate(lines) if ln.startswith("$ planner ")]
            for j, i in enumerate(starts):
                shown = lines[i + 1: starts[j + 1] if j + 1 < len(starts) else len(lines)]
                cmd = Command(lines[i][2:], _exit_code("\n".join(shown)), _used(variables, lines[i]), at)
                commands.append(cmd)
                if shown:
                    examples.append(Example(at, (cmd,), tuple(shown)))
    for m in re.finditer(r"`(planner (?:show|simulate) [^`]+)`", text):
        commands.append(Command(m.group(1), 0, _used(variables, m.group(1)), f"{doc} (inline)"))
    return commands, examples, left_out


def doc_commands() -> tuple[list[Command], list[Example], list[str]]:
    """Every file's commands, outputs and lines left out, README first."""
    commands: list[Command] = []
    examples: list[Example] = []
    left_out: list[str] = []
    for path in DOCS:
        c, e, lo = parse(path)
        commands += c
        examples += e
        left_out += lo
    return commands, examples, left_out


def split_fast(commands: list[Command]) -> tuple[list[Command], list[Command]]:
    """(fast, slow): slow commands, and those reading what a slow command writes."""
    slow_outputs: set[str] = set()
    fast, slow = [], []
    for cmd in commands:
        tokens = _tokens(cmd.line)
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
    if tokens[:2] == ["python", "-"]:  # a python block: the files it opens for writing
        outs |= set(re.findall(r"open\(\"([^\"]+)\", \"w\"\)", " ".join(tokens)))
    return outs


def slow_with_inputs(commands: list[Command]) -> list[Command]:
    """The slow commands, in order, with the fast commands that write what a kept command after
    them reads (the fast test runs every fast command)."""
    _, slow = split_fast(commands)
    kept: list[Command] = []
    read: set[str] = set()
    for cmd in reversed(commands):
        tokens = _tokens(cmd.line)
        if cmd in slow or _outputs(tokens) & read:
            kept.append(cmd)
            read |= set(tokens)
    return kept[::-1]


@dataclass
class Folder:
    """A folder the commands run in, and what ran there: (what was run, the files it wrote) of
    each command that exited as its file says, in order, and what each printed."""

    path: Path
    ran: list[tuple[tuple[str, int], set[str]]] = field(default_factory=list)
    printed: dict[tuple[str, int], str] = field(default_factory=dict)

    def already_ran(self, cmd: Command) -> bool:
        """Whether ``cmd`` (the same line, with the same variables set, expecting the same exit)
        ran here and no command since wrote a file it names (an input it reads or an output it
        wrote)."""
        for i in range(len(self.ran) - 1, -1, -1):
            if self.ran[i][0] == cmd.key:
                names = set(_tokens(cmd.line))
                return not any(names & outs for _, outs in self.ran[i + 1:])
        return False

    def record(self, cmd: Command, printed: str = "") -> None:
        self.ran.append((cmd.key, _writes(_tokens(cmd.line))))
        self.printed[cmd.key] = printed


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
    for name in ("profiles", "configs", "tests/data"):  # tests/data: the graph.txt files the docs plan
        if not (where.path / name).exists():
            (where.path / name).parent.mkdir(parents=True, exist_ok=True)
            (where.path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PLANNER_PROGRESS": "0", "MPLBACKEND": "Agg"}
    prelude = (f'planner() {{ "{sys.executable}" -m planner "$@"; }}\n'
               f'torchrun() {{ "{sys.executable}" -m torch.distributed.run "$@"; }}\n'
               f'python() {{ "{sys.executable}" "$@"; }}\n')
    failures = []
    for cmd in commands:
        if where.already_ran(cmd):
            continue
        proc = subprocess.run(["bash", "-c", prelude + cmd.variables + cmd.line], cwd=where.path, env=env, capture_output=True,
                              text=True, timeout=900)
        if proc.returncode != cmd.exit_code:
            failures.append(f"{cmd.doc}: {cmd.line[:200]}: exit {proc.returncode}, expected {cmd.exit_code}: {proc.stderr.strip()[-400:]}")
            continue
        where.record(cmd, proc.stdout if cmd.exit_code == 0 else proc.stderr)
    return failures


def _shape(line: str) -> str:
    """``line`` with runs of spaces as one and its numbers as ``#`` (a table's rules follow its columns' widths)."""
    return re.sub(r"-{2,}", "--", NUMBER.sub("#", " ".join(line.split())))


def _normal(line: str, measured: bool) -> str:
    line = " ".join(line.split())
    return _shape(line) if (measured and not MATTERS.match(line)) or TIMING.search(line) else line


def mismatch(example: Example, printed: str, measured: bool) -> str:
    """'' when every line ``example`` shows is in ``printed`` in its order (see the module's
    docstring); else the first line that is not, in words."""
    actual = [_normal(ln, measured) for ln in printed.splitlines()]
    at = 0
    for shown in example.expected:
        want = _normal(shown, measured)
        if not want or want == "...":
            continue
        prefix = want.endswith("...")
        want = want.removesuffix("...").rstrip()
        for i in range(at, len(actual)):
            if actual[i] == want or (prefix and actual[i].startswith(want)):
                at = i + 1
                break
        else:
            near = [a for a in actual[at:] if a.split()[:1] == want.split()[:1]][:1] or actual[at: at + 1]
            return f"{example.doc}: shows {shown.strip()!r}, not printed (in order) by {example.commands[-1].line[:120]!r}; nearest: {near}"
    return ""


def refreshed(example: Example, printed: str) -> tuple[str, ...]:
    """``example``'s shown lines, each replaced by the printed line (in order) of its shape that keeps
    most of its words."""
    actual = printed.splitlines()
    out, at = [], 0
    for shown in example.expected:
        body = shown.strip()
        if not body or body == "..." or body.endswith("..."):
            out.append(shown)
            continue
        same = [i for i in range(at, len(actual)) if _shape(actual[i]) == _shape(shown)]
        words = shown.split()  # of the lines of its shape, the one that keeps most of its words (a table's row)
        hit = max(same, key=lambda i: (sum(a == b for a, b in zip(actual[i].split(), words)), -i), default=None)
        if hit is None:
            out.append(shown)
            continue
        out.append(actual[hit])
        at = hit + 1
    return tuple(out)


def _rewrite(example: Example, lines: tuple[str, ...]) -> None:
    """Replace ``example``'s block in its file (the first such block at or after its line)."""
    doc, _, line = example.doc.partition(":")
    path = ROOT / doc
    text = path.read_text()
    old = "\n".join(example.expected)
    start = len("\n".join(text.splitlines()[: int(line or 1) - 1]))
    at = text.find(old, start)
    if at >= 0 and lines != example.expected:
        path.write_text(text[:at] + "\n".join(lines) + text[at + len(old):])


def check_examples(examples: list[Example], where: Folder, measured_commands: list[Command], which: list[Command]) -> list[str]:
    """The mismatches of the examples all of whose commands are in ``which`` and ran in ``where``."""
    failures = []
    for ex in examples:
        if not all(c in which for c in ex.commands):
            continue
        missing = [c.line for c in ex.commands if c.key not in where.printed]
        if missing:
            failures.append(f"{ex.doc}: its command did not run: {missing[0][:120]}")
            continue
        printed = "\n".join(where.printed[c.key] for c in ex.commands)
        measured = any(c in measured_commands for c in ex.commands)
        problem = mismatch(ex, printed, measured)
        if problem and os.environ.get("PLANNER_DOCS_REFRESH") == "1":
            fresh = Example(ex.doc, ex.commands, refreshed(ex, printed))
            if mismatch(fresh, printed, measured) and not any(ln.strip().endswith("...") for ln in ex.expected):
                fresh = Example(ex.doc, ex.commands, tuple(printed.rstrip("\n").splitlines()))  # shown whole: shown anew
            problem = mismatch(fresh, printed, measured)
            if not problem:  # written only where every line then matches
                _rewrite(ex, fresh.expected)
        if problem:
            failures.append(problem)
    return failures


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Folder:
    """The module's one folder: the slow test finds there what the fast test wrote."""
    return Folder(tmp_path_factory.mktemp("readme"))


def test_a_command_is_run_again_only_when_a_file_it_names_was_rewritten(tmp_path: Path) -> None:
    """What :class:`Folder` skips: the same command, variables and expectation, when no command
    since wrote a file it reads or writes."""
    plan = Command("planner plan --devices 2 --out a.json", 0)
    run = Command("planner run a.json --model gpt --report r.json", 0)
    where = Folder(tmp_path)
    for cmd in (plan, run, Command("planner show a.json", 0)):
        where.record(cmd)
    assert where.already_ran(plan) and where.already_ran(run)
    assert not where.already_ran(Command(run.line, 0, "M=x\n")) and not where.already_ran(Command(run.line, 3))
    where.record(Command("torchrun -m planner.runtime --plan a.json --report r.json", 0))
    assert where.already_ran(plan) and not where.already_ran(run)  # r.json rewritten
    where.record(Command("planner plan --devices 4 --out a.json", 0))
    assert not where.already_ran(plan)


def test_an_output_that_differs_from_what_its_command_prints_is_found() -> None:
    """A changed plan line fails; a measured time does not, except on the lines that matter; an
    elision and runs of spaces are read as the docstring says."""
    run = Command("planner run p.json --model gpt", 0)
    printed = ("plan for gpt on local-cpu (2 devices) by solver 'dp'\nP=2 x D=1, no ZeRO, schedule gpipe, M=4 micro-batches of 2\n"
               "ran 2 stages x 1 replicas, gpipe, M=4 x 2 on 2 gloo processes\niteration: measured 156.6 ms, error +219.4%\n"
               "0            72.7       30.7  +136.4%")
    shown = ["P=2 x D=1, no ZeRO, schedule gpipe, M=4 micro-batches of 2", "...", "iteration: measured 99.0 ms, error -3.0%",
             "0  70.0  30.7  +1.4%"]
    assert mismatch(Example("x", (run,), tuple(shown)), printed, measured=True) == ""
    assert mismatch(Example("x", (run,), tuple(shown)), printed, measured=False) != ""  # a plan's numbers are compared
    changed = ["P=2 x D=1, no ZeRO, schedule 1f1b, M=4 micro-batches of 2"]
    assert "schedule 1f1b" in mismatch(Example("x", (run,), tuple(changed)), printed, measured=True)
    assert mismatch(Example("x", (run,), ("ran 2 stages x 1 replicas, gpipe, M=8 x 1 on 2 gloo processes",)), printed, True) != ""
    out_of_order = ["ran 2 stages x 1 replicas, gpipe, M=4 x 2 on 2 gloo processes", "plan for gpt on local-cpu (2 devices) by solver 'dp'"]
    assert mismatch(Example("x", (run,), tuple(out_of_order)), printed, measured=False) != ""


def test_refreshing_rewrites_numbers_and_keeps_structure() -> None:
    """:func:`refreshed` takes a printed line of the shown line's shape; a line of another shape stays."""
    run = Command("planner plan", 0)
    printed = ("plan for gpt on local-cpu (2 devices) by solver 'dp'\nP=2 x D=1, no ZeRO, schedule gpipe, M=4 micro-batches of 2\n"
               "3  10-12  1.5\n30  91-93  2.5\niteration 12.5 ms")
    shown = ("P=2 x D=1, no ZeRO, schedule gpipe, M=8 micro-batches of 1", "...", "30  91-93  2.0", "iteration 10.0 ms",
             "P=2 x D=1, schedule 1f1b")
    assert refreshed(Example("x", (run,), shown), printed) == (
        "P=2 x D=1, no ZeRO, schedule gpipe, M=4 micro-batches of 2", "...", "30  91-93  2.5", "iteration 12.5 ms",
        "P=2 x D=1, schedule 1f1b")


def test_doc_commands_are_found() -> None:
    commands, examples, left_out = doc_commands()
    fast, slow = split_fast(commands)
    lines = [c.line for c in commands]
    assert "planner plan" in lines  # the first command of the README
    assert any(c.startswith("planner compare ours.json --baselines") for c in lines)
    assert any(c.startswith("planner show") for c in lines) and any(c.startswith("planner simulate") for c in lines)
    assert any(c.exit_code == 3 for c in commands)  # the Llama-3-70B refusal
    assert len(fast) >= 8 and len(slow) >= 8
    assert {d.name for d in DOCS} >= {"README.md", "index.md", "planning.md", "cost-model.md", "parallelism.md", "schedules.md",
                                      "runtime.md", "faults.md", "profiles.md"}
    assert len(examples) >= 20 and any(e.doc.startswith("README.md") for e in examples)
    assert all(any(c in fast for c in e.commands) or any(c in slow for c in e.commands) for e in examples)
    # the README's two set-ups (the second runs the suite), the suite's fast subset, the two-node torchrun
    assert len(left_out) == 4, left_out


def test_doc_fast_commands_run_and_print_as_written(folder: Folder) -> None:
    """Every command that needs neither torchrun nor measuring (and reads only what such commands
    write) exits as its file says, in a fresh folder, and prints what its file shows;
    ``--figures figs`` makes ``figs``."""
    commands, examples, _ = doc_commands()
    fast, slow = split_fast(commands)
    assert run_commands(fast, folder) == []
    assert sorted(p.name for p in (folder.path / "figs").iterdir()) == ["memory.png", "pareto.png", "timelines.png"]
    assert check_examples(examples, folder, slow, fast) == []


@pytest.mark.slow
@pytest.mark.hf
def test_doc_every_command_runs_and_prints_as_written(folder: Folder) -> None:
    """The rest: torchrun runs and measured profiles (minutes), with the fast commands whose files
    they read (the fast test above runs every fast one: those it ran in the module's folder are not
    run again), and the outputs of the blocks that run them."""
    all_commands, examples, _ = doc_commands()
    commands = slow_with_inputs(all_commands)
    _, slow = split_fast(all_commands)
    assert len(commands) < len(all_commands)
    assert run_commands(commands, folder) == []
    shown = [e for e in examples if any(c in slow for c in e.commands)]
    assert check_examples(shown, folder, slow, commands) == []
