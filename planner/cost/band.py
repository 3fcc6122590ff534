"""The band of a prediction: the range its inputs' stated uncertainty leaves it (issue 47).

A plan's iteration time is priced from inputs each known only within a range. The band prices
the same plan (layout, partition, recomputation, schedule: nothing re-searched) with each input
at the two ends of its range, the others nominal (:func:`band_inputs` lists them;
:func:`planner.solve.account.with_accounts` prices them), and adds the deviations from the
nominal time in quadrature, as independent errors (:func:`combine`):

- the device's GEMM constants (:mod:`planner.profiling.analytic.gemm`): the spread of their
  leave-one-source-out fits (``DEVICE_GEMM_LOSO``: each fitted on every published source but one,
  ``benchmarks/published_runs.py``), the model rebuilt with each (analytic profiles only: a
  measured profile's times are its own). No fit saw a user's run; a published row's band, priced
  to measure the model term below, takes only the fits that saw no row of its source (for a source
  with fit rows only its own prediction's, so no range: the others were fitted on its rows). The
  term then holds those rows' GEMM error, and a plan's band adds the spread again: wider, by at
  most that spread (0-6% a side on the published rows);
- the host time per kernel (``Stack.host_us_per_kernel``): 5-20 us, the range Holistic Trace
  Analysis documents;
- the stack's attention kernel's efficiency (:mod:`planner.cost.attention_kernels`): the ends of
  its measured forward range, with the backward / forward rate's;
- the GPUs' speed variation (``Cluster.gpu_speed_variation``): none to 22%, the largest spread
  Sinha et al. (SC'22) measured in a cluster ("8% (max 22%) average performance variation": the
  largest of their per-cluster, per-application averages, five HPC clusters of V100s and MI60s).
  A range of the run's cluster, not of one GPU: the straggler term makes it the slowest of the
  run's GPUs (:func:`planner.cost.overheads.straggler_fraction`), once per run;
- collectives across nodes: NCCL's tuning model (nominal) or plain alpha-beta rings (the lower
  end: the latencies NCCL charges are its model's, not measured on this fabric);
- a pipeline send/receive between nodes: 30.7-34.2 us (nccl-tests, the range measured);
- the model's own error out of source, which the inputs above do not capture (how the element-wise
  work, the kernels and the fabric of a run differ from the model's): +-:data:`MODEL_ERROR`, for
  analytic profiles (a measured one's times are its own).

The model term is measured, not chosen. A published run priced out of source (each source with the
constants fitted on the others, ``benchmarks/published_runs.py``) misses its published time by
``d = published / predicted - 1``; the inputs' ranges above (and the settings its source leaves
out) already allow it ``below`` or ``above`` on the side it missed on. What they leave unexplained
is the run's score, ``sqrt(max(0, d^2 - side^2))`` (:func:`residual_score`): the same quadrature
the band adds with, run backwards, so an error the inputs' ranges account for is not counted twice.
A figure lies inside ``combine`` of its inputs and +-``m`` exactly when its score is at most ``m``,
so ``m`` is the :data:`BAND_COVERAGE` (nine in ten) split-conformal quantile of the scores
(:func:`conformal_quantile`: the ``ceil((n + 1) 0.9)``-th smallest of n; Vovk et al. 2005, Lei et
al. 2018 "Distribution-free predictive inference for regression"): if runs are exchangeable with
the published ones, nine in ten of them fall inside. ``benchmarks/published_runs.py`` judges it
out of source (each source's rows take ``m`` from the other sources' scores, never their own) and
prints the value over every source, which is the shipped :data:`MODEL_ERROR` (``--fit`` prints
it for pasting beside the constants). The model term is symmetric: the inputs make the band
asymmetric (the settings a source leaves out only slow a run down), and a term per side at
95% each was measured wider for the same coverage (too few runs miss on each side).

The memory at the band's top is the peak plus what a GPU process holds outside PyTorch's
allocator (:data:`RUNTIME_RESERVE_BYTES`: the CUDA context, cuBLAS workspaces, NCCL's buffers),
and "fits" is judged there.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import AttentionKernel, CollectiveModel
from planner.artifacts.plan_summary import Band
from planner.artifacts.plan_summary import BandInput as InputRange
from planner.artifacts.profile import Profile
from planner.artifacts.stack import HOST_US_PER_KERNEL_RANGE, Stack
from planner.cost.attention_kernels import BWD_RATE, KERNELS
from planner.cost.offload import carry_offload
from planner.cost.precision import like_precision
from planner.profiling.analytic.common import DEVICE_PRESETS
from planner.profiling.analytic.gemm import DEVICE_GEMM_LOSO, GemmModel

__all__ = ["BAND_COVERAGE", "GPU_VARIATION_RANGE", "MODEL_ERROR", "MODEL_ERROR_SOURCE",
           "P2P_LATENCY_RANGE_US", "RUNTIME_RESERVE_BYTES", "BandEnd", "BandSetting", "band_ends", "band_inputs",
           "band_of", "combine", "conformal_quantile", "memory_top_bytes", "residual_score", "with_setting"]

GIB = 1024**3
#: memory a training process holds outside PyTorch's caching allocator: the CUDA context, cuBLAS
#: workspaces, NCCL's buffers. A public H100 out-of-memory report reads 79.11 GiB total, 77.78 allocated,
#: 0.4 reserved but unallocated and ~0.15 free: ~0.8 GiB outside the allocator; 1 GiB assumed.
RUNTIME_RESERVE_BYTES = GIB
#: the spread of GPU speeds within a cluster: none, to the largest Sinha et al. (SC'22) measured (22%)
GPU_VARIATION_RANGE = (0.0, 0.22)
#: NCCL send/recv between two nodes, 256 B - 8 KiB (nccl-tests, NVIDIA/nccl-tests issue #214)
P2P_LATENCY_RANGE_US = (30.7, 34.2)
#: the share of out-of-source figures the band is meant to hold (its model term's conformal level)
BAND_COVERAGE = 0.9
#: :func:`conformal_quantile` at :data:`BAND_COVERAGE` of the :func:`residual_score` of every published
#: run priced out of source (benchmarks/published_runs.py, printed there; 43 figures from 5 sources, 2026-12-07,
#: each row's GEMM spread from the fits that saw no row of its source)
MODEL_ERROR = 0.096
#: the band input's name
MODEL_ERROR_SOURCE = "model error out of source"


@dataclass(frozen=True, slots=True, kw_only=True)
class BandSetting:
    """One end of one input's range (None: the input as the plan has it)."""

    gemm: GemmModel | None = None
    host_us_per_kernel: float | None = None
    attention_efficiency: tuple[float, ...] | None = None
    gpu_speed_variation: float | None = None
    collective_model: CollectiveModel | None = None
    inter_node_p2p_latency_us: float | None = None
    scale: float | None = None  # the model's own error: the iteration scaled by this


@dataclass(frozen=True, slots=True, kw_only=True)
class BandInput:
    """An input's name, where its range comes from, and its two ends (or, for the GEMM constants,
    every leave-one-source-out fit: the band takes their extremes)."""

    name: str
    source: str
    settings: tuple[BandSetting, ...]


def _device_of(profile: Profile) -> str:
    """The analytic device preset an analytic profile was priced on ("" if none)."""
    if profile.source != "analytic":
        return ""
    return next((key for key, preset in DEVICE_PRESETS.items() if preset.name == profile.device), "")


def band_inputs(profile: Profile, cluster: Cluster, stack: Stack) -> list[BandInput]:
    """The uncertain inputs of a plan of ``profile`` on ``cluster`` under ``stack`` (module docstring)."""
    out = []
    fits = DEVICE_GEMM_LOSO.get(_device_of(profile), ())
    if fits and _rebuild(profile, fits[0]) is not None:
        out.append(BandInput(name="GEMM constants", source="the device's leave-one-source-out fits "
                             "(planner.profiling.analytic.gemm.DEVICE_GEMM_LOSO)",
                             settings=tuple(BandSetting(gemm=g) for g in fits)))
    if stack.host_us_per_kernel and profile.source == "analytic":
        out.append(BandInput(name="host time per kernel", source="Holistic Trace Analysis: 5-20 us",
                             settings=tuple(BandSetting(host_us_per_kernel=v) for v in HOST_US_PER_KERNEL_RANGE)))
    kernel = KERNELS.get((stack.attention_kernel, _device_of(profile)))
    if kernel is not None and stack.attention_kernel is not AttentionKernel.MODEL:
        out.append(BandInput(name="attention kernel", source=kernel.source, settings=tuple(
            BandSetting(attention_efficiency=(f, r)) for f, r in zip(kernel.forward, BWD_RATE))))
    if cluster.gpu_speed_variation:
        out.append(BandInput(name="GPU speed variation", source="Sinha et al. SC'22: up to 22%",
                             settings=tuple(BandSetting(gpu_speed_variation=v) for v in GPU_VARIATION_RANGE)))
    if cluster.collective_model is CollectiveModel.NCCL:
        out.append(BandInput(name="collective model", source="alpha-beta rings .. NCCL's tuning model",
                             settings=(BandSetting(collective_model=CollectiveModel.ALPHA_BETA),)))
    if profile.source == "analytic":
        out.append(BandInput(name=MODEL_ERROR_SOURCE, source=f"{BAND_COVERAGE:.0%} conformal quantile of the published runs' out-of-source "
                             f"errors left after their inputs' ranges: {MODEL_ERROR:.1%}",
                             settings=(BandSetting(scale=1.0 - MODEL_ERROR), BandSetting(scale=1.0 + MODEL_ERROR))))
    if cluster.num_nodes > 1 and cluster.inter_node_p2p_latency_us:
        out.append(BandInput(name="send/receive across nodes", source="nccl-tests: 30.7-34.2 us",
                             settings=tuple(BandSetting(inter_node_p2p_latency_us=v) for v in P2P_LATENCY_RANGE_US)))
    return out


def with_setting(setting: BandSetting, profile: Profile, cluster: Cluster, stack: Stack) -> tuple[Profile, Cluster, Stack]:
    """The model, cluster and stack with ``setting`` applied."""
    if setting.gemm is not None:
        rebuilt = _rebuild(profile, setting.gemm)
        # rebuilt in bf16: priced again at the profile's precision (planner.cost.precision), the
        # offload choice carried over
        if rebuilt is not None:
            profile = carry_offload(profile, like_precision(rebuilt, cluster, profile))
    changes = {k: getattr(setting, k) for k in ("gpu_speed_variation", "collective_model", "inter_node_p2p_latency_us")
               if getattr(setting, k) is not None}
    if changes:
        cluster = dataclasses.replace(cluster, **changes)
    if setting.host_us_per_kernel is not None:
        stack = dataclasses.replace(stack, host_us_per_kernel=setting.host_us_per_kernel)
    if setting.attention_efficiency is not None:
        stack = dataclasses.replace(stack, attention_efficiency=setting.attention_efficiency)
    return profile, cluster, stack


#: one end of an input's range as a plan is priced again there: the iteration's scale (the model's own
#: error), or the model, cluster and stack to price it with
BandEnd = float | tuple[Profile, Cluster, Stack]


def band_ends(profile: Profile, cluster: Cluster, stack: Stack) -> list[tuple[BandInput, tuple[BandEnd, ...]]]:
    """Each uncertain input of a plan (:func:`band_inputs`) with its ends to price the plan at
    (:func:`with_setting` applied)."""
    return [(entry, tuple(s.scale if s.scale is not None else with_setting(s, profile, cluster, stack)
                          for s in entry.settings)) for entry in band_inputs(profile, cluster, stack)]


def band_of(nominal_ms: float, priced: Sequence[tuple[BandInput, Sequence[float]]], peak_bytes: int,
            cluster: Cluster) -> Band:
    """The band of a plan of iteration ``nominal_ms`` and peak ``peak_bytes`` whose inputs, at
    their ends, price it at ``priced``'s times: each input's range (the nominal time inside it),
    their deviations added in quadrature (:func:`combine`), the memory top
    (:func:`memory_top_bytes`)."""
    t = nominal_ms
    inputs = tuple(InputRange(name=entry.name, low_ms=min([*times, t]), high_ms=max([*times, t]), source=entry.source)
                   for entry, times in priced)
    low, high = combine(t, [(i.low_ms, i.high_ms) for i in inputs])
    return Band(iteration_low_ms=low, iteration_high_ms=high, peak_memory_high_bytes=memory_top_bytes(peak_bytes, cluster),
                device_memory_bytes=cluster.device_memory_bytes, inputs=inputs)


def combine(nominal_ms: float, ranges: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(low, high) of the iteration: each input's (low, high) deviation from ``nominal_ms`` added in
    quadrature (independent errors)."""
    below = math.sqrt(sum(max(0.0, nominal_ms - lo) ** 2 for lo, _ in ranges))
    above = math.sqrt(sum(max(0.0, hi - nominal_ms) ** 2 for _, hi in ranges))
    return max(0.0, nominal_ms - below), nominal_ms + above


def residual_score(deviation: float, below: float, above: float) -> float:
    """What of a figure's out-of-source error its inputs' ranges leave unexplained (module
    docstring): ``deviation`` = published / predicted - 1, ``below`` / ``above`` the band's
    half-widths without the model term, as fractions of the prediction."""
    side = above if deviation > 0 else below
    return math.sqrt(max(0.0, deviation * deviation - side * side))


def conformal_quantile(scores: Sequence[float], coverage: float = BAND_COVERAGE) -> float:
    """The split-conformal quantile of ``scores``: the ``ceil((n + 1) coverage)``-th smallest, a
    bound a further exchangeable score stays within with probability at least ``coverage``; the
    largest where fewer than ``coverage / (1 - coverage)`` scores are given (then less is promised)."""
    if not scores:
        raise ValueError("conformal_quantile needs at least one score")
    ordered = sorted(scores)
    rank = math.ceil((len(ordered) + 1) * coverage)
    return ordered[min(rank, len(ordered)) - 1]


def memory_top_bytes(peak_bytes: int, cluster: Cluster) -> int:
    """The peak memory at the band's top: with a CUDA device, what the process holds outside the
    allocator too (:data:`RUNTIME_RESERVE_BYTES`)."""
    return peak_bytes + (RUNTIME_RESERVE_BYTES if cluster.device_name.startswith("NVIDIA") else 0)


def _rebuild(profile: Profile, gemm: GemmModel) -> Profile | None:
    """:func:`planner.profiling.analytic.rebuild.rebuild_with`, imported when a band needs it (the
    analytic generators are not loaded to plan a measured profile)."""
    from planner.profiling.analytic.rebuild import rebuild_with

    return rebuild_with(profile, gemm)
