"""Regenerate the shipped profiles in ``profiles/``.

- measured profiles of the zoo models (gpt, bert, vgg, resnet, moe, and gpt2 when transformers
  is installed) at their default (small) sizes (moe: its layers' routed experts in ``Layer.moe``):
  ``zoo-<model>-<device>.json`` (CPU by default; ``--device cuda`` on a GPU machine);
- analytic GPT-3 1.3B / 13B / 175B on A100 and H100: ``gpt3-<size>-<a100|h100>.json``
  (planner.profiling.analytic.gpt, formulas cited there);
- analytic Llama-3 8B / 70B from ``configs/llama-3-*.json`` on A100 and H100:
  ``llama-3-<size>-<a100|h100>.json`` (planner.profiling.analytic.llama, formulas cited there);
- analytic Qwen3-235B-A22B (mixture of experts) from ``configs/qwen3-235b-a22b.json`` on H100 at
  4,096 tokens per sample (the published Megatron runs' length): ``qwen3-235b-a22b-h100.json``
  (planner.profiling.analytic.moe).

Usage: python benchmarks/make_profiles.py [--only measured|analytic] [--device cpu|cuda]
       [--threads N] [--models gpt,bert,...] [--out-dir profiles]
       python benchmarks/make_profiles.py --refresh-splits [--models gpt,bert]
       python benchmarks/make_profiles.py --refresh-keep [--models gpt,bert]

``--refresh-splits`` rewrites only what a shipped measured profile counts rather than times --
each layer's tensor split (``Layer.tp``: the split and sequence-split saved bytes, the bytes one
device saves at each degree) and the parameters' names -- from today's zoo model, keeping the
timings as they were measured (so plans that do not use those figures stay the same). Used for
profile version 4 (issue 51: sequence parallelism on torch's DTensor keeps the column splits'
gathered inputs whole).

``--refresh-keep`` likewise writes only what W keeps from a layer's I until its W
(``Layer.weight_grad_saved_fraction``, :mod:`planner.profiling.measured.wgrad`, measured at the
profile's byte-measuring micro-batch size) into the shipped measured zoo profiles, keeping their
timings (W's share of the backward time, ``weight_grad_fraction``, stays unset: timing it means
re-timing). Issue 50: zoo plans priced with what torch's split backward keeps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.artifacts.profile import save_profile

ZOO_SPECS = ("gpt", "bert", "vgg", "resnet", "moe", "gpt2")  # gpt2 only when transformers is installed
GPT3 = ("gpt3-1.3b", "gpt3-13b", "gpt3-175b")
LLAMA3 = ("llama-3-8b", "llama-3-70b")  # configs/<name>.json
MOE = (("qwen3-235b-a22b", "h100", 4096),)  # configs/<name>.json, device, tokens per sample
PRESETS = {"a100": "a100-80gb", "h100": "h100-80gb"}


def shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (as the shipped profiles are named)."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def make_measured(out_dir: Path, device: str, threads: int, sizes: tuple[int, ...], models: tuple[str, ...]) -> None:
    import importlib.util

    from planner.models import load_workload
    from planner.profiling.measured import profile_model

    for spec in models:
        if spec == "gpt2" and importlib.util.find_spec("transformers") is None:
            print("gpt2: skipped (transformers is not installed)", file=sys.stderr)
            continue
        profile = profile_model(
            load_workload(spec), microbatch_sizes=sizes, device=device, warmup=3, repeats=10, num_threads=threads
        )
        path = out_dir / f"zoo-{spec}-{device}.json"
        save_profile(profile, path)
        print(f"{shown(path)}: {profile.num_layers} layers, {path.stat().st_size / 1e3:.0f} KB")


def refresh_splits(out_dir: Path, models: tuple[str, ...]) -> None:
    """Recount the tensor splits and parameter names of the shipped measured zoo profiles (see
    the module docstring)."""
    import dataclasses

    from planner.artifacts.profile import load_profile
    from planner.models import layer_param_names, load_workload
    from planner.profiling.measured.profiler import BATCH_SEED
    from planner.profiling.measured.tensor_split import layer_splits

    for spec in models:
        path = out_dir / f"zoo-{spec}-cpu.json"
        old = load_profile(path)
        work = load_workload(spec)
        size = int(old.metadata["bytes_measured_at_microbatch_size"])
        inputs, _ = work.make_batch(size, BATCH_SEED)
        splits = layer_splits(work, inputs, size, [layer.output_bytes_per_sample for layer in old.layers])
        names = layer_param_names(work)
        layers = tuple(dataclasses.replace(layer, tp=split, param_names=names[i])
                       for i, (layer, split) in enumerate(zip(old.layers, splits)))
        save_profile(dataclasses.replace(old, layers=layers), path)
        print(f"{shown(path)}: tensor splits and parameter names recounted, timings kept")


def refresh_keep(out_dir: Path, models: tuple[str, ...]) -> None:
    """Measure what W keeps per layer into the shipped measured zoo profiles (see the module
    docstring), every other field as it was."""
    import dataclasses

    from planner.artifacts.profile import load_profile
    from planner.models import load_workload, workload_fingerprint
    from planner.profiling.measured.profiler import BATCH_SEED
    from planner.profiling.measured.wgrad import weight_grad_saved_fractions

    for spec in models:
        path = out_dir / f"zoo-{spec}-cpu.json"
        old = load_profile(path)
        work = load_workload(spec)
        if workload_fingerprint(work) != old.fingerprint_sha256:
            raise SystemExit(f"{shown(path)}: fingerprint_sha256 is not today's zoo {spec!r} model's; regenerate it")
        inputs, targets = work.make_batch(int(old.metadata["bytes_measured_at_microbatch_size"]), BATCH_SEED)
        kept = weight_grad_saved_fractions(work, inputs, targets)
        layers = tuple(dataclasses.replace(layer, weight_grad_saved_fraction=f) for layer, f in zip(old.layers, kept))
        save_profile(dataclasses.replace(old, layers=layers), path)
        print(f"{shown(path)}: what W keeps measured (last layer {kept[-1]}), timings kept")


def make_analytic(out_dir: Path) -> None:
    from planner.artifacts.errors import PlannerInputError
    from planner.profiling.analytic.gpt import gpt3_profile

    for size in GPT3:
        for short, preset in PRESETS.items():
            path = out_dir / f"{size}-{short}.json"
            try:
                profile = gpt3_profile(size, device_preset=preset)
            except PlannerInputError as exc:
                print(f"{shown(path)}: not written ({exc})", file=sys.stderr)
                continue
            save_profile(profile, path)
            print(f"{shown(path)}: analytic, {path.stat().st_size / 1e3:.0f} KB")
    make_analytic_llama(out_dir)
    make_analytic_moe(out_dir)


def make_analytic_moe(out_dir: Path) -> None:
    from planner.profiling.analytic.llama import read_config
    from planner.profiling.analytic.moe import moe_profile

    for name, short, seq in MOE:
        path = out_dir / f"{name}-{short}.json"
        profile = moe_profile(read_config(REPO / "configs" / f"{name}.json"), seq=seq, device_preset=PRESETS[short],
                              model=name, source=f"configs/{name}.json")
        save_profile(profile, path)
        print(f"{shown(path)}: analytic, {path.stat().st_size / 1e3:.0f} KB")


def make_analytic_llama(out_dir: Path) -> None:
    from planner.profiling.analytic.llama import llama_profile, read_config

    for name in LLAMA3:
        config = REPO / "configs" / f"{name}.json"
        for short, preset in PRESETS.items():
            path = out_dir / f"{name}-{short}.json"
            profile = llama_profile(read_config(config), device_preset=preset, model=name, source=f"configs/{name}.json")
            save_profile(profile, path)
            print(f"{shown(path)}: analytic, {path.stat().st_size / 1e3:.0f} KB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["measured", "analytic"])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadiest on a shared machine)")
    parser.add_argument("--microbatch-sizes", default="1,2,4,8")
    parser.add_argument("--models", default=",".join(ZOO_SPECS), help="zoo models to measure (default: all)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "profiles")
    parser.add_argument("--refresh-splits", action="store_true",
                        help="recount the tensor splits and parameter names of the shipped measured profiles only")
    parser.add_argument("--refresh-keep", action="store_true",
                        help="measure what W keeps (weight_grad_saved_fraction) into the shipped measured profiles only")
    args = parser.parse_args()
    args.out_dir = args.out_dir.resolve()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.refresh_splits:
        refresh_splits(args.out_dir, tuple(args.models.split(",")))
        return 0
    if args.refresh_keep:
        refresh_keep(args.out_dir, tuple(args.models.split(",")))
        return 0
    if args.only != "analytic":
        sizes = tuple(int(s) for s in args.microbatch_sizes.split(","))
        make_measured(args.out_dir, args.device, args.threads, sizes, tuple(args.models.split(",")))
    if args.only != "measured":
        make_analytic(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
