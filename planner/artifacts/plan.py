"""The Plan artifact: stages, replication, micro-batching, schedule and predictions.

Rank placement: rank = pipeline rank x dp_degree + replica; with one stage per rank the
pipeline rank is the stage index; for interleaved schedules (``virtual_stages_per_rank`` = v)
there are R = num_stages / v pipeline ranks and rank p holds stages p, p + R, p + 2R, ...

Times in ``PlanStage`` are per micro-batch except ``allreduce_ms`` (once per iteration).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner import codec
from planner.artifacts.request import PlanRequest, ScheduleKind

SCHEMA = "planner.plan"
VERSION = 1


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
    allreduce_ms: float
    memory: StageMemory
    memory_total_bytes: int
    memory_cap_bytes: int

    def __post_init__(self) -> None:
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
    lower_bound_ms: float
    me_index: float = field(default=0.0, metadata={"doc": "against the reference plan named in me_reference; 0 if none"})
    me_reference: str = ""

    @classmethod
    def unset(cls, peak_memory_bytes: int = 0) -> "Prediction":
        """Zeros, for a plan whose predictions are still to be made (or not needed)."""
        return cls(
            iteration_ms=0.0,
            throughput_samples_per_s=0.0,
            peak_memory_bytes=peak_memory_bytes,
            bubble_fraction=0.0,
            exposed_allreduce_ms=0.0,
            lower_bound_ms=0.0,
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
    stages: tuple[PlanStage, ...]
    predicted: Prediction
    pareto: tuple[ParetoPoint, ...] = ()

    def __post_init__(self) -> None:
        if len(self.stages) != self.num_stages:
            raise ValueError(f"num_stages is {self.num_stages} but {len(self.stages)} stages are listed")
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
        return self.num_stages * self.dp_degree // self.virtual_stages_per_rank

    @property
    def num_layers(self) -> int:
        return self.stages[-1].layer_stop


def load_plan(path: str | Path) -> Plan:
    return plan_from_json(codec.read_json(path), str(path))


def plan_from_json(data: Any, source: str = "<plan>") -> Plan:
    return codec.decode_document(Plan, data, SCHEMA, VERSION, source)


def plan_to_json(plan: Plan) -> dict[str, Any]:
    return codec.encode_document(plan, SCHEMA, VERSION)


def dumps_plan(plan: Plan) -> str:
    return codec.dumps_canonical(plan_to_json(plan))


def save_plan(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(dumps_plan(plan))
