"""The FP8 view of a profile's layer: the GEMMs an FP8 recipe runs in FP8 (issue 49 item 1;
priced by ``planner.cost.precision``, filled by the analytic profiles,
``planner.profiling.analytic.common.fp8_gemms``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.artifacts.limits import check_count, check_nonneg
from planner.artifacts.timefit import TimeFit

__all__ = ["Fp8Gemms"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fp8Gemms:
    """The linear layers of a layer that an FP8 recipe runs in FP8 (the weighted GEMMs of a
    transformer block; ``planner.cost.precision``): their bf16 time inside the layer's, the
    bytes of their distinct inputs (cast to FP8 in the forward, saved in FP8 for the weight
    gradient) and of their outputs' gradients (cast in the backward), and their parameters (an
    FP8 copy each). Bytes are of the bf16 tensors, per sample."""

    fwd: TimeFit = field(metadata={"doc": "the FP8-able GEMMs' part of the layer's forward, in bf16"})
    bwd: TimeFit = field(metadata={"doc": "their part of the backward (input and weight gradients), in bf16"})
    input_bytes_per_sample: float = field(metadata={"doc": "bf16 bytes of their distinct inputs, per sample"})
    grad_bytes_per_sample: float = field(metadata={"doc": "bf16 bytes of their outputs' gradients, per sample"})
    param_count: int = field(metadata={"doc": "their weights' parameters"})

    def __post_init__(self) -> None:
        check_nonneg("Fp8Gemms", input_bytes_per_sample=self.input_bytes_per_sample,
                      grad_bytes_per_sample=self.grad_bytes_per_sample)
        check_count("Fp8Gemms.param_count", self.param_count)
