"""The training stack a plan is priced for: which communication it overlaps with computation.

Real stacks hide communication behind computation in ways a cost model cannot guess; each is
therefore a stated capability of the stack being planned for, recorded in the request and the
plan, never assumed. What it overlaps (:mod:`planner.cost.overlap`,
:mod:`planner.cost.tensor_parallel`, :mod:`planner.cost.context`):

- ``grad_reduce_overlap`` (the all-reduce of plain data parallelism) and
  ``zero_reduce_overlap`` (ZeRO's reduce-scatter): the data-parallel gradient reduction runs
  in buckets of ``grad_bucket_bytes``, each started as soon as its gradients are final during
  the stage's last backward (PyTorch DDP, Li et al. 2020 sec. 3.2.3; Megatron-Core
  ``--overlap-grad-reduce``), also with one stage. Without it the stage's whole reduction
  starts when its last backward ends (it still overlaps the other stages' cooldown, the
  pipeline's own hiding, Hippie / TPDS 2024);
- ``param_gather_overlap``: ZeRO's all-gather of the updated weights runs in buckets ahead of
  the next iteration's first forward, each layer waiting only for its own bucket
  (Megatron-Core ``--overlap-param-gather``). Without it the all-gather follows the reduction;
- ``fsdp_prefetch`` (ZeRO 3 / FSDP): each layer's weight all-gather runs one layer ahead, beside
  the previous layer's forward (backward: beside the next layer's backward, with that layer's
  gradient reduce-scatter), as FSDP2's implicit forward and explicit backward prefetching do
  (torch ``fully_shard``, torchtitan; Zhao et al. 2023 "PyTorch FSDP" sec. 3.3). Without it each
  layer's gather and reduce-scatter wait for, and are waited for by, its computation
  (:mod:`planner.cost.fsdp`);
- ``tp_overlap_backward``: each backward tensor-parallel collective (the all-reduce of a
  column-parallel GEMM's input gradient) runs beside that GEMM's weight-gradient GEMM
  (Korthikanti et al. 2022 sec. 6.2; Megatron-LM's asynchronous tensor-parallel all-reduce),
  hiding at most that GEMM's time;
- ``tp_overlap_forward``: each forward tensor-parallel collective runs beside the column- and
  row-parallel GEMMs around it, pipelined in chunks (Transformer Engine's userbuffers behind
  Megatron-Core ``--tp-comm-overlap``), hiding at most their time;
- ``moe`` (:class:`~planner.artifacts.moe.MoeStack`): mixture-of-experts layers' token dispatcher
  (NCCL all-to-all or DeepEP's fused kernels), whether dispatch and combine overlap another
  micro-batch's compute, and how the tokens fall on the experts (forced balance, dropless with a
  skew, a capacity factor);
- ``cp_overlap``: each context-parallel key/value all-gather (and its reduce-scatter in backward)
  runs beside the attention core it feeds, as ring attention overlaps its transfers with the
  attention blocks (Megatron-Core's and torchtitan's context parallelism), hiding at most the
  core's time (:mod:`planner.cost.context`). Its own flag: a stack may overlap tensor-parallel
  collectives and not context-parallel ones, or the reverse.

What a stack measurably costs besides what it overlaps (its "efficiencies", each with the
source of its number in :attr:`Stack.sources`):

- ``host_us_per_kernel``: the CPU time to issue one kernel (Python, the framework's dispatcher,
  ``cudaLaunchKernel``). A layer's pass cannot run faster than its kernels are issued: the cost
  model prices a pass at the larger of its GPU time and its kernels x this
  (:mod:`planner.cost.overheads`). Eager PyTorch stacks: 10 us, the middle (geometric mean) of the
  5-20 us "launch time on the CPU side" Meta's Holistic Trace Analysis documents
  (facebookresearch/HolisticTraceAnalysis, docs/source/features/cuda_kernel_launch_stats.rst); the
  band (:mod:`planner.cost.band`) spans 5-20. 0: not priced (a measured profile's times include it).
- ``moe.host_ms_per_layer``: what an MoE layer's pass costs the host beyond issuing its kernels
  (:attr:`~planner.artifacts.moe.MoeStack.host_ms_per_layer`), the floor of the layer's forward
  (a third) and backward with its kernels' issue time. Eager Megatron-Core: 7.31 ms per layer's
  forward + backward (:data:`MCORE_MOE_HOST_MS_PER_LAYER`), more per routed expert on the device
  with the alltoall dispatcher (``moe.alltoall_host_ms_per_local_expert``,
  :data:`MCORE_ALLTOALL_HOST_MS_PER_LOCAL_EXPERT`) and per FP8 expert GEMM under FP8 current scaling
  (``moe.fp8_host_us_per_expert_gemm``, :data:`MCORE_FP8_HOST_US_PER_EXPERT_GEMM`), each fitted on
  one published MoE row, the rest out of sample; 0 elsewhere (not priced).

Presets (:data:`STACKS`), each named for the software and year whose runs it prices:

- ``none``: nothing of the above (what plans before version 4 were priced for);
- ``planner``: this package's runtime (``planner.runtime.grads``: the all-reduce in 25 MiB buckets
  started from gradient hooks during the last backward; its ZeRO reduce-scatter after the last
  backward), eager PyTorch. The default, since plans are run by it;
- ``megatron-lm-2021``: Megatron-LM as Narayanan et al. 2021 (SC'21) ran it: no overlap of either
  data- or tensor-parallel communication is described; eager PyTorch with fused kernels;
- ``megatron-lm-2022``: Megatron-LM as Korthikanti et al. 2022 ran it: the backward
  tensor-parallel all-reduce beside the weight-gradient GEMM (their sec. 6.2); data-parallel
  gradients all-reduced after the backward (their sec. 6.3);
- ``megatron-deepspeed-2021``: Megatron-DeepSpeed (DeepSpeed's pipeline engine with Megatron's
  tensor parallelism, as MT-NLG and BLOOM trained): the pipeline engine reduces the gradients
  after the last micro-batch's backward (``PipelineEngine._exec_reduce_grads``), ZeRO-1's
  reduce-scatter and all-gather after it; no tensor-parallel overlap;
- ``megatron-core-0.8``: Megatron-Core r0.8 (the Megatron-LM README's H100 table):
  ``--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap``, its bucket of 40,000,000
  gradient elements in bf16, FSDP prefetching, ring attention's overlap for context parallelism;
  its MoE layers' host time (above);
- ``torchtitan-2024``: torchtitan's 2024 releases: FSDP2 per transformer block with its
  prefetching, the gradient reduction during backward, ZeRO's gathers ahead of the forward, ring
  attention's overlap for context parallelism; asynchronous tensor parallelism off (its default).

``megatron-core`` and ``torchtitan`` (the names before the years were added) name the same
presets. ``benchmarks/published_runs.py`` prices each published run with the stack it ran on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.artifacts.kinds import AttentionKernel
from planner.artifacts.moe import MoeStack

__all__ = ["DEFAULT_STACK", "STACKS", "STACK_ALIASES", "Stack", "stack_named"]


#: the host time to issue one kernel in eager PyTorch (us): the geometric mean of the 5-20 us range below
EAGER_HOST_US_PER_KERNEL = 10.0
#: the range it is known within (the band's spread)
HOST_US_PER_KERNEL_RANGE = (5.0, 20.0)
_SDPA = "torch's scaled_dot_product_attention, whose flash backend is FlashAttention-2 (Dao 2023)"
_HTA = ("Holistic Trace Analysis (facebookresearch/HolisticTraceAnalysis, docs: cuda_kernel_launch_stats): 'the "
        "launch time on the CPU side is between 5-20 microseconds'; 10 us, their geometric mean")


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """What a training stack overlaps and what it costs (see the module docstring)."""

    name: str = field(metadata={"doc": "the preset's name, or any label of a stack described here"})
    grad_reduce_overlap: bool = field(
        default=False,
        metadata={"doc": "the data-parallel gradient all-reduce in buckets started during the stage's last backward"},
    )
    zero_reduce_overlap: bool = field(
        default=False,
        metadata={"doc": "ZeRO's gradient reduce-scatter in buckets started during the stage's last backward"},
    )
    grad_bucket_bytes: int = field(
        default=25 << 20,
        metadata={"doc": "bytes of gradients per bucket of the overlapped reduction (and gather); 25 MiB is PyTorch "
                         "DDP's default bucket_cap_mb (Li et al. 2020 sec. 3.2.3)"},
    )
    param_gather_overlap: bool = field(
        default=False, metadata={"doc": "ZeRO's weight all-gather in buckets ahead of the next iteration's forward"}
    )
    fsdp_prefetch: bool = field(
        default=False,
        metadata={"doc": "ZeRO 3: each layer's weight all-gather (and reduce-scatter) beside the neighbouring layer's "
                         "computation, one layer ahead (FSDP2 prefetching)"},
    )
    tp_overlap_backward: bool = field(
        default=False,
        metadata={"doc": "backward tensor-parallel all-reduces beside the weight-gradient GEMMs (hiding at most their time)"},
    )
    tp_overlap_forward: bool = field(
        default=False,
        metadata={"doc": "forward tensor-parallel collectives beside the GEMMs around them (hiding at most their time)"},
    )
    cp_overlap: bool = field(
        default=False,
        metadata={"doc": "context-parallel key/value all-gathers (and their gradients' reduce-scatters) beside the "
                         "attention core (ring attention), hiding at most its time (absent when false)",
                  "omit_if_default": True},
    )
    host_us_per_kernel: float = field(
        default=0.0,
        metadata={"doc": "CPU time to issue one kernel, us: a layer's pass takes at least its kernels x this "
                         "(planner.cost.overheads); 0 = not priced (absent when 0)", "omit_if_default": True},
    )
    attention_kernel: AttentionKernel = field(
        default=AttentionKernel.MODEL,
        metadata={"doc": "the fused attention kernel the stack runs, priced at its measured efficiency "
                         "(planner.cost.attention_kernels); model: the GEMM model's (absent when model)",
                  "omit_if_default": True},
    )
    attention_efficiency: tuple[float, ...] = field(
        default=(),
        metadata={"doc": "(forward fraction of peak, backward / forward rate) of the attention kernel where not "
                         "its nominal (a band's end); () = nominal (absent when ())", "omit_if_default": True},
    )
    sources: tuple[tuple[str, str], ...] = field(
        default=(),
        metadata={"doc": "(field, where its setting or number comes from) for the preset's choices (absent when none)",
                  "omit_if_default": True},
    )
    moe: MoeStack = field(
        default=MoeStack(),
        metadata={"doc": "what the stack does with a mixture-of-experts layer's tokens: dispatcher, all-to-all overlap, "
                         "load balance (planner.artifacts.moe; absent: the default)", "omit_if_default": True},
    )

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a stack needs a name")
        if self.grad_bucket_bytes < 1:
            raise ValueError(f"grad_bucket_bytes must be >= 1 (got {self.grad_bucket_bytes})")
        if not (0.0 <= self.host_us_per_kernel <= 1e6):
            raise ValueError(f"host_us_per_kernel must be in [0, 1e6] us (got {self.host_us_per_kernel!r})")
        object.__setattr__(self, "attention_kernel", AttentionKernel(self.attention_kernel))
        eff = tuple(self.attention_efficiency)
        if eff and (len(eff) != 2 or not all(0.0 < v <= 1.0 for v in eff)):
            raise ValueError(f"attention_efficiency must be () or two fractions in (0, 1] (got {list(eff)})")
        object.__setattr__(self, "attention_efficiency", eff)

    def reduce_overlap(self, sharded: bool) -> bool:
        """Whether the reduction overlaps the last backward: ZeRO's reduce-scatter (``sharded``)
        or the all-reduce."""
        return self.zero_reduce_overlap if sharded else self.grad_reduce_overlap

    def source_of(self, name: str) -> str:
        """Where the preset's ``name`` setting comes from ("" when not stated)."""
        return dict(self.sources).get(name, "")

    def describe(self) -> str:
        """One line: the name and what it overlaps (and its host time per kernel, when priced)."""
        reduce = {(True, True): "gradient reduction", (True, False): "gradient all-reduce",
                  (False, True): "ZeRO reduce-scatter"}.get((self.grad_reduce_overlap, self.zero_reduce_overlap), "")
        parts = [what for flag, what in (
            (bool(reduce), f"{reduce} with backward ({self.grad_bucket_bytes / 2**20:.3g} MiB buckets)"),
            (self.param_gather_overlap, "ZeRO all-gather with forward"),
            (self.fsdp_prefetch, "FSDP gathers one layer ahead"),
            (self.tp_overlap_forward and self.tp_overlap_backward, "tensor-parallel collectives with GEMMs"),
            (self.tp_overlap_backward and not self.tp_overlap_forward, "backward tensor-parallel all-reduces with GEMMs"),
            (self.tp_overlap_forward and not self.tp_overlap_backward, "forward tensor-parallel collectives with GEMMs"),
            (self.moe != MoeStack(host_ms_per_layer=self.moe.host_ms_per_layer,
                                 alltoall_host_ms_per_local_expert=self.moe.alltoall_host_ms_per_local_expert,
                                 fp8_host_us_per_expert_gemm=self.moe.fp8_host_us_per_expert_gemm), self.moe.describe()),
            (self.cp_overlap, "context-parallel K/V transfers with attention"),
        ) if flag]
        host = f"; {self.host_us_per_kernel:g} us of host time per kernel" if self.host_us_per_kernel else ""
        kernel = f"; attention by {self.attention_kernel.value}" if self.attention_kernel is not AttentionKernel.MODEL else ""
        return f"{self.name}: overlaps " + (", ".join(parts) if parts else "nothing beyond the pipeline") + host + kernel


#: host ms of one MoE layer's forward + backward in eager Megatron-Core beyond issuing its kernels
#: (its router, token dispatcher and experts' Python: permutation maps, split lists, the dispatch's
#: host-device synchronisation that stops the host running ahead of the layer; Megatron-Core
#: captures ``moe_router`` and ``moe_preprocess`` in CUDA graphs to remove it, and its MoE report
#: (arXiv 2603.07685 sec. 4.3.6-4.3.7) names host overhead and the dispatch's synchronisation):
#: fitted on one of the six published MoE rows (benchmarks/published_moe.py FIT_ROWS: Qwen3-235B's
#: DeepEP TP 4 EDP 4 row, whose layers' GPU time is least, about a third of its published pass, so
#: where the floor binds whatever the GPU model's error)
MCORE_MOE_HOST_MS_PER_LAYER = 7.31
#: with the alltoall dispatcher (NCCL's all-to-all, Megatron-Core's MoEAlltoAllTokenDispatcher) the
#: further ms per MoE layer's forward + backward and routed expert on the device, joining the floor:
#: both published bf16 alltoall rows (16 experts per device) want 5.7 ms over the DeepEP rows' floor;
#: its host path (the token counts' all-gather over the expert group and device-to-host copy, split
#: lists, the probabilities' own all-to-all, the received chunks sorted by local expert and back) is
#: the suspected cause, not isolated. Per local expert: Megatron-Core's step time grows with the
#: experts per device at a fixed token count (Qwen3-30B-A3B on 16 H800s, alltoall dispatch:
#: 10.4 s at EP 8, 21.0 s for twice the batch at EP 4, alibaba/Pai-Megatron-Patch#643), and
#: Megatron-Bridge's 235B-A22B FP8 row (4 experts per device) sits 9% under a flat 5.7 ms.
#: Fitted on the ModelZoo's alltoall row (Qwen3-235B PP 32), out of sample on Megatron-Bridge's
#: GPT-OSS 120B (another source, model and layout) and its Qwen3 FP8 rows
MCORE_ALLTOALL_HOST_MS_PER_LOCAL_EXPERT = 0.358
#: under FP8 current scaling, host us per routed-expert GEMM call and pass direction beyond its
#: kernels (Transformer Engine's GroupedLinear per-split allocation, quantisation and Python;
#: block scaling and MXFP8 allocate their splits in bulk: planner.cost.overheads): fitted on
#: Megatron-Bridge's Qwen3 30B-A3B FP8 row (16 experts per device: its floor is three times its GPU
#: time), out of sample on its 235B-A22B FP8 row (4 per device)
MCORE_FP8_HOST_US_PER_EXPERT_GEMM = 208.0
_MCORE_MOE_HOST = ("moe.host_ms_per_layer", "fitted on 3 of the 8 published MoE rows (Megatron-MoE-ModelZoo Qwen3-235B "
                   "DeepEP TP4 EDP4 for the layer's host time, its alltoall PP32 row for the alltoall dispatcher's "
                   "extra per local expert, Megatron-Bridge's Qwen3 30B-A3B FP8 row for the FP8 expert GEMMs'), the "
                   "others out of sample (benchmarks/published_moe.py, published_fp8.py); mechanism: eager "
                   "Megatron-Core's MoE layers are host-bound (their CUDA-graph scopes moe_router, moe_preprocess; "
                   "arXiv 2603.07685 sec. 4.3.6)")

_MCORE_SOURCES = (
    ("overlaps", "Megatron-LM README (r0.8), 'Training Speed and Scalability': --overlap-grad-reduce "
                 "--overlap-param-gather --tp-comm-overlap; ring attention (context parallelism) overlaps its transfers"),
    ("grad_bucket_bytes", "Megatron-Core DistributedDataParallelConfig.bucket_size default: 40,000,000 elements, bf16"),
    ("host_us_per_kernel", _HTA),
    ("attention_kernel", "Transformer Engine's get_attention_backend: 'Disabling FlashAttention to give FusedAttention "
                         "preference on Hopper+' (cuDNN's fused attention there; FlashAttention-2 on Ampere)"),
)

STACKS: dict[str, Stack] = {
    "none": Stack(name="none"),
    "planner": Stack(name="planner", grad_reduce_overlap=True, grad_bucket_bytes=25 << 20, host_us_per_kernel=EAGER_HOST_US_PER_KERNEL,
                     attention_kernel=AttentionKernel.FLASH_ATTN_2,
                     sources=(("overlaps", "planner.runtime.grads: gradient hooks start 25 MiB all-reduce buckets "
                                           "during the last backward"), ("host_us_per_kernel", _HTA),
                              ("attention_kernel", _SDPA))),
    "megatron-lm-2021": Stack(name="megatron-lm-2021", host_us_per_kernel=EAGER_HOST_US_PER_KERNEL, sources=(
        ("overlaps", "Narayanan et al. 2021 (SC'21) describe no overlap of data- or tensor-parallel communication"),
        ("host_us_per_kernel", _HTA))),
    "megatron-lm-2022": Stack(name="megatron-lm-2022", tp_overlap_backward=True, host_us_per_kernel=EAGER_HOST_US_PER_KERNEL, sources=(
        ("overlaps", "Korthikanti et al. 2022 sec. 6.2 (backward tensor-parallel all-reduce beside the weight-gradient "
                     "GEMM) and 6.3 (gradient all-reduce not overlapped with back-propagation)"),
        ("host_us_per_kernel", _HTA))),
    "megatron-deepspeed-2021": Stack(name="megatron-deepspeed-2021", host_us_per_kernel=EAGER_HOST_US_PER_KERNEL, sources=(
        ("overlaps", "DeepSpeed's PipelineEngine reduces gradients after the last micro-batch's backward "
                     "(_exec_reduce_grads); Megatron's tensor parallelism without overlap"),
        ("host_us_per_kernel", _HTA))),
    "megatron-core-0.8": Stack(
        name="megatron-core-0.8", grad_reduce_overlap=True, zero_reduce_overlap=True, grad_bucket_bytes=80_000_000,
        param_gather_overlap=True, fsdp_prefetch=True, tp_overlap_backward=True, tp_overlap_forward=True,
        cp_overlap=True, host_us_per_kernel=EAGER_HOST_US_PER_KERNEL, attention_kernel=AttentionKernel.TRANSFORMER_ENGINE,
        sources=(*_MCORE_SOURCES, _MCORE_MOE_HOST), moe=MoeStack(
            host_ms_per_layer=MCORE_MOE_HOST_MS_PER_LAYER, alltoall_host_ms_per_local_expert=MCORE_ALLTOALL_HOST_MS_PER_LOCAL_EXPERT,
            fp8_host_us_per_expert_gemm=MCORE_FP8_HOST_US_PER_EXPERT_GEMM),
    ),
    "torchtitan-2024": Stack(
        name="torchtitan-2024", grad_reduce_overlap=True, zero_reduce_overlap=True, param_gather_overlap=True,
        fsdp_prefetch=True, cp_overlap=True, host_us_per_kernel=EAGER_HOST_US_PER_KERNEL,
        attention_kernel=AttentionKernel.FLASH_ATTN_2, sources=(
            ("overlaps", "torchtitan (2024): FSDP2 fully_shard per block with implicit forward / explicit backward "
                         "prefetching; ring attention for context parallelism; async tensor parallelism off by default"),
            ("host_us_per_kernel", _HTA), ("attention_kernel", _SDPA)),
    ),
}
#: the names the presets had before their years were added
STACK_ALIASES: dict[str, str] = {"megatron-core": "megatron-core-0.8", "torchtitan": "torchtitan-2024"}

#: what a request plans for unless it says otherwise: the bundled runtime that runs its plans
DEFAULT_STACK = STACKS["planner"]


def stack_named(name: str) -> Stack:
    """A preset by name or former name (ValueError naming the presets otherwise)."""
    name = STACK_ALIASES.get(name, name)
    if name not in STACKS:
        raise ValueError(f"unknown stack {name!r} (known: {', '.join([*STACKS, *STACK_ALIASES])})")
    return STACKS[name]
