"""Cost-model fidelity: predicted vs measured iteration time and activation bytes, emulated.

For each configuration (P stages x D replicas, M micro-batches, schedule, recompute), build
the plan with ``build_plan`` (predictions from the event simulator), run it with
``python -m planner.runtime --emulate`` (stage chunks stretched to their profile times; real tensors and
gloo communication), and compare the RunReport with the plan. Targets (issue 6): iteration
time error median <= 5%, max <= 15%; activation bytes within 1%.

Configurations with ``z=1``/``z=2`` run ZeRO (with AdamW, so that there is optimizer state to
shard); ``R2+1`` is a pipeline replicated per stage (stage 0 on two processes, micro-batches
round-robin), run by the planner's own executor. ``16k`` plans are priced for the bundled
runtime's stack with 16 KiB buckets (the all-reduce in several buckets overlapping the last
backward, as the runtime runs it), ``none`` for a stack overlapping nothing (run as one
all-reduce after the schedule); the others for the default stack (1 MiB buckets: one per stage
of this toy model). ``zb-h1`` runs zero bubble (issue 21); its activation bytes are predicted from
the schedule's held counts with what W keeps measured by the profiler (with recomputation the
runtime recomputes once in I and keeps W's inputs to W, as the plan prices: docs/zero-bubble.md).

Usage: python benchmarks/fidelity.py [--steps 5] [--warmup 2] [--out results.json] [--only N] [--select 14,18]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from emulated_setup import MODEL_SPEC, STACK_CHOICES, emulated_layout, emulated_plan, emulated_profile

from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import Layout
from planner.artifacts.plan import save_plan
from planner.artifacts.profile import save_profile
from planner.artifacts.report import load_report

G, F, Z, V = ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1, ScheduleKind.ZBV


@dataclass(frozen=True)
class Config:
    num_stages: int
    dp_degree: int
    num_microbatches: int
    schedule: ScheduleKind
    recompute: bool
    zero: int = 0
    replicas: tuple[int, ...] = ()  # per-stage copies (dp_degree 1, M global)
    stack: str = ""  # emulated_setup.STACK_CHOICES: "" the default, "16k" small buckets, "none"

    @property
    def name(self) -> str:
        layout = f"P{self.num_stages} R{'+'.join(map(str, self.replicas))}" if self.replicas else f"P{self.num_stages} D{self.dp_degree}"
        stack = f" {self.stack}" if self.stack else ""
        return f"{layout} M{self.num_microbatches} {self.schedule.value:<5} rc={int(self.recompute)} z={self.zero}{stack}"

    @property
    def layout(self) -> Layout:
        return emulated_layout(self.num_stages, self.dp_degree, self.zero, self.replicas, self.schedule)

    @property
    def num_processes(self) -> int:
        return self.layout.world_size


CONFIGS = (
    Config(1, 1, 4, G, False),
    Config(1, 2, 4, F, False),
    Config(1, 2, 2, G, True),
    Config(2, 1, 4, G, False),
    Config(2, 1, 8, F, False),
    Config(2, 1, 6, F, True),
    Config(2, 2, 4, G, True),
    Config(2, 2, 8, F, False),
    Config(2, 2, 2, F, True),
    Config(4, 1, 2, G, False),
    Config(4, 1, 4, G, False),
    Config(4, 1, 8, F, False),
    Config(4, 1, 8, G, True),
    Config(4, 1, 6, F, True),
    # ZeRO (AdamW, so there is optimizer state to shard) and pipelines replicated per stage
    Config(1, 2, 4, F, False, zero=1),
    Config(1, 2, 4, G, True, zero=2),
    Config(2, 2, 4, G, False, zero=1),
    Config(2, 2, 8, F, False, zero=2),
    Config(2, 1, 8, F, False, replicas=(2, 1)),
    Config(2, 1, 8, G, False, replicas=(1, 2)),
    Config(2, 1, 8, F, False, zero=1, replicas=(2, 1)),
    # issue 19: the all-reduce in 16 KiB buckets overlapping the last backward, and not overlapped
    Config(1, 2, 4, F, False, stack="16k"),
    Config(1, 2, 4, G, True, stack="16k"),
    Config(2, 2, 4, F, False, stack="16k"),
    Config(2, 2, 8, G, True, stack="16k"),
    Config(1, 2, 4, F, False, stack="none"),
    Config(2, 2, 4, F, False, stack="none"),
    # issue 21: ZB-H1 (its action lists in torch's action-list runtime), the backward's I and W chunks
    # stretched to the plan's (bwd - wgrad, wgrad)
    Config(2, 1, 8, Z, False),
    Config(2, 1, 6, Z, True),
    Config(4, 1, 8, Z, False),
    Config(4, 1, 8, Z, True),
    Config(2, 2, 8, Z, False),
    # issue 21: ZBV (its action lists in torch's action-list runtime), P counting chunks: two per rank in a V
    Config(4, 1, 8, V, False),
    Config(4, 1, 6, V, True),
    Config(8, 1, 8, V, False),
)


def run_one(cfg: Config, profile_path: Path, work: Path, steps: int, warmup: int) -> dict[str, object]:
    from planner.artifacts.profile import load_profile

    plan = emulated_plan(
        load_profile(profile_path),
        num_stages=cfg.num_stages,
        dp_degree=cfg.dp_degree,
        num_microbatches=cfg.num_microbatches,
        schedule=cfg.schedule,
        recompute=cfg.recompute,
        zero=cfg.zero,
        replicas=cfg.replicas,
        stack=STACK_CHOICES[cfg.stack],
    )
    plan_path, report_path = work / "plan.json", work / "report.json"
    save_plan(plan, plan_path)
    nproc = cfg.num_processes
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    cmd += ["-m", "planner.runtime", "--plan", str(plan_path), "--model", MODEL_SPEC, "--emulate"]
    cmd += ["--profile", str(profile_path), "--steps", str(steps), "--warmup-steps", str(warmup), "--report", str(report_path)]
    if cfg.zero:
        cmd += ["--optimizer", "adamw"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{cfg.name}: runtime failed:\n{proc.stderr[-2000:]}")
    report = load_report(report_path)
    act_errors = [abs(s.activation_rel_error) for s in report.stages]
    return {
        "config": cfg.name,
        "predicted_ms": report.iteration_ms_predicted,
        "measured_ms": report.iteration_ms,
        "time_error": report.iteration_rel_error,
        "activation_predicted_bytes": [s.activation_bytes_predicted for s in report.stages],
        "activation_measured_bytes": [s.saved_bytes_peak for s in report.stages],
        "activation_max_error": max(act_errors),
        "stage_compute_ms": [round(s.compute_ms, 2) for s in report.stages],
        "stage_compute_predicted_ms": [round(s.compute_ms_predicted, 2) for s in report.stages],
        "step_ms": [round(s.wall_ms, 2) for s in report.steps],
        "overrun_fraction": report.emulation_overrun_fraction,
        "fidelity_sample": report.fidelity_sample,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default="")
    parser.add_argument("--only", type=int, default=0, help="run the first N configurations")
    parser.add_argument("--select", default="", help="comma-separated indices of configurations to run")
    args = parser.parse_args()
    configs = CONFIGS[: args.only] if args.only else CONFIGS
    if args.select:
        configs = tuple(CONFIGS[int(i)] for i in args.select.split(","))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        profile_path = work / "profile.json"
        save_profile(emulated_profile(), profile_path)
        print(f"{'config':<32} {'pred ms':>9} {'meas ms':>9} {'t err':>7}  {'act bytes pred/meas per stage':<40} {'a err':>6}")
        for cfg in configs:
            row = run_one(cfg, profile_path, work, args.steps, args.warmup)
            rows.append(row)
            acts = " ".join(f"{p}/{m}" for p, m in zip(row["activation_predicted_bytes"], row["activation_measured_bytes"]))  # type: ignore[call-overload]
            print(
                f"{row['config']:<32} {row['predicted_ms']:>9.1f} {row['measured_ms']:>9.1f} "
                f"{100 * row['time_error']:>6.1f}%  {acts:<40} {100 * row['activation_max_error']:>5.2f}%"
                f"{'' if row['fidelity_sample'] else '  (overran: not a valid sample)'}",
                flush=True,
            )
    summary = fidelity_summary(rows)
    if summary:
        print(summary)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


def fidelity_summary(rows: list[dict[str, object]]) -> str:
    """The time and activation errors over the valid samples; a run whose emulated compute
    overran its profiled times by more than 5% (``RunReport.fidelity_sample`` False) measured
    the machine's load, not the cost model, and is left out of the time statistics and named
    (activation bytes do not depend on time: every run counts)."""
    valid = [r for r in rows if r["fidelity_sample"]]
    skipped = [f"{r['config'].strip()} (overrun {100 * r['overrun_fraction']:.1f}%)" for r in rows if not r["fidelity_sample"]]  # type: ignore[operator]
    lines = [f"not valid fidelity samples (emulated compute overran > 5%), left out: {'; '.join(skipped)}"] if skipped else []
    if not valid:
        return "\n".join(lines + ["no valid fidelity sample: re-run on a quieter machine"])
    errors = [abs(r["time_error"]) for r in valid]  # type: ignore[arg-type]
    act = max(r["activation_max_error"] for r in rows)  # type: ignore[type-var]  # bytes: every run counts
    return "\n".join(lines) + (
        f"\n{len(valid)} configurations: time error median {100 * statistics.median(errors):.1f}% "
        f"(target <= 5%), max {100 * max(errors):.1f}% (target <= 15%); activation bytes max error {100 * act:.2f}% (target <= 1%)"
    )


if __name__ == "__main__":
    main()
