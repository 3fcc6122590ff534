"""A walk of one request through the planner's modules (issue 46): ``planner plan`` with no
arguments (the embedded default profile, cluster and request) from the command line to the
printed plan, traced with ``sys.setprofile`` on the planner's own modules.

What is counted: a reader following the request through the code, reading each function the
first time the request calls it (a function already read is not followed again, so the figures
count the distinct calls one request makes, not how often the search repeats them). The first
call of a planner function (its code object) from a function of *another* planner module is an
*entry* into the callee's module; an entry into a module the walk had entered before (and left)
is a *return* to it: ``A -> B -> A`` (a function of ``B`` calling a function of ``A`` that was
not read yet) counts once, for the return to ``A``; ``B`` entered again later through another of
its functions counts again. So ``returns = entries - modules entered``: 0 when every module is
entered once, through one function, and the flow goes forward.

Two figures: over every planner module, and over the flow's modules with ``planner/artifacts``
looked through (the documents, the Layout, the enums: values every layer reads, not steps of the
flow), which is how issue 46 counted (29 modules, 75 returns, measured by hand). Calls made
while a planner module is being imported (its module-level code) are not part of the walk;
functions outside the counted modules (NumPy, the standard library, dataclass-generated
methods, and for the second figure the artifacts) are looked through: a function called from
them counts as called by the nearest counted function below them.

Printed per figure: the modules visited, the entries and returns, and the modules most often
re-entered (their entries less one); ``--all`` lists every module with its entries; ``--why``
names, under each re-entered module, the functions entered and the module that entered each (what
to make one call, or a record read, to bring the figure down).

Run: ``python benchmarks/request_walk.py [--top 10] [--all] [--why]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import planner

PACKAGE = Path(planner.__file__).resolve().parent


@dataclass(slots=True)
class Walk:
    """One figure's state: the modules counted (``skip``: prefixes of ``planner/`` looked
    through), which codes were read, and the entries per module."""

    skip: tuple[str, ...] = ()
    modules: dict[types.CodeType, str | None] = field(default_factory=dict)  # code -> module (None: looked through)
    read: set[types.CodeType] = field(default_factory=set)
    visited: dict[str, None] = field(default_factory=dict)  # in the order first entered
    entries: Counter[str] = field(default_factory=Counter)
    #: per module, each function entered from another module and the module that entered it
    entered: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    @property
    def num_entries(self) -> int:
        return sum(self.entries.values())

    @property
    def returns(self) -> int:
        """Entries into a module already entered: every entry but each module's first."""
        return self.num_entries - len(self.entries)

    def module_of(self, code: types.CodeType) -> str | None:
        found = self.modules.get(code, "")
        if found == "":
            path = Path(code.co_filename)
            found = str(path.relative_to(PACKAGE)) if path.is_relative_to(PACKAGE) else None
            if found is not None and found.startswith(self.skip):
                found = None
            self.modules[code] = found
        return found

    def caller(self, frame: types.FrameType) -> tuple[str | None, bool]:
        """(the nearest counted module below ``frame``, whether a planner module is being imported)."""
        module = None
        back = frame.f_back
        while back is not None:
            if back.f_code.co_name == "<module>" and Path(back.f_code.co_filename).is_relative_to(PACKAGE):
                return module, True
            found = self.module_of(back.f_code)
            if module is None and found is not None:
                module = found
            back = back.f_back
        return module, False

    def call(self, frame: types.FrameType) -> None:
        """A function called: an entry if it is read now, from another counted module."""
        code = frame.f_code
        if code in self.read:
            return
        module = self.module_of(code)
        if module is None or code.co_name == "<module>":
            return
        caller, importing = self.caller(frame)
        if importing:
            return
        self.read.add(code)
        self.visited.setdefault(module, None)
        if caller is not None and caller != module:
            self.entries[module] += 1
            self.entered.setdefault(module, []).append((code.co_qualname, caller))


def walk(argv: list[str]) -> tuple[Walk, Walk]:
    """The walks of ``planner`` run with ``argv`` (its printed output discarded): over every
    planner module, and with the artifacts looked through."""
    from planner.commands.cli import main

    every, flow = Walk(), Walk(skip=("artifacts",))

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call":
            every.call(frame)
            flow.call(frame)

    out = io.StringIO()
    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(out):
            code = main(argv)
    finally:
        sys.setprofile(None)
    if code:
        raise SystemExit(f"planner {' '.join(argv)} exited {code}")
    return every, flow


def report(name: str, state: Walk, top: int, everything: bool, why: bool = False) -> None:
    print(f"{name}: {len(state.visited)} modules visited, {state.num_entries} entries, "
          f"{state.returns} returns to a module already left")
    print("  most re-entered (returns to the module):")
    for module, count in state.entries.most_common(top):
        print(f"    {count - 1:4d}  {module}")
        if why:
            for qualname, caller in state.entered[module]:
                print(f"            {qualname}  <- {caller}")
    if everything:
        print("  every module visited, in the order first entered (entries):")
        for module in state.visited:
            print(f"    {state.entries[module]:4d}  {module}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=8, help="re-entered modules listed per figure")
    ap.add_argument("--all", action="store_true", help="also list every module visited with its entries")
    ap.add_argument("--why", action="store_true",
                    help="under each re-entered module, the functions entered and the module entering each")
    args = ap.parse_args()
    every, flow = walk(["plan"])
    print(f"planner plan (no arguments), traced with sys.setprofile over {PACKAGE}")
    report("every planner module", every, args.top, args.all, args.why)
    report("the flow (planner/artifacts looked through)", flow, args.top, args.all, args.why)
    print(f"returns: {flow.returns} (flow), {every.returns} (every module)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
