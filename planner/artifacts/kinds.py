"""The closed sets of choices a plan is made of, as enums (their values are what plan, profile
and request files hold).

- :class:`ScheduleKind`: the pipeline schedule, and its :class:`ChunkPlacement`;
- :class:`Objective`: what the solver minimises or maximises;
- :class:`OptimizerKind`: optimizer and precision the memory is priced for, and its
  :class:`OptimizerFamily` (the optimizer the runtime runs: SGD or AdamW);
- :class:`DType`: the element type of a profile's parameters and activations;
- :class:`SolverKind`: the exact solvers and the peers' baseline partition methods;
- :class:`ZeroStage`: how much model state is sharded over a stage's data-parallel ranks;
- :class:`AttentionKind`: how a profile's attention keeps its scores (flash or materialised);
- :class:`RecomputeLevel`: how much of a layer is recomputed in backward (none, selective, full);
- :class:`SequenceParallelRuntime`: whose sequence parallelism a profile's tensor splits describe;
- :class:`CollectiveModel`: how a cluster's collectives across nodes are priced;
- :class:`OverheadKind`: the overhead terms of a plan's breakdown;
- :class:`SelectiveUnit`: what an analytic profile's selective recompute level re-runs;
- :class:`AttentionKernel`: the fused attention kernel a training stack runs.
"""

from __future__ import annotations

import enum


class ScheduleKind(enum.Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    ZB_H1 = "zb-h1"  # zero bubble, backward split into input (I) and weight (W) gradients (Qi et al. 2024)
    ZB_H2 = "zb-h2"  # zero bubble with more warm-up forwards: ~no bubble, more memory (Qi et al. 2024 sec. 3.2)
    ZBV = "zbv"  # zero bubble on two chunks per rank placed in a V (Qi et al. 2024 sec. 6)
    # DeepSeek-V3's DualPipe folded in a V (torch ScheduleDualPipeV): ZBV's chunks, a forward and a whole
    # backward of other micro-batches paired in its steady phase (planner.schedule.dualpipe)
    DUALPIPE_V = "dualpipe-v"
    # DeepSeek-V3's DualPipe (tech. report sec. 3.2.1): two copies of the parameters, micro-batches fed from both
    # ends; priced as its folded form's order on each device, the copies as a data-parallel pair (ChunkPlacement.MIRROR)
    DUALPIPE = "dualpipe"

    @property
    def splits_backward(self) -> bool:
        """The schedule runs each backward as an input-gradient pass and a weight-gradient pass."""
        return self in (ScheduleKind.ZB_H1, ScheduleKind.ZB_H2, ScheduleKind.ZBV, ScheduleKind.DUALPIPE_V,
                        ScheduleKind.DUALPIPE)

    @property
    def placement(self) -> ChunkPlacement:
        """How the schedule places a rank's chunks: in a V for ZBV and DualPipe-V, mirrored for
        DualPipe, round-robin otherwise."""
        if self is ScheduleKind.DUALPIPE:
            return ChunkPlacement.MIRROR
        return ChunkPlacement.V if self in (ScheduleKind.ZBV, ScheduleKind.DUALPIPE_V) else ChunkPlacement.LOOP


class ChunkPlacement(enum.Enum):
    """Which chunks a pipeline rank holds when it holds several (torch's
    ``generate_stage_to_rank_mapping`` styles): ``loop``, rank ``p`` of ``P`` holds chunks
    ``p, p + P, p + 2P, ...`` (interleaved 1F1B, Narayanan et al. 2021); ``v``, the chunks go
    down the ranks and back up: chunk ``s`` is on rank ``s mod P`` in an even round and
    ``P - 1 - s mod P`` in an odd one, so with two chunks rank ``p`` holds ``p`` and
    ``2P - 1 - p`` (ZBV, Qi et al. 2024 sec. 6: the last chunk ends on rank 0, where the
    backward starts without a transfer); ``mirror``, DualPipe's (DeepSeek-V3 tech. report sec.
    3.2.1): ``N`` devices, each holding stage ``r`` of one copy of the model and stage
    ``N - 1 - r`` of the other, micro-batches fed to both ends. Written as the V of ``N / 2``
    pipeline ranks with the two copies as a data-parallel pair (``dp_degree`` even, replicas
    ``2d`` and ``2d + 1`` the copies): every device runs DualPipe-V's order of rank
    ``min(r, N - 1 - r)`` on half the micro-batches (DeepSeek's ``dualpipe.py`` runs exactly
    that per device), so chunks and held counts are the V's; only the turn differs: it crosses
    from device ``N / 2 - 1`` to device ``N / 2``, which holds the other copy
    (:meth:`~planner.artifacts.layout.Layout.downstream_rank`)."""

    LOOP = "loop"
    V = "v"
    MIRROR = "mirror"


class Objective(enum.Enum):
    TIME = "time"  # least iteration time
    MEMORY = "memory"  # least peak memory within time_budget_ms (or within 10% of the fastest)
    ME = "me"  # highest memory-efficiency index against the fastest GPipe plan without recompute


#: the memory objective without a time budget: the least memory among plans at most this times the fastest
MEMORY_OBJECTIVE_FACTOR = 1.10


class OptimizerFamily(enum.Enum):
    """The optimizer the bundled runtime runs (in the run's dtype; mixed precision is not run)."""

    SGD = "sgd"
    ADAMW = "adamw"
    ADAMW_BF16_MOMENTS = "adamw-bf16-moments"  # AdamW keeping exp_avg and exp_avg_sq in bfloat16

    @property
    def moments(self) -> int:
        """The per-parameter moment tensors it keeps (AdamW 2, SGD without momentum 0)."""
        return 0 if self is OptimizerFamily.SGD else 2

    def moment_bytes(self, element_size: int) -> int:
        """Bytes of its moments per parameter, in a run of ``element_size``-byte parameters."""
        return self.moments * (2 if self is OptimizerFamily.ADAMW_BF16_MOMENTS else element_size)


class Precision(enum.Enum):
    """The arithmetic of the transformer blocks' linear layers (issue 49 item 1;
    ``planner.cost.precision`` prices each): bf16; FP8 with per-tensor current scaling
    (Transformer Engine's ``Float8CurrentScaling``); FP8 with block scaling, 1 x 128 activation
    tiles and 128 x 128 weight blocks (DeepSeek-V3 tech. report sec. 3.3.2; TE's
    ``Float8BlockScaling``); MXFP8, blocks of 32 scaled in hardware (OCP MX v1.0; Blackwell only,
    TE's ``MXFP8BlockScaling``). The attention core, the router, the embedding and the head stay
    bf16."""

    BF16 = "bf16"
    FP8_CURRENT = "fp8-current"
    FP8_BLOCK = "fp8-block"
    MXFP8 = "mxfp8"

    @property
    def fp8(self) -> bool:
        return self is not Precision.BF16


class OptimizerKind(enum.Enum):
    """Optimizer and precision; fixes kappa, the bytes of model state per parameter."""

    SGD_FP32 = "sgd-fp32"  # weights 4 + grads 4 + momentum 4
    ADAM_FP32 = "adam-fp32"  # weights 4 + grads 4 + m 4 + v 4
    ADAM_MIXED = "adam-mixed"  # fp16 w 2 + fp16 g 2 + fp32 master 4 + m 4 + v 4 (ZeRO paper, Rajbhandari et al. 2020)
    ADAM_MIXED_FP32_GRAD = "adam-mixed-fp32-grad"  # as above + 2 for fp32 gradient accumulation
    # the lean optimizer states (issue 49 item 2): moments in bf16 (as DeepSeek-V3 tech. report sec. 3.3.3 keeps
    # AdamW's moments), and/or no fp32 master copy (the bf16 weights are the ones updated)
    ADAM_MIXED_BF16_MOMENTS = "adam-mixed-bf16-moments"  # bf16 w 2 + g 2 + fp32 master 4 + bf16 m 2 + v 2
    ADAM_BF16_FP32_MOMENTS = "adam-bf16-fp32-moments"  # bf16 w 2 (the master) + g 2 + fp32 m 4 + v 4
    ADAM_BF16 = "adam-bf16"  # bf16 w 2 (the master) + g 2 + bf16 m 2 + v 2

    @property
    def family(self) -> OptimizerFamily:
        """The runtime optimizer of this kind: SGD for ``sgd-fp32``, AdamW for the Adam kinds
        (with bf16 moments where the kind keeps them so)."""
        if self is OptimizerKind.SGD_FP32:
            return OptimizerFamily.SGD
        return OptimizerFamily.ADAMW_BF16_MOMENTS if self.moment_bytes == 2 else OptimizerFamily.ADAMW

    @property
    def moment_bytes(self) -> int:
        """Bytes of one moment (first or second) per parameter: 2 (bf16) or 4 (fp32)."""
        return 2 if self in (OptimizerKind.ADAM_MIXED_BF16_MOMENTS, OptimizerKind.ADAM_BF16) else 4

    @property
    def master_weights(self) -> bool:
        """Whether it keeps an fp32 master copy beside 16-bit weights (the mixed kinds)."""
        return self in (OptimizerKind.ADAM_MIXED, OptimizerKind.ADAM_MIXED_FP32_GRAD, OptimizerKind.ADAM_MIXED_BF16_MOMENTS)

    @property
    def state_bytes_per_param(self) -> tuple[int, int, int]:
        """(weights, gradients, optimizer state) bytes per parameter."""
        return STATE_BYTES_PER_PARAM[self]

    @property
    def step_bytes_per_param(self) -> int:
        """Bytes the optimizer step reads and writes per parameter it updates: the gradient read,
        the optimizer state read and written (moments, and the fp32 master weights of the mixed
        kinds), the weights written (also read where they are the master copy: the fp32 kinds).
        Adam mixed: 2 + 2 x 12 + 2 = 28; with fp32 gradients 30; Adam fp32 4 + 2 x 8 + 2 x 4 =
        28; SGD with momentum 4 + 2 x 4 + 2 x 4 = 20; bf16 moments with an fp32 master 2 + 2 x 8 + 2
        = 20; bf16 weights as the master with fp32 moments 2 + 2 x 8 + 2 x 2 = 22, with bf16 moments
        2 + 2 x 4 + 2 x 2 = 14. The update itself, as a fused
        (multi-tensor) kernel streams it once; a gradient-norm pass for clipping would add a
        gradient read."""
        w, g, o = self.state_bytes_per_param
        master = not self.master_weights  # the weights themselves are updated: read and written
        return g + 2 * o + (2 * w if master else w)


# (weights, gradients, optimizer state) bytes per parameter for each optimizer kind.
STATE_BYTES_PER_PARAM: dict[OptimizerKind, tuple[int, int, int]] = {
    OptimizerKind.SGD_FP32: (4, 4, 4),
    OptimizerKind.ADAM_FP32: (4, 4, 8),
    OptimizerKind.ADAM_MIXED: (2, 2, 12),
    OptimizerKind.ADAM_MIXED_FP32_GRAD: (2, 4, 12),
    OptimizerKind.ADAM_MIXED_BF16_MOMENTS: (2, 2, 8),
    OptimizerKind.ADAM_BF16_FP32_MOMENTS: (2, 2, 8),
    OptimizerKind.ADAM_BF16: (2, 2, 4),
}


class DType(enum.Enum):
    """Element type of a profile (and of the plan priced from it)."""

    FLOAT32 = "float32"
    FLOAT64 = "float64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"

    @property
    def itemsize(self) -> int:
        return {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}[self.value]


#: the dtypes the bundled runtime trains in
RUNTIME_DTYPES = (DType.FLOAT32, DType.FLOAT64)


class SolverKind(enum.Enum):
    """Who chooses the plan: an exact solver, or one of the peers' partition methods as published."""

    DP = "dp"  # exact chain DP per configuration, re-scored by the simulator
    ILP = "ilp"  # the same problem as an OR-Tools CP-SAT model
    BRUTE_FORCE = "brute-force"  # every cut set and recompute mask (small cases)
    UNIFORM = "uniform"
    PARAMETERS = "parameters"
    TIME_BALANCED = "time-balanced"
    PIPEDREAM = "pipedream"
    DATA_PARALLEL = "data-parallel"
    GIVEN = "given"  # not searched: a layout and partition given to the planner to price

    @property
    def is_baseline(self) -> bool:
        return self in BASELINES

    @property
    def searches(self) -> bool:
        """One of the planner's own exact solvers (searched layouts, not a peer's rule)."""
        return self in (SolverKind.DP, SolverKind.ILP, SolverKind.BRUTE_FORCE)


#: the baseline partition methods (the peers' rules as published), in the order tables list them
BASELINES: tuple[SolverKind, ...] = (
    SolverKind.UNIFORM, SolverKind.PARAMETERS, SolverKind.TIME_BALANCED, SolverKind.PIPEDREAM, SolverKind.DATA_PARALLEL,
)
#: what ``PlanRequest.solver`` may name (``given`` is for plans priced outside a search)
REQUESTABLE_SOLVERS: tuple[SolverKind, ...] = (SolverKind.DP, SolverKind.ILP, SolverKind.BRUTE_FORCE, *BASELINES)


class ZeroStage(enum.IntEnum):
    """ZeRO (Rajbhandari et al. 2020) over a stage's data-parallel ranks: 0 nothing sharded,
    1 the optimizer state, 2 also the gradients (reduce-scattered every micro-batch, DeepSpeed's
    ZeRO-2; see :mod:`planner.cost.sharding`), 3 also the parameters (FSDP: each layer's weights all-gathered
    before its forward and again before its backward, its gradients reduce-scattered after its
    backward, every micro-batch; see :mod:`planner.cost.fsdp`)."""

    NONE = 0
    OPTIMIZER = 1
    GRADIENTS = 2
    PARAMETERS = 3


class AttentionKind(enum.Enum):
    """How the attention of a profiled model keeps what its backward needs.

    - ``flash``: FlashAttention (Dao et al. 2022, sec. 3.1; torch's flash, memory-efficient
      and cuDNN SDPA backends): no ``s x s`` tensor is saved, only Q, K, V, the output and
      the fp32 log-sum-exp per head and token; the backward recomputes the scores
      (``2 s^2 h`` more FLOPs per sample than a materialised backward);
    - ``materialised``: the softmax output and dropout mask are saved (``5 a s^2`` bytes per
      sample in 16-bit, Korthikanti et al. 2022 eq. 1; torch's math SDPA backend, eager
      attention);
    - ``none``: the model has no attention;
    - ``unknown``: not recorded (profiles written before version 3).
    """

    FLASH = "flash"
    MATERIALISED = "materialised"
    NONE = "none"
    UNKNOWN = "unknown"


class RecomputeLevel(enum.Enum):
    """What of a layer's forward is re-run in its backward (Korthikanti et al. 2022 sec. 4):
    nothing (it keeps everything it saves), its attention core only (``selective``: QK^T,
    softmax, dropout and attention over V; it keeps the rest), or all of it (``full``: it
    keeps only its input)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class RecomputeMode(enum.Enum):
    """How a request has recomputation chosen: ``auto``, the solver picks each layer's level
    (the least recompute time that fits); ``none``, nothing recomputed; ``selective``, every
    transformer block's attention core (Megatron-LM's ``--recompute-granularity selective``);
    ``full``, every transformer block whole (``--recompute-granularity full``; where no layer
    has an attention core, every layer)."""

    AUTO = "auto"
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


#: ``planner calibrate``'s time scales (:mod:`planner.report.calibrate`): one overall, or one per stage
CALIBRATION_GRANULARITIES: tuple[str, ...] = ("global", "stage")
#: what explains the time a calibration's compute scale leaves: slower links, a per-layer
#: overhead, the better fit of the two (``auto``), or nothing
CALIBRATION_RESIDUALS: tuple[str, ...] = ("auto", "links", "overhead", "none")


class SequenceParallelRuntime(enum.Enum):
    """Whose sequence parallelism a layer's tensor split describes (``TensorSplit.sequence_runtime``):
    the two keep different tensors whole.

    - ``megatron-lm`` (Korthikanti et al. 2022 sec. 4.2.2, eq. 4): every saved activation is
      split along the sequence; a column-parallel linear keeps its input's sequence shard and
      all-gathers it again in backward. The analytic profiles, and every version-1 to -3 file
      (what the cost model of those versions priced).
    - ``torch-dtensor``: ``torch.distributed.tensor.parallel`` as this planner's runtime runs it
      (``SequenceParallel`` norms, ``ColwiseParallel`` / ``RowwiseParallel``): the all-gathered
      input of each column split is saved whole by it, and tensors that do not come from the
      hidden stream (an attention mask, rotary tables built for the whole sequence) are whole
      on every device. The measured profiles.
    """

    MEGATRON = "megatron-lm"
    DTENSOR = "torch-dtensor"
class CollectiveModel(enum.Enum):
    """How a cluster's data-parallel collectives across nodes are priced
    (:mod:`planner.cost.collectives`): ``alpha-beta``, a ring's ``2 (n-1)`` steps at the link's
    latency and bandwidth; ``nccl``, the latencies and the ring / tree choice of NCCL's own tuning
    model (``src/graph/tuning.cc``), whose rings pay a network latency per step across nodes."""

    ALPHA_BETA = "alpha-beta"
    NCCL = "nccl"


class OverheadKind(enum.Enum):
    """The overheads a plan's breakdown names, each priced from a cited measurement
    (:mod:`planner.cost.overheads`): collectives under NCCL's model (across nodes above all),
    pipeline send/receive latency between nodes, the host's time to issue kernels, the slowest
    GPU of the job."""

    NCCL_COLLECTIVES = "nccl-collectives"
    P2P_LATENCY = "p2p-latency"
    HOST = "host"
    STRAGGLER = "straggler"


class SelectiveUnit(enum.Enum):
    """What the selective recompute level of an analytic profile's blocks re-runs in backward
    (``Layer.attention_core`` holds its bytes and time): ``attention-core``, the attention core
    (Korthikanti et al. 2022 sec. 5, Megatron-LM's ``--recompute-granularity selective``);
    ``ops``, torchtitan's op-level selective activation checkpointing (every element-wise op and
    every second matmul of a block re-run, the attention kernel's and the other matmuls' outputs
    kept: ``planner.profiling.analytic.llama``)."""

    ATTENTION_CORE = "attention-core"
    OPS = "ops"


class AttentionKernel(enum.Enum):
    """The fused attention kernel a stack runs, whose measured efficiency prices an analytic
    FlashAttention profile's attention (:mod:`planner.cost.attention_kernels`): ``model``, the
    GEMM model's own efficiency for the fused pair (as the profile prices it); ``flash-attn-2``
    (Dao 2023; torch's SDPA flash backend); ``transformer-engine``, what Transformer Engine runs:
    cuDNN's fused attention on Hopper, FlashAttention-2 on Ampere."""

    MODEL = "model"
    FLASH_ATTN_2 = "flash-attn-2"
    TRANSFORMER_ENGINE = "transformer-engine"


