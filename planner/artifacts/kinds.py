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
- :class:`SequenceParallelRuntime`: whose sequence parallelism a profile's tensor splits describe.
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

    @property
    def splits_backward(self) -> bool:
        """The schedule runs each backward as an input-gradient pass and a weight-gradient pass."""
        return self in (ScheduleKind.ZB_H1, ScheduleKind.ZB_H2, ScheduleKind.ZBV)

    @property
    def placement(self) -> ChunkPlacement:
        """How the schedule places a rank's chunks: in a V for ZBV, round-robin otherwise."""
        return ChunkPlacement.V if self is ScheduleKind.ZBV else ChunkPlacement.LOOP


class ChunkPlacement(enum.Enum):
    """Which chunks a pipeline rank holds when it holds several (torch's
    ``generate_stage_to_rank_mapping`` styles): ``loop``, rank ``p`` of ``P`` holds chunks
    ``p, p + P, p + 2P, ...`` (interleaved 1F1B, Narayanan et al. 2021); ``v``, the chunks go
    down the ranks and back up: chunk ``s`` is on rank ``s mod P`` in an even round and
    ``P - 1 - s mod P`` in an odd one, so with two chunks rank ``p`` holds ``p`` and
    ``2P - 1 - p`` (ZBV, Qi et al. 2024 sec. 6: the last chunk ends on rank 0, where the
    backward starts without a transfer)."""

    LOOP = "loop"
    V = "v"


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


class OptimizerKind(enum.Enum):
    """Optimizer and precision; fixes kappa, the bytes of model state per parameter."""

    SGD_FP32 = "sgd-fp32"  # weights 4 + grads 4 + momentum 4
    ADAM_FP32 = "adam-fp32"  # weights 4 + grads 4 + m 4 + v 4
    ADAM_MIXED = "adam-mixed"  # fp16 w 2 + fp16 g 2 + fp32 master 4 + m 4 + v 4 (ZeRO paper, Rajbhandari et al. 2020)
    ADAM_MIXED_FP32_GRAD = "adam-mixed-fp32-grad"  # as above + 2 for fp32 gradient accumulation

    @property
    def family(self) -> OptimizerFamily:
        """The runtime optimizer of this kind: SGD for ``sgd-fp32``, AdamW for the Adam kinds."""
        return OptimizerFamily.SGD if self is OptimizerKind.SGD_FP32 else OptimizerFamily.ADAMW

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
        28; SGD with momentum 4 + 2 x 4 + 2 x 4 = 20. The update itself, as a fused
        (multi-tensor) kernel streams it once; a gradient-norm pass for clipping would add a
        gradient read."""
        w, g, o = self.state_bytes_per_param
        master = self in (OptimizerKind.SGD_FP32, OptimizerKind.ADAM_FP32)
        return g + 2 * o + (2 * w if master else w)


# (weights, gradients, optimizer state) bytes per parameter for each optimizer kind.
STATE_BYTES_PER_PARAM: dict[OptimizerKind, tuple[int, int, int]] = {
    OptimizerKind.SGD_FP32: (4, 4, 4),
    OptimizerKind.ADAM_FP32: (4, 4, 8),
    OptimizerKind.ADAM_MIXED: (2, 2, 12),
    OptimizerKind.ADAM_MIXED_FP32_GRAD: (2, 4, 12),
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
    1 the optimizer state, 2 also the gradients (after the iteration's reduce-scatter; see
    :mod:`planner.cost.model`), 3 also the parameters (FSDP: each layer's weights all-gathered
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
