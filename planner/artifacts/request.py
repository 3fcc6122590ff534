"""The PlanRequest: what the user asks the solver for."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.artifacts.host import OffloadMode
from planner.artifacts.kinds import (
    REQUESTABLE_SOLVERS,
    STATE_BYTES_PER_PARAM,
    Objective,
    OptimizerKind,
    Precision,
    RecomputeMode,
    ScheduleKind,
    SolverKind,
    ZeroStage,
)
from planner.artifacts.limits import (
    MAX_BATCH,
    MAX_BYTES,
    MAX_DEVICES,
    MAX_LAYERS,
    MAX_MS,
    check_count,
    check_range,
    first_duplicate,
)
from planner.artifacts.stack import DEFAULT_STACK, Stack

__all__ = ["STATE_BYTES_PER_PARAM", "ZERO_STAGES", "Objective", "OptimizerKind", "PlanRequest", "RecomputeMode",
           "ScheduleKind", "SolverKind", "Stack", "ZeroStage"]

#: the ZeRO stages a request may ask for
ZERO_STAGES = tuple(ZeroStage)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRequest:
    """A planning request. Defaults give the fastest plan that fits with 10% headroom."""

    global_batch: int = 512
    num_devices: int = field(default=0, metadata={"doc": "devices to plan for; 0 = every device of the cluster"})
    objective: Objective = Objective.TIME
    schedules: tuple[ScheduleKind, ...] = field(
        default=(ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B, ScheduleKind.ZB_H1,
                 ScheduleKind.ZB_H2, ScheduleKind.ZBV, ScheduleKind.DUALPIPE_V),
        metadata={"doc": "schedules to consider; interleaved 1F1B with the chunks per rank the search settings "
                         "allow (planner.solve.settings.SearchSettings.interleave_factors), chosen by the search; "
                         "the zero-bubble schedules zb-h1, zb-h2, zbv and dualpipe-v (DeepSeek's DualPipe in a V, "
                         "torch's ScheduleDualPipeV) priced with each stage's exact in-flight memory "
                         "(docs/zero-bubble.md); the runtime runs every one through torch's action-list "
                         "runtime", "max_items": len(ScheduleKind)},
    )
    microbatch_sizes: tuple[int, ...] = field(
        default=(), metadata={"doc": "micro-batch sizes to consider; empty = every size that divides the batch"}
    )
    max_stages: int = 0
    recompute: bool = True
    memory_headroom_fraction: float = 0.1
    memory_cap_bytes: int = field(default=0, metadata={"doc": "per-device cap; 0 = device memory x (1 - headroom)"})
    optimizer: OptimizerKind = OptimizerKind.ADAM_MIXED
    time_budget_ms: float = 0.0
    fixed_boundaries: tuple[int, ...] = field(
        default=(),
        metadata={"doc": "layer indices where a stage must start: every plan has a stage starting at each of them "
                         "(with an interleaved schedule: a model chunk); stages may also start elsewhere, unless "
                         "num_stages is one more than their count. A request that cannot honour them is refused"},
    )
    num_stages: int = field(
        default=0,
        metadata={"doc": "pipeline stages P the plan must have (with an interleaved schedule: pipeline ranks, each "
                         "holding virtual_stages_per_rank stages); 0 = searched"},
    )
    dp_degree: int = field(
        default=0,
        metadata={"doc": "replicated pipelines D the plan must have (then no per-stage replication is searched); "
                         "0 = searched"},
    )
    solver: SolverKind = SolverKind.DP
    zero_stages: tuple[ZeroStage, ...] = field(
        default=(ZeroStage.NONE, ZeroStage.OPTIMIZER, ZeroStage.PARAMETERS),
        metadata={"doc": "ZeRO stages to consider: 0 none, 1 optimizer state sharded over a stage's replicas, "
                         "2 also its gradients (reduce-scattered every micro-batch), 3 also its parameters (FSDP; "
                         "Rajbhandari et al. 2020). 2 only when asked for: the chain solver's tables do not price its "
                         "reduce-scatter every micro-batch (the plan and the simulator do), so a search would rank it "
                         "too well",
                 "max_items": len(ZeroStage)},
    )
    per_stage_replication: bool = field(
        default=True,
        metadata={"doc": "also search plans whose stages have their own replica counts (PipeDream's optimizer)"},
    )
    tp_degrees: tuple[int, ...] = field(
        default=(),
        metadata={"doc": "tensor-parallel degrees to consider; empty = every divisor of the devices per node that "
                         "the profile's layers allow (1 only when no layer declares a split)"},
    )
    sequence_parallel: tuple[bool, ...] = field(
        default=(False, True),
        metadata={"doc": "with a tensor-parallel degree > 1: sequence parallelism off and/or on; with both, on is "
                         "planned (under the cost model it is never slower nor larger, see planner.cost.tensor_parallel)",
                 "max_items": 2},
    )
    stack: Stack = field(
        default=DEFAULT_STACK,
        metadata={"doc": "the training stack planned for: which communication it overlaps with computation "
                         "(planner.artifacts.stack; default: this package's runtime)"},
    )
    recompute_mode: RecomputeMode = field(
        default=RecomputeMode.AUTO,
        metadata={"doc": "auto: each layer's recompute level chosen by the solver (none when recompute is false); "
                         "none; selective: every transformer block's attention core; full: every transformer block "
                         "(absent when auto)", "omit_if_default": True},
    )
    cp_degrees: tuple[int, ...] = field(
        default=(),
        metadata={"doc": "context-parallel degrees to consider; empty = 1 and every degree that cuts the profile's "
                         "sequence into 2 cp whole chunks and divides the devices (profiles that declare what scales "
                         "with the sequence: analytic GPT and Llama; else 1)", "omit_if_default": True},
    )
    ep_degrees: tuple[int, ...] = field(
        default=(),
        metadata={"doc": "expert-parallel degrees to consider for profiles with routed experts; empty = every degree "
                         "that divides the experts and folds over a pipeline rank's devices (1 without experts)",
                  "omit_if_default": True},
    )
    etp_degrees: tuple[int, ...] = field(
        default=(),
        metadata={"doc": "expert tensor-parallel degrees to consider; empty = 1 and every divisor of the devices per "
                         "node that splits the experts' FFN width (1 without experts)", "omit_if_default": True},
    )
    precisions: tuple[Precision, ...] = field(
        default=(Precision.BF16,),
        metadata={"doc": "precisions of the blocks' linear layers to consider (planner.cost.precision): bf16, "
                         "fp8-current, fp8-block, mxfp8; several: the best plan over them (absent when bf16 only)",
                  "omit_if_default": True, "max_items": len(Precision)},
    )
    offload: OffloadMode = field(
        default=OffloadMode.NONE,
        metadata={"doc": "what the plan keeps in host memory: none; optimizer (state and master weights, the step on "
                         "the host); activations (per stage, where the search chooses it); both; auto (each searched, "
                         "the objective choosing) (planner.cost.offload) (absent when none)", "omit_if_default": True},
    )

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise ValueError(f"global_batch must be >= 1 (got {self.global_batch})")
        if self.num_devices < 0:
            raise ValueError(f"num_devices must be >= 1, or 0 for the whole cluster (got {self.num_devices})")
        if not self.schedules:
            raise ValueError("schedules must name at least one schedule")
        if any(b < 1 for b in self.microbatch_sizes):
            raise ValueError(f"microbatch_sizes must be >= 1 (got {list(self.microbatch_sizes)})")
        if self.max_stages < 0:
            raise ValueError(f"max_stages must be >= 0 (got {self.max_stages})")
        if not (math.isfinite(self.memory_headroom_fraction) and 0 <= self.memory_headroom_fraction < 1):
            raise ValueError(f"memory_headroom_fraction must be in [0, 1) (got {self.memory_headroom_fraction})")
        if self.memory_cap_bytes < 0:
            raise ValueError(f"memory_cap_bytes must be >= 0 (got {self.memory_cap_bytes})")
        if not (math.isfinite(self.time_budget_ms) and self.time_budget_ms >= 0):
            raise ValueError(f"time_budget_ms must be >= 0 (got {self.time_budget_ms})")
        if any(b < 1 for b in self.fixed_boundaries):
            raise ValueError(f"fixed_boundaries must be layer indices >= 1 (got {list(self.fixed_boundaries)})")
        if self.num_stages < 0:
            raise ValueError(f"num_stages must be >= 1, or 0 to search (got {self.num_stages})")
        if self.dp_degree < 0:
            raise ValueError(f"dp_degree must be >= 1, or 0 to search (got {self.dp_degree})")
        if self.num_stages and self.max_stages and self.num_stages > self.max_stages:
            raise ValueError(f"num_stages {self.num_stages} is more than max_stages {self.max_stages}")
        if self.dp_degree and self.global_batch % self.dp_degree:
            raise ValueError(f"dp_degree {self.dp_degree} does not divide global_batch {self.global_batch}")
        if any(t < 1 for t in self.tp_degrees):
            raise ValueError(f"tp_degrees must be >= 1 (got {list(self.tp_degrees)})")
        if any(c < 1 for c in self.cp_degrees):
            raise ValueError(f"cp_degrees must be >= 1 (got {list(self.cp_degrees)})")
        if any(c < 1 for c in self.ep_degrees + self.etp_degrees):
            raise ValueError(f"ep_degrees and etp_degrees must be >= 1 (got {list(self.ep_degrees)}, "
                             f"{list(self.etp_degrees)})")
        if not self.sequence_parallel:
            raise ValueError("sequence_parallel must allow off, on, or both")
        if not self.precisions:
            raise ValueError("precisions must name at least one precision")
        object.__setattr__(self, "precisions", tuple(Precision(p) for p in self.precisions))
        for name in ("schedules", "microbatch_sizes", "zero_stages", "tp_degrees", "cp_degrees", "sequence_parallel",
                     "fixed_boundaries", "precisions"):
            dup = first_duplicate(getattr(self, name))
            if dup is not None:
                raise ValueError(f"{name} lists {getattr(dup, 'value', dup)!r} twice (each value once)")
        check_count("global_batch", self.global_batch, 1, MAX_BATCH)
        for name in ("num_devices", "max_stages", "num_stages", "dp_degree"):
            check_count(name, getattr(self, name), 0, MAX_DEVICES)
        for name, values, hi in (("microbatch_sizes", self.microbatch_sizes, MAX_BATCH), ("tp_degrees", self.tp_degrees, MAX_DEVICES),
                                 ("cp_degrees", self.cp_degrees, MAX_DEVICES), ("ep_degrees", self.ep_degrees, MAX_DEVICES),
                                 ("etp_degrees", self.etp_degrees, MAX_DEVICES),
                                 ("fixed_boundaries", self.fixed_boundaries, MAX_LAYERS)):
            for i, value in enumerate(values):
                check_count(f"{name}[{i}]", value, 1, hi)
        check_count("memory_cap_bytes", self.memory_cap_bytes, 0, MAX_BYTES)
        check_range("time_budget_ms", self.time_budget_ms, 0, MAX_MS)
        if not self.zero_stages or any(isinstance(z, bool) or z not in ZERO_STAGES for z in self.zero_stages):
            raise ValueError(
                f"zero_stages must be a non-empty subset of {[int(z) for z in ZERO_STAGES]} (got {list(self.zero_stages)})"
            )
        object.__setattr__(self, "zero_stages", tuple(ZeroStage(z) for z in self.zero_stages))
        object.__setattr__(self, "recompute_mode", RecomputeMode(self.recompute_mode))
        object.__setattr__(self, "offload", OffloadMode(self.offload))
        if self.recompute_mode is RecomputeMode.NONE:
            object.__setattr__(self, "recompute", False)
        elif self.recompute_mode is not RecomputeMode.AUTO and not self.recompute:
            raise ValueError(f"recompute_mode {self.recompute_mode.value} needs recompute (got recompute false)")
        known = [k.value for k in REQUESTABLE_SOLVERS]
        if getattr(self.solver, "value", self.solver) not in known:
            raise ValueError(f"unknown solver {self.solver!r} (known: {', '.join(known)})")
        object.__setattr__(self, "solver", SolverKind(getattr(self.solver, "value", self.solver)))
