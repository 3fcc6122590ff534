"""Context parallelism with the attention core kept: the gathered keys and values held to the
backward (the runtime before this change) against re-gathered in backward (now,
``planner.models.context.SequenceShard.regathering``), side by side in one launch.

Two gloo processes, cp = 2 (the zoo GPT's layers, each rank on its two chunks of every
sample, ``SequenceShard.regather`` off and on alternating step by step so both share the
machine's load drift). Per model and per variant:

- saved bytes of one micro-batch's forward per rank (the runtime's meter,
  ``planner.runtime.memory.SavedBytesMeter``: saved-tensor hooks, once per storage) and the peak
  of the K/V re-gathered in backward live at once (storages some tensor still uses);
- process CPU time (user + sys, all threads: gloo's too) of a forward + backward step,
  median of ``--steps`` after a warm-up, and the relative overhead of the re-gather.

For the memory model (the test's: L = 2, h = 32, S = 64, float64, b = 2) also the cost model's
prediction of the stage's activation bytes at cp = 2 (its measured profile declared to scale
with the sequence, as ``tests/test_runtime_context.py`` does) and the float masks the CPU
kernel keeps, which the cost model does not price.

Usage: python benchmarks/context_regather.py [--steps 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch
import torch.distributed as dist

from planner.models import load_workload
from planner.models.context import SequenceShard, observing_regathers, set_context
from planner.runtime.memory import SavedBytesMeter

MODELS = {
    "memory": ("gpt:layers=2,hidden=32,heads=4,seq=64,vocab=64,dtype=float64", 2),
    "timing": ("gpt:layers=4,hidden=128,heads=8,seq=512,vocab=256", 2),
}


class _Peak:
    """Re-gathered K/V live at once (as tests/runtime_driver.py's RegatherMeter)."""

    def __init__(self) -> None:
        self.held: list[torch.UntypedStorage] = []
        self.peak_bytes = 0

    def observe(self, tensor: torch.Tensor) -> None:
        self.held = [s for s in self.held if torch._C._storage_Use_Count(s._cdata) > 1]
        self.held.append(tensor.untyped_storage())
        self.peak_bytes = max(self.peak_bytes, sum(s.nbytes() for s in self.held))


def _step(work: Any, shards: dict[bool, SequenceShard], regather: bool, inputs: Any, targets: Any) -> tuple[int, int, float]:
    """One forward + backward on the rank's chunks: (saved bytes, re-gathered peak, CPU s)."""
    for layer in work.layers:
        set_context(layer, shards[regather])
    params = [p for layer in work.layers for p in layer.parameters()]
    meter, peak = SavedBytesMeter(params), _Peak()
    start = time.process_time()
    with observing_regathers(peak.observe):
        with meter.hooks():
            x = inputs
            for layer in work.layers:
                x = layer(x)
            loss = work.loss_fn(x, targets)
        saved = meter.live_bytes
        loss.backward()
    cpu = time.process_time() - start
    peak.held.clear()
    for p in params:
        p.grad = None
    return saved, peak.peak_bytes, cpu


def worker(steps: int, out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    rows: dict[str, Any] = {}
    for name, (spec, b) in MODELS.items():
        work = load_workload(spec)
        shards = {r: SequenceShard(degree=2, index=rank, group=dist.group.WORLD, regather=r) for r in (False, True)}
        tokens, targets = work.make_batch(b, 0)
        inputs, targets = shards[True].split(tokens, dim=1), shards[True].split(targets, dim=1)
        runs: dict[bool, list[tuple[int, int, float]]] = {False: [], True: []}
        for i in range(steps + 2):
            for regather in ((False, True) if i % 2 else (True, False)):
                got = _step(work, shards, regather, inputs, targets)
                if i >= 2:  # the first two rounds warm up
                    runs[regather].append(got)
        rows[name] = {
            str(r): {"saved": runs[r][0][0], "peak": runs[r][0][1], "cpu_s": statistics.median(c for _, _, c in runs[r])}
            for r in (False, True)
        }
    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        out.write_text(json.dumps(gathered))
    dist.destroy_process_group()


def _prediction() -> tuple[float, int]:
    """The cost model's activation bytes of the memory model's stage at cp = 2, b = 2, and the
    float masks the runtime adds (L x S/2 x S x 8)."""
    from tests.test_runtime_context import cost_model_at_cp2

    spec, b = MODELS["memory"]
    cm = cost_model_at_cp2(spec, seq=64, hidden=32, heads=4)
    return cm.activation_bytes(0, cm.num_layers, (), b), 2 * 32 * 64 * 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.worker)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
               str(Path(__file__).resolve()), "--steps", str(args.steps), "--worker", str(out)]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        if proc.returncode:
            sys.exit(proc.stderr[-3000:])
        ranks = json.loads(out.read_text())
    predicted, masks = _prediction()
    print(f"cp = 2, 2 gloo processes, attention cores kept; median process CPU s of a forward + backward over {args.steps} steps")
    print(f"{'model':<62} {'rank':>4} {'K/V held':>12} {'re-gathered':>12} {'held s':>8} {'re-g. s':>8} {'overhead':>8}")
    for name, (spec, b) in MODELS.items():
        for rank, rows in enumerate(ranks):
            held, regathered = rows[name]["False"], rows[name]["True"]
            over = regathered["cpu_s"] / held["cpu_s"] - 1.0
            print(f"{spec + f' b={b}':<62} {rank:>4} {held['saved']:>12,} {regathered['saved']:>12,} "
                  f"{held['cpu_s']:>8.4f} {regathered['cpu_s']:>8.4f} {over:>+8.1%}")
    print("saved bytes of one micro-batch per rank (meter); re-gathered K/V live at once in backward, held / re-gathered:")
    for name in MODELS:
        print(f"  {name}: " + ", ".join(f"rank {r}: {rows[name]['False']['peak']:,} / {rows[name]['True']['peak']:,}"
                                         for r, rows in enumerate(ranks)))
    got = ranks[0]["memory"]["True"]["saved"]
    print(f"memory model, cost model's activation bytes at cp = 2: {predicted:,.0f}; measured re-gathered {got:,} "
          f"= prediction + float masks {masks:,} {got - masks - predicted:+,.0f} B")


if __name__ == "__main__":
    main()
