"""Feed N malformed documents (default 10,000) to each loader and count crashes.

A crash is any exception other than PlannerInputError, or a multi-line error message.
    python benchmarks/fuzz_loaders.py [--count 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzzing import check_one, mutate, valid_documents


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    total_crashes = 0
    for kind, (valid, loader) in sorted(valid_documents().items()):
        rng = random.Random(args.seed)
        crashes: list[str] = []
        start = time.perf_counter()
        for _ in range(args.count):
            crash = check_one(mutate(valid, rng), loader, rng)
            if crash:
                crashes.append(crash)
        wall = time.perf_counter() - start
        total_crashes += len(crashes)
        print(f"{kind:8s} documents {args.count:6d}  crashes {len(crashes):4d}  wall {wall:6.2f} s")
        for c in crashes[:5]:
            print(f"    {c}")
    print(f"total crashes: {total_crashes}")
    return 1 if total_crashes else 0


if __name__ == "__main__":
    sys.exit(main())
