"""Feed N hostile files (default 2,000) to every loader and count what goes wrong.

The mutation classes and their oracles are tests/fuzzing.py's (truncations, non-UTF-8, BOM,
empty files, duplicate keys, lone surrogates, NaN/Infinity/1e400, type swaps, deletions,
unknown keys, deep nesting, long strings, huge and negative numbers; graph.txt's own), plus the
special files (FIFO, /dev/zero, a directory, a socket, an empty file). Prints, per loader: the
mutants, how many were refused and accepted, the crashes, hangs, silent acceptances and slow
refusals, and the largest CPU time one refusal took.

    python benchmarks/fuzz_loaders.py [--count 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzzing import loaders, run_mutants, run_one, special_files


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--count", type=int, default=2_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    total = 0
    print(f"{'loader':16s} {'mutants':>7s} {'refused':>7s} {'loaded':>6s} {'problems':>8s} {'max CPU s':>9s} {'wall s':>7s}")
    for name, loader in loaders().items():
        problems: collections.Counter[str] = collections.Counter()
        refused = loaded = 0
        worst = 0.0
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            results = list(run_mutants(loader, folder, args.count, args.seed))
            with special_files(folder) as files:
                results += [(kind, run_one(loader, path, must_refuse=True)) for kind, path in files.items()]  # type: ignore[misc]
        for mutant, outcome in results:
            kind = mutant if isinstance(mutant, str) else mutant.kind
            refused += outcome.refused
            loaded += not outcome.refused and not outcome.problem
            worst = max(worst, outcome.cpu_s)
            if outcome.problem:
                problems[f"{kind}: {outcome.problem[:120]}"] += 1
        wall = time.perf_counter() - start
        total += sum(problems.values())
        print(f"{name:16s} {len(results):7d} {refused:7d} {loaded:6d} {sum(problems.values()):8d} {worst:9.3f} {wall:7.1f}")
        for text, count in problems.most_common(8):
            print(f"    {count:4d} x {text}")
    print(f"total problems (crashes, hangs, silent acceptances, slow or unnamed refusals): {total}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
