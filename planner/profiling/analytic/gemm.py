"""Achieved GEMM throughput as a function of the GEMM's shape (no torch).

A matrix product of an ``m x k`` by a ``k x n`` matrix in 16-bit does ``2 m n k`` FLOPs and
moves at least ``2 (m k + k n + m n)`` bytes, so its arithmetic intensity is

    I = m n k / (m k + k n + m n) = 1 / (1/m + 1/n + 1/k)   FLOP/byte,

dominated by its smallest dimension. A roofline (Williams et al. 2009) makes small intensities
bandwidth-bound and large ones compute-bound; measured GEMMs bend smoothly between the two
and saturate below peak (tile and wave quantisation, the k loop's prologue and epilogue).
The model here is that curve with two constants (a saturating, Michaelis-Menten form of the
roofline):

    achieved FLOP/s = peak x e_max x I / (I + I_half)

``e_max``: the fraction of the datasheet peak the largest GEMMs reach; ``I_half``: the
intensity at which a GEMM reaches half of that (its low-intensity asymptote is a bandwidth,
``peak e_max / I_half``). The backward of a product is two products of the same three
dimensions (input gradient ``m x n . n x k``, weight gradient ``k x m . m x n``), so the same
intensity and twice the time. A third constant, ``memory_efficiency``, is the achieved
fraction of the HBM datasheet bandwidth at which the element-wise work around the GEMMs runs
(its bytes: the activations the layer saves, :mod:`planner.profiling.analytic.gpt`).

Per device: at most these three constants, each with its source and the rows of published
runs it was fitted on (:data:`DEVICE_GEMM`; ``benchmarks/published_runs.py --fit`` refits
them, on at most a third of each device's rows). A profile records the ones it was built
with in its metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from planner.artifacts.errors import PlannerInputError

__all__ = ["DEVICE_GEMM", "DEVICE_GEMM_LOSO", "FIT_METHOD", "MAMF_FRACTION", "MAMF_SOURCE", "Gemm", "GemmModel",
           "carried_from_h100", "fit_source", "gemm_model_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmModel:
    """One device's achieved throughput model (module docstring). ``metadata``: the constants
    as a profile's metadata records them (:meth:`of_metadata` reads them back), worked out
    where the model is made (the analytic profiles copy it into theirs)."""

    max_efficiency: float
    half_intensity: float
    memory_efficiency: float
    source: str = ""
    fitted_on: tuple[str, ...] = ()
    metadata: dict[str, str | float] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.max_efficiency <= 1:
            raise PlannerInputError(f"GEMM max_efficiency must be in (0, 1] (got {self.max_efficiency})")
        if not self.half_intensity >= 0:
            raise PlannerInputError(f"GEMM half_intensity must be >= 0 (got {self.half_intensity})")
        if not 0 < self.memory_efficiency <= 1:
            raise PlannerInputError(f"memory_efficiency must be in (0, 1] (got {self.memory_efficiency})")
        object.__setattr__(self, "metadata", {
            "gemm_max_efficiency": self.max_efficiency,
            "gemm_half_intensity_flop_per_byte": self.half_intensity,
            "memory_efficiency": self.memory_efficiency,
            "gemm_model": "achieved = peak x e_max x I / (I + I_half), I = 1 / (1/m + 1/n + 1/k) "
                          "(planner.profiling.analytic.gemm)",
            "gemm_source": self.source,
            "gemm_fitted_on": "; ".join(self.fitted_on),
        })

    def efficiency(self, m: float, n: float, k: float, fused: bool = False) -> float:
        """Achieved fraction of peak of one ``m x k . k x n`` product (``fused``: FlashAttention's
        pair, intensity ``1 / (1/m + 1/n)``, see :class:`Gemm`)."""
        intensity = 1.0 / (1.0 / m + 1.0 / n + (0.0 if fused else 1.0 / k))
        return self.max_efficiency * intensity / (intensity + self.half_intensity)

    @classmethod
    def of_metadata(cls, meta: Mapping[str, object], memory_default: float | None = 1.0) -> GemmModel | None:
        """The constants a profile's metadata records (:attr:`metadata`'s inverse); None where it
        records none (a measured profile). ``memory_default``: the memory efficiency where none is
        recorded (None: it must be recorded too)."""
        e_max, half = meta.get("gemm_max_efficiency"), meta.get("gemm_half_intensity_flop_per_byte")
        mem = meta.get("memory_efficiency", memory_default)
        if not (isinstance(e_max, float) and isinstance(half, float) and isinstance(mem, float)):
            return None
        return cls(max_efficiency=e_max, half_intensity=half, memory_efficiency=mem)


#: how a dimension of a layer's GEMM follows the micro-batch size ``b`` and the tensor-parallel degree ``t``
Dim = Literal["m", "n", "k", "count", ""]


@dataclass(frozen=True, slots=True, kw_only=True)
class Gemm:
    """``count`` products of ``m x k . k x n`` in one sample's forward (at t = 1): ``batch`` is
    the dimension that grows with the micro-batch (``m``: tokens, or ``count``: heads of
    batched attention), ``split`` the one Megatron's tensor parallelism divides by ``t``
    (``n`` column-parallel, ``k`` row-parallel, ``count`` heads; ``""`` none); ``window`` and
    ``bwd_window``: the index of the forward / backward collective this GEMM may run beside
    (-1: none; :mod:`planner.cost.tensor_parallel`).

    ``fused``: the attention pair of FlashAttention (Dao et al. 2022): ``count`` products
    ``s x d . d x s`` and ``s x s . s x d`` (m = n = s queries and keys, k = d) whose ``s x s``
    scores never leave the chip, so its bytes are Q, K, V and O only and its intensity
    ``m n k / (m k + n k) = 1 / (1/m + 1/n)``; ``work_fraction``: the share of the counted
    FLOPs the kernel executes (a causal kernel skips the masked half: 0.5);
    ``bwd_factor``: backward time over forward (2: input and weight gradients; FlashAttention's
    backward also recomputes the scores: 2.5, Dao 2023 sec. 3.1); ``weighted``: one operand is
    a weight, so the backward splits into the input gradient (B) and the weight gradient (W),
    each one product of the forward's shape (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR
    2024, sec. 2); False for attention's products of two activations, whose backward is all B."""

    name: str
    m: int
    n: int
    k: int
    count: int = 1
    batch: Dim = "m"
    split: Dim = ""
    window: int = -1
    bwd_window: int = -1
    fused: bool = False
    work_fraction: float = 1.0
    bwd_factor: float = 2.0
    weighted: bool = True

    @property
    def flops(self) -> float:
        """Forward FLOPs per sample at t = 1, as counted (the whole of every product)."""
        return 2.0 * self.m * self.n * self.k * self.count


#: the largest BF16 matmul each device reaches, as a fraction of its datasheet peak: Stas Bekman's
#: "Maximum Achievable Matmul FLOPS" table (stas00/ml-engineering, compute/accelerator/README.md;
#: mamf-finder.py, CUDA 12.1): A100 SXM 267.9 of 312 TFLOPS, H100 SXM 792.1 of 989. The devices'
#: e_max are one fitted fraction of these (the share of the best matmul a training run's GEMMs reach)
MAMF_FRACTION: dict[str, float] = {"a100-80gb": 267.9 / 312.0, "h100-80gb": 792.1 / 989.0}
MAMF_SOURCE = ("stas00/ml-engineering, 'Maximum Achievable Matmul FLOPS comparison table': A100 SXM 267.9 / 312, "
               "H100 SXM 792.1 / 989 TFLOPS (BF16, CUDA 12.1)")

#: how the fitted constants were fitted (each model's ``source``, with the source a fit left out)
FIT_METHOD = ("e_max and I_half (the A100's; the H100's scaled by the ratio of the devices' measured largest matmuls, "
              "MAMF_FRACTION, and of their ridge points) and the HBM fraction shared by both devices, fitted on the "
              "rows of fitted_on")


def fit_source(without: str = "") -> str:
    """A fitted model's ``source``: ``benchmarks/published_runs.py --fit``, the source it left out."""
    what = f"leave-one-source-out: without {without}; " if without else ""
    return f"benchmarks/published_runs.py --fit: {what}{FIT_METHOD}"


# Fitted by ``benchmarks/published_runs.py --fit`` (4 digits; the table, the fits left out one
# source each, and what chose them: benchmarks/RESULTS.md section 40): one set for both devices
# (e_max and the HBM fraction are fractions of each datasheet; I_half the A100's, the H100's scaled
# by the ridge-point ratio), fitted on at most a third of each source's rows
DEVICE_GEMM: dict[str, GemmModel] = {
    'a100-80gb': GemmModel(
        max_efficiency=0.6936, half_intensity=0.01, memory_efficiency=0.4067,
        source=fit_source(),
        fitted_on=('N1 1.7B', 'N6 76.1B', 'N9 529.6B', 'K4 baseline', 'K4 seq-par', 'K5 175B full',
                   'K5 530B sp+sel', 'M 1.7B', 'M 32B', 'M 462B', 'T L3 8B b1 sel-layer', 'T L2 13B b2 none',
                   'T L2 70B b2 full',),
    ),
    'h100-80gb': GemmModel(
        max_efficiency=0.6470, half_intensity=0.02, memory_efficiency=0.4067,
        source=fit_source(),
        fitted_on=('N1 1.7B', 'N6 76.1B', 'N9 529.6B', 'K4 baseline', 'K4 seq-par', 'K5 175B full',
                   'K5 530B sp+sel', 'M 1.7B', 'M 32B', 'M 462B', 'T L3 8B b1 sel-layer', 'T L2 13B b2 none',
                   'T L2 70B b2 full',),
    ),
}
#: each device's constants as fitted on every published source but one, one per source left out:
#: the spread a prediction's band takes them over (:mod:`planner.cost.band`), and each row's
#: out-of-source prediction (``benchmarks/published_runs.py``)
DEVICE_GEMM_LOSO: dict[str, tuple[GemmModel, ...]] = {
    'a100-80gb': (
        GemmModel(
            max_efficiency=0.6949, half_intensity=0.01, memory_efficiency=0.3717,
            source=fit_source('Narayanan et al. 2021'),
            fitted_on=('K4 baseline', 'K4 seq-par', 'K5 175B full', 'K5 530B sp+sel', 'M 1.7B', 'M 32B', 'M 462B',
                       'T L3 8B b1 sel-layer', 'T L2 13B b2 none', 'T L2 70B b2 full',),
        ),
        GemmModel(
            max_efficiency=0.6904, half_intensity=0.01, memory_efficiency=0.4107,
            source=fit_source('Korthikanti et al. 2022'),
            fitted_on=('N1 1.7B', 'N6 76.1B', 'N9 529.6B', 'M 1.7B', 'M 32B', 'M 462B', 'T L3 8B b1 sel-layer',
                       'T L2 13B b2 none', 'T L2 70B b2 full',),
        ),
        GemmModel(
            max_efficiency=0.6890, half_intensity=0.01, memory_efficiency=0.4444,
            source=fit_source('Megatron-LM README'),
            fitted_on=('N1 1.7B', 'N6 76.1B', 'N9 529.6B', 'K4 baseline', 'K4 seq-par', 'K5 175B full',
                       'K5 530B sp+sel', 'T L3 8B b1 sel-layer', 'T L2 13B b2 none', 'T L2 70B b2 full',),
        ),
        GemmModel(
            max_efficiency=0.7009, half_intensity=0.01, memory_efficiency=0.3986,
            source=fit_source('torchtitan 2024'),
            fitted_on=('N1 1.7B', 'N6 76.1B', 'N9 529.6B', 'K4 baseline', 'K4 seq-par', 'K5 175B full',
                       'K5 530B sp+sel', 'M 1.7B', 'M 32B', 'M 462B',),
        ),
    ),
    'h100-80gb': (
        GemmModel(
            max_efficiency=0.6482, half_intensity=0.02, memory_efficiency=0.3717,
            source=fit_source('Narayanan et al. 2021'),
            fitted_on=('K4 baseline', 'K4 seq-par', 'K5 175B full', 'K5 530B sp+sel', 'M 1.7B', 'M 32B', 'M 462B',
                       'T L3 8B b1 sel-layer', 'T L2 13B b2 none', 'T L2 70B b2 full',),
        ),
        GemmModel(
            max_efficiency=0.6440, half_intensity=0.02, memory_efficiency=0.4107,
            source=fit_source('Korthikanti et al. 2022'),
            fitted_on=('N1 1.7B', 'N6 76.1B', 'N9 529.6B', 'M 1.7B', 'M 32B', 'M 462B', 'T L3 8B b1 sel-layer',
                       'T L2 13B b2 none', 'T L2 70B b2 full',),
        ),
        GemmModel(
            max_efficiency=0.6427, half_intensity=0.02, memory_efficiency=0.4444,
            source=fit_source('Megatron-LM README'),
            fitted_on=('N1 1.7B', 'N6 76.1B', 'N9 529.6B', 'K4 baseline', 'K4 seq-par', 'K5 175B full',
                       'K5 530B sp+sel', 'T L3 8B b1 sel-layer', 'T L2 13B b2 none', 'T L2 70B b2 full',),
        ),
        GemmModel(
            max_efficiency=0.6538, half_intensity=0.02, memory_efficiency=0.3986,
            source=fit_source('torchtitan 2024'),
            fitted_on=('N1 1.7B', 'N6 76.1B', 'N9 529.6B', 'K4 baseline', 'K4 seq-par', 'K5 175B full',
                       'K5 530B sp+sel', 'M 1.7B', 'M 32B', 'M 462B',),
        ),
    ),
}


def carried_from_h100(h100: GemmModel, ridge_ratio: float) -> GemmModel:
    """A newer device's constants from the H100's (no published run on it to fit): ``e_max`` and
    the HBM fraction the H100's (the same fractions of the datasheet peak and bandwidth), ``I_half``
    the H100's x the ratio of the two devices' ridge points (the roofline's knee moves with peak /
    HBM bandwidth: the rule that carries the A100's ``I_half`` to the H100)."""
    return GemmModel(max_efficiency=h100.max_efficiency, half_intensity=h100.half_intensity * ridge_ratio,
                     memory_efficiency=h100.memory_efficiency,
                     source=f"the H100's constants carried (I_half x ridge ratio {ridge_ratio:.3f}); {h100.source}",
                     fitted_on=h100.fitted_on)


def gemm_model_of(device_preset: str) -> GemmModel:
    """The shipped constants of a device preset."""
    if device_preset not in DEVICE_GEMM:
        raise PlannerInputError(f"unknown --device-preset {device_preset!r} (known: {', '.join(DEVICE_GEMM)})")
    return DEVICE_GEMM[device_preset]
