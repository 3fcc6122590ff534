"""Megatron-LM's published GPT runs against our cost model and our planner.

Source: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM" (SC '21), Table 1 ("Weak-scaling throughput for GPT models ranging from 1
billion to 1 trillion parameters"). Every row is used, as published: attention heads, hidden
size, layers, tensor-parallel size t, pipeline-parallel size p, GPUs N, global batch size B and
the achieved teraFLOP/s per GPU. Common to every row (same paper, section 5): sequence length
2048, vocabulary 51,200, DGX A100 80 GB nodes of 8 GPUs (NVLink/NVSwitch inside a node, 8 x
200 Gb/s HDR InfiniBand per node: our ``a100-80gb-x8`` preset grown to N/8 nodes), mixed
precision with Adam, activation recomputation. Data-parallel size d = N / (t p).

Priced, with the planner's own plan beside each row, by ``benchmarks/published_runs.py``
(which holds every published table the cost model is checked against; this module keeps the
rows and their FLOP count): ``python benchmarks/narayanan_table.py`` runs it on these rows.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


SOURCE = "Narayanan et al. 2021 (SC'21), Table 1"
SEQ, VOCAB = 2048, 51200


@dataclasses.dataclass(frozen=True)
class Row:
    params_b: float
    heads: int
    hidden: int
    layers: int
    t: int
    p: int
    gpus: int
    batch: int
    tflops_per_gpu: float  # achieved, as published


# Table 1 of the source, every row: parameters (billions), attention heads, hidden size, layers,
# tensor-parallel size, pipeline-parallel size, GPUs, batch size, achieved teraFLOP/s per GPU.
ROWS = (
    Row(1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    Row(3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    Row(7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    Row(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    Row(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    Row(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    Row(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    Row(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    Row(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    Row(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)
MICROBATCH = 1  # not in Table 1 (see the module docstring)


def their_flops(r: Row) -> float:
    """FLOPs per iteration by the source's eq. 3 (recomputation forward included)."""
    s, h, l, B = SEQ, r.hidden, r.layers, r.batch
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + VOCAB / (16 * l * h))


def main() -> int:
    """``benchmarks/published_runs.py`` on this table's rows (its arguments pass through)."""
    import published_runs

    sys.argv = [sys.argv[0], "--rows", ",".join(f"N{i} {r.params_b:g}B" for i, r in enumerate(ROWS, 1)), *sys.argv[1:]]
    return published_runs.main()


if __name__ == "__main__":
    sys.exit(main())
