"""The golden plan corpus: plans written by the planner before a refactor, which the planner
must reproduce byte for byte after it (apart from ``provenance.planner_version``).

Each case is a profile, a cluster grown to N devices and a request; its plan is the planner's
public ``plan()`` written as canonical JSON. ``tests/test_golden_plans.py`` replans every case
and compares; regenerate only on purpose (a change that *should* change plans), and say why
in the commit:

    python -m tests.golden_plans --write            # every case
    python -m tests.golden_plans --write NAME ...   # some cases
    python -m tests.golden_plans --diff             # which fields of which cases differ

Cases: the default request; every shipped profile on its device's preset at two or three device
counts; the graph.txt profiles the project writes (``tests/graph_fixtures.py``: a CNN, a ResNet,
an LSTM encoder-decoder; PipeDream's published ones are read by benchmarks only) at 8 and 16
V100s; the ``--tp 1``, ``--zero 0`` and ``--no-stage-replication`` variants; replicated per
stage and interleaved plans; the other solvers and objectives on small cases; refusals (exit 3
text) are pinned as ``.txt``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "plans"
GRAPHS = ("cnn", "resnet", "seq2seq")  # graph.txt fixtures (tests/graph_fixtures.py)


@dataclass(frozen=True)
class Case:
    name: str
    profile: str  # a shipped profile's stem, or "graph:<fixture>" (a graph.txt of tests/graph_fixtures.py)
    devices: int
    request: dict[str, Any]
    slow: bool = False  # over ~5 s of CPU: in the slow tier only

    @property
    def is_graph(self) -> bool:
        return self.profile.startswith("graph:")


def _preset_of(profile: str) -> str:
    if profile.startswith("graph:"):
        return "v100-16gb-2x8"
    if profile.endswith("-cpu"):
        return "local-cpu"
    return "a100-80gb-x8" if profile.endswith("-a100") else "h100-80gb-x8"


def _cases() -> list[Case]:
    out: list[Case] = [Case("default", "gpt3-13b-a100", 8, {})]
    gpt_like = {
        "gpt3-1.3b-a100": (8, 16), "gpt3-1.3b-h100": (8, 32), "gpt3-13b-a100": (16, 32), "gpt3-13b-h100": (8, 16),
        "gpt3-175b-a100": (64, 128), "gpt3-175b-h100": (64,), "llama-3-8b-a100": (8, 16), "llama-3-8b-h100": (8, 16),
        "llama-3-70b-a100": (32, 64), "llama-3-70b-h100": (32, 64),
    }
    for prof, counts in gpt_like.items():
        for n in counts:
            out.append(Case(f"{prof}-n{n}", prof, n, {"global_batch": 512}, slow="175b" in prof or "70b" in prof))
    for prof in ("zoo-gpt-cpu", "zoo-gpt2-cpu", "zoo-bert-cpu", "zoo-vgg-cpu", "zoo-resnet-cpu"):
        for n in (2, 4, 8):
            out.append(Case(f"{prof}-n{n}", prof, n, {"global_batch": 64}))
    for model in GRAPHS:
        for n in (8, 16):
            out.append(Case(f"graph-{model}-n{n}", f"graph:{model}", n, {"global_batch": 0}))
    # variants of the default request
    out += [
        Case("default-tp1", "gpt3-13b-a100", 8, {"tp_degrees": [1]}),
        Case("default-zero0", "gpt3-13b-a100", 8, {"zero_stages": [0]}),
        Case("default-no-stage-replication", "gpt3-13b-a100", 8, {"per_stage_replication": False}),
        Case("default-tp1-zero0-norepl", "gpt3-13b-a100", 8,
             {"tp_degrees": [1], "zero_stages": [0], "per_stage_replication": False}),
        Case("default-sp-off", "gpt3-13b-a100", 8, {"sequence_parallel": [False]}),
        Case("default-g64", "gpt3-13b-a100", 8, {"global_batch": 64}),
        Case("default-memory", "gpt3-13b-a100", 8, {"objective": "memory"}),
        Case("default-me", "gpt3-13b-a100", 8, {"objective": "me", "tp_degrees": [1]}),
        Case("default-interleaved", "gpt3-13b-a100", 8,
             {"schedules": ["gpipe", "1f1b", "interleaved-1f1b"], "tp_degrees": [1]}),
        Case("gpt3-1.3b-a100-interleaved-only", "gpt3-1.3b-a100", 8,
             {"schedules": ["interleaved-1f1b"], "tp_degrees": [1], "num_stages": 4}),
        Case("default-forced-layout", "gpt3-13b-a100", 8, {"num_stages": 2, "dp_degree": 2, "tp_degrees": [2]}),
        Case("default-fixed-boundaries", "gpt3-13b-a100", 8, {"fixed_boundaries": [10, 20], "tp_degrees": [1]}),
        Case("default-no-recompute", "gpt3-13b-a100", 8, {"recompute": False}),
        Case("default-sgd", "gpt3-13b-a100", 8, {"optimizer": "sgd-fp32"}),
        # replicated per stage (the README's VGG and the zoo GPT's 2 of 4 devices)
        Case("zoo-vgg-cpu-n4-replicated", "zoo-vgg-cpu", 4, {"global_batch": 32, "zero_stages": [0]}),
        Case("zoo-gpt-cpu-n4-fixed", "zoo-gpt-cpu", 4, {"global_batch": 16, "fixed_boundaries": [3]}),
        Case("zoo-gpt-cpu-n4-zero1-forced", "zoo-gpt-cpu", 4,
             {"global_batch": 16, "fixed_boundaries": [3], "zero_stages": [1], "num_stages": 2, "dp_degree": 2}),
        Case("zoo-gpt-cpu-n2-readme", "zoo-gpt-cpu", 2, {"global_batch": 8, "fixed_boundaries": [3]}),
        Case("zoo-gpt-cpu-n4-interleaved", "zoo-gpt-cpu", 4,
             {"global_batch": 16, "schedules": ["interleaved-1f1b"], "tp_degrees": [1]}),
        Case("graph-cnn-n16-zero0", "graph:cnn", 16, {"global_batch": 0, "zero_stages": [0]}),
        Case("graph-resnet-n8-norepl", "graph:resnet", 8, {"global_batch": 0, "per_stage_replication": False}),
        # PipeDream's optimizer as the baseline on a graph.txt profile (its copies: 14, 1, 1)
        Case("graph-cnn-n16-pipedream", "graph:cnn", 16, {"global_batch": 3584, "solver": "pipedream"}),
    ]
    # the other solvers on small cases
    for solver in ("ilp", "brute-force", "uniform", "parameters", "time-balanced", "pipedream", "data-parallel"):
        out.append(Case(f"zoo-gpt-cpu-n4-{solver}", "zoo-gpt-cpu", 4,
                        {"global_batch": 16, "solver": solver, "tp_degrees": [1]}))
    for solver in ("uniform", "parameters", "time-balanced", "pipedream"):
        out.append(Case(f"gpt3-13b-a100-g64-{solver}", "gpt3-13b-a100", 8,
                        {"global_batch": 64, "solver": solver, "tp_degrees": [1]}))
    out.append(Case("zoo-gpt-cpu-n2-ilp-tp2", "zoo-gpt-cpu", 2, {"global_batch": 8, "solver": "ilp", "tp_degrees": [2]}))
    # refusals (Llama-3-70B on 16 A100s fits since the presets' memory is what CUDA reports: a plan)
    out.append(Case("llama-3-70b-a100-n16", "llama-3-70b-a100", 16, {"global_batch": 512}, slow=True))
    out.append(Case("llama-3-70b-a100-n8-refused", "llama-3-70b-a100", 8, {"global_batch": 512}))
    out.append(Case("gpt3-175b-a100-n8-refused", "gpt3-175b-a100", 8, {"global_batch": 512}))
    return out


CASES: tuple[Case, ...] = tuple(_cases())


def setting(case: Case) -> tuple[Any, Any, Any]:
    """(profile, cluster, request) of one case."""
    from planner.artifacts.cluster import PRESETS
    from planner.artifacts.codec import decode
    from planner.artifacts.profile import load_profile
    from planner.artifacts.request import PlanRequest

    if case.is_graph:
        from planner.profiling.imported.pipedream import import_pipedream
        from tests.graph_fixtures import graph_path

        profile = import_pipedream(graph_path(case.profile.split(":", 1)[1]))
    else:
        profile = load_profile(REPO / "profiles" / f"{case.profile}.json")
    base = PRESETS[_preset_of(case.profile)]
    nodes = max(base.num_nodes, -(-case.devices // base.devices_per_node))
    cluster = dataclasses.replace(base, num_nodes=nodes).with_devices(case.devices)
    fields = dict(case.request)
    if fields.get("global_batch") == 0:  # graph.txt: one 8-GPU server's minibatch (plan_quality's G)
        fields["global_batch"] = profile.microbatch_sizes[0] * 8
    request = decode(PlanRequest, fields, "request")
    return profile, cluster, request


def render(case: Case) -> str:
    """The canonical text of a case's plan (planner_version blanked), or of its refusal."""
    from planner.artifacts.codec import dumps_canonical
    from planner.artifacts.errors import InfeasibleError
    from planner.artifacts.plan import plan_to_json
    from planner.solve import plan

    profile, cluster, request = setting(case)
    try:
        found = plan(profile, cluster, request)
    except InfeasibleError as exc:
        return f"infeasible: {exc}\n"
    data = plan_to_json(found)
    data["provenance"]["planner_version"] = ""
    return dumps_canonical(data)


def path_of(case: Case) -> Path:
    """A plan's JSON, or a refusal's text (cases named ``*-refused``)."""
    return GOLDEN / f"{case.name}.{'txt' if case.name.endswith('-refused') else 'json'}"


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in list(a) + [k for k in b if k not in a]:
            out += _differences(a.get(k), b.get(k), f"{path}.{k}" if path else k)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the golden files")
    ap.add_argument("--diff", action="store_true", help="print the field paths that differ per case")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    chosen = [c for c in CASES if not args.names or c.name in args.names]
    GOLDEN.mkdir(parents=True, exist_ok=True)
    bad = 0
    for case in chosen:
        t0 = time.process_time()
        text = render(case)
        cpu = time.process_time() - t0
        path = path_of(case)
        old = path.read_text() if path.exists() else None
        same = old == text
        if args.diff and old is not None and not same:
            try:
                fields = _differences(json.loads(old), json.loads(text))
            except json.JSONDecodeError:
                fields = ["<text>"]
            print(f"{case.name}: {len(fields)} fields differ: {', '.join(fields[:8])}")
        if args.write:
            path.write_text(text)
        bad += not same
        print(f"{case.name:45s} {cpu:6.2f} s CPU  {'same' if same else ('new' if old is None else 'DIFFERS')}",
              flush=True)
    return 1 if bad and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
