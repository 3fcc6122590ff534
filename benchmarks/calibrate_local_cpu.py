"""Fit the ``local-cpu`` preset's link figures from emulated runs held out of the fidelity set.

A pipeline hop between two gloo processes on a small shared CPU costs more than an idle
ping-pong shows (the receiver wakes from a blocking wait on a busy core). This measures it the
way users would: run two emulated plans that are not among ``fidelity.py``'s configurations,
and fit the links with ``planner.report.calibrate`` (compute scale global, residual on the links).
Print the fitted intra-node latency and bandwidth, to be written into the preset with this
script named as the source.

Usage: python benchmarks/calibrate_local_cpu.py [--steps 5] [--warmup 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from emulated_setup import CLUSTER, emulated_plan, emulated_profile
from fidelity import CONFIGS, Config, run_one

from planner.artifacts.cluster import load_cluster
from planner.artifacts.profile import save_profile
from planner.artifacts.report import load_report
from planner.artifacts.request import ScheduleKind
from planner.report.calibrate import calibrate

HELD_OUT = (
    Config(4, 1, 3, ScheduleKind.GPIPE, False),
    Config(2, 1, 3, ScheduleKind.ONE_F_ONE_B, False),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    assert not set(HELD_OUT) & set(CONFIGS), "calibration runs must be held out of the fidelity set"
    cluster = load_cluster(CLUSTER)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        profile_path = work / "profile.json"
        profile = emulated_profile()
        save_profile(profile, profile_path)
        plans, reports = [], []
        for cfg in HELD_OUT:
            row = run_one(cfg, profile_path, work, args.steps, args.warmup)
            plans.append(emulated_plan(profile, num_stages=cfg.num_stages, dp_degree=cfg.dp_degree,
                                       num_microbatches=cfg.num_microbatches, schedule=cfg.schedule,
                                       recompute=cfg.recompute))
            reports.append(load_report(work / "report.json"))
            print(f"{cfg.name}: predicted {row['predicted_ms']:.1f} ms, measured {row['measured_ms']:.1f} ms")
        result = calibrate(reports, plans, profile, cluster, granularity="global", residual="links")
    fitted = result.cluster
    print(
        f"local-cpu intra-node latency {cluster.intra_node_latency_us:.0f} us -> {fitted.intra_node_latency_us:.0f} us, "
        f"bandwidth {cluster.intra_node_bandwidth_gb_per_s:.3f} -> {fitted.intra_node_bandwidth_gb_per_s:.3f} GB/s"
    )
    print(f"calibration: {result.calibration}")


if __name__ == "__main__":
    main()
