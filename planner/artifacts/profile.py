"""The Profile artifact: a model as a topologically ordered list of layers with costs.

A *layer* is the unit a stage boundary may fall between. Layers are stored in a
topological order of the layer DAG; ``edges`` carry the tensors that flow between them, so
the bytes crossing a cut after layer ``i`` are the tensors produced at or before ``i`` and
consumed after it (skip connections included). See ``planner.graph``.

Times are for the device named in ``device``; each is a fitted line in the micro-batch size
``t(b) = intercept_ms + per_sample_ms * b`` with the measured points kept beside it. Memory
figures are bytes *per sample*, plus for saved bytes an intercept that does not grow with the
micro-batch (``saved_bytes_fixed``: e.g. rotary tables broadcast over the batch), fitted like
the times: ``saved(b) = saved_bytes_fixed + saved_bytes_per_sample * b``.

Saved bytes are counted once per storage (a view or a re-save of one tensor is one tensor,
as the allocator holds it). Two layers that save one storage (a ReLU that keeps its output
and the next layer's linear that keeps it as its input) each count it, and the pair is listed
in ``Profile.shared_saved``: a stage holding both counts it once.

Recompute levels per layer (Korthikanti et al. 2022 sec. 4; :class:`RecomputeLevel`): none
keeps the saved bytes; selective (a layer with an ``attention_core``) re-runs the attention
core in backward and keeps the saved bytes less the core's; full keeps the layer's input and
re-runs its whole forward.

Zero bubble (Qi et al., ICLR 2024) splits the backward into B (input gradient) and W (weight
gradient): ``weight_grad_fraction`` is W's share of ``bwd``, ``weight_grad_saved_fraction`` the
share of the saved bytes W keeps from the end of B until it runs. Unset (imported and older
files): a layer with parameters spends half its backward in W (dgrad + wgrad of one shape) and W
keeps all it saved (torch's ``stage_backward_input`` retains the graph until W); one without
parameters has no W. Analytic profiles compute both (W keeps its weight GEMMs' inputs); measured
ones time W and measure what torch's split backward keeps
(:mod:`planner.profiling.measured.wgrad`).

Version 4 added the parameters' names (``Layer.param_names``, beside ``param_shapes``, so a
model that differs from a profile's is told apart by name: an extra bias, not a shifted list),
the model's configuration (``Profile.model_config``: settings that change what the model
computes but no shape, hashed into ``fingerprint_sha256``), and which runtime's sequence
parallelism a tensor split describes (``TensorSplit.sequence_runtime`` and
``sequence_saved_bytes_per_sample``; version-1 to -3 files load with no names, no
configuration and Megatron-LM's rule, what their versions priced), and a layer's routed experts
(``Layer.moe``, :mod:`planner.artifacts.moe`; absent: a dense layer).
Version 3 added ``saved_bytes_fixed``, ``attention_core``, ``Profile.attention``,
``Profile.shared_saved`` and ``TensorSplit.degrees`` (version-1 and -2 files load with none of
them: no intercept, no selective level, attention ``unknown``, nothing shared, the ``1/t``
rule for tensor-parallel times); version 2 added ``model_flops_per_sample``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.artifacts import codec
from planner.artifacts.codec import JSONScalar
from planner.artifacts.consistency import check_profile
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.fp8 import Fp8Gemms
from planner.artifacts.kinds import AttentionKind, DType, SequenceParallelRuntime
from planner.artifacts.limits import (
    MAX_BATCH,
    MAX_BYTES,
    MAX_FLOPS_PER_SAMPLE,
    MAX_LAYERS,
    MAX_MS,
    MAX_SHAPE_DIMS,
    check_count,
    check_name,
    check_nonneg,
    check_range,
    check_ranges,
    first_duplicate,
)
from planner.artifacts.moe import MoeLayer
from planner.artifacts.tensor_split import TensorSplit
from planner.artifacts.timefit import TimeFit as TimeFit  # re-exported: its home before the MoE fields

#: W's share of a backward the profile does not split: a matmul's backward is two products of
#: its forward's shape, dgrad (B) and wgrad (W) (Qi et al. 2024 sec. 2: T_B = T_W = T_F)
DEFAULT_WEIGHT_GRAD_FRACTION = 0.5

SCHEMA = "planner.profile"
#: version 2 added ``model_flops_per_sample``; version 3 the recompute levels, saved-byte
#: intercepts, shared storages and ``TensorSplit.degrees``; version 4 parameter names, the
#: model configuration and the sequence-parallel runtime (see the module docstring); older
#: files load with defaults (``degrees`` none: the ``1/t`` rule; Megatron-LM's sequence parallelism)
VERSION = 4


def _check_bytes(**values: float) -> None:
    check_ranges(0, MAX_BYTES, **values)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimePoint:
    """One measured point: median forward/backward ms at one micro-batch size."""

    microbatch_size: int
    fwd_ms: float
    bwd_ms: float

    def __post_init__(self) -> None:
        if self.microbatch_size < 1:
            raise ValueError(f"microbatch_size must be >= 1 (got {self.microbatch_size})")
        check_count("microbatch_size", self.microbatch_size, 1, MAX_BATCH)
        check_ranges(0, MAX_MS, fwd_ms=self.fwd_ms, bwd_ms=self.bwd_ms)  # raw points too, though the fit is what plans use


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionCore:
    """The attention core of a layer (Korthikanti et al. 2022 sec. 4: QK^T, softmax, softmax
    dropout and attention over V), which selective recomputation re-runs in backward: the bytes
    it saves for backward (freed by the selective level, live again while its backward runs)
    and its forward time (what the selective level costs in every backward). The core runs per
    head, so with tensor parallelism all of it divides by t: its bytes are part of the layer's
    ``TensorSplit.split_saved_bytes_per_sample``."""

    saved_bytes_per_sample: float
    saved_bytes_fixed: float = 0.0
    fwd: TimeFit

    def __post_init__(self) -> None:
        check_nonneg("AttentionCore", saved_bytes_per_sample=self.saved_bytes_per_sample,
                      saved_bytes_fixed=self.saved_bytes_fixed)
        _check_bytes(saved_bytes_per_sample=self.saved_bytes_per_sample, saved_bytes_fixed=self.saved_bytes_fixed)

    def saved_bytes(self, microbatch_size: int) -> float:
        return self.saved_bytes_fixed + self.saved_bytes_per_sample * microbatch_size


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
    param_names: tuple[str, ...] = field(
        default=(), metadata={"doc": "the parameters' names in param_shapes' order (named_parameters()); empty = "
                                     "unknown (version 1-3 files, analytic and imported profiles)",
                              "omit_if_default": True}
    )
    saved_bytes_per_sample: float = field(metadata={"doc": "bytes saved for backward per sample (once per storage)"})
    saved_bytes_fixed: float = field(
        default=0.0, metadata={"doc": "bytes saved for backward whatever the micro-batch (the fit's intercept)"}
    )
    input_bytes_per_sample: float = field(
        metadata={"doc": "bytes kept per sample when the layer is recomputed (its inputs)"}
    )
    output_bytes_per_sample: float
    tp: TensorSplit | None = field(
        default=None, metadata={"doc": "how the layer splits over tensor-parallel devices; null = it does not"}
    )
    attention_core: AttentionCore | None = field(
        default=None,
        metadata={"doc": "what selective recomputation of this layer frees and costs; null = no selective level"},
    )
    weight_grad_fraction: float | None = field(default=None, metadata={
        "doc": "W's share of bwd (the rest is B; Qi et al. 2024); null = the default: 0.5 with parameters, 0 without"})
    weight_grad_saved_fraction: float | None = field(default=None, metadata={
        "doc": "share of the saved bytes W keeps from the end of B until it runs; null = 1 with parameters, 0 without"})
    moe: MoeLayer | None = field(default=None, metadata={
        "doc": "the layer's routed experts (a mixture-of-experts layer, planner.artifacts.moe); absent: none",
        "omit_if_default": True})
    fp8: Fp8Gemms | None = field(default=None, metadata={"doc": "FP8-able GEMMs (planner.artifacts.fp8)", "omit_if_default": True})

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("layer name must not be empty")
        check_name("layer name", self.name)
        check_count("param_count", self.param_count)
        _check_bytes(param_bytes=self.param_bytes, saved_bytes_per_sample=self.saved_bytes_per_sample,
                     input_bytes_per_sample=self.input_bytes_per_sample, output_bytes_per_sample=self.output_bytes_per_sample,
                     saved_bytes_fixed=self.saved_bytes_fixed)
        if self.param_names and len(self.param_names) != len(self.param_shapes):
            raise ValueError(f"layer {self.name!r}: {len(self.param_names)} param_names for {len(self.param_shapes)} "
                             "param_shapes")
        for i, shape in enumerate(self.param_shapes):
            if len(shape) > MAX_SHAPE_DIMS:  # before its dimensions are checked one by one
                raise ValueError(f"param_shapes[{i}]: {len(shape):,} dimensions, at most {MAX_SHAPE_DIMS}")
            for j, dim in enumerate(shape):
                check_count(f"param_shapes[{i}][{j}]", dim)
        for fname in ("weight_grad_fraction", "weight_grad_saved_fraction"):
            if getattr(self, fname) is not None:
                check_range(f"layer {self.name!r}: {fname}", getattr(self, fname), 0.0, 1.0)
        core = self.attention_core
        if core is not None and core.saved_bytes_per_sample > self.saved_bytes_per_sample * (1 + 1e-9) + 1e-9:
            raise ValueError(f"layer {self.name!r}: attention_core.saved_bytes_per_sample exceeds saved_bytes_per_sample")
        if core is not None and core.saved_bytes_fixed > self.saved_bytes_fixed * (1 + 1e-9) + 1e-9:
            raise ValueError(f"layer {self.name!r}: attention_core.saved_bytes_fixed exceeds saved_bytes_fixed")
        if self.moe is not None:
            self._check_moe(self.moe)
        if self.tp is not None:
            if self.tp.split_param_count > self.param_count:
                raise ValueError(f"layer {self.name!r}: tp.split_param_count exceeds param_count")
            divided = self.tp.split_saved_bytes_per_sample + self.tp.sequence_saved_bytes_per_sample
            if divided > self.saved_bytes_per_sample * (1 + 1e-9) + 1e-9:
                raise ValueError(f"layer {self.name!r}: tp.split_saved_bytes_per_sample + sequence_saved_bytes_per_sample "
                                 f"({divided:g}) exceeds saved_bytes_per_sample ({self.saved_bytes_per_sample:g})")
        check_nonneg(
            f"layer {self.name!r}",
            param_count=self.param_count,
            param_bytes=self.param_bytes,
            saved_bytes_per_sample=self.saved_bytes_per_sample,
            saved_bytes_fixed=self.saved_bytes_fixed,
            input_bytes_per_sample=self.input_bytes_per_sample,
            output_bytes_per_sample=self.output_bytes_per_sample,
        )

    def _check_moe(self, moe: MoeLayer) -> None:
        """The routed experts are part of the layer: their parameters, saved bytes and times."""
        if moe.expert_param_count > self.param_count:
            raise ValueError(f"layer {self.name!r}: moe.expert_param_count exceeds param_count")
        if moe.expert_saved_bytes_per_sample + moe.norm_saved_bytes_per_sample > self.saved_bytes_per_sample * (1 + 1e-9) + 1e-9:
            raise ValueError(f"layer {self.name!r}: moe's saved bytes exceed saved_bytes_per_sample")
        for name, part, whole in (("expert_fwd", moe.expert_fwd, self.fwd), ("expert_bwd", moe.expert_bwd, self.bwd)):
            if part.at(1) > whole.at(1) * (1 + 1e-9) + 1e-12 or part.at(8) > whole.at(8) * (1 + 1e-9) + 1e-12:
                raise ValueError(f"layer {self.name!r}: moe.{name} exceeds the layer's time")

    def fwd_ms(self, microbatch_size: int) -> float:
        return self.fwd.at(microbatch_size)

    def bwd_ms(self, microbatch_size: int) -> float:
        return self.bwd.at(microbatch_size)

    def saved_bytes(self, microbatch_size: int) -> float:
        """Bytes saved for backward by one micro-batch of ``microbatch_size`` samples."""
        return self.saved_bytes_fixed + self.saved_bytes_per_sample * microbatch_size

    @property
    def wgrad_fraction(self) -> float:
        """:attr:`weight_grad_fraction`, or the default split (module docstring)."""
        w = self.weight_grad_fraction
        return w if w is not None else DEFAULT_WEIGHT_GRAD_FRACTION if self.param_count > 0 else 0.0

    @property
    def wgrad_saved_fraction(self) -> float:
        """:attr:`weight_grad_saved_fraction`, or the default (module docstring)."""
        w = self.weight_grad_saved_fraction
        return w if w is not None else 1.0 if self.param_count > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedSaved:
    """One storage (or several) that layers ``first`` < ``second`` both save for backward (each
    layer's saved bytes count it): a stage holding both layers holds it once. Storages saved
    by three layers are listed pairwise along the chain of their savers (a-b, b-c), so a stage
    holding any run of them counts each once."""

    first: int
    second: int
    bytes_per_sample: float
    bytes_fixed: float = 0.0

    def __post_init__(self) -> None:
        check_nonneg("shared_saved", first=self.first, second=self.second, bytes_per_sample=self.bytes_per_sample,
                      bytes_fixed=self.bytes_fixed)
        _check_bytes(bytes_per_sample=self.bytes_per_sample, bytes_fixed=self.bytes_fixed)
        if self.first >= self.second:
            raise ValueError(f"shared_saved {self.first}-{self.second}: first must come before second")

    def at(self, microbatch_size: int) -> float:
        return self.bytes_fixed + self.bytes_per_sample * microbatch_size


@dataclass(frozen=True, slots=True, kw_only=True)
class Edge:
    """A tensor flowing from layer ``src`` to layer ``dst`` (indices, ``src < dst``)."""

    src: int
    dst: int
    bytes_per_sample: float

    def __post_init__(self) -> None:
        check_nonneg("edge", src=self.src, dst=self.dst, bytes_per_sample=self.bytes_per_sample)
        _check_bytes(bytes_per_sample=self.bytes_per_sample)
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
        check_nonneg(f"tied {self.name!r}", param_count=self.param_count, param_bytes=self.param_bytes)
        check_count("param_count", self.param_count)
        _check_bytes(param_bytes=self.param_bytes)


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
    model_config: dict[str, str] = field(
        default_factory=dict,
        metadata={"doc": "settings that change what the model computes but no parameter shape (a Hugging Face "
                         "config's fields that differ from its type's defaults): field -> its value as JSON text; "
                         "hashed into fingerprint_sha256", "omit_if_default": True},
    )
    model_flops_per_sample: float = field(
        default=0.0,
        metadata={"doc": "FLOPs of one training sample's forward and backward without recomputation (the count MFU "
                         "uses), set by whoever builds the profile; 0 = unknown"},
    )
    attention: AttentionKind = field(
        default=AttentionKind.UNKNOWN,
        metadata={"doc": "how the model's attention keeps its scores: flash | materialised | none | unknown"},
    )
    layers: tuple[Layer, ...]
    edges: tuple[Edge, ...]
    tied: tuple[TiedParams, ...] = ()
    shared_saved: tuple[SharedSaved, ...] = field(
        default=(), metadata={"doc": "storages two layers both save (counted once on a stage holding both)"}
    )

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("a profile needs at least one layer")
        check_name("model", self.model)
        check_count("layers", len(self.layers), 1, MAX_LAYERS)
        check_nonneg("profile", model_flops_per_sample=self.model_flops_per_sample)
        check_range("model_flops_per_sample", self.model_flops_per_sample, 0, MAX_FLOPS_PER_SAMPLE)
        if not self.microbatch_sizes or min(self.microbatch_sizes) < 1:
            raise ValueError(f"microbatch_sizes must be positive (got {list(self.microbatch_sizes)})")
        for i, b in enumerate(self.microbatch_sizes):
            check_count(f"microbatch_sizes[{i}]", b, 1, MAX_BATCH)
        names = [layer.name for layer in self.layers]
        dup = first_duplicate(names)
        if dup is not None:
            raise ValueError(f"layer names must be unique ({dup!r} repeats)")
        n = len(self.layers)
        for i, edge in enumerate(self.edges):
            if edge.dst >= n:
                raise ValueError(f"edges[{i}]: layer {edge.dst} does not exist ({n} layers)")
        for tie in self.tied:
            bad = [i for i in tie.layers if not 0 <= i < n]
            if bad:
                raise ValueError(f"tied {tie.name!r}: layer {bad[0]} does not exist ({n} layers)")
        for i, shared in enumerate(self.shared_saved):
            if shared.second >= n:
                raise ValueError(f"shared_saved[{i}]: layer {shared.second} does not exist ({n} layers)")
        self._check_shared_within_saves()

    def _check_shared_within_saves(self) -> None:
        """A layer's storages shared with later layers are bytes it saves, outside its attention
        core (a core's tensors are its own), so together no more than that; the same for those
        shared with earlier layers (each side on its own: a storage three layers save is listed
        a-b, b-c, the middle one's on both sides). More would make a stage's bytes negative."""
        for side, other in (("first", "later"), ("second", "earlier")):
            totals: dict[int, list[float]] = {}
            for shared in self.shared_saved:
                at = totals.setdefault(getattr(shared, side), [0.0, 0.0])
                at[0] += shared.bytes_per_sample
                at[1] += shared.bytes_fixed
            for index, (per_sample, fixed) in sorted(totals.items()):
                layer = self.layers[index]
                core = layer.attention_core
                for what, got, saved, in_core in (
                        ("per sample", per_sample, layer.saved_bytes_per_sample, core.saved_bytes_per_sample if core else 0.0),
                        ("fixed", fixed, layer.saved_bytes_fixed, core.saved_bytes_fixed if core else 0.0)):
                    if got > (saved - in_core) * (1 + 1e-9) + 1e-9:
                        raise ValueError(f"shared_saved: layer {layer.name!r} shares {got:g} bytes {what} with {other} "
                                         f"layers, more than it saves outside its attention core ({saved - in_core:g})")


    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.layers)


def profile_fingerprint(
    layer_names: tuple[str, ...], param_shapes: tuple[tuple[tuple[int, ...], ...], ...],
    model_config: dict[str, str] | None = None,
) -> str:
    """sha256 over layer names, parameter shapes and (when it has any) the model's configuration
    (``Profile.model_config``): what the runtime checks a model against. Parameter names are not
    hashed (a fingerprint made before version 4 stays valid); the profile keeps them to name a
    difference."""
    data: dict[str, Any] = {"layers": list(layer_names), "shapes": [[list(s) for s in shp] for shp in param_shapes]}
    if model_config:
        data["config"] = dict(sorted(model_config.items()))
    return codec.sha256_of(data)


def load_profile(path: str | Path) -> Profile:
    return profile_from_json(codec.read_json(path), str(path))


def profile_from_json(data: Any, source: str = "<profile>") -> Profile:
    """A profile document, decoded and cross-checked (``planner.artifacts.consistency``)."""
    if any(codec.is_version(data, SCHEMA, v) for v in (1, 2, 3)):
        data = dict(data, version=VERSION)  # v2, v3 and v4 only added fields with defaults
    profile = codec.decode_document(Profile, data, SCHEMA, VERSION, source)
    try:
        check_profile(profile, profile_fingerprint)
    except ValueError as exc:
        raise PlannerInputError(f"{source}: {exc}") from None
    return profile


def profile_to_json(profile: Profile) -> dict[str, Any]:
    """The profile's document, at the lowest version that holds it: a profile that uses nothing
    version 4 added (parameter names, a configuration, torch-dtensor sequence parallelism,
    measured per-degree split bytes, routed experts: those fields are left out at their defaults) is written as
    version 3, as before -- the same text, so the same sha256, which plans record
    (``provenance.profile_sha256``) and by which ``planner compare`` finds a plan's profile."""
    data = codec.encode_document(profile, SCHEMA, VERSION)
    if not _needs_version_4(profile):
        data["version"] = 3
    return data


def _needs_version_4(profile: Profile) -> bool:
    """Whether a field version 4 added is set (routed experts, :mod:`planner.artifacts.moe`, among them)."""
    return bool(profile.model_config) or any(
        layer.moe is not None or layer.param_names or (layer.tp is not None and (
            layer.tp.sequence_runtime is not SequenceParallelRuntime.MEGATRON
            or layer.tp.sequence_saved_bytes_per_sample
            or any(d.split_saved_bytes_per_sample is not None for d in layer.tp.degrees)))
        for layer in profile.layers)


def save_profile(profile: Profile, path: str | Path) -> None:
    Path(path).write_text(codec.dumps_canonical(profile_to_json(profile)))
