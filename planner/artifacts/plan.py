"""The Plan artifact: stages, micro-batching, schedule and predictions, under a Layout.

The plan's parallel dimensions (pipeline stages and chunks per rank, replicated pipelines,
per-stage copies, tensor parallelism, ZeRO) are one :class:`~planner.artifacts.layout.Layout`
(``Plan.layout``), which also places the ranks. Each stage lists its own ``ranks`` and
``replicas`` for the reader; they must be the layout's (checked on construction and load).

Data parallelism in two kinds, which compose: ``dp_degree`` = D replicated pipelines split the
global batch into D contiguous parts, each run as ``num_microbatches`` micro-batches; a stage
replicated per stage runs micro-batch ``m`` on its copy ``m mod R_s`` (``num_microbatches``
is then global and a multiple of every R_s). A stage's gradients are synchronised over its
D x R_s devices of each tensor-parallel shard: an all-reduce, or with ZeRO 1 and 2 a
reduce-scatter of the gradients and an all-gather of the updated weights (``allreduce_ms``
holds whichever the plan does; ZeRO 2 reduce-scatters every micro-batch's gradients and keeps
1/n of them at the peak, see :mod:`planner.cost.sharding`).

``dtype`` and ``optimizer`` record what the plan's memory was priced for (the profile's dtype
and the request's optimizer), so that a run with other settings can be told apart; None
(``""`` in the file) when unknown.

The file keeps the layout's degrees at its top level (``num_stages``, ``dp_degree``,
``virtual_stages_per_rank``, ``zero``, ``tp_degree``, ``sequence_parallel``; per-stage copies in
each stage's ``replicas``), as version 3 wrote them before the Layout existed: files are
unchanged by it. The layout's ``placement`` is not written: the schedule implies it
(:attr:`ScheduleKind.placement`: a V for ``zbv``, round-robin otherwise), and the plan checks
that its layout's is the schedule's. ``cp_degree`` (context parallelism) is written only when
> 1, so a file without it is a plan with cp 1 and every plan without context parallelism reads
and writes the same bytes as before the field (no new version); so are ``ep_degree`` and
``etp_degree`` (the routed experts' layout, :class:`~planner.artifacts.layout.Layout`), and each
stage's ``alltoall_ms`` (its mixture-of-experts dispatch and combine, part of its times).

Times in ``PlanStage`` are per micro-batch except ``allreduce_ms`` (once per iteration).

Version 4 added ``stack``, the training stack the plan was priced for (what it
overlaps: :mod:`planner.artifacts.stack`), also in the request, and per stage ``sync_early_ms``,
``gather_ahead_ms`` and ``gather_bound_ms`` (when the synchronisation runs under that stack);
older files are read as priced for the ``none`` stack (nothing overlapped beyond the
pipeline), which is what they were, with those three 0. Version 4 also added each stage's
``recompute_selective`` (the layers whose attention core is recomputed, Korthikanti et al.
2022 sec. 4, beside ``recompute``, the fully recomputed ones); older files are read with none.

Version 6 (this one) added to ``predicted`` the ``straggler_fraction`` (the share of the
iteration the job's slowest GPU adds to the simulated replay), the ``overheads`` (the named
overhead terms priced in the iteration, each with its source: :mod:`planner.cost.overheads`)
and the ``band`` (the iteration's range from its inputs' uncertainty and the peak memory at its
top: :mod:`planner.cost.band`). Version-5 files are read with none of them (what they were).

Version 5 added each stage's ``optimizer_ms``, the optimizer step of one of its
devices (:mod:`planner.cost.sharding`), which the simulator runs after the stage's gradient
synchronisation; version-4 files are read with 0 (not priced, which is what they were).

Version 2 renamed ``predicted.lower_bound_ms`` to ``partition_bound_ms`` and added
``machine_bound_ms``, the FLOP figures, ``zero`` and ``replicas``; version-1 files are read
and upgraded (their machine bound is left 0: unknown without the profile). Version 3 added
``tp_degree``, ``sequence_parallel``, ``dtype`` and ``optimizer``; version-2 files
are read as t = 1 with dtype and optimizer unknown ("").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.artifacts import codec
from planner.artifacts.consistency import check_plan
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.host import OffloadMode
from planner.artifacts.json_schema import document_schema
from planner.artifacts.kinds import DType, OptimizerKind, Precision, RecomputeLevel, ScheduleKind
from planner.artifacts.layout import Layout
from planner.artifacts.limits import (
    MAX_BATCH,
    MAX_BYTES,
    MAX_DEVICES,
    MAX_LAYERS,
    MAX_MS,
    check_count,
    check_fields,
    check_name,
    first_duplicate,
)
from planner.artifacts.plan_summary import ParetoPoint, Prediction, Provenance
from planner.artifacts.plan_upgrade import upgrade_v1, upgrade_v3
from planner.artifacts.stack import DEFAULT_STACK, Stack

SCHEMA = "planner.plan"
VERSION = 6


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMemory:
    """Peak memory of one device of a stage, by kind (bytes)."""

    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    recompute_workspace_bytes: int
    buffer_bytes: int

    def __post_init__(self) -> None:
        check_fields(self, 0, MAX_BYTES, "param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes",
                     "recompute_workspace_bytes", "buffer_bytes")

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
    recompute_selective: tuple[int, ...] = field(
        default=(),
        metadata={"doc": "layer indices whose attention core (QK^T, softmax, dropout, attention over V) is recomputed "
                         "in backward (selective recomputation); disjoint from recompute"},
    )
    sync_early_ms: float = field(
        default=0.0,
        metadata={"doc": "how long before the stage's last backward ends its gradient reduction may start (buckets "
                         "overlapping that backward, when the stack does so); 0: it starts at the end"},
    )
    gather_ahead_ms: float = field(
        default=0.0,
        metadata={"doc": "of allreduce_ms, ZeRO's all-gather of the weights run ahead of the next iteration's forward "
                         "(when the stack does so); 0: it follows the reduction"},
    )
    gather_bound_ms: float = field(
        default=0.0,
        metadata={"doc": "with gather_ahead_ms: the earliest end of the stage's first forward after that gather starts"},
    )
    wgrad_ms: float = field(
        default=0.0,
        metadata={"doc": "of bwd_ms, the weight-gradient pass W a zero-bubble schedule runs apart from the input-gradient "
                         "pass (Qi et al. 2024); 0 unless the plan's schedule splits the backward"},
    )
    optimizer_ms: float = field(
        default=0.0,
        metadata={"doc": "one device's optimizer step per iteration over the parameters whose state it holds "
                         "(memory-bound: bytes streamed / the device's memory bandwidth); 0: not priced"},
    )
    wgrad_bytes_per_microbatch: int = field(
        default=0,
        metadata={"doc": "of activation_bytes_per_microbatch, what one micro-batch keeps from the end of its input-gradient "
                         "pass until its W runs (its weight GEMMs' inputs); 0 unless the schedule splits the backward"},
    )
    alltoall_ms: float = field(
        default=0.0,
        metadata={"doc": "of fwd_ms + bwd_ms, the mixture-of-experts token dispatch and combine (all-to-all) on the "
                         "critical path, per micro-batch (absent when 0: no routed experts)", "omit_if_default": True},
    )
    offload_layers: tuple[int, ...] = field(default=(), metadata={"omit_if_default": True, "doc": "layers whose saved "
        "activations go to the host after their forward, back before their backward (planner.cost.offload; the copies' "
        "exposed part in bwd_ms) (absent when none)"})
    host_memory_bytes: int = field(default=0, metadata={"omit_if_default": True, "doc": "host memory of one device: "
        "offloaded optimizer state, master weights and activations of its micro-batches in flight (absent when 0)"})

    def __post_init__(self) -> None:
        check_count("stage_idx", self.stage_idx, 0, MAX_LAYERS)
        check_count("host_memory_bytes", self.host_memory_bytes, 0, MAX_BYTES)
        if any(not self.layer_start <= i < self.layer_stop for i in self.offload_layers):
            raise ValueError(f"stage {self.stage_idx}: offload_layers lists a layer outside the stage")
        check_fields(self, 0, MAX_MS, "wgrad_ms")
        check_fields(self, 0, MAX_BYTES, "wgrad_bytes_per_microbatch")
        if self.wgrad_ms > self.bwd_ms * (1 + 1e-9) + 1e-12:
            raise ValueError(f"stage {self.stage_idx}: wgrad_ms {self.wgrad_ms} exceeds bwd_ms {self.bwd_ms}")
        if self.replicas < 1:
            raise ValueError(f"stage {self.stage_idx}: replicas must be >= 1 (got {self.replicas})")
        check_count("replicas", self.replicas, 1, MAX_DEVICES)
        check_fields(self, 0, MAX_LAYERS, "layer_start", "layer_stop")
        check_count("inflight_microbatches", self.inflight_microbatches, 0, MAX_BATCH)
        check_fields(self, 0, MAX_MS, "fwd_ms", "bwd_ms", "recompute_ms", "send_fwd_ms", "send_bwd_ms", "allreduce_ms")
        check_fields(self, 0, MAX_MS, "sync_early_ms", "gather_ahead_ms", "gather_bound_ms", "optimizer_ms", "alltoall_ms")
        check_fields(self, 0, MAX_BYTES, "activation_bytes_per_microbatch", "memory_total_bytes", "memory_cap_bytes")
        for name in self.layer_names:
            check_name(f"stage {self.stage_idx}: layer name", name)
        ranks = self.ranks
        if not (ranks and all(type(r) is int for r in ranks) and min(ranks) >= 0 and max(ranks) < MAX_DEVICES):
            for rank in ranks:  # the first bad one named (a plan of 16,384 devices lists them all)
                check_count("ranks[*]", rank, 0, MAX_DEVICES - 1)
        if not 0 <= self.layer_start < self.layer_stop:
            raise ValueError(f"stage {self.stage_idx}: layer range [{self.layer_start}, {self.layer_stop}) is empty")
        if len(self.layer_names) != self.layer_stop - self.layer_start:
            raise ValueError(f"stage {self.stage_idx}: layer_names does not match the layer range")
        if not self.ranks:
            raise ValueError(f"stage {self.stage_idx}: no ranks")
        if any(not self.layer_start <= i < self.layer_stop for i in self.recompute):
            raise ValueError(f"stage {self.stage_idx}: recompute lists a layer outside the stage")
        if len(set(self.recompute)) != len(self.recompute):
            raise ValueError(f"stage {self.stage_idx}: recompute lists a layer twice")
        if any(not self.layer_start <= i < self.layer_stop for i in self.recompute_selective):
            raise ValueError(f"stage {self.stage_idx}: recompute_selective lists a layer outside the stage")
        if len(set(self.recompute_selective)) != len(self.recompute_selective):
            raise ValueError(f"stage {self.stage_idx}: recompute_selective lists a layer twice")
        both = set(self.recompute) & set(self.recompute_selective)
        if both:
            raise ValueError(f"stage {self.stage_idx}: layer {min(both)} is in both recompute and recompute_selective")

    def recompute_level(self, layer_idx: int) -> RecomputeLevel:
        """How layer ``layer_idx`` of this stage is recomputed in backward."""
        if layer_idx in self.recompute:
            return RecomputeLevel.FULL
        return RecomputeLevel.SELECTIVE if layer_idx in self.recompute_selective else RecomputeLevel.NONE
        if not 0.0 <= self.gather_ahead_ms <= self.allreduce_ms + 1e-9 or self.sync_early_ms < 0 or self.gather_bound_ms < 0:
            raise ValueError(
                f"stage {self.stage_idx}: sync_early_ms {self.sync_early_ms}, gather_ahead_ms {self.gather_ahead_ms} and "
                f"gather_bound_ms {self.gather_bound_ms} must be >= 0, gather_ahead_ms at most allreduce_ms {self.allreduce_ms}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    provenance: Provenance
    layout: Layout
    num_microbatches: int
    microbatch_size: int
    global_batch: int
    schedule: ScheduleKind
    dtype: DType | None = field(default=None, metadata={"doc": "the profile's dtype the plan was priced for (None = unknown)"})
    optimizer: OptimizerKind | None = field(
        default=None, metadata={"doc": "the optimizer the plan's memory was priced for (None = unknown)"}
    )
    precision: Precision = field(default=Precision.BF16, metadata={"doc": "the blocks' linear layers' arithmetic "
                                 "it was priced for (planner.cost.precision) (absent when bf16)", "omit_if_default": True})
    devices_available: int = field(
        default=0,
        metadata={"doc": "devices the solver had (0 = unknown: an older plan, or one priced outside a search); the "
                         "plan occupies num_devices of them, fewer only when that is faster (or better by the "
                         "objective) than any plan found on all"},
    )
    stack: Stack = field(
        default=DEFAULT_STACK,
        metadata={"doc": "the training stack the plan was priced for: what it overlaps (planner.artifacts.stack)"},
    )
    offload: OffloadMode = field(default=OffloadMode.NONE, metadata={"omit_if_default": True, "doc": "what the plan "
        "keeps on the host: optimizer (state, master weights, step), activations (offload_layers), both (absent: none)"})
    stages: tuple[PlanStage, ...]
    predicted: Prediction
    pareto: tuple[ParetoPoint, ...] = ()

    def __post_init__(self) -> None:
        lay = self.layout
        check_fields(self, 1, MAX_BATCH, "global_batch", "num_microbatches", "microbatch_size")
        if OffloadMode(self.offload) is OffloadMode.AUTO:
            raise ValueError("offload: a plan records what it offloads (none, optimizer, activations, both), not auto")
        check_count("devices_available", self.devices_available, 0, MAX_DEVICES)
        check_fields(lay, 1, MAX_DEVICES, "num_stages", "dp_degree", "tp_degree", "cp_degree", "virtual_stages_per_rank",
                     "ep_degree", "etp_degree")
        if len(self.stages) != lay.num_stages:
            raise ValueError(f"num_stages is {lay.num_stages} but {len(self.stages)} stages are listed")
        if lay.placement is not self.schedule.placement:
            raise ValueError(
                f"schedule {self.schedule.value} places chunks {self.schedule.placement.value}, "
                f"the layout {lay.placement.value}"
            )
        if self.devices_available < 0:
            raise ValueError(f"devices_available must be >= 0 (got {self.devices_available})")
        for s, stage in enumerate(self.stages):
            if stage.stage_idx != s:
                raise ValueError(f"stage {s} is listed as stage_idx {stage.stage_idx}")
            if stage.replicas != lay.replicas_of(s):
                raise ValueError(f"stage {s}: replicas {stage.replicas}, the layout has {lay.replicas_of(s)}")
            if self.num_microbatches % stage.replicas:
                raise ValueError(
                    f"stage {s}: num_microbatches {self.num_microbatches} is not a multiple of its replicas ({stage.replicas})"
                )
            if len(stage.ranks) != lay.dp_degree * stage.replicas * lay.cp_degree * lay.tp_degree:
                raise ValueError(
                    f"stage {s}: {len(stage.ranks)} ranks, expected dp_degree x replicas x cp_degree x tp_degree = "
                    f"{lay.dp_degree} x {stage.replicas} x {lay.cp_degree} x {lay.tp_degree}"
                )
            if tuple(stage.ranks) != lay.stage_ranks(s):
                raise ValueError(f"stage {s}: ranks {list(stage.ranks)} differ from the layout's {list(lay.stage_ranks(s))}")
        if self.num_microbatches * self.microbatch_size * lay.dp_degree != self.global_batch:
            raise ValueError(
                f"num_microbatches x microbatch_size x dp_degree = "
                f"{self.num_microbatches} x {self.microbatch_size} x {lay.dp_degree} != global_batch {self.global_batch}"
            )
        for prev, stage in zip(self.stages, self.stages[1:]):
            if stage.layer_start != prev.layer_stop:
                raise ValueError(f"stage {stage.stage_idx} starts at layer {stage.layer_start}, not {prev.layer_stop}")
        if self.stages and self.stages[0].layer_start != 0:
            raise ValueError("the first stage must start at layer 0")
        dup = first_duplicate(n for stage in self.stages for n in stage.layer_names)
        if dup is not None:
            raise ValueError(f"layer name {dup!r} appears twice (in more than one stage, or twice in one)")

    @property
    def num_devices(self) -> int:
        """Devices the plan occupies (its layout's world size)."""
        return self.layout.world_size

    @property
    def num_layers(self) -> int:
        return self.stages[-1].layer_stop


#: the layout's fields as version 3 to 6 files hold them, at the top level (stage_replicas: in stages)
_LAYOUT_KEYS = ("num_stages", "dp_degree", "virtual_stages_per_rank", "zero", "tp_degree", "sequence_parallel", "cp_degree",
                "ep_degree", "etp_degree", "shard_group_size")
#: layout keys a version-3 to -6 file must have (the others have defaults)
_REQUIRED_LAYOUT_KEYS = ("num_stages", "dp_degree")
#: the top-level keys of a version-6 file, in order
_WIRE_ORDER = (
    "provenance", "num_stages", "dp_degree", "num_microbatches", "microbatch_size", "global_batch", "schedule",
    "virtual_stages_per_rank", "zero", "tp_degree", "sequence_parallel", "cp_degree", "ep_degree", "etp_degree", "shard_group_size",
    "dtype",
    "optimizer", "precision", "offload",
    "devices_available", "stack", "stages", "predicted", "pareto",
)


def load_plan(path: str | Path) -> Plan:
    return plan_from_json(codec.read_json(path), str(path))


def plan_from_json(data: Any, source: str = "<plan>") -> Plan:
    if codec.is_version(data, SCHEMA, 1):
        data = upgrade_v1(data)
    if codec.is_version(data, SCHEMA, 2):
        data = dict(data, version=3)  # v3 only added fields with defaults
    if codec.is_version(data, SCHEMA, 3):
        data = upgrade_v3(data)
    if codec.is_version(data, SCHEMA, 4):
        data = dict(data, version=5)  # v5 only added a field with a default
    if codec.is_version(data, SCHEMA, 5):
        data = dict(data, version=VERSION)  # v6 only added fields with defaults
    if codec.is_version(data, SCHEMA, VERSION):
        missing = [k for k in _REQUIRED_LAYOUT_KEYS if k not in data]
        if missing:
            raise PlannerInputError(f"{source}: {missing[0]}: missing required field")
        try:
            data = _nested(data)
        except PlannerInputError as exc:
            raise PlannerInputError(f"{source}: {exc}") from None
    stages = data.get("layout", {}).get("num_stages") if isinstance(data, dict) and isinstance(data.get("layout"), dict) else None
    if isinstance(data, dict) and isinstance(data.get("stages"), list) and type(stages) is int and len(data["stages"]) != stages:
        raise PlannerInputError(f"{source}: num_stages is {stages} but {len(data['stages']):,} stages are listed")
    try:
        plan = codec.decode_document(Plan, data, SCHEMA, VERSION, source)
        check_plan(plan)
    except PlannerInputError as exc:
        raise PlannerInputError(_wire_path(str(exc))) from None
    except ValueError as exc:
        raise PlannerInputError(f"{source}: {exc}") from None
    return plan


def _nested(data: dict[str, Any]) -> dict[str, Any]:
    """A file's flat layout keys gathered into the ``layout`` field (the stages' copies into
    ``stage_replicas``), and ``""`` (unknown dtype or optimizer) read as None."""
    out = {k: v for k, v in data.items() if k not in _LAYOUT_KEYS}
    layout = {k: data[k] for k in _LAYOUT_KEYS if k in data}
    stages = data.get("stages")
    if isinstance(stages, list) and all(isinstance(st, dict) for st in stages):
        replicas = [st.get("replicas", 1) for st in stages]
        if any(r != 1 for r in replicas):
            layout["stage_replicas"] = replicas
    if isinstance(data.get("schedule"), str) and data["schedule"] in {k.value for k in ScheduleKind}:
        layout["placement"] = ScheduleKind(data["schedule"]).placement.value  # implied by the schedule
    out["layout"] = layout
    for key in ("dtype", "optimizer"):
        if key in out and out[key] is None:  # the file says "" for unknown; null is not the format
            raise PlannerInputError(f"{key}: must be a {key} name, or \"\" for unknown (got null)")
        if out.get(key) == "":
            out[key] = None
    return out


def _wire_path(message: str) -> str:
    """An error about the ``layout`` field as the file's own field path names it."""
    return message.replace(": layout.stage_replicas", ": stages[*].replicas").replace(": layout.", ": ").replace(
        ": layout: ", ": <document>: "
    )


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The version-6 document: the layout's degrees at the top level (see the module docstring)."""
    body = codec.encode(plan)
    layout = body.pop("layout")
    body.update({k: layout[k] for k in _LAYOUT_KEYS if k in layout})  # placement: implied; cp_degree: if > 1
    body["dtype"] = body["dtype"] or ""
    body["optimizer"] = body["optimizer"] or ""
    return {"schema": SCHEMA, "version": VERSION, **{k: body[k] for k in _WIRE_ORDER if k in body}}


def plan_schema() -> dict[str, Any]:
    """The JSON Schema of a version-6 file (the layout's fields at the top level)."""
    doc = document_schema(Plan, SCHEMA, VERSION)
    props = doc["properties"]
    layout = doc["$defs"].pop("Layout")
    for key in ("dtype", "optimizer"):
        props[key] = {**props[key], "anyOf": [a for a in props[key]["anyOf"] if a != {"type": "null"}] + [{"const": ""}]}
    wire = {"schema": props["schema"], "version": props["version"]}
    for key in _WIRE_ORDER:
        wire[key] = layout["properties"][key] if key in _LAYOUT_KEYS else props[key]
    doc["properties"] = wire
    doc["required"] = ["schema", "version"] + [
        k for k in _WIRE_ORDER if k in doc["required"] or k in _REQUIRED_LAYOUT_KEYS
    ]
    return doc


def dumps_plan(plan: Plan) -> str:
    return codec.dumps_canonical(plan_to_json(plan))


def save_plan(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(dumps_plan(plan))
