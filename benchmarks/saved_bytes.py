"""Bytes saved for backward, counted four ways, side by side in one run, per model and micro-batch.

- ``per tensor``: every tensor autograd saves, ``numel x element_size`` (how the profiler and the
  runtime counted before issue 18: a tensor saved by two nodes, or a view of a saved one,
  twice);
- ``hooks``: the same saves once per storage (``planner.runtime.memory.SavedBytesMeter``), one
  micro-batch through the model cut into two stages as the runtime runs them;
- ``allocator``: the allocator's own count of the same storages (``torch.profiler`` memory
  events: bytes a stage's forward left allocated, its output excepted) beside the hooks' count
  of those storages;
- ``predicted``: the profile's prediction for the two stages (measured at micro-batch 1, 2, 4,
  fitted ``a + b x micro-batch``, shared storages once; ``planner.cost.CostModel``).

Models: the zoo GPT and BERT, Hugging Face Llama (tied embeddings) and Qwen2 when
``transformers`` is installed, and a small U-Net (``tests.factories:unet``: concatenated skips).

Run: ``python benchmarks/saved_bytes.py [--sizes 1,2,4]``
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch

from planner.artifacts.cluster import PRESETS
from planner.cost import CostModel
from planner.models import load_workload
from planner.models.selective import set_selective
from planner.models.workload import Workload
from planner.profiling.measured import profile_model
from planner.profiling.measured.memory import excluded_storages
from planner.runtime.memory import AllocatorProbe
from planner.runtime.stage import StageModule
from tests.factories import unet

MODELS = {
    "zoo gpt": "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256",
    "zoo bert": "bert:layers=2,hidden=64,heads=4,seq=32,vocab=256",
    "hf llama (tied)": "hf:llama:layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128,vocab=256,seq=32,"
                       "tie_word_embeddings=true",
    "hf qwen2": "hf:qwen2:layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128,vocab=256,seq=32",
    "u-net": "",
}


def _args(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def per_tensor_bytes(work: Workload, b: int) -> int:
    """Every saved tensor's own bytes, parameters and buffers excluded (the old count)."""
    excluded = excluded_storages(work)
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if t.numel() and t.untyped_storage().data_ptr() not in excluded:
            total += t.numel() * t.element_size()
        return t

    inputs, targets = work.make_batch(b, 0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        x = inputs
        for layer in work.layers:
            x = layer(x)
        work.loss_fn(x, targets)
    return total


def two_stages(work: Workload, cut: int, b: int) -> list[StageModule]:
    n = len(work.layers)
    mods = [StageModule(list(work.layers[a:z]), [False] * (z - a)) for a, z in ((0, cut), (cut, n))]
    probe = AllocatorProbe(torch.device("cpu"))
    inputs, targets = work.make_batch(b, 0)
    with probe.session():
        for m in mods:
            m.probe = probe
        out0 = mods[0](*_args(inputs))
        received = tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in _args(out0))
        out1 = mods[1](*received)
        with mods[1].measured((out1, targets), merge=True) as box:
            box.append(work.loss_fn(out1, targets))
        kept = (out0, received, box)
    for m in mods:
        m.read_allocator()
        for layer in m.layers:
            set_selective(layer, False)
    del kept
    return mods


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,2,4")
    args = ap.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    head = (f"{'model':<16} {'mb':>2} {'per tensor':>10} {'hooks':>10} {'predicted':>10} {'pred err':>8} "
            f"{'alloc':>10} {'hooks(same)':>11} {'hook err':>8} {'per tensor / hooks':>18}")
    print(head)
    print("-" * len(head))
    for name, spec in MODELS.items():
        if spec.startswith("hf") and importlib.util.find_spec("transformers") is None:
            print(f"{name}: skipped (transformers is not installed)")
            continue
        work = unet() if not spec else load_workload(spec)
        profile = profile_model(work, microbatch_sizes=sizes, warmup=0, repeats=1, progress=False, trace_ops=False)
        cm = CostModel(profile, PRESETS["local-cpu"])
        cut = cm.num_layers // 2
        for b in sizes:
            mods = two_stages(work, cut, b)
            hooks = sum(m.records[0].saved_bytes for m in mods)
            predicted = cm.activation_bytes(0, cut, (), b) + cm.activation_bytes(cut, cm.num_layers, (), b)
            alloc = sum(m.records[0].allocated_bytes for m in mods)
            same = sum(m.records[0].new_saved_bytes for m in mods)
            naive = per_tensor_bytes(work, b)
            print(f"{name:<16} {b:>2} {naive:>10} {hooks:>10} {predicted:>10.0f} {(hooks - predicted) / predicted:>+8.2%} "
                  f"{alloc:>10} {same:>11} {(same - alloc) / alloc:>+8.2%} {naive / hooks:>18.3f}")
    print("\nhooks and predicted: both stages, inputs included; alloc and hooks(same): the storages the forwards made "
          "(outputs and received inputs excepted); per tensor: one process, whole model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
