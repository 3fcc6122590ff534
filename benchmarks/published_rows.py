"""The published training runs the cost model is held to, as rows (the numbers of
``../shared/reference/published_runs/README.md``, sources named per table; the home of the
rows of ``benchmarks/published_runs.py``, times and memory alike).

Each :class:`PublishedRun` is one published figure with the configuration it was measured
under; what its source does not give is filled in and named in ``assumed``. Recomputation is a
:class:`Recompute` level as published (Korthikanti et al. 2022's "present work" is SELECTIVE:
every transformer block's attention core); :func:`published_runs.partition` makes a level the
fully or selectively recomputed blocks of each stage (one place).

The optimizer state is what each run's Megatron-LM kept (:attr:`PublishedRun.optimizer`): fp16
runs (Narayanan et al. 2021) 16 bytes per parameter, fp16 gradients reduced in fp16; bf16 runs
(Korthikanti et al. 2022, the Megatron-LM README) accumulate and reduce gradients in fp32
(Megatron-LM's ``arguments.py`` turns ``accumulate_allreduce_grads_in_fp32`` on for bf16), 18
bytes per parameter, 6 + 12 / d with the distributed optimizer (ZeRO-1). The precision of
either is not in the sources: assumed, and printed.

Korthikanti et al. 2022 Table 3's four configurations are the "present work" rows of Table 5
(``K5 ... sp+sel``): every Table 3 row has a published time, so none appears with its memory only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from narayanan_table import ROWS as NARAYANAN_ROWS

from planner.artifacts.kinds import OptimizerKind
from planner.artifacts.stack import STACKS, Stack


class Recompute(enum.Enum):
    NONE = "none"
    SELECTIVE = "selective"  # the attention core only (Korthikanti et al. 2022 sec. 5)
    FULL = "full"  # every transformer layer (Narayanan et al. 2021 sec. 3.5)


class Metric(enum.Enum):
    TFLOPS = "TFLOP/s per GPU"
    ITERATION_S = "iteration s"
    LAYER_MS = "one layer fwd+bwd ms"


#: Megatron-LM as Narayanan et al. 2021 and Korthikanti et al. 2022 ran it: the backward
#: tensor-parallel all-reduce beside the weight-gradient GEMM (Korthikanti et al. sec. 6.2);
#: data-parallel gradients all-reduced after the backward (their sec. 6.3: "without overlapping
#: gradient all-reduce with back-propagation"). Narayanan et al. 2021 describe no overlap of
#: either: ``none``.
MEGATRON_2022 = Stack(name="megatron-lm-2022", tp_overlap_backward=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRun:
    """One published figure and the configuration it was measured under."""

    source: str
    label: str
    device: str  # analytic device preset
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    t: int
    p: int
    d: int
    batch: int
    microbatch: int
    chunks: tuple[int, ...]  # chunks per pipeline rank tried (several: the faster that fits is priced, assumed)
    # micro-batch sizes tried where the source gives none (the faster that fits is priced, assumed);
    # (): ``microbatch`` as published
    microbatches: tuple[int, ...] = ()
    recompute: Recompute
    sequence_parallel: bool
    zero: int
    stack: Stack
    metric: Metric
    published: float
    flops_per_iteration: float = 0.0  # for TFLOP/s: the FLOP count the source divides by
    assumed: tuple[str, ...] = ()
    published_fwd_ms: float = 0.0  # Table 4 rows: the forward and backward as published
    published_bwd_ms: float = 0.0
    flash_attention: bool = False
    optimizer: OptimizerKind = OptimizerKind.ADAM_MIXED

    @property
    def gpus(self) -> int:
        return self.t * self.p * self.d

    @property
    def preset(self) -> str:
        return "a100-80gb-x8" if self.device == "a100-80gb" else "h100-80gb-x8"


def eq3_flops(batch: int, layers: int, hidden: int, seq: int, vocab: int, recompute: bool) -> float:
    """FLOPs per iteration: Narayanan et al. 2021 eq. 3 with the recomputation forward (96), or
    the model FLOPs without it (72; Korthikanti et al. 2022 appendix A eq. 7, Megatron-LM's
    ``num_floating_point_operations``)."""
    B, l, h, s, V = batch, layers, hidden, seq, vocab
    if recompute:
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * h * l))


_NARAYANAN_ASSUMED = ("micro-batch 1", "fp16 with fp16 gradients (adam-mixed, 16 B/param)",
                      "schedule: the faster of 1F1B and interleaved with 2 chunks (where M is a "
                      "multiple of p) that fits in its memory", "even split of the layers", "no ZeRO", "stack none (no overlap described)")


def narayanan_rows() -> list[PublishedRun]:
    """Narayanan et al. 2021 (SC'21) Table 1, every row (benchmarks/narayanan_table.py):
    A100 80 GB, seq 2048, vocab 51,200, full recomputation; TFLOP/s per GPU by their eq. 3."""
    out = []
    for i, r in enumerate(NARAYANAN_ROWS, 1):
        out.append(PublishedRun(
            source="Narayanan 2021 T1", label=f"N{i} {r.params_b:g}B", device="a100-80gb", layers=r.layers,
            hidden=r.hidden, heads=r.heads, seq=2048, vocab=51200, t=r.t, p=r.p, d=r.gpus // (r.t * r.p),
            batch=r.batch, microbatch=1, chunks=(1, 2), recompute=Recompute.FULL, sequence_parallel=False, zero=0,
            stack=STACKS["none"], metric=Metric.TFLOPS, published=float(r.tflops_per_gpu),
            flops_per_iteration=eq3_flops(r.batch, r.layers, r.hidden, 2048, 51200, True), assumed=_NARAYANAN_ASSUMED,
        ))
    return out


# Korthikanti et al. 2022 Table 3: (size, heads, hidden, layers, t, p, batch, micro-batch, chunks per rank)
_K_CONFIGS = (
    ("22B", 64, 6144, 48, 8, 1, 4, 4, 1),
    ("175B", 96, 12288, 96, 8, 8, 64, 1, 3),
    ("530B", 128, 20480, 105, 8, 35, 280, 1, 3),
    ("1T", 160, 25600, 128, 8, 64, 512, 1, 0),  # chunks not given (0): the faster of 1 and 2
)
# Table 5: iteration seconds, full recompute / present work (sequence parallelism + selective)
_K_TABLE5 = {"22B": (1.42, 1.10), "175B": (18.13, 13.75), "530B": (49.05, 37.83), "1T": (94.42, 71.49)}


def korthikanti_t5_rows() -> list[PublishedRun]:
    """Korthikanti et al. 2022 Table 5 (configurations of Table 3): A100 80 GB, seq 2048, vocab
    51,200, no data parallelism; both columns of every row."""
    out = []
    for size, a, h, l, t, p, batch, mb, v in _K_CONFIGS:
        assumed = ["no ZeRO", "bf16 with fp32 gradients (adam-mixed-fp32-grad, 18 B/param)",
                   "attention materialised (their Table 2 counts the 5as/h scores)"]
        assumed += (["1T: chunks not given, the faster of 1 and 2 per rank that fits in its memory"] if size == "1T" else [])
        for present, secs in zip((False, True), _K_TABLE5[size]):
            out.append(PublishedRun(
                source="Korthikanti 2022 T5", label=f"K5 {size} {'sp+sel' if present else 'full'}", device="a100-80gb",
                layers=l, hidden=h, heads=a, seq=2048, vocab=51200, t=t, p=p, d=1, batch=batch, microbatch=mb,
                chunks=(v,) if v else (1, 2), recompute=Recompute.SELECTIVE if present else Recompute.FULL, sequence_parallel=present,
                zero=0, stack=MEGATRON_2022, metric=Metric.ITERATION_S, published=secs, assumed=tuple(assumed),
                optimizer=OptimizerKind.ADAM_MIXED_FP32_GRAD,
            ))
    return out


# Table 4: one layer of the 22B model (t = 8, micro-batch 4): (experiment, sp, recompute, fwd, bwd, combined) ms
_K_TABLE4 = (
    ("baseline", False, Recompute.NONE, 7.7, 11.9, 19.6),
    ("seq-par", True, Recompute.NONE, 7.2, 11.8, 19.0),
    ("full rc", False, Recompute.FULL, 7.7, 19.5, 27.2),
    ("selective", False, Recompute.SELECTIVE, 7.7, 13.2, 20.9),
    ("sel+sp", True, Recompute.SELECTIVE, 7.2, 13.1, 20.3),
)


def korthikanti_t4_rows() -> list[PublishedRun]:
    """Korthikanti et al. 2022 Table 4: one transformer layer of the 22B model, forward and
    backward ms (the row's figure is their sum, "combined")."""
    return [
        PublishedRun(
            source="Korthikanti 2022 T4", label=f"K4 {name}", device="a100-80gb", layers=48, hidden=6144, heads=64,
            seq=2048, vocab=51200, t=8, p=1, d=1, batch=4, microbatch=4, chunks=(1,), recompute=rc,
            sequence_parallel=sp, zero=0, stack=MEGATRON_2022, metric=Metric.LAYER_MS, published=combined,
            published_fwd_ms=fwd, published_bwd_ms=bwd, optimizer=OptimizerKind.ADAM_MIXED_FP32_GRAD,
        )
        for name, sp, rc, fwd, bwd, combined in _K_TABLE4
    ]


# Megatron-LM README model table (H100, Megatron-Core): (size, heads, hidden, layers, t, p, d, batch, TFLOP/s)
_M_ROWS = (
    ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
    ("7.1B", 32, 4096, 30, 2, 1, 48, 192, 465.9),
    ("16B", 48, 6144, 32, 4, 1, 48, 192, 489.1),
    ("32B", 56, 7168, 48, 8, 1, 48, 192, 459.6),
    ("70B", 64, 8192, 84, 8, 2, 48, 384, 419.7),
    ("119B", 80, 10240, 92, 8, 4, 48, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 48, 1152, 432.8),
    ("314B", 128, 16384, 96, 8, 8, 48, 1536, 474.4),
    ("462B", 144, 18432, 112, 8, 16, 48, 3072, 459.9),
)
_M_ASSUMED = ("micro-batch not given: the faster of 1, 2 and 4 that fits in its memory", "no recomputation",
              "distributed optimizer (ZeRO-1, fp32 gradients: 6 + 12/d B/param)",
              "sequence parallelism with t > 1",
              "schedule not given: the faster of 1F1B and interleaved with 2 chunks (where M is a multiple of p "
              "and p x 2 divides the layers) that fits in its memory, as the Narayanan rows", "bf16 (no FP8)",
              "inter-node fabric: the h100 preset's 50 GB/s per GPU", "GPT blocks (4h GeLU MLP, learned positions)",
              "fused causal attention (FlashAttention / cuDNN)")


#: the Megatron-LM rows' micro-batch sizes tried (the README table gives none; every row's batch
#: per replica is a multiple of 4)
_M_MICROBATCHES = (1, 2, 4)


def megatron_rows() -> list[PublishedRun]:
    """Megatron-LM README "Training Speed and Scalability" table: H100 80 GB, seq 4096, vocab
    131,072, Megatron-Core with data-parallel and tensor-parallel overlap; TFLOP/s per GPU of
    the model FLOPs (72 count)."""
    return [
        PublishedRun(
            source="Megatron-LM README", label=f"M {size}", device="h100-80gb", layers=l, hidden=h, heads=a, seq=4096,
            vocab=131072, t=t, p=p, d=d, batch=batch, microbatch=1, microbatches=_M_MICROBATCHES, chunks=(1, 2) if p > 1 else (1,),
            recompute=Recompute.NONE,
            sequence_parallel=t > 1, zero=1, stack=STACKS["megatron-core"], metric=Metric.TFLOPS, published=tflops,
            flops_per_iteration=eq3_flops(batch, l, h, 4096, 131072, False), assumed=_M_ASSUMED, flash_attention=True,
            optimizer=OptimizerKind.ADAM_MIXED_FP32_GRAD,
        )
        for size, a, h, l, t, p, d, batch, tflops in _M_ROWS
    ]


def all_rows() -> list[PublishedRun]:
    return narayanan_rows() + korthikanti_t4_rows() + korthikanti_t5_rows() + megatron_rows()
