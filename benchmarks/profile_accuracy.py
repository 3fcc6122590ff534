"""How well per-layer times add up to a whole training step, for each zoo model.

For each model: profile it layer by layer at one micro-batch size, sum the per-layer
forward + backward medians, and compare with the median of whole-model steps (forward of
every layer, loss, backward) at the same size. Prints the ratio sum/step (target 0.9-1.1).

Usage: python benchmarks/profile_accuracy.py [--batch 8] [--threads 1] [--rounds 25] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch

from planner.models import load_workload
from planner.profiling.measured import profile_model
from planner.profiling.measured.tensors import to_device
from planner.profiling.measured.timing import Clock, time_step

SPECS = ("gpt", "bert", "vgg", "resnet")


def measure(spec: str, batch: int, threads: int, rounds: int, device: str) -> tuple[float, float]:
    """(sum over layers of the median fwd+bwd ms, median whole-step ms) at micro-batch ``batch``.

    Profiling (one repeat per round) and whole steps alternate round by round, so a change
    of load on a shared machine hits both alike; per-layer medians over the rounds are summed,
    the statistic a profile's per-layer medians give.
    """
    workload = load_workload(spec)
    dev = torch.device(device)
    layers = tuple(m.to(dev) for m in workload.layers)
    inputs, targets = to_device(workload.make_batch(batch, 0), dev, None)
    per_layer: list[list[float]] = [[] for _ in layers]
    steps = []
    for _ in range(rounds):
        profile = profile_model(
            workload, microbatch_sizes=(batch,), device=device, warmup=1, repeats=1,
            num_threads=threads, trace_ops=False, progress=False,
        )
        for times, layer in zip(per_layer, profile.layers):
            times.append(layer.measured[0].fwd_ms + layer.measured[0].bwd_ms)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            loss = lambda out: workload.loss_fn(out, targets)
            steps.append(time_step(layers, inputs, loss, Clock(dev), warmup=1, repeats=1))
        finally:
            torch.set_num_threads(before)
    return sum(statistics.median(t) for t in per_layer), statistics.median(steps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    print(f"micro-batch {args.batch}, {args.threads} thread(s), medians of {args.rounds} alternating rounds, device {args.device}")
    print(f"{'model':8} {'sum of layers ms':>17} {'whole step ms':>14} {'ratio':>6}")
    for spec in SPECS:
        layer_sum, step = measure(spec, args.batch, args.threads, args.rounds, args.device)
        print(f"{spec:8} {layer_sum:17.3f} {step:14.3f} {layer_sum / step:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
