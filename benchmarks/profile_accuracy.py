"""How well per-layer times add up to a whole training step, for each zoo model.

For each model: profile it layer by layer at one micro-batch size, sum the per-layer
forward + backward medians, and compare with the median of whole-model steps (forward of
every layer, loss, backward) at the same size. Prints the ratio sum/step (target 0.9-1.1).

Usage: python benchmarks/profile_accuracy.py [--batch 8] [--threads 1] [--repeats 5] [--rounds 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from planner.models import load_workload  # noqa: E402
from planner.profiling import profile_model  # noqa: E402
from planner.profiling.tensors import to_device  # noqa: E402
from planner.profiling.timing import Clock, time_step  # noqa: E402

SPECS = ("gpt", "bert", "vgg", "resnet")


def measure(spec: str, batch: int, threads: int, repeats: int, rounds: int, device: str) -> tuple[float, float]:
    """(sum of per-layer fwd+bwd ms, whole-step ms) at micro-batch ``batch``, medians.

    The two measurements alternate over ``rounds`` (each a median of ``repeats``) and the
    median round is kept, so a change of load on a shared machine hits both alike.
    """
    workload = load_workload(spec)
    dev = torch.device(device)
    layers = tuple(m.to(dev) for m in workload.layers)
    inputs, targets = to_device(workload.make_batch(batch, 0), dev, None)
    sums, steps = [], []
    for _ in range(rounds):
        profile = profile_model(
            workload, microbatch_sizes=(batch,), device=device, warmup=2, repeats=repeats,
            num_threads=threads, trace_ops=False, progress=False,
        )
        sums.append(sum(p.fwd_ms + p.bwd_ms for layer in profile.layers for p in layer.measured))
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            loss = lambda out: workload.loss_fn(out, targets)  # noqa: E731
            steps.append(time_step(layers, inputs, loss, Clock(dev), warmup=2, repeats=repeats))
        finally:
            torch.set_num_threads(before)
    return statistics.median(sums), statistics.median(steps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    print(f"micro-batch {args.batch}, {args.threads} thread(s), median of {args.rounds} rounds x {args.repeats} repeats, device {args.device}")
    print(f"{'model':8} {'sum of layers ms':>17} {'whole step ms':>14} {'ratio':>6}")
    for spec in SPECS:
        layer_sum, step = measure(spec, args.batch, args.threads, args.repeats, args.rounds, args.device)
        print(f"{spec:8} {layer_sum:17.3f} {step:14.3f} {layer_sum / step:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
