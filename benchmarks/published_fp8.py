"""The published FP8 rows priced with a measured FP8 GEMM efficiency (issue 49 item 5).

Megatron-Bridge's DGX-H100 table (``../shared/reference/published_runs/README.md`` section 6;
the rows: ``benchmarks/published_rows.py``'s :func:`megatron_bridge_rows`): Llama 3 8B (FSDP),
Llama 3 70B and Llama 3.1 405B trained with FP8 current scaling. Each is priced as
``benchmarks/published_runs.py`` prices every row (the published configuration forced, the
shipped bf16 GEMM constants, which never saw these rows), its profile re-priced at
``fp8-current`` by :func:`planner.cost.precision.at_precision` with the settings of
Megatron-Bridge 25.11's performance scripts: every block in FP8 (``first_last_layers_bf16``
off), Transformer Engine's fused cross entropy.

No constant is fitted: the FP8 GEMMs' fraction of the FP8 peak relative to the bf16 GEMMs' of
the bf16 peak (``planner.cost.precision.FP8_GEMM_EFFICIENCY``) is the H100's measured maximum
achievable matmul FLOPS in FP8 over that in BF16 (``FP8_EFFICIENCY_SOURCE``); every row is out
of sample. ``--fit`` prints, for comparison only, the value a fit on all three rows would take
(golden-section search on the squared log time ratio) and the rows at it; it ships nothing.

Run: ``python benchmarks/published_fp8.py [--fit]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import published_runs as pr
from published_rows import PublishedRun, megatron_bridge_rows

from planner.artifacts.kinds import Precision
from planner.cost import precision

GIB = 1024**3


def priced_ratio(run: PublishedRun, efficiency: float) -> float:
    """Predicted / published time of ``run`` with the FP8 constant at ``efficiency``."""
    precision.FP8_GEMM_EFFICIENCY[run.precision] = efficiency
    pr.profile_for.cache_clear()
    return pr.time_ratio(run, pr.price(run, pr.DEVICE_GEMM[run.device]))


def fit(rows: list[PublishedRun], lo: float = 0.3, hi: float = 2.0, iters: int = 40) -> float:
    """The constant minimising the fit rows' squared log time ratios (golden-section search)."""
    def loss(e: float) -> float:
        return sum(math.log(priced_ratio(r, e)) ** 2 for r in rows)

    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = loss(d)
    return (a + b) / 2


def table(rows: list[PublishedRun], efficiency: float, fitted_on: tuple[str, ...] = precision.FP8_FIT_ROWS) -> list[float]:
    """Print every row at ``efficiency``; the time ratios - 1 of the rows out of sample (not in ``fitted_on``)."""
    print(f"{'row':<18} {'t':>2} {'p':>2} {'v':>2} {'cp':>2} {'d':>3} {'ZeRO':>4} {'published':>10} {'predicted':>10} "
          f"{'ratio':>6} {'GiB':>5} {'fits':>4}  fit?")
    out = []
    for r in rows:
        precision.FP8_GEMM_EFFICIENCY[r.precision] = efficiency
        pr.profile_for.cache_clear()
        p = pr.price(r, pr.DEVICE_GEMM[r.device])
        ratio = pr.time_ratio(r, p)
        fitted = r.label in fitted_on
        if not fitted:
            out.append(ratio - 1)
        print(f"{r.label:<18} {r.t:>2} {r.p:>2} {r.chunks[0]:>2} {r.cp:>2} {r.d:>3} {r.zero:>4} {r.published:>10.5g} "
              f"{p.predicted:>10.5g} {ratio:>6.3f} {p.peak_bytes / GIB:>5.1f} {'yes' if p.fits else 'NO':>4}  "
              f"{'fitted' if fitted else 'out of sample'}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="also print what a fit on all rows would give (not shipped)")
    args = ap.parse_args()
    rows = megatron_bridge_rows()
    shipped = precision.FP8_GEMM_EFFICIENCY[Precision.FP8_CURRENT]
    edges = sorted({precision.BF16_EDGE_BLOCKS[r.precision] if r.bf16_edge_blocks is None else r.bf16_edge_blocks
                    for r in rows})
    print(f"fp8-current: FP8 GEMMs at {shipped:.4f} x the bf16 GEMMs' fraction of peak (measured: "
          f"{precision.FP8_EFFICIENCY_SOURCE}), x {1979 / 989:.3f} the H100's bf16 peak; quantisation "
          f"{precision.QUANTISE_BYTES[Precision.FP8_CURRENT]:.2f} bytes moved per bf16 byte; "
          f"{'/'.join(map(str, edges))} block(s) bf16 at each end\n")
    errors = table(rows, shipped)
    mags = [abs(e) for e in errors]
    print(f"\nFP8 rows: {len(rows)}, fitted on {len(rows) - len(errors)}, out of sample median |error| "
          f"{100 * statistics.median(mags):.1f}%, worst {100 * max(mags):.1f}%, mean signed "
          f"{100 * statistics.fmean(errors):+.1f}%")
    if args.fit:
        fitted = fit(rows)
        print(f"\nfor comparison, not shipped: FP8_GEMM_EFFICIENCY fitted on all {len(rows)} rows: {fitted:.4f}\n")
        table(rows, fitted, tuple(r.label for r in rows))
        precision.FP8_GEMM_EFFICIENCY[Precision.FP8_CURRENT] = shipped
    return 0


if __name__ == "__main__":
    sys.exit(main())
