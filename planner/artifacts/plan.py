"""The Plan artifact: stages, replication, micro-batching, schedule and predictions.

Rank placement: rank = pipeline rank x dp_degree + replica; with one stage per rank the
pipeline rank is the stage index; for interleaved schedules (``virtual_stages_per_rank`` = v)
there are R = num_stages / v pipeline ranks and rank p holds stages p, p + R, p + 2R, ...

Two kinds of data parallelism, which compose:

- ``dp_degree`` = D replicated pipelines: the global batch is split into D contiguous parts,
  one per pipeline, each run as ``num_microbatches`` micro-batches;
- per-stage replication (PipeDream's optimizer, Narayanan et al. 2019): stage ``s`` has
  ``replicas`` = R_s copies inside one pipeline and micro-batch ``m`` runs on copy ``m mod R_s``
  (round-robin); ``num_microbatches`` must be a multiple of every R_s.

A stage's ``ranks`` are its D x R_s devices; its gradients are synchronised over all of them.
With per-stage replication the stages' ranks are consecutive blocks: stage 0 takes ranks
0 .. R_0 - 1, stage 1 the next R_1, and so on (replica r of stage s is rank offset_s + r).

``zero`` (Rajbhandari et al. 2020): 0 every rank of a stage keeps the stage's full optimizer
state and gradients; 1 the optimizer state is sharded over the stage's ranks (each keeps
1/|ranks|); 2 the gradients too, once the iteration's micro-batches are reduce-scattered (the
whole gradient buffer is live while they accumulate, so the peak memory of 2 is that of 1). The stage's gradient synchronisation is then a
reduce-scatter of the gradients and an all-gather of the updated weights instead of an
all-reduce; ``allreduce_ms`` holds whichever the plan does.

Tensor parallelism (Shoeybi et al. 2019, Megatron-LM): ``tp_degree`` = t devices run each
stage replica together, each holding 1/t of every layer that declares a
:class:`~planner.artifacts.profile.TensorSplit`; ``sequence_parallel`` also splits the
remaining activations along the sequence (Korthikanti et al. 2022). The t devices of one
tensor-parallel group are consecutive ranks (inside a node): rank = (pipeline rank x
dp_degree + replica) x t + tp index -- a ("pp", "dp", "tp") device mesh of shape (P, D, t) in
row-major order. A stage's ``ranks`` list all its D x t (x replicas) devices in rank order.

``dtype`` and ``optimizer`` record what the plan's memory was priced for (the profile's dtype
and the request's optimizer), so that a run with other settings can be told apart.

Times in ``PlanStage`` are per micro-batch except ``allreduce_ms`` (once per iteration).

Version 2 renamed ``predicted.lower_bound_ms`` to ``partition_bound_ms`` and added
``machine_bound_ms``, the FLOP figures, ``zero`` and ``replicas``; version-1 files are read
and upgraded (their machine bound is left 0: unknown without the profile). Version 3 (this
one) added ``tp_degree``, ``sequence_parallel``, ``dtype`` and ``optimizer``; version-2 files
are read as t = 1 with dtype and optimizer unknown ("").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.artifacts import codec
from planner.artifacts.request import ZERO_STAGES, PlanRequest, ScheduleKind

SCHEMA = "planner.plan"
VERSION = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMemory:
    """Peak memory of one device of a stage, by kind (bytes)."""

    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    recompute_workspace_bytes: int
    buffer_bytes: int

    @property
    def total_bytes(self) -> int:
        return (
            self.param_bytes
            + self.grad_bytes
            + self.optimizer_bytes
            + self.activation_bytes
            + self.recompute_workspace_bytes
            + self.buffer_bytes
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanStage:
    stage_idx: int
    layer_start: int
    layer_stop: int = field(metadata={"doc": "exclusive"})
    layer_names: tuple[str, ...]
    ranks: tuple[int, ...]
    recompute: tuple[int, ...] = field(metadata={"doc": "layer indices recomputed in backward"})
    inflight_microbatches: int
    activation_bytes_per_microbatch: int = field(
        metadata={"doc": "bytes one in-flight micro-batch keeps on this stage (recomputed layers keep their input)"}
    )
    fwd_ms: float
    bwd_ms: float
    recompute_ms: float = field(metadata={"doc": "re-running the recomputed layers' forward, per micro-batch"})
    send_fwd_ms: float = field(metadata={"doc": "activation send to the next stage, per micro-batch"})
    send_bwd_ms: float = field(metadata={"doc": "gradient send to the previous stage, per micro-batch"})
    allreduce_ms: float = field(
        metadata={"doc": "gradient synchronisation once per iteration: all-reduce, or reduce-scatter + all-gather with ZeRO"}
    )
    memory: StageMemory
    memory_total_bytes: int
    memory_cap_bytes: int
    replicas: int = field(
        default=1, metadata={"doc": "copies of this stage inside one pipeline; micro-batch m runs on copy m mod replicas"}
    )

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"stage {self.stage_idx}: replicas must be >= 1 (got {self.replicas})")
        if not 0 <= self.layer_start < self.layer_stop:
            raise ValueError(f"stage {self.stage_idx}: layer range [{self.layer_start}, {self.layer_stop}) is empty")
        if len(self.layer_names) != self.layer_stop - self.layer_start:
            raise ValueError(f"stage {self.stage_idx}: layer_names does not match the layer range")
        if not self.ranks:
            raise ValueError(f"stage {self.stage_idx}: no ranks")
        if any(not self.layer_start <= i < self.layer_stop for i in self.recompute):
            raise ValueError(f"stage {self.stage_idx}: recompute lists a layer outside the stage")


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    iteration_ms: float
    throughput_samples_per_s: float
    peak_memory_bytes: int
    bubble_fraction: float
    exposed_allreduce_ms: float
    partition_bound_ms: float = field(
        metadata={"doc": "no schedule of this plan's own stages, recompute and communication runs faster"}
    )
    machine_bound_ms: float = field(
        default=0.0,
        metadata={"doc": "no plan of any kind runs faster on these devices: global batch x the fastest per-sample "
                         "forward + backward of the profile / devices (0 = unknown)"},
    )
    model_flops_per_iteration: float = field(
        default=0.0, metadata={"doc": "model FLOPs of one iteration (transformer profiles; 0 = unknown)"}
    )
    achieved_tflops_per_device: float = field(default=0.0, metadata={"doc": "model FLOPs / iteration time / devices"})
    device_peak_tflops: float = field(default=0.0, metadata={"doc": "the cluster's peak per device used for MFU (0 = unknown)"})
    mfu: float = field(default=0.0, metadata={"doc": "model FLOPs utilisation: achieved / device_peak_tflops (0 = unknown)"})
    me_index: float = field(default=0.0, metadata={"doc": "against the reference plan named in me_reference; 0 if none"})
    me_reference: str = ""
    all_devices_ms: float = field(
        default=0.0,
        metadata={"doc": "when the plan uses fewer devices than devices_available: the iteration time of the best "
                         "plan the solver found on all of them (0 = none fits on all, or the plan uses them all)"},
    )

    @classmethod
    def unset(cls, peak_memory_bytes: int = 0) -> "Prediction":
        """Zeros, for a plan whose predictions are still to be made (or not needed)."""
        return cls(
            iteration_ms=0.0,
            throughput_samples_per_s=0.0,
            peak_memory_bytes=peak_memory_bytes,
            bubble_fraction=0.0,
            exposed_allreduce_ms=0.0,
            partition_bound_ms=0.0,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ParetoPoint:
    iteration_ms: float
    peak_memory_bytes: int
    num_stages: int
    dp_degree: int
    microbatch_size: int
    schedule: ScheduleKind
    num_recomputed_layers: int
    zero: int = 0
    stage_replicas: tuple[int, ...] = ()
    tp_degree: int = 1
    sequence_parallel: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Provenance:
    model: str
    profile_sha256: str
    cluster_name: str
    cluster_sha256: str
    planner_version: str
    solver: str
    request: PlanRequest
    fingerprint_sha256: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    provenance: Provenance
    num_stages: int
    dp_degree: int
    num_microbatches: int
    microbatch_size: int
    global_batch: int
    schedule: ScheduleKind
    virtual_stages_per_rank: int = 1
    zero: int = field(default=0, metadata={"doc": "ZeRO stage: 0, 1 (optimizer state sharded) or 2 (and gradients)"})
    tp_degree: int = field(default=1, metadata={"doc": "tensor-parallel devices per stage replica (t)"})
    sequence_parallel: bool = field(
        default=False, metadata={"doc": "activations outside the tensor-parallel matmuls split along the sequence"}
    )
    dtype: str = field(default="", metadata={"doc": "the profile's dtype the plan was priced for (\"\" = unknown)"})
    optimizer: str = field(default="", metadata={"doc": "the optimizer the plan's memory was priced for (\"\" = unknown)"})
    devices_available: int = field(
        default=0,
        metadata={"doc": "devices the solver had (0 = unknown: an older plan, or one priced outside a search); the "
                         "plan occupies num_devices of them, fewer only when that is faster (or better by the "
                         "objective) than any plan found on all"},
    )
    stages: tuple[PlanStage, ...]
    predicted: Prediction
    pareto: tuple[ParetoPoint, ...] = ()

    def __post_init__(self) -> None:
        if len(self.stages) != self.num_stages:
            raise ValueError(f"num_stages is {self.num_stages} but {len(self.stages)} stages are listed")
        if self.zero not in ZERO_STAGES:
            raise ValueError(f"zero must be one of {list(ZERO_STAGES)} (got {self.zero})")
        if self.tp_degree < 1:
            raise ValueError(f"tp_degree must be >= 1 (got {self.tp_degree})")
        if self.sequence_parallel and self.tp_degree == 1:
            raise ValueError("sequence_parallel needs tp_degree > 1")
        if self.devices_available < 0:
            raise ValueError(f"devices_available must be >= 0 (got {self.devices_available})")
        for stage in self.stages:
            if stage.replicas > 1 and self.virtual_stages_per_rank > 1:
                raise ValueError(f"stage {stage.stage_idx}: per-stage replication needs one stage per rank")
            if self.num_microbatches % stage.replicas:
                raise ValueError(
                    f"stage {stage.stage_idx}: num_microbatches {self.num_microbatches} is not a multiple of "
                    f"its replicas ({stage.replicas})"
                )
            if len(stage.ranks) != self.dp_degree * stage.replicas * self.tp_degree:
                raise ValueError(
                    f"stage {stage.stage_idx}: {len(stage.ranks)} ranks, expected dp_degree x replicas x tp_degree = "
                    f"{self.dp_degree} x {stage.replicas} x {self.tp_degree}"
                )
        if self.num_microbatches * self.microbatch_size * self.dp_degree != self.global_batch:
            raise ValueError(
                f"num_microbatches x microbatch_size x dp_degree = "
                f"{self.num_microbatches} x {self.microbatch_size} x {self.dp_degree} != global_batch {self.global_batch}"
            )
        for prev, stage in zip(self.stages, self.stages[1:]):
            if stage.layer_start != prev.layer_stop:
                raise ValueError(f"stage {stage.stage_idx} starts at layer {stage.layer_start}, not {prev.layer_stop}")
        if self.stages and self.stages[0].layer_start != 0:
            raise ValueError("the first stage must start at layer 0")

    @property
    def num_devices(self) -> int:
        return len({r for stage in self.stages for r in stage.ranks})

    @property
    def stage_replicas(self) -> tuple[int, ...]:
        """Each stage's copies inside one pipeline (all 1 unless replicated per stage)."""
        return tuple(stage.replicas for stage in self.stages)

    @property
    def replicated_per_stage(self) -> bool:
        return any(r > 1 for r in self.stage_replicas)

    @property
    def num_layers(self) -> int:
        return self.stages[-1].layer_stop


def load_plan(path: str | Path) -> Plan:
    return plan_from_json(codec.read_json(path), str(path))


def plan_from_json(data: Any, source: str = "<plan>") -> Plan:
    if isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("version") == 1:
        data = _upgrade_v1(data)
    if isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("version") == 2:
        data = dict(data, version=VERSION)  # v3 only added fields with defaults
    return codec.decode_document(Plan, data, SCHEMA, VERSION, source)


def _upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 plan as version 2: ``lower_bound_ms`` was the partition bound."""
    out = dict(data, version=2)
    pred = out.get("predicted")
    if isinstance(pred, dict) and "lower_bound_ms" in pred:
        pred = dict(pred)
        pred["partition_bound_ms"] = pred.pop("lower_bound_ms")
        out["predicted"] = pred
    return out


def plan_to_json(plan: Plan) -> dict[str, Any]:
    return codec.encode_document(plan, SCHEMA, VERSION)


def dumps_plan(plan: Plan) -> str:
    return codec.dumps_canonical(plan_to_json(plan))


def save_plan(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(dumps_plan(plan))
