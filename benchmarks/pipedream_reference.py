"""Running PipeDream's own optimizer (``../shared/reference/pipedream/optimizer_src``, unmodified)
and reading its choice back: which stage each node went to (its ``-o`` output, ``gpus=N.txt``),
each stage's replication factor and its objective (the lines it prints). Used by
``benchmarks/pipedream_replication.py --reproduce``, which runs it beside our reimplementation
and records its choices (``--record``) in :data:`RECORDED`; ``benchmarks/pipedream_profiles.py``
checks ours against that record on PipeDream's profiles (neither the optimizer's source nor its
profiles are in the repository: both are read from ``../shared/reference/pipedream``). Its command line and
environment (:func:`optimizer_command`, :func:`optimizer_env`) are also used by the benchmarks
that time the optimizer (``benchmarks/pipedream_side_by_side.py`` and those built on it).

Its ``graph`` module imports ``graphviz`` and ``-o`` renders a drawing with it; where the package
is missing, a module of that name whose ``Digraph`` draws nothing is put on its path instead.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: PipeDream's optimizer source and its profiles (graph.txt), beside the clone (benchmarks only)
REFERENCE = ROOT.parent / "shared" / "reference" / "pipedream"
#: the real optimizer's choices at the side-by-side setting, recorded by
#: ``benchmarks/pipedream_replication.py --reproduce --record`` (:func:`write_recorded`)
RECORDED = ROOT / "benchmarks" / "pipedream_optimizer_choices.json"
RECORDED_FORMAT = "pipedream-optimizer-choices/1"
# the side-by-side setting (benchmarks/pipedream_side_by_side.py): 10 GB/s, 16 GB per device
BANDWIDTH_BYTES_PER_S = 10_000_000_000.0
MEMORY_BYTES = 16_000_000_000.0

_SHIM = '''"""Stands in for graphviz: PipeDream's optimizer draws its partition with it (-o)."""


class Digraph:
    def node(self, *args, **kwargs):
        pass

    def edge(self, *args, **kwargs):
        pass

    def render(self, *args, **kwargs):
        pass
'''


@dataclass(frozen=True)
class RealChoice:
    """PipeDream's answer: per stage its node ids (inputs left out) and copies; its objective."""

    stage_nodes: tuple[frozenset[str], ...]
    replicas: tuple[int, ...]
    objective_s: float


def require_reference(reference: Path = REFERENCE) -> Path:
    """The optimizer's folder, or a clear failure (the benchmarks that run it)."""
    opt_dir = reference / "optimizer_src" / "optimizer"
    if not (opt_dir / "optimizer_graph_hierarchical.py").is_file():
        raise AssertionError(f"PipeDream's optimizer is not at {opt_dir}: this check runs it; "
                             f"put ../shared/reference/pipedream beside the clone")
    return opt_dir


def optimizer_command(model: str, num_machines: int, reference: Path = REFERENCE, out_dir: Path | None = None) -> list[str]:
    """The optimizer's command line with the side-by-side flags (``-b 1e10 -s 1.6e10
    --activation_compression_ratio 1 --use_memory_constraint``, one level), to run from
    :func:`require_reference`'s folder; ``-o out_dir`` (write its partition) when given."""
    cmd = [sys.executable, "optimizer_graph_hierarchical.py", "-f", str(reference / model / "graph.txt"),
           "-n", str(num_machines), "-b", f"{BANDWIDTH_BYTES_PER_S:.0f}", "-s", f"{MEMORY_BYTES:.0f}",
           "--activation_compression_ratio", "1", "--use_memory_constraint"]
    return cmd + ["-o", str(out_dir)] if out_dir is not None else cmd


def optimizer_env(shim_dir: Path) -> dict[str, str]:
    """The optimizer's environment: this one, with the ``graphviz`` stand-in written to
    ``shim_dir`` and put on its path when the real package is not installed."""
    env = dict(os.environ)
    if importlib.util.find_spec("graphviz") is None:
        (shim_dir / "graphviz.py").write_text(_SHIM)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim_dir), env.get("PYTHONPATH", "")) if p)
    return env


def run_real(model: str, num_machines: int, *, timeout_s: float = 600.0, reference: Path = REFERENCE) -> RealChoice:
    """Run the optimizer on ``model``'s graph.txt (:func:`optimizer_command`) and parse its
    choice (``subprocess.TimeoutExpired`` past ``timeout_s``)."""
    opt_dir = require_reference(reference)
    with tempfile.TemporaryDirectory() as tmp:
        env = optimizer_env(Path(tmp))
        out_dir = Path(tmp) / "out"
        out_dir.mkdir()
        cmd = optimizer_command(model, num_machines, reference, out_dir)
        proc = subprocess.run(cmd, cwd=opt_dir, capture_output=True, text=True, timeout=timeout_s, env=env)
        if proc.returncode:
            raise RuntimeError(f"PipeDream's optimizer failed on {model} N={num_machines}: {proc.stderr[-500:]}")
        return parse_choice(proc.stdout, (out_dir / f"gpus={num_machines}.txt").read_text())


def parse_choice(stdout: str, partitioned_graph: str) -> RealChoice:
    """The optimizer's printed table ``(start, end) time replication`` and objective, and the
    ``stage_id`` of every node in its output graph."""
    table = stdout.split("(Split start, split end)", 1)[1]
    replicas = tuple(int(r) for r in re.findall(r"^\(\d+, \d+\) \S+ (\d+)$", table, re.M))
    objective = float(re.search(r"^Time per stage in pipeline: (\S+)$", stdout, re.M).group(1))  # type: ignore[union-attr]
    stages: dict[int, set[str]] = {}
    for line in partitioned_graph.splitlines():
        if line.startswith("\t"):
            continue
        parts = line.split(" -- ")
        if parts[1].startswith("Input"):
            continue
        stages.setdefault(int(parts[-1].split("=")[1]), set()).add(parts[0])
    if sorted(stages) != list(range(len(replicas))):
        raise ValueError(f"stage ids {sorted(stages)} do not match {len(replicas)} printed stages")
    return RealChoice(tuple(frozenset(stages[s]) for s in range(len(replicas))), replicas, objective)


def write_recorded(choices: dict[tuple[str, int], RealChoice], path: Path = RECORDED) -> None:
    """Record the real optimizer's choices (by model and machine count) as versioned JSON: per
    case its copies per stage, node ids per stage (sorted) and objective (s per minibatch)."""
    cases = [{"model": model, "num_machines": n, "replicas": list(c.replicas), "objective_s": c.objective_s,
              "stage_nodes": [sorted(stage) for stage in c.stage_nodes]}
             for (model, n), c in sorted(choices.items())]
    head = {"format": RECORDED_FORMAT,
            "optimizer": "PipeDream optimizer_graph_hierarchical.py (msr-fiddle/pipedream 7db6a1c, unmodified)",
            "flags": optimizer_command("MODEL", 0)[6:]}  # after -f graph.txt -n N
    body = ",\n".join(f"  {json.dumps(c)}" for c in cases)  # one case a line
    path.write_text(json.dumps(head)[:-1] + ',\n "cases": [\n' + body + "\n ]}\n")


def read_recorded(path: Path = RECORDED) -> dict[tuple[str, int], RealChoice]:
    """The recorded choices of :func:`write_recorded`, by (model, machine count)."""
    doc = json.loads(path.read_text())
    if doc.get("format") != RECORDED_FORMAT:
        raise ValueError(f"{path}: format {doc.get('format')!r}, expected {RECORDED_FORMAT!r}")
    return {(c["model"], c["num_machines"]): RealChoice(tuple(frozenset(s) for s in c["stage_nodes"]),
                                                        tuple(c["replicas"]), float(c["objective_s"]))
            for c in doc["cases"]}


REL_TIE = 1e-9  # "a tie": equal objectives within 1e-9 relative


def same_value(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TIE * max(abs(a), abs(b))


@dataclass(frozen=True)
class Compared:
    """One case: the real choice, ours, and the verdict: ``agree`` (same stages, same copies,
    same objective), ``tie`` (different split, but the real split scores ours's objective under
    our reimplementation and both objectives are equal, all within :data:`REL_TIE`), ``no``."""

    verdict: str
    real: RealChoice
    ours_nodes: tuple[frozenset[str], ...]
    ours_replicas: tuple[int, ...]
    ours_objective_s: float
    real_under_ours_s: float


def require_profiles(reference: Path = REFERENCE) -> Path:
    """PipeDream's profiles folder, or a one-line exit: they are read from beside the clone."""
    if not (reference / "alexnet" / "graph.txt").is_file():
        raise SystemExit(f"PipeDream's profiles are not at {reference}: this benchmark reads them from "
                         f"../shared/reference/pipedream beside the clone (or --reference DIR)")
    return reference


def ours_of(model: str, num_machines: int, reference: Path = REFERENCE, max_states: int | None = None) -> tuple[Any, ...]:
    """(graph, args, states, our choice) on ``model`` (``reference/model/graph.txt``) at the
    side-by-side setting."""
    from planner.profiling.imported.pipedream import import_pipedream
    from planner.solve.pipedream_optimizer import OptimizerArgs, antichain_states, nodes_of_profile, optimize

    graph = nodes_of_profile(import_pipedream(reference / model / "graph.txt"))
    args = OptimizerArgs(num_machines=num_machines, bandwidth_bytes_per_s=BANDWIDTH_BYTES_PER_S, memory_bytes=MEMORY_BYTES)
    states = antichain_states(graph, max_states)
    return graph, args, states, optimize(graph, args, states)


def compare(model: str, num_machines: int, *, timeout_s: float = 600.0, reference: Path = REFERENCE,
            max_states: int | None = None) -> Compared:
    """The real optimizer's choice and ours on one case (``TooManyStates`` from ours beyond
    ``max_states``, ``subprocess.TimeoutExpired`` from the real one past ``timeout_s``)."""
    graph, args, states, ours = ours_of(model, num_machines, reference, max_states)
    real = run_real(model, num_machines, timeout_s=timeout_s, reference=reference)
    return judge(graph, args, states, ours, real)


def judge(graph: Any, args: Any, states: Any, ours: Any, real: RealChoice) -> Compared:
    """The verdict of :class:`Compared` on our choice ``ours`` and the real one."""
    from planner.solve.pipedream_optimizer import objective_of

    index = {name: i for i, name in enumerate(graph.names)}
    real_idx = [frozenset(index[n] for n in stage if n in index) for stage in real.stage_nodes]
    real_under_ours = objective_of(graph, args, real_idx, real.replicas, states)
    if ours is None:
        return Compared("no", real, (), (), math.inf, real_under_ours)
    names = tuple(frozenset(graph.names[i] for i in stage) for stage in ours.stage_nodes)
    if names == real.stage_nodes and ours.replicas == real.replicas and same_value(ours.objective_s, real.objective_s):
        verdict = "agree"
    elif same_value(ours.objective_s, real.objective_s) and same_value(real_under_ours, ours.objective_s):
        verdict = "tie"
    else:
        verdict = "no"
    return Compared(verdict, real, names, ours.replicas, ours.objective_s, real_under_ours)
