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

A row expresses any layout the cost model can price with it forced (issue 47): Llama-shaped
blocks (``arch="llama"``: GQA, SwiGLU, RMSNorm, the analytic Llama profile), context parallelism
(``cp``: ``gpus = t p d cp``), any chunks per pipeline rank (``chunks``), uneven first and last
stages (``first_stage_layers`` / ``last_stage_layers``, Megatron's
``--decoder-first/last-pipeline-num-layers``) and the embedding or the head as a pipeline slot of
its own (``embedding_stage`` / ``head_stage``, Megatron's ``--pipeline-model-parallel-layout``),
recomputation as published (:class:`Recompute`: none, selective, full, every second block,
torchtitan's op-level policy), the stack it ran on (``planner.artifacts.stack``: what it overlaps
and its host time per kernel) and the FLOP convention of its published figure
(:class:`~planner.models.flops.AttentionFlops`). What the solver cannot price is not expressible
here: a schedule it has no action lists for, expert parallelism, FP8.

Sources (``publication``) are what leave-one-source-out holds out together: Narayanan et al. 2021
(Table 1), Korthikanti et al. 2022 (Tables 4 and 5), the Megatron-LM README's H100 table, and
torchtitan's 64-A100 FSDP table (including the configuration that ran out of memory, a row whose
only claim is that: :attr:`Metric.OUT_OF_MEMORY`).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narayanan_table import ROWS as NARAYANAN_ROWS

from planner.artifacts.kinds import OptimizerKind, Precision
from planner.artifacts.stack import STACKS, Stack
from planner.models.flops import AttentionFlops, attention_fwd_flops, palm_flops_per_token

REPO = Path(__file__).resolve().parents[1]


class Recompute(enum.Enum):
    NONE = "none"
    SELECTIVE = "selective"  # the attention core only (Korthikanti et al. 2022 sec. 5)
    FULL = "full"  # every transformer layer (Narayanan et al. 2021 sec. 3.5)
    EVERY_OTHER = "every-2nd"  # every second block whole (torchtitan's "selective layer", ac_freq 2)
    OPS = "op-sac"  # torchtitan's op-level selective checkpointing ("selective op")


class Metric(enum.Enum):
    TFLOPS = "TFLOP/s per GPU"
    ITERATION_S = "iteration s"
    LAYER_MS = "one layer fwd+bwd ms"
    TOKENS_PER_S = "tokens/s per GPU"
    OUT_OF_MEMORY = "ran out of memory"  # no time published: the configuration must not fit

    @property
    def throughput(self) -> bool:
        """A rate (more is faster), not a time."""
        return self in (Metric.TFLOPS, Metric.TOKENS_PER_S)


#: Megatron-LM as Korthikanti et al. 2022 ran it (planner.artifacts.stack)
MEGATRON_2022 = STACKS["megatron-lm-2022"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedRun:
    """One published figure and the configuration it was measured under."""

    source: str  # the table
    publication: str  # the source leave-one-source-out holds out
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
    flops_convention: AttentionFlops = AttentionFlops.FULL  # how that count takes attention
    assumed: tuple[str, ...] = ()
    published_fwd_ms: float = 0.0  # Table 4 rows: the forward and backward as published
    published_bwd_ms: float = 0.0
    flash_attention: bool = False
    optimizer: OptimizerKind = OptimizerKind.ADAM_MIXED
    arch: str = "gpt"  # "gpt" (4h GeLU MLP, learned positions, LayerNorm) or "llama" (GQA, SwiGLU, RMSNorm)
    kv_heads: int = 0  # llama: key/value heads
    ffn: int = 0  # llama: MLP width
    cp: int = 1
    first_stage_layers: int = 0  # blocks of the first / last pipeline stage when uneven (0: even split)
    last_stage_layers: int = 0
    embedding_stage: bool = False  # the embedding a pipeline slot of its own
    head_stage: bool = False  # the LM head a pipeline slot of its own
    published_mfu: float = 0.0  # the source's MFU where it gives one (checked against our FLOP count)
    # recomputation levels the source leaves open (plausible values, priced in the band; () = as published)
    recompute_options: tuple[Recompute, ...] = ()
    precision: Precision = Precision.BF16  # the blocks' linear layers (planner.cost.precision)
    bf16_edge_blocks: int | None = None  # FP8: blocks kept bf16 at each end (None: the recipe's)
    fused_cross_entropy: bool = False  # llama: Transformer Engine's cross entropy (planner.profiling.analytic.llama)
    recompute_layers: int = 0  # with FULL: only the first this many blocks of each stage (Megatron's block method)

    @property
    def gpus(self) -> int:
        return self.t * self.p * self.d * self.cp

    @property
    def preset(self) -> str:
        return "a100-80gb-x8" if self.device == "a100-80gb" else "h100-80gb-x8"

    @property
    def tokens_per_iteration(self) -> int:
        return self.batch * self.seq

    def llama_config(self) -> dict[str, Any]:
        """The Hugging Face config of a Llama-shaped row (the analytic Llama profile reads it)."""
        return {"model_type": "llama", "num_hidden_layers": self.layers, "hidden_size": self.hidden,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads or self.heads,
                "intermediate_size": self.ffn, "vocab_size": self.vocab, "max_position_embeddings": self.seq}

    def published_seconds(self) -> float:
        """The published figure as an iteration time (s), where it is one or converts to one (0: a layer
        time or no time)."""
        if self.metric is Metric.ITERATION_S:
            return self.published
        if self.metric is Metric.TFLOPS:
            return self.flops_per_iteration / (self.published * 1e12 * self.gpus)
        if self.metric is Metric.TOKENS_PER_S:
            return self.tokens_per_iteration / (self.published * self.gpus)
        return 0.0


def eq3_flops(batch: int, layers: int, hidden: int, seq: int, vocab: int, recompute: bool,
              convention: AttentionFlops = AttentionFlops.FULL) -> float:
    """FLOPs per iteration: Narayanan et al. 2021 eq. 3 with the recomputation forward (96), or
    the model FLOPs without it (72; Korthikanti et al. 2022 appendix A eq. 7, Megatron-LM's
    ``num_floating_point_operations``); attention's ``s x s`` products counted by ``convention``
    (eq. 3 counts the whole square)."""
    B, l, h, s, V = batch, layers, hidden, seq, vocab
    attention = attention_fwd_flops(s, h, convention) / (4.0 * s * s * h)  # the convention's share
    if recompute:
        return 96.0 * B * s * l * h * h * (1 + attention * s / (6 * h) + V / (16 * l * h))
    return 72.0 * B * s * l * h * h * (1 + attention * s / (6 * h) + V / (12 * h * l))


_NARAYANAN_ASSUMED = ("micro-batch 1", "fp16 with fp16 gradients (adam-mixed, 16 B/param)",
                      "schedule: the faster of 1F1B and interleaved with 2 chunks (where M is a "
                      "multiple of p) that fits in its memory", "even split of the layers", "no ZeRO",
                      "stack megatron-lm-2021 (no overlap described)")


def narayanan_rows() -> list[PublishedRun]:
    """Narayanan et al. 2021 (SC'21) Table 1, every row (benchmarks/narayanan_table.py):
    A100 80 GB, seq 2048, vocab 51,200, full recomputation; TFLOP/s per GPU by their eq. 3."""
    out = []
    for i, r in enumerate(NARAYANAN_ROWS, 1):
        out.append(PublishedRun(
            source="Narayanan 2021 T1", publication="Narayanan et al. 2021", label=f"N{i} {r.params_b:g}B",
            device="a100-80gb", layers=r.layers,
            hidden=r.hidden, heads=r.heads, seq=2048, vocab=51200, t=r.t, p=r.p, d=r.gpus // (r.t * r.p),
            batch=r.batch, microbatch=1, chunks=(1, 2), recompute=Recompute.FULL, sequence_parallel=False, zero=0,
            stack=STACKS["megatron-lm-2021"], metric=Metric.TFLOPS, published=float(r.tflops_per_gpu),
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
                source="Korthikanti 2022 T5", publication="Korthikanti et al. 2022",
                label=f"K5 {size} {'sp+sel' if present else 'full'}", device="a100-80gb",
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
            source="Korthikanti 2022 T4", publication="Korthikanti et al. 2022", label=f"K4 {name}", device="a100-80gb",
            layers=48, hidden=6144, heads=64,
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
_M_ASSUMED = ("micro-batch not given: the faster of 1, 2 and 4 that fits in its memory",
              "recomputation not given: none (the band spans selective too, Megatron-Core's recommended level)",
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
            source="Megatron-LM README", publication="Megatron-LM README", label=f"M {size}", device="h100-80gb",
            layers=l, hidden=h, heads=a, seq=4096,
            vocab=131072, t=t, p=p, d=d, batch=batch, microbatch=1, microbatches=_M_MICROBATCHES, chunks=(1, 2) if p > 1 else (1,),
            recompute=Recompute.NONE,
            sequence_parallel=t > 1, zero=1, stack=STACKS["megatron-core-0.8"], metric=Metric.TFLOPS, published=tflops,
            flops_per_iteration=eq3_flops(batch, l, h, 4096, 131072, False), assumed=_M_ASSUMED, flash_attention=True,
            optimizer=OptimizerKind.ADAM_MIXED_FP32_GRAD, recompute_options=(Recompute.NONE, Recompute.SELECTIVE),
        )
        for size, a, h, l, t, p, d, batch, tflops in _M_ROWS
    ]


# torchtitan docs/performance.md (2024), FSDP2 on 64 A100 80 GB: (model, local batch, recompute, WPS, MFU %);
# WPS 0: the configuration that ran out of memory (the reason the table gives Llama 2 70B local batch 1 there)
_T_ROWS = (
    ("Llama 3 8B", 1, Recompute.EVERY_OTHER, 2904, 56.8),
    ("Llama 3 8B", 1, Recompute.OPS, 2973, 58.2),
    ("Llama 3 70B", 1, Recompute.FULL, 331, 51.7),
    ("Llama 2 13B", 2, Recompute.NONE, 2162, 61.1),
    ("Llama 2 13B", 2, Recompute.EVERY_OTHER, 1914, 54.1),
    ("Llama 2 13B", 2, Recompute.OPS, 1904, 53.8),
    ("Llama 2 70B", 1, Recompute.OPS, 355, 50.8),
    ("Llama 2 70B", 2, Recompute.FULL, 353, 50.5),
    ("Llama 2 70B", 2, Recompute.OPS, 0, 0.0),
)
#: (layers, hidden, heads, kv heads, MLP width, vocabulary, sequence): configs/llama-3-*.json (Dubey et al. 2024
#: table 3) and Llama 2's (Touvron et al. 2023; meta-llama/Llama-2-13b-hf and -70b-hf config.json)
_LLAMA_SHAPES = {
    "Llama 3 8B": (32, 4096, 32, 8, 14336, 128256, 8192),
    "Llama 3 70B": (80, 8192, 64, 8, 28672, 128256, 8192),
    "Llama 2 13B": (40, 5120, 40, 40, 13824, 32000, 4096),
    "Llama 2 70B": (80, 8192, 64, 8, 28672, 32000, 4096),
    "Llama 3.1 405B": (126, 16384, 128, 8, 53248, 128256, 8192),  # Dubey et al. 2024 table 3
}
_T_ASSUMED = ("one FSDP2 group over the 64 GPUs (ZeRO 3, d = 64), no TP/PP, one micro-batch of the local batch",
              "FSDP2 mixed precision: bf16 compute, fp32 gradient reduce-scatter and sharded fp32 state "
              "(adam-mixed-fp32-grad, 18 B/param / 64)", "fabric: the a100 preset's (8 x 200 Gb/s HDR per node)",
              "stack torchtitan-2024 (FSDP2 prefetching; eager, no torch.compile)",
              "selective layer = every second block recomputed whole; selective op = torchtitan's op-level policy "
              "(every other mm and the element-wise ops re-run)")


def _config_params(layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int) -> int:
    d = hidden // heads
    block = hidden * heads * d * 2 + 2 * hidden * kv * d + 3 * hidden * ffn + 2 * hidden
    return 2 * vocab * hidden + layers * block + hidden


def torchtitan_rows() -> list[PublishedRun]:
    """torchtitan's FSDP2 table on 64 A100 80 GB (reference README section 4): tokens per second per
    GPU at each published configuration, and the Llama 2 70B configuration that ran out of memory."""
    out = []
    for model, local, rc, wps, mfu in _T_ROWS:
        layers, hidden, heads, kv, ffn, vocab, seq = _LLAMA_SHAPES[model]
        params = _config_params(layers, hidden, heads, kv, ffn, vocab)
        rc_name = {Recompute.EVERY_OTHER: "sel-layer", Recompute.OPS: "sel-op"}.get(rc, rc.value)
        out.append(PublishedRun(
            source="torchtitan 2024 (64 A100)", publication="torchtitan 2024",
            label=f"T {model.replace('Llama ', 'L')} b{local} {rc_name}", device="a100-80gb", layers=layers,
            hidden=hidden, heads=heads, kv_heads=kv, ffn=ffn, seq=seq, vocab=vocab, arch="llama", t=1, p=1, d=64,
            batch=64 * local, microbatch=local, chunks=(1,), recompute=rc, sequence_parallel=False, zero=3,
            stack=STACKS["torchtitan-2024"], metric=Metric.TOKENS_PER_S if wps else Metric.OUT_OF_MEMORY,
            published=float(wps), flash_attention=True, optimizer=OptimizerKind.ADAM_MIXED_FP32_GRAD,
            flops_per_iteration=palm_flops_per_token(params=params, layers=layers, heads=heads, head_dim=hidden // heads,
                                                     seq=seq) * 64 * local * seq,
            assumed=_T_ASSUMED, published_mfu=mfu / 100.0,
        ))
    return out


# Megatron-Bridge performance summary, 25.11 container, DGX-H100 (reference README section 6), the dense FP8-CS rows:
# (model, GPUs, batch, t, p, cp, chunks per rank, ZeRO, first / last stage blocks, blocks fully recomputed per stage,
#  tokens/s per GPU, TFLOP/s per GPU); the recomputed blocks: Megatron-Bridge's perf preset at v0.2.1, the first tag whose
#  docs/performance-summary.md holds the 25.11 table: LLAMA3_8B_H100_FP8_CS_BASE_CONFIG (recompute_num_layers=5,
#  scripts/performance/configs/llama3/workload_base_configs.py), run by utils/helpers.py's set_recompute_overrides as
#  full recomputation of 5 blocks (recompute_method "block"); the 70B's and 405B's presets set none
_MB_ROWS = (
    ("Llama 3 8B", 8, 128, 1, 1, 1, 1, 3, 0, 0, 5, 14451, 744),
    ("Llama 3 70B", 64, 128, 4, 8, 1, 5, 1, 0, 0, 0, 1602, 719),
    ("Llama 3.1 405B", 1024, 512, 8, 8, 2, 8, 1, 1, 1, 0, 292, 737),
)
_MB_ASSUMED = ("FP8 with per-tensor current scaling (fp8-current) on every block's linear layers (the perf scripts' "
               "get_precision_config turns first_last_layers_bf16 off: scripts/performance/utils/precision.py, 25.11); "
               "attention core, embedding and head bf16",
               "cross entropy: Transformer Engine's fused kernel (the Llama recipes' cross_entropy_fusion_impl 'te': "
               "src/megatron/bridge/recipes/llama/llama3.py)",
               "recomputation: the perf presets' at v0.2.1, the tag of the 25.11 table (LLAMA3_8B/LLAMA3_70B/"
               "LLAMA31_405B_H100_FP8_CS_BASE_CONFIG): the 8B's 5 blocks in full (recompute_num_layers=5, method "
               "block), none on the 70B and 405B (no recompute setting); not an unknown, so the band does not span it",
               "distributed optimizer (ZeRO 1) with bf16 gradient reduction (adam-mixed: the perf scripts' "
               "grad_reduce_in_fp32 False); the 8B row's FSDP (not in its preset: the run's use_megatron_fsdp override, "
               "optim_grads_params sharding) as ZeRO 3",
               "sequence parallelism with t > 1", "stack megatron-core-0.8 (the newest named; the row ran 25.11)",
               "405B: 126 blocks over 64 chunks as Megatron's layout does it: the embedding and the head take the "
               "first and last chunks' second slots (1 block each), the rest 2 per chunk",
               "inter-node fabric: the h100 preset's 50 GB/s per GPU")


def megatron_bridge_rows() -> list[PublishedRun]:
    """Megatron-Bridge's DGX-H100 FP8 rows (reference README section 6): Llama 3 8B (FSDP), 70B and
    3.1 405B with FP8 current scaling, seq 8192, micro-batch 1; tokens per second per GPU."""
    out = []
    for model, gpus, batch, t, p, cp, v, zero, first, last, rc, tokens, _tflops in _MB_ROWS:
        layers, hidden, heads, kv, ffn, vocab, seq = _LLAMA_SHAPES[model]
        params = _config_params(layers, hidden, heads, kv, ffn, vocab)
        out.append(PublishedRun(
            source="Megatron-Bridge 25.11 (H100)", publication="Megatron-Bridge 25.11",
            label=f"MB {model.replace('Llama ', 'L').replace('3.1', '3')} fp8", device="h100-80gb", layers=layers,
            hidden=hidden, heads=heads, kv_heads=kv, ffn=ffn, seq=seq, vocab=vocab, arch="llama", t=t, p=p, cp=cp,
            d=gpus // (t * p * cp), batch=batch, microbatch=1, chunks=(v,), recompute=Recompute.FULL if rc else Recompute.NONE,
            recompute_layers=rc, sequence_parallel=t > 1, zero=zero, stack=STACKS["megatron-core-0.8"],
            metric=Metric.TOKENS_PER_S, published=float(tokens), flash_attention=True, optimizer=OptimizerKind.ADAM_MIXED,
            first_stage_layers=first, last_stage_layers=last, precision=Precision.FP8_CURRENT, bf16_edge_blocks=0,
            fused_cross_entropy=True,
            flops_per_iteration=palm_flops_per_token(params=params, layers=layers, heads=heads, head_dim=hidden // heads,
                                                     seq=seq) * batch * seq,
            assumed=_MB_ASSUMED, recompute_options=(),
        ))
    return out


def all_rows() -> list[PublishedRun]:
    return (narayanan_rows() + korthikanti_t4_rows() + korthikanti_t5_rows() + megatron_rows() + torchtitan_rows()
            + megatron_bridge_rows())


def read_config(name: str) -> dict[str, Any]:
    """A config of ``configs/`` (for checks against the rows' shapes)."""
    return json.loads((REPO / "configs" / name).read_text())  # type: ignore[no-any-return]
