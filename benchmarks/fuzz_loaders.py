"""Feed N hostile inputs (default 2,000 per loader) to every loader and count what goes wrong.

The file loaders: tests/fuzzing.py's mutation classes and oracles (truncations, non-UTF-8, BOM,
empty files, duplicate keys, lone surrogates, NaN/Infinity/1e400, type swaps, deletions,
unknown keys, deep nesting, long strings, huge and negative numbers; graph.txt's own), plus
the special files (FIFO, /dev/zero, a directory, a socket, an empty file). Then (issue 52):

- ``checkpoint``: a checkpoint directory of two committed steps, damaged one way per mutant
  (tests/fuzzing_checkpoints.py: a mutated manifest or ``latest.json``, flipped bits with and
  without manifests, truncations, special files), resumed as ``planner run --resume`` does;
- ``run-flags``: every number ``planner run`` takes, set to a hostile text, parsed as the
  launcher parses it (tests/fuzzing_values.py);
- ``hf-values``: a config field of a value family (probability, epsilon, activation, ...) set to
  a hostile value;
- ``cross-field``: profiles, plans and run reports whose fields contradict each other (every
  case, not N).

Prints, per loader: the mutants, how many were refused and accepted, the problems (crashes,
hangs, silent acceptances, slow or unnamed refusals), and the largest CPU time one took; then
the totals by kind.

    python benchmarks/fuzz_loaders.py [--count 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzzing import Outcome, loaders, run_mutants, run_one, special_files

KINDS = ("crash", "hang", "silent", "slow", "multi-line", "message", "refused a valid", "refusal not")


def _row(name: str, results: Iterable[tuple[str, Outcome]], started: float, totals: collections.Counter[str]) -> None:
    problems: collections.Counter[str] = collections.Counter()
    refused = loaded = count = 0
    worst = 0.0
    for kind, outcome in results:
        count += 1
        refused += outcome.refused
        loaded += not outcome.refused and not outcome.problem
        worst = max(worst, outcome.cpu_s)
        if outcome.problem:
            problems[f"{kind}: {outcome.problem[:120]}"] += 1
            totals[next((k for k in KINDS if outcome.problem.startswith(k)), "other")] += 1
    print(f"{name:16s} {count:7d} {refused:7d} {loaded:6d} {sum(problems.values()):8d} {worst:9.3f} "
          f"{time.perf_counter() - started:7.1f}", flush=True)
    for text, n in problems.most_common(8):
        print(f"    {n:4d} x {text}")


def _files(count: int, seed: int, totals: collections.Counter[str]) -> None:
    for name, loader in loaders().items():
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            results = [(m.kind, o) for m, o in run_mutants(loader, folder, count, seed)]
            with special_files(folder) as files:
                results += [(kind, run_one(loader, path, must_refuse=True)) for kind, path in files.items()]
        _row(name, results, start, totals)


def _checkpoint(count: int, seed: int, totals: collections.Counter[str]) -> None:
    import torch.distributed as dist

    from tests.fuzzing_checkpoints import make_base, run_dir_mutants

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        dist.init_process_group("gloo", store=dist.FileStore(str(folder / "store"), 1), rank=0, world_size=1)
        try:
            base = make_base(folder)
            results = [(f"{m.kind} ({m.variant[:30]})", o) for m, o in run_dir_mutants(base, folder, count, seed)]
        finally:
            dist.destroy_process_group()
    _row("checkpoint", results, start, totals)


def _values(count: int, seed: int, totals: collections.Counter[str]) -> None:
    from planner.artifacts.plan import save_plan
    from tests.fuzzing_checkpoints import _plan
    from tests.fuzzing_values import cross_field_cases, flag_cases, hf_value_loader, hf_value_mutants, run_flag_case

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        plan = folder / "plan.json"
        save_plan(_plan(), plan)
        start = time.perf_counter()
        results = [(f"{c.flag}={c.text[:20]!r}", run_flag_case(c, str(plan), str(folder / "ckpt")))
                   for c in flag_cases(random.Random(seed), count)]
        _row("run-flags", results, start, totals)
        start, loader, results = time.perf_counter(), hf_value_loader(), []
        for i, mutant in enumerate(hf_value_mutants(random.Random(seed), count)):
            path = folder / f"config-{i}.json"
            path.write_bytes(mutant.data)
            results.append((mutant.kind, run_one(loader, path, must_refuse=mutant.must_refuse)))
        _row("hf-values", results, start, totals)
        start, results = time.perf_counter(), []
        for i, (doc_loader, mutant) in enumerate(cross_field_cases()):
            path = folder / f"doc-{i}.json"
            path.write_bytes(mutant.data)
            results.append((mutant.kind, run_one(doc_loader, path, must_refuse=True)))
        _row("cross-field", results, start, totals)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--count", type=int, default=2_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    totals: collections.Counter[str] = collections.Counter()
    print(f"{'loader':16s} {'mutants':>7s} {'refused':>7s} {'loaded':>6s} {'problems':>8s} {'max CPU s':>9s} {'wall s':>7s}")
    _files(args.count, args.seed, totals)
    _checkpoint(args.count, args.seed, totals)
    _values(args.count, args.seed, totals)
    total = sum(totals.values())
    print(f"total problems: {total} (crashes/tracebacks {totals['crash']}, hangs {totals['hang']}, silent acceptances "
          f"{totals['silent']}, slow {totals['slow']}, refusals not one line naming the input "
          f"{totals['multi-line'] + totals['message'] + totals['refusal not']}, valid values refused "
          f"{totals['refused a valid']}, other {totals['other']})")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
