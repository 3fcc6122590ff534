"""Start-up cost: whole ``planner`` processes, the code before lazy imports (``--base``, a
checkout) beside this repository's, with the floors under them (issue 24).

Each round runs every command once per code version and every floor once, in an order rotated
by one each round (so each sees the same background load); the table gives medians of each
process's user + sys CPU (``RUSAGE_CHILDREN``, interpreter start and imports included) and wall
time. Both versions run as ``python -m planner ...`` with this interpreter from their own
checkout (the working directory comes first on ``sys.path`` with ``-m``; each run checks which
``planner`` it imported, once, with ``-X importtime``, and lists the heavy third-party packages
and the number of planner modules it imported).

Commands: ``--help``; ``plan`` (the embedded default: GPT-3 13B on one 8x A100 node, the main
job); ``plan --profile graph.txt`` on PipeDream's alexnet and vgg16 at 4 V100s, global batch
``b0 x 4`` (the setting of ``benchmarks/pipedream_side_by_side.py``). Floors: ``python -c pass``,
``python -c "import numpy"`` (the cost model computes with NumPy: no planning process is
below it) and PipeDream's own optimizer on the same two profiles (``benchmarks/pipedream_reference.py``'s
command line).

Run: ``python benchmarks/import_cost.py --base /work/wt-imports-base [--rounds 5]
[--reference ../shared/reference/pipedream]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipedream_side_by_side import Run, timed

from benchmarks.pipedream_reference import optimizer_command, optimizer_env, require_reference

#: third-party packages worth naming when a command imports them (import cost of 0.1 s and up)
HEAVY = ("numpy", "networkx", "ortools", "pandas", "matplotlib", "torch", "scipy", "jsonschema")
#: (label, planner arguments); ``{ref}``: the PipeDream reference folder
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("planner --help", ("--help",)),
    ("planner plan (default)", ("plan",)),
    ("plan alexnet N=4", ("plan", "--profile", "{ref}/alexnet/graph.txt", "--cluster", "v100-16gb-2x8", "--devices", "4",
                          "--global-batch", "1024")),
    ("plan vgg16 N=4", ("plan", "--profile", "{ref}/vgg16/graph.txt", "--cluster", "v100-16gb-2x8", "--devices", "4",
                        "--global-batch", "512")),
)


def imported(code: Path, argv: list[str]) -> tuple[str, str]:
    """(the ``planner`` package a run of ``argv`` from ``code`` imported, what it imported: the
    :data:`HEAVY` packages and the count of planner modules), from ``-X importtime``."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "import runpy, sys, planner; print(planner.__file__, file=sys.stderr); "
                           f"sys.argv = ['planner', *{argv!r}]; runpy.run_module('planner', run_name='__main__')"],
                          cwd=code, capture_output=True, text=True, timeout=600)
    lines = proc.stderr.splitlines()
    names = {ln.split("|")[-1].strip() for ln in lines if ln.startswith("import time:")}
    where = next((ln for ln in lines if ln.endswith("__init__.py")), "?")
    heavy = [h for h in HEAVY if h in names]
    return where, f"{'+'.join(heavy) or 'none'}; {sum(n.startswith('planner') for n in names)} planner modules"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="checkout of the code before the change")
    ap.add_argument("--reference", type=Path, default=ROOT.parent / "shared" / "reference" / "pipedream")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=300.0)
    args = ap.parse_args()
    opt_dir = require_reference(args.reference)
    ref = str(args.reference.resolve())
    codes = {"old": args.base.resolve(), "new": ROOT}
    py = sys.executable
    jobs: dict[str, tuple[list[str], Path, dict[str, str] | None]] = {
        "python -c pass": ([py, "-c", "pass"], ROOT, None),
        "python -c 'import numpy'": ([py, "-c", "import numpy"], ROOT, None),
    }
    with tempfile.TemporaryDirectory() as tmp:
        env = optimizer_env(Path(tmp))
        for model in ("alexnet", "vgg16"):
            jobs[f"PipeDream optimizer {model} N=4"] = (optimizer_command(model, 4, args.reference), opt_dir, env)
        for label, argv in COMMANDS:
            for name, code in codes.items():
                jobs[f"{label} [{name}]"] = ([py, "-m", "planner", *(a.format(ref=ref) for a in argv)], code, None)
        print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}, "
              f"{args.rounds} rounds, order rotated each round; old = {codes['old']}, new = {ROOT}")
        runs: dict[str, list[Run]] = {label: [] for label in jobs}
        order = list(jobs)
        for r in range(args.rounds):
            for label in order[r % len(order):] + order[:r % len(order)]:
                cmd, cwd, job_env = jobs[label]
                runs[label].append(timed(cmd, cwd, args.timeout_s, job_env))
    print(f"{'process':34s} {'cpu s':>6s} {'wall s':>6s}  imports")
    for label, rs in runs.items():
        failed = "" if all(x.ok for x in rs) else "  FAILED: " + rs[-1].summary[:80]
        what = ""
        if label.endswith("]"):
            name = label.rsplit("[", 1)[1][:-1]
            argv = next(a for lab, a in COMMANDS if label.startswith(lab + " ["))
            where, what = imported(codes[name], [a.format(ref=ref) for a in argv])
            if not where.startswith(str(codes[name])):
                raise SystemExit(f"{label} imported the planner from {where}, not {codes[name]}")
        print(f"{label:34s} {statistics.median(x.cpu_s for x in rs):6.3f} {statistics.median(x.wall_s for x in rs):6.3f}  "
              f"{what}{failed}", flush=True)
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
