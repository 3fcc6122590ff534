"""What a plan says of itself besides its stages: the :class:`Prediction` of its time and memory,
the :class:`ParetoPoint` rows of the solver's front, and the :class:`Provenance` of its inputs
(parts of the Plan artifact, :mod:`planner.artifacts.plan`, which reads and writes them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.artifacts.host import OffloadMode
from planner.artifacts.kinds import OverheadKind, ScheduleKind, SolverKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.limits import (
    MAX_BATCH,
    MAX_BYTES,
    MAX_DEVICES,
    MAX_FLOPS,
    MAX_LAYERS,
    MAX_MS,
    MAX_RATE,
    MAX_THROUGHPUT,
    check_count,
    check_fields,
    check_range,
)
from planner.artifacts.request import PlanRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class OverheadTerm:
    """One overhead of a plan's breakdown (:mod:`planner.cost.overheads`): how much longer its
    iteration is with the term priced than without it, and where the term's number comes from."""

    kind: OverheadKind
    ms: float = field(metadata={"doc": "iteration time with the term less without it (>= 0 up to the simulator's rounding)"})
    source: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", OverheadKind(self.kind))
        check_range("ms", self.ms, -MAX_MS, MAX_MS)


@dataclass(frozen=True, slots=True, kw_only=True)
class BandInput:
    """One uncertain input of a prediction and the iteration time at the two ends of its range
    (the others at their nominal values): :mod:`planner.cost.band`."""

    name: str
    low_ms: float
    high_ms: float
    source: str = ""

    def __post_init__(self) -> None:
        check_fields(self, 0, MAX_MS, "low_ms", "high_ms")


@dataclass(frozen=True, slots=True, kw_only=True)
class Band:
    """The range a prediction's inputs leave it (:mod:`planner.cost.band`): its iteration time at
    the low and high ends (each input's deviation from the nominal added in quadrature, as
    independent errors), and its peak memory at the top (what "fits" is judged at). All 0: no band
    worked out."""

    iteration_low_ms: float = 0.0
    iteration_high_ms: float = 0.0
    peak_memory_high_bytes: int = 0
    device_memory_bytes: int = field(default=0, metadata={"doc": "the device's memory, which fits is judged against"})
    inputs: tuple[BandInput, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self, 0, MAX_MS, "iteration_low_ms", "iteration_high_ms")
        check_count("peak_memory_high_bytes", self.peak_memory_high_bytes, 0, MAX_BYTES)
        check_count("device_memory_bytes", self.device_memory_bytes, 0, MAX_BYTES)
        if self.iteration_low_ms > self.iteration_high_ms:
            raise ValueError(f"band: iteration_low_ms {self.iteration_low_ms} > iteration_high_ms {self.iteration_high_ms}")

    @property
    def known(self) -> bool:
        return self.iteration_high_ms > 0

    @property
    def fits(self) -> bool:
        """The peak at the band's top within the device's memory."""
        return self.peak_memory_high_bytes <= self.device_memory_bytes


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
        metadata={"doc": "no plan of any kind runs faster on the devices available (devices_available, all of them "
                         "whether the plan uses them or not): global batch x the fastest per-sample forward + backward "
                         "of the profile / devices (0 = unknown)"},
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
    straggler_fraction: float = field(
        default=0.0,
        metadata={"doc": "the share by which iteration_ms exceeds the simulated replay: the job's slowest GPU "
                         "(planner.cost.overheads)"},
    )
    overheads: tuple[OverheadTerm, ...] = field(
        default=(), metadata={"doc": "the overhead terms priced in iteration_ms, each with its source (() = not worked out)"}
    )
    band: Band = field(default=Band(), metadata={"doc": "the range the inputs' uncertainty leaves the prediction"})

    def __post_init__(self) -> None:
        check_fields(self, 0, MAX_MS, "iteration_ms", "exposed_allreduce_ms", "partition_bound_ms", "machine_bound_ms",
                     "all_devices_ms")
        check_count("peak_memory_bytes", self.peak_memory_bytes, 0, MAX_BYTES)
        check_range("bubble_fraction", self.bubble_fraction, -1e-9, 1 + 1e-9)  # the simulator's rounding: -4e-16 seen
        check_range("throughput_samples_per_s", self.throughput_samples_per_s, 0, MAX_THROUGHPUT)
        check_range("model_flops_per_iteration", self.model_flops_per_iteration, 0, MAX_FLOPS)
        check_fields(self, 0, MAX_RATE, "achieved_tflops_per_device", "device_peak_tflops")
        check_fields(self, 0, 1e15, "mfu", "me_index")  # ratios of bounded figures
        check_range("straggler_fraction", self.straggler_fraction, 0, 1)

    @classmethod
    def unset(cls, peak_memory_bytes: int = 0) -> Prediction:
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
    """One point of the solver's (iteration time, peak memory) front: a row of the Pareto
    table, its layout columns read from a plan's :class:`Layout` by :meth:`of`."""

    iteration_ms: float
    peak_memory_bytes: int
    num_stages: int
    dp_degree: int
    microbatch_size: int
    schedule: ScheduleKind
    num_recomputed_layers: int  # at either level, full or selective
    zero: ZeroStage = ZeroStage.NONE
    stage_replicas: tuple[int, ...] = ()
    tp_degree: int = 1
    sequence_parallel: bool = False
    cp_degree: int = field(default=1, metadata={"doc": "context-parallel degree (absent when 1)", "omit_if_default": True})
    offload: OffloadMode = field(default=OffloadMode.NONE,
                                 metadata={"doc": "what the point keeps in host memory (absent when none)",
                                           "omit_if_default": True})

    def __post_init__(self) -> None:
        check_range("iteration_ms", self.iteration_ms, 0, MAX_MS)
        check_count("peak_memory_bytes", self.peak_memory_bytes, 0, MAX_BYTES)
        check_fields(self, 1, MAX_DEVICES, "num_stages", "dp_degree", "tp_degree", "cp_degree")
        check_count("microbatch_size", self.microbatch_size, 1, MAX_BATCH)
        check_count("num_recomputed_layers", self.num_recomputed_layers, 0, MAX_LAYERS)
        _ = self.layout  # its axes combine (the Layout's own checks)

    @property
    def layout(self) -> Layout:
        """The point's parallel dimensions (chunks per rank are not recorded: 1)."""
        return Layout(num_stages=self.num_stages, dp_degree=self.dp_degree, stage_replicas=self.stage_replicas,
                      tp_degree=self.tp_degree, sequence_parallel=self.sequence_parallel, cp_degree=self.cp_degree,
                      zero=self.zero)


@dataclass(frozen=True, slots=True, kw_only=True)
class Provenance:
    model: str
    profile_sha256: str
    cluster_name: str
    cluster_sha256: str
    planner_version: str
    solver: SolverKind
    request: PlanRequest
    fingerprint_sha256: str = ""
    search_notes: tuple[str, ...] = field(
        default=(),
        metadata={"doc": "what the search did differently from its default, one line each (e.g. a long profile "
                         "coarsened under the working-set ceiling, planner.solve.ceiling; absent when none)",
                  "omit_if_default": True},
    )
