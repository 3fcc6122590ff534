"""The RunReport artifact: what the runtime measured, beside what the plan predicted.

Written by rank 0 of ``python -m planner.runtime`` (see ``planner/runtime``). Every measured
figure that the plan also predicts sits next to the prediction and the relative error
``(measured - predicted) / predicted`` (0 when nothing was predicted).

Emulated runs (``emulate``) record how far each stage's actions ran past their profiled times
(``StageRecord.overrun_ms`` ...): emulation sleeps to the profiled time and cannot shorten an
action whose real work took longer. A run whose stages overran by more than
``OVERRUN_LIMIT`` (5%) of their emulated compute is flagged (``fidelity_sample`` False):
its times measure the machine's load, not the cost model. (Fields added in place: version-1
files written before them load with 0 overruns and ``fidelity_sample`` False.) Version 2 holds
the plan's parallel dimensions as one ``layout``
(:class:`~planner.artifacts.layout.Layout`); version-1 files, which had them at the top level,
are read and upgraded. Version 3 added the per-micro-batch memory of each stage and the
allocator's measurement beside the hooks' (version-1 and -2 files load without them: 0, and
-1 for "not measured").

Times are wall-clock milliseconds. ``compute_ms`` of a stage is the time its ranks spent
inside forward and backward of their micro-batches in one iteration (mean over measured
steps, max over the stage's replicas); ``idle_ms`` is the rest of the iteration (waiting
for peers, communication, optimizer). ``saved_bytes_peak`` is the peak over the iteration
of the bytes saved for backward (``torch.autograd.graph.saved_tensors_hooks``, once per
storage, parameters and buffers excluded; a recomputed layer counts the inputs it keeps, a
selectively recomputed one its saved bytes less its attention core's).

Memory per micro-batch, measured two independent ways (``planner.runtime.memory``):
``saved_bytes_per_microbatch`` is the hooks' count of what one micro-batch's forward saves
(the largest over the metered step; inputs included), beside the plan's
``activation_bytes_per_microbatch``; ``allocator_bytes_per_microbatch`` is the allocator's own
count (CPU: ``torch.profiler`` memory events; GPU: ``torch.cuda.memory_allocated``) of the bytes
a forward left allocated, its output excepted, beside ``allocator_hook_bytes_per_microbatch``,
the hooks' count of the same storages (the saved storages the forward created).

Model state per rank: ``optimizer_state_bytes`` is the bytes of the tensors in the rank's
optimizer state (after its steps), ``grad_bytes_after_sync`` the bytes of gradient storage
the rank holds after the gradient synchronisation; both max over the stage's ranks. Their
predictions use the runtime's optimizer, not the plan's optimizer kind (which the runtime
does not run): the plan's parameters of the stage (``param_bytes`` / the plan's weight bytes
per parameter) x ``RunReport.optimizer_state_bytes_per_param`` / ``optimizer_shards``, and x
the runtime's element size (/ ``optimizer_shards`` with ZeRO 2) for gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.artifacts import codec
from planner.artifacts.consistency import check_report
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.files import atomic_write_text
from planner.artifacts.kinds import DType, OptimizerFamily, ScheduleKind
from planner.artifacts.layout import Layout
from planner.artifacts.limits import (
    MAX_BATCH,
    MAX_BYTES,
    MAX_DEVICES,
    MAX_LOSS,
    MAX_MS,
    check_count,
    check_name,
    check_range,
)

SCHEMA = "planner.runreport"
VERSION = 3


#: an emulated run whose stages overran their profiled compute by more than this fraction is not
#: a valid fidelity sample (the emulation could not keep the profiled times; e.g. the CPU was busy)
OVERRUN_LIMIT = 0.05


def overrun_warning(report: RunReport) -> str:
    """One line when an emulated run overran (not a valid fidelity sample); "" otherwise."""
    if not report.emulate or report.fidelity_sample:
        return ""
    worst = max(report.stages, key=lambda s: s.overrun_fraction)
    return (
        f"warning: emulated compute overran its profiled time by {100 * worst.overrun_fraction:.1f}% on stage "
        f"{worst.stage_idx} ({worst.overrun_ms:.2f} ms per iteration, {worst.overrun_max_ms:.2f} ms at most in one action; "
        f"limit {100 * OVERRUN_LIMIT:.0f}%): not a valid fidelity sample"
    )


def relative_error(measured: float, predicted: float) -> float:
    """``(measured - predicted) / predicted``; 0 when there is no prediction."""
    return (measured - predicted) / predicted if predicted else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One training iteration: the mean loss over the global batch and its wall time."""

    step_idx: int
    loss: float
    wall_ms: float

    def __post_init__(self) -> None:
        check_count("step_idx", self.step_idx, 0, 2**40)
        check_range("loss", self.loss, 0, MAX_LOSS)
        check_range("wall_ms", self.wall_ms, 0, MAX_MS)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageRecord:
    """One pipeline stage, measured (over its replicas) beside the plan's predictions."""

    stage_idx: int
    ranks: tuple[int, ...]
    compute_ms: float
    idle_ms: float
    compute_ms_predicted: float = field(metadata={"doc": "M x (fwd + bwd + recompute) from the plan"})
    compute_rel_error: float
    saved_bytes_peak: int
    activation_bytes_predicted: int = field(
        metadata={"doc": "activation_bytes_per_microbatch x inflight_microbatches from the plan"}
    )
    activation_rel_error: float
    cuda_peak_bytes: int = field(default=0, metadata={"doc": "torch.cuda.max_memory_allocated; 0 on CPU"})
    memory_total_bytes_predicted: int = 0
    memory_rel_error: float = 0.0
    optimizer_shards: int = field(default=1, metadata={"doc": "ranks the optimizer state is sharded over (ZeRO >= 1), else 1"})
    optimizer_state_bytes: int = field(default=0, metadata={"doc": "optimizer state tensors on one rank"})
    optimizer_state_bytes_predicted: int = field(
        default=0, metadata={"doc": "plan's stage parameters / optimizer_shards x the runtime optimizer's state bytes per parameter"}
    )
    optimizer_state_rel_error: float = 0.0
    grad_bytes_after_sync: int = field(default=0, metadata={"doc": "gradient storage one rank holds after the sync"})
    grad_bytes_predicted: int = field(
        default=0, metadata={"doc": "plan's stage parameters x the runtime's element size (/ optimizer_shards with ZeRO 2)"}
    )
    grad_rel_error: float = 0.0
    overrun_ms: float = field(
        default=0.0,
        metadata={"doc": "emulated compute: ms per iteration by which the stage's actions ran past their profiled "
                         "times (summed over its forward and backward chunks; the rank that overran most); 0 without --emulate"},
    )
    overrun_max_ms: float = field(default=0.0, metadata={"doc": "emulated compute: the largest overrun of one action (ms)"})
    overrun_fraction: float = field(
        default=0.0, metadata={"doc": "overrun_ms / the stage's emulated compute ms per iteration (1 when that is 0)"}
    )
    saved_bytes_per_microbatch: int = field(
        default=0, metadata={"doc": "the hooks' bytes saved by one micro-batch's forward (once per storage, inputs included)"}
    )
    activation_bytes_per_microbatch_predicted: int = field(
        default=0, metadata={"doc": "the plan's activation_bytes_per_microbatch"}
    )
    microbatch_rel_error: float = 0.0
    allocator_bytes_per_microbatch: int = field(
        default=-1,
        metadata={"doc": "the allocator's bytes left allocated by one forward, its output excepted (CPU: torch.profiler "
                         "memory events, GPU: torch.cuda.memory_allocated); -1 = not measured"},
    )
    allocator_hook_bytes_per_microbatch: int = field(
        default=0, metadata={"doc": "the hooks' bytes of the storages the allocator counts (the saved storages a forward made)"}
    )
    allocator_rel_error: float = field(
        default=0.0, metadata={"doc": "(hooks - allocator) / allocator for the same storages; 0 when not measured"}
    )

    def __post_init__(self) -> None:
        check_count("stage_idx", self.stage_idx, 0, MAX_DEVICES)
        for rank in self.ranks:
            check_count("ranks[*]", rank, 0, MAX_DEVICES - 1)
        for name in ("compute_ms", "idle_ms", "compute_ms_predicted", "overrun_ms", "overrun_max_ms"):
            check_range(name, getattr(self, name), 0, MAX_MS)
        for name in ("saved_bytes_peak", "activation_bytes_predicted", "cuda_peak_bytes", "memory_total_bytes_predicted",
                     "optimizer_state_bytes", "optimizer_state_bytes_predicted", "grad_bytes_after_sync",
                     "grad_bytes_predicted", "saved_bytes_per_microbatch", "activation_bytes_per_microbatch_predicted",
                     "allocator_hook_bytes_per_microbatch"):
            check_count(name, getattr(self, name), 0, MAX_BYTES)
        check_range("allocator_bytes_per_microbatch", self.allocator_bytes_per_microbatch, -1, MAX_BYTES)  # -1: not measured
        for name in ("compute_rel_error", "activation_rel_error", "memory_rel_error", "optimizer_state_rel_error",
                     "grad_rel_error", "microbatch_rel_error", "allocator_rel_error"):  # (a - b) / b >= -1
            check_range(name, getattr(self, name), -1, MAX_MS)
        check_count("optimizer_shards", self.optimizer_shards, 1, MAX_DEVICES)
        check_range("overrun_fraction", self.overrun_fraction, 0, MAX_MS)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunReport:
    """Measured training run of a plan under the bundled runtime."""

    model: str
    plan_fingerprint_sha256: str
    world_size: int
    backend: str
    device: str
    dtype: DType
    optimizer: OptimizerFamily
    emulate: bool
    layout: Layout = field(metadata={"doc": "the plan's parallel dimensions, as run"})
    num_microbatches: int
    microbatch_size: int
    schedule: ScheduleKind
    optimizer_state_bytes_per_param: int = field(
        default=0, metadata={"doc": "the runtime optimizer's state per parameter element: AdamW 2 x element size, SGD 0"}
    )
    warmup_steps: int = field(metadata={"doc": "first steps left out of the timing summary"})
    steps: tuple[StepRecord, ...]
    stages: tuple[StageRecord, ...]
    iteration_ms: float = field(metadata={"doc": "median wall time of the measured steps"})
    iteration_ms_predicted: float
    iteration_rel_error: float
    versions: dict[str, str] = field(default_factory=dict)
    emulation_overrun_fraction: float = field(
        default=0.0, metadata={"doc": "the largest overrun_fraction of a stage (emulated runs; 0 otherwise)"}
    )
    fidelity_sample: bool = field(
        default=False,
        metadata={"doc": "a valid sample of the cost model's fidelity: emulated compute that overran its profiled "
                         "times by at most OVERRUN_LIMIT (5%) on every stage. False for real compute, for an emulated "
                         "run that overran, and in reports written before overruns were measured"},
    )

    def __post_init__(self) -> None:
        check_name("model", self.model)
        check_count("world_size", self.world_size, 1, MAX_DEVICES)
        check_count("num_microbatches", self.num_microbatches, 1, MAX_BATCH)
        check_count("microbatch_size", self.microbatch_size, 1, MAX_BATCH)
        check_count("warmup_steps", self.warmup_steps, 0, 2**40)
        check_count("optimizer_state_bytes_per_param", self.optimizer_state_bytes_per_param, 0, 1024)
        for name in ("iteration_ms", "iteration_ms_predicted"):
            check_range(name, getattr(self, name), 0, MAX_MS)
        check_range("iteration_rel_error", self.iteration_rel_error, -1, MAX_MS)
        check_range("emulation_overrun_fraction", self.emulation_overrun_fraction, 0, MAX_MS)
        for name in ("num_stages", "dp_degree", "tp_degree", "virtual_stages_per_rank"):
            check_count(f"layout.{name}", getattr(self.layout, name), 1, MAX_DEVICES)
        for stage in self.stages:
            bad = [r for r in stage.ranks if r >= self.world_size]
            if bad:
                raise ValueError(f"stage {stage.stage_idx}: rank {bad[0]} is outside the world of {self.world_size}")
        if len(self.stages) != self.layout.num_stages:
            raise ValueError(f"the layout has {self.layout.num_stages} stages but {len(self.stages)} stage records are listed")
        if self.world_size != self.layout.world_size:
            raise ValueError(f"world_size {self.world_size} is not the layout's {self.layout.world_size} devices")


def load_report(path: str | Path) -> RunReport:
    return report_from_json(codec.read_json(path), str(path))


def report_from_json(data: Any, source: str = "<runreport>") -> RunReport:
    if codec.is_version(data, SCHEMA, 1):
        data = _upgrade_v1(data)
    if isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("version") == 2:
        data = dict(data, version=VERSION)  # v3 only added fields with defaults
    _check_counts(data, source)
    report = codec.decode_document(RunReport, data, SCHEMA, VERSION, source)
    try:
        check_report(report)
    except ValueError as exc:
        raise PlannerInputError(f"{source}: {exc}") from None
    return report


def _check_counts(data: Any, source: str) -> None:
    """The stage records against the layout's stage count, before any record is decoded: a
    report listing 20,000 records for 2 stages is refused at once (decoding them took 6 s)."""
    if not isinstance(data, dict):
        return
    stages, layout = data.get("stages"), data.get("layout")
    num = layout.get("num_stages") if isinstance(layout, dict) else None
    if isinstance(stages, list) and type(num) is int and len(stages) != num:
        raise PlannerInputError(f"{source}: stages: the layout has {num} stages but {len(stages):,} stage records are listed")


_V1_LAYOUT_KEYS = ("num_stages", "dp_degree", "zero", "tp_degree", "sequence_parallel")


def _upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 report (the layout's degrees at the top level) as version 2: the layout
    gathered, its chunks per rank and per-stage copies read off the stages' ranks."""
    out = {k: v for k, v in data.items() if k not in _V1_LAYOUT_KEYS}
    out["version"] = VERSION
    layout: dict[str, Any] = {k: data[k] for k in _V1_LAYOUT_KEYS if k in data}
    stages, world = data.get("stages"), data.get("world_size")
    num, dp, tp = layout.get("num_stages"), layout.get("dp_degree", 1), layout.get("tp_degree", 1)
    ints = all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (num, dp, tp, world))
    if ints and isinstance(stages, list) and all(isinstance(st, dict) and isinstance(st.get("ranks"), list) for st in stages):
        copies = [len(st["ranks"]) // (dp * tp) for st in stages]
        if any(c > 1 for c in copies) and dp == 1 and tp == 1:
            layout["stage_replicas"] = copies
        elif num * dp * tp != world and (num * dp * tp) % world == 0:
            layout["virtual_stages_per_rank"] = num * dp * tp // world
    out["layout"] = layout
    return out


def report_to_json(report: RunReport) -> dict[str, Any]:
    return codec.encode_document(report, SCHEMA, VERSION)


def save_report(report: RunReport, path: str | Path) -> None:
    """Write the report atomically (``planner.artifacts.files``): the old file or the whole new
    one, never a part; raises ``OSError`` (a full disk, a directory gone) with nothing left behind."""
    atomic_write_text(path, codec.dumps_canonical(report_to_json(report)))
