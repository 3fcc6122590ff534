"""Simulator speed: the full Timeline at P = 64, M = 512 (target under 1 s) and the solver's
low-level entry ``simulate_iteration_ms`` at P = 8, M = 32 (target ~1 ms) and P = 16, M = 64.

Run: ``python benchmarks/simulator_speed.py``. Times are the best of a few repeats; the first
(cold) call also builds and caches the schedule, and is reported separately.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.artifacts.kinds import ScheduleKind
from planner.simulation import simulate, simulate_iteration_ms
from tests.plan_factory import make_plan, stage_terms


def stage_arrays(p: int, seed: int = 0) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.uniform(a, b) for _ in range(p)] for a, b in ((1, 2), (2, 4), (0, 1), (0, 0.2), (0, 0.2), (0, 5))]


def best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    print(f"{'case':44s} {'cold':>10s} {'warm':>10s}")
    for kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B):
        p, m = 64, 512
        f, b, rc, sf, sb, ar = stage_arrays(p)
        plan = make_plan(kind, m, f, b, recompute_ms=rc, send_fwd_ms=sf, send_bwd_ms=sb, allreduce_ms=ar)
        cold = best_of(lambda: simulate(plan), 1)
        warm = best_of(lambda: simulate(plan), 3)
        print(f"{f'simulate(plan) {kind.value} P={p} M={m}':44s} {cold * 1e3:8.1f}ms {warm * 1e3:8.1f}ms")
    for kind, p, m, v in (
        (ScheduleKind.ONE_F_ONE_B, 8, 32, 1),
        (ScheduleKind.GPIPE, 8, 32, 1),
        (ScheduleKind.ONE_F_ONE_B, 16, 64, 1),
        (ScheduleKind.INTERLEAVED_1F1B, 16, 64, 2),
        (ScheduleKind.ONE_F_ONE_B, 64, 512, 1),
    ):
        terms = stage_terms(*stage_arrays(p))
        cold = best_of(lambda: simulate_iteration_ms(kind, m, terms, virtual_stages_per_rank=v), 1)
        warm = best_of(lambda: simulate_iteration_ms(kind, m, terms, virtual_stages_per_rank=v), 20)
        name = f"simulate_iteration_ms {kind.value} P={p // v} v={v} M={m}"
        print(f"{name:44s} {cold * 1e3:8.2f}ms {warm * 1e3:8.2f}ms")


if __name__ == "__main__":
    main()
