"""The Profile artifact: a model as a topologically ordered list of layers with costs.

A *layer* is the unit a stage boundary may fall between. Layers are stored in a
topological order of the layer DAG; ``edges`` carry the tensors that flow between them, so
the bytes crossing a cut after layer ``i`` are the tensors produced at or before ``i`` and
consumed after it (skip connections included). See ``planner.graph``.

Times are for the device named in ``device``; each is a fitted line in the micro-batch size
``t(b) = intercept_ms + per_sample_ms * b`` with the measured points kept beside it. Memory
figures are bytes *per sample* and scale linearly with the micro-batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.artifacts import codec
from planner.artifacts.codec import JSONScalar
from planner.artifacts.kinds import DType

SCHEMA = "planner.profile"
#: version 2 added ``model_flops_per_sample``; version-1 files load with it 0 (unknown)
VERSION = 2


def _check_nonneg(owner: str, **values: float) -> None:
    for name, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{owner}.{name} must be finite (got {value!r})")
        if value < 0:
            raise ValueError(f"{owner}.{name} must be >= 0 (got {value!r})")


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeFit:
    """A time as a line in the micro-batch size: ``intercept_ms + per_sample_ms * b``."""

    intercept_ms: float
    per_sample_ms: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.intercept_ms) and math.isfinite(self.per_sample_ms)):
            raise ValueError("time fit must be finite")
        if self.per_sample_ms < 0:
            raise ValueError(f"per_sample_ms must be >= 0 (got {self.per_sample_ms!r})")
        if self.intercept_ms + self.per_sample_ms < 0:
            raise ValueError("time fit is negative at micro-batch size 1")

    def at(self, microbatch_size: int) -> float:
        """Time in ms for one micro-batch of ``microbatch_size`` samples (never negative)."""
        return max(0.0, self.intercept_ms + self.per_sample_ms * microbatch_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimePoint:
    """One measured point: median forward/backward ms at one micro-batch size."""

    microbatch_size: int
    fwd_ms: float
    bwd_ms: float

    def __post_init__(self) -> None:
        if self.microbatch_size < 1:
            raise ValueError(f"microbatch_size must be >= 1 (got {self.microbatch_size})")
        _check_nonneg("TimePoint", fwd_ms=self.fwd_ms, bwd_ms=self.bwd_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSplit:
    """How a layer splits over ``t`` tensor-parallel devices (Megatron-LM: Shoeybi et al. 2019
    column/row split of attention and MLP; activations per Korthikanti et al. 2022).

    On each of the ``t`` devices, without sequence parallelism: ``split_time_fraction`` of the
    forward and backward time runs on 1/t of the work (the rest, e.g. layer norms and dropout,
    runs whole on every device); ``split_param_count`` parameters are divided by ``t`` (the rest
    is replicated); ``split_saved_bytes_per_sample`` of the saved activations are divided by
    ``t`` (the rest is replicated); the layer's input and output are whole. It runs
    ``collectives_fwd`` all-reduces of ``collective_bytes_per_sample`` in forward and
    ``collectives_bwd`` in backward, on the critical path.

    With sequence parallelism (Korthikanti et al. 2022 section 4.2.2) every all-reduce becomes
    a reduce-scatter + all-gather of the same bytes (the same ring time), and the remaining
    work, saved activations, input and output are all divided by ``t`` along the sequence.
    """

    must_divide: tuple[int, ...] = field(
        default=(), metadata={"doc": "sizes t must divide (attention heads, key/value heads)"}
    )
    split_time_fraction: float
    split_param_count: int
    split_saved_bytes_per_sample: float
    collective_bytes_per_sample: float
    collectives_fwd: int
    collectives_bwd: int

    def __post_init__(self) -> None:
        _check_nonneg(
            "TensorSplit",
            split_param_count=self.split_param_count,
            split_saved_bytes_per_sample=self.split_saved_bytes_per_sample,
            collective_bytes_per_sample=self.collective_bytes_per_sample,
            collectives_fwd=self.collectives_fwd,
            collectives_bwd=self.collectives_bwd,
        )
        if not 0.0 <= self.split_time_fraction <= 1.0:
            raise ValueError(f"split_time_fraction must be in [0, 1] (got {self.split_time_fraction!r})")
        if any(n < 1 for n in self.must_divide):
            raise ValueError(f"must_divide sizes must be >= 1 (got {list(self.must_divide)})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Layer:
    """One layer: times, parameters and the activation bytes it keeps and emits."""

    name: str
    kind: str = ""
    fwd: TimeFit
    bwd: TimeFit
    measured: tuple[TimePoint, ...] = ()
    param_count: int
    param_bytes: int
    param_shapes: tuple[tuple[int, ...], ...] = ()
    saved_bytes_per_sample: float = field(metadata={"doc": "bytes saved for backward per sample"})
    input_bytes_per_sample: float = field(
        metadata={"doc": "bytes kept per sample when the layer is recomputed (its inputs)"}
    )
    output_bytes_per_sample: float
    tp: TensorSplit | None = field(
        default=None, metadata={"doc": "how the layer splits over tensor-parallel devices; null = it does not"}
    )

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("layer name must not be empty")
        if self.tp is not None:
            if self.tp.split_param_count > self.param_count:
                raise ValueError(f"layer {self.name!r}: tp.split_param_count exceeds param_count")
            if self.tp.split_saved_bytes_per_sample > self.saved_bytes_per_sample:
                raise ValueError(f"layer {self.name!r}: tp.split_saved_bytes_per_sample exceeds saved_bytes_per_sample")
        _check_nonneg(
            f"layer {self.name!r}",
            param_count=self.param_count,
            param_bytes=self.param_bytes,
            saved_bytes_per_sample=self.saved_bytes_per_sample,
            input_bytes_per_sample=self.input_bytes_per_sample,
            output_bytes_per_sample=self.output_bytes_per_sample,
        )

    def fwd_ms(self, microbatch_size: int) -> float:
        return self.fwd.at(microbatch_size)

    def bwd_ms(self, microbatch_size: int) -> float:
        return self.bwd.at(microbatch_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class Edge:
    """A tensor flowing from layer ``src`` to layer ``dst`` (indices, ``src < dst``)."""

    src: int
    dst: int
    bytes_per_sample: float

    def __post_init__(self) -> None:
        _check_nonneg("edge", src=self.src, dst=self.dst, bytes_per_sample=self.bytes_per_sample)
        if self.src >= self.dst:
            raise ValueError(f"edge {self.src}->{self.dst} must go forward (src < dst)")


@dataclass(frozen=True, slots=True, kw_only=True)
class TiedParams:
    """Parameters shared by several layers (e.g. input embedding = output head)."""

    name: str
    layers: tuple[int, ...]
    param_count: int
    param_bytes: int

    def __post_init__(self) -> None:
        if len(self.layers) < 2:
            raise ValueError(f"tied parameter {self.name!r} needs at least two layers")
        _check_nonneg(f"tied {self.name!r}", param_count=self.param_count, param_bytes=self.param_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """A profiled (or analytic, or imported) model, ready for planning."""

    model: str
    source: str = field(metadata={"doc": "measured | analytic | pipedream | calibrated"})
    device: str
    dtype: DType
    microbatch_sizes: tuple[int, ...]
    versions: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, JSONScalar] = field(default_factory=dict)
    fingerprint_sha256: str = ""
    model_flops_per_sample: float = field(
        default=0.0,
        metadata={"doc": "FLOPs of one training sample's forward and backward without recomputation (the count MFU "
                         "uses), set by whoever builds the profile; 0 = unknown"},
    )
    layers: tuple[Layer, ...]
    edges: tuple[Edge, ...]
    tied: tuple[TiedParams, ...] = ()

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("a profile needs at least one layer")
        _check_nonneg("profile", model_flops_per_sample=self.model_flops_per_sample)
        if not self.microbatch_sizes or min(self.microbatch_sizes) < 1:
            raise ValueError(f"microbatch_sizes must be positive (got {list(self.microbatch_sizes)})")
        names = [layer.name for layer in self.layers]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"layer names must be unique ({dup!r} repeats)")
        n = len(self.layers)
        for i, edge in enumerate(self.edges):
            if edge.dst >= n:
                raise ValueError(f"edges[{i}]: layer {edge.dst} does not exist ({n} layers)")
        for tie in self.tied:
            bad = [i for i in tie.layers if not 0 <= i < n]
            if bad:
                raise ValueError(f"tied {tie.name!r}: layer {bad[0]} does not exist ({n} layers)")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.layers)


def profile_fingerprint(layer_names: tuple[str, ...], param_shapes: tuple[tuple[tuple[int, ...], ...], ...]) -> str:
    """sha256 over layer names and parameter shapes: what the runtime checks a model against."""
    return codec.sha256_of({"layers": list(layer_names), "shapes": [[list(s) for s in shp] for shp in param_shapes]})


def load_profile(path: str | Path) -> Profile:
    return profile_from_json(codec.read_json(path), str(path))


def profile_from_json(data: Any, source: str = "<profile>") -> Profile:
    if isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("version") == 1:
        data = dict(data, version=VERSION)  # v2 only added a field with a default
    return codec.decode_document(Profile, data, SCHEMA, VERSION, source)


def profile_to_json(profile: Profile) -> dict[str, Any]:
    return codec.encode_document(profile, SCHEMA, VERSION)


def save_profile(profile: Profile, path: str | Path) -> None:
    Path(path).write_text(codec.dumps_canonical(profile_to_json(profile)))
