"""Context parallelism, planning (issue 20): the plans with and without cp searched.

Cases (the issue's "done when"):

- Llama-3-70B and Llama-3-8B at 131,072 tokens per sample (analytic profiles of the shipped
  Hugging Face configs, ``planner profile --analytic hf --config configs/llama-3-{70b,8b}.json
  --seq 131072 --device-preset h100-80gb``) on 64 H100s (8 nodes of the h100-80gb-x8 preset),
  global batch 64: the best plan with ``--cp 1`` and with cp searched (the default), their
  iteration time, MFU, recomputed layers and solver CPU time;
- Llama-3-70B (the shipped ``profiles/llama-3-70b-a100.json``, 8,192 tokens) on
  ``a100-80gb-2x8`` at global batch 512: the plan, or the refusal and what it names.

The solver time of the default request and of GPT-3 175B over 1,024 GPUs against the commit
before this work is measured side by side by ``benchmarks/same_run_speed.py --base``.

Run: ``python benchmarks/context_parallel.py [--cases 8b,70b,a100]``
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from planner.artifacts.cluster import PRESETS
from planner.artifacts.errors import PlannerError
from planner.artifacts.plan import Plan
from planner.artifacts.profile import load_profile
from planner.artifacts.request import PlanRequest
from planner.profiling.analytic.llama import llama_profile, read_config
from planner.solve import plan

REPO = Path(__file__).resolve().parents[1]
SEQ = 131072


def _row(label: str, found: Plan, cpu_s: float) -> str:
    recomputed = sum(len(s.recompute) + len(s.recompute_selective) for s in found.stages)
    return (f"  {label:8s} {found.layout.describe():42s} M={found.num_microbatches:<3d} b={found.microbatch_size} "
            f"recomputed {recomputed:2d}/{found.num_layers}  {found.predicted.iteration_ms / 1e3:8.1f} s  "
            f"MFU {100 * found.predicted.mfu:4.1f}%  peak {found.predicted.peak_memory_bytes / 2**30:5.2f} GiB  "
            f"solver {cpu_s:5.1f} s CPU")


def _timed(*args: object) -> tuple[Plan, float]:
    c0 = time.process_time()
    found = plan(*args)  # type: ignore[arg-type]
    return found, time.process_time() - c0


def long_context(size: str) -> None:
    prof = llama_profile(read_config(REPO / "configs" / f"llama-3-{size}.json"), seq=SEQ, device_preset="h100-80gb",
                         model=f"llama-3-{size}", source=f"configs/llama-3-{size}.json")
    cluster = dataclasses.replace(PRESETS["h100-80gb-x8"], num_nodes=8)
    print(f"llama-3-{size} at {SEQ:,} tokens per sample, 64 H100 (8 x h100-80gb-x8), global batch 64", flush=True)
    before, t0 = _timed(prof, cluster, PlanRequest(global_batch=64, cp_degrees=(1,)))
    print(_row("--cp 1", before, t0), flush=True)
    after, t1 = _timed(prof, cluster, PlanRequest(global_batch=64))
    print(_row("cp", after, t1))
    gain = before.predicted.iteration_ms / after.predicted.iteration_ms - 1
    print(f"  cp searched: {100 * gain:.1f}% faster ({before.predicted.iteration_ms / 1e3:.1f} s -> "
          f"{after.predicted.iteration_ms / 1e3:.1f} s), solver {t1 / t0:.2f}x CPU\n", flush=True)


def a100_70b() -> None:
    prof = load_profile(REPO / "profiles" / "llama-3-70b-a100.json")
    cluster = PRESETS["a100-80gb-2x8"]
    print("llama-3-70b (8,192 tokens) on a100-80gb-2x8 (16 A100-80GB), global batch 512", flush=True)
    for label, request in (("--cp 1", PlanRequest(global_batch=512, cp_degrees=(1,))),
                           ("cp", PlanRequest(global_batch=512))):
        try:
            found, cpu = _timed(prof, cluster, request)
            print(_row(label, found, cpu), flush=True)
        except PlannerError as exc:
            print(f"  {label:8s} refused: {str(exc).splitlines()[0]}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="8b,70b,a100")
    args = ap.parse_args()
    for case in args.cases.split(","):
        if case == "a100":
            a100_70b()
        else:
            long_context(case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
