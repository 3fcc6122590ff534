"""Expert parallelism run on gloo (issue 48 item 5): ``planner plan``'s own plans of the shipped
zoo MoE profile at EP = 1, 2 and 4 on four CPU processes, run by ``planner run``, their
predictions and measurements side by side in one run.

Per EP degree: the layout the solver chose (``--ep K``, global batch 16, SGD float32, uniform
layouts: ``--no-stage-replication``), its predicted iteration and all-to-all ms, the measured
iteration ms (median of the timed steps), and per stage the bytes one micro-batch saves for backward (the runtime's
hooks) and the gradient bytes a rank holds after the sync, each against the plan's. The model
runs with the forced-balance router (``moe:router=balanced``: the profile's experts were timed
and counted with the tokens spread evenly; same parameters, same fingerprint).

Run: ``python benchmarks/expert_parallel.py [--ep 1,2,4] [--steps 4] [--devices 4]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.artifacts.plan import load_plan
from planner.artifacts.report import load_report

PROFILE = REPO / "profiles" / "zoo-moe-cpu.json"
MODEL = "moe:router=balanced"


def _planner(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "planner", *args], cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"planner {args[0]} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")


def measure(ep: int, devices: int, steps: int, folder: Path) -> list[str]:
    """Plan at ``--ep ep``, run it, and return the table's lines for it."""
    plan_path, report_path = folder / f"ep{ep}.json", folder / f"ep{ep}-report.json"
    _planner("plan", "--profile", str(PROFILE), "--cluster", "local-cpu", "--devices", str(devices), "--global-batch",
             str(4 * devices), "--optimizer", "sgd-fp32", "--no-stage-replication", "--ep", str(ep),
             "--out", str(plan_path))
    _planner("run", str(plan_path), "--model", MODEL, "--steps", str(steps), "--report", str(report_path))
    plan, report = load_plan(plan_path), load_report(report_path)
    a2a = sum(s.alltoall_ms for s in plan.stages)
    lines = [f"EP={ep}  {plan.layout.describe():48s} M={plan.num_microbatches} b={plan.microbatch_size}  iteration "
             f"predicted {plan.predicted.iteration_ms:7.1f} ms, measured {report.iteration_ms:7.1f} ms "
             f"({100 * (report.iteration_ms / plan.predicted.iteration_ms - 1):+.0f}%); a2a predicted {a2a:.1f} ms a "
             "micro-batch"]
    for stage, got in zip(plan.stages, report.stages, strict=True):
        saved, want = got.saved_bytes_per_microbatch, stage.activation_bytes_per_microbatch
        lines.append(f"    stage {stage.stage_idx}: saved a micro-batch {saved:>10,} B, plan {want:>10,} B "
                     f"({100 * (saved / want - 1):+.2f}%); grads held {got.grad_bytes_after_sync:>9,} B, plan "
                     f"{got.grad_bytes_predicted:>9,} B")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ep", default="1,2,4")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--devices", type=int, default=4)
    args = parser.parse_args()
    print(f"zoo MoE ({PROFILE.relative_to(REPO)}, {MODEL}) on {args.devices} gloo processes, global batch "
          f"{4 * args.devices}, {args.steps} steps (1 warm-up)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for ep in (int(e) for e in args.ep.split(",")):
            print("\n".join(measure(ep, args.devices, args.steps, Path(tmp))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
