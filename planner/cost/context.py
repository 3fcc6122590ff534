"""Context parallelism in the cost model: the profile as one device of a context-parallel group sees it.

A plan with context-parallel degree ``cp`` (the "cp" axis of its
:class:`~planner.artifacts.layout.Layout`) splits every sample's sequence of ``s`` tokens over
``cp`` devices, as Llama 3 trains its long contexts (Dubey et al. 2024, sec. 3.3.2): the
sequence is cut into ``2 cp`` chunks and rank ``i`` holds chunks ``i`` and ``2 cp - 1 - i``, so
that every rank does the same share of a causal mask's work; before each attention the keys
and values are all-gathered over the group, and their gradients reduce-scattered after its
backward. :func:`context_parallel_view` builds the per-device profile (as
:mod:`planner.cost.tensor_parallel` does for ``t``, after it), so the DP / CP-SAT / brute-force
solvers, the simulator and the bounds price ``cp`` with no change. Per layer and micro-batch of
``b`` samples, on each of the ``cp`` devices:

- token-wise work (the GEMMs, norms, MLP, the embedding and the head: everything but the
  attention core) on ``s / cp`` tokens: its time ``x r / cp``, ``r`` = the GEMM model's
  efficiency at ``s`` tokens over that at ``s / cp`` (:class:`~planner.profiling.analytic.gemm.GemmModel`
  for an ``s x h . h x h`` product, ``h / t`` wide with tensor parallelism: shorter products run
  at a lower efficiency); the attention core (its forward as the profile has it, its backward
  :data:`CORE_BWD_FACTOR` times that) ``/ cp``: the balanced split gives each rank ``1 / cp`` of
  the causal score matrix, and its product keeps its shape (``s / cp`` queries against ``s``
  keys). A line's intercept (fixed per-call time) stays whole;
- the collectives (a layer with an attention core): forward, an all-gather of its keys and
  values, ``K = 2 s g d x 2`` bytes per sample (``g`` key/value heads of width ``d``, ``/ t``
  with tensor parallelism; each rank receives ``(cp - 1) / cp`` of it); backward, the same
  all-gather again (the gathered keys and values are not kept, see memory) and a
  reduce-scatter of their gradients. Each is half the all-reduce line of the cp group's ranks
  (:func:`planner.cost.collectives.allreduce_line`: intra- or inter-node as the layout places
  them: a cp group is ``cp`` ranks ``t`` apart). On the critical path unless the stack overlaps
  a layer's collectives with its own compute (``Stack.cp_overlap``: ring attention overlaps its
  transfers with the attention blocks, Megatron-Core's and torchtitan's; a flag of its own,
  apart from the tensor-parallel overlap): then each
  direction hides behind the attention core's time in that direction, at most that time
  (the time is then fitted as a line through micro-batch sizes 1 and 8);
- memory: saved activations, a recomputed layer's input, the attention core's bytes and every
  tensor crossing a stage boundary ``/ cp``; parameters whole (replicated over the group:
  gradients are synchronised and ZeRO-sharded over dp x cp, :meth:`Layout.grad_group`); plus
  the gathered keys and values of one layer in flight, ``K b`` per device on every stage
  (:attr:`ContextView.gather_bytes_per_sample`). The runtime does what this prices: a kept
  attention core saves only the rank's own K and V and re-gathers them in its backward
  (``planner.models.context.SequenceShard.regathering``), a recomputed one re-runs the gather
  with the core; tests/test_runtime_context.py measures a rank's saved bytes against this
  view's activation bytes and the re-gathered K/V live at once against one layer's.

What scales with the sequence must be declared: the analytic GPT and Llama profiles
(:mod:`planner.profiling.analytic`) record their generator's parameters in their metadata
(``seq``, ``hidden``, ``heads``, for Llama ``kv_heads`` and ``head_dim``, and the GEMM model's
constants), from which :func:`planner.profiling.analytic.sequence.sequence_shape` reads them. A
measured or imported profile does not say which of its time is token-wise and which is
attention, nor its key/value bytes: context parallelism is not searched for it (the degrees a
search covers are :mod:`planner.cost.context_degrees`').
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import AttentionKind
from planner.artifacts.profile import AttentionCore, Edge, Layer, Profile, SharedSaved, TimeFit
from planner.artifacts.stack import DEFAULT_STACK, Stack
from planner.cost.collectives import allreduce_line
from planner.cost.context_degrees import refusal
from planner.profiling.analytic.sequence import SequenceShape, sequence_shape

__all__ = ["ContextView", "context_parallel_view", "gemm_ratio"]

#: the attention core's backward over its forward: FlashAttention recomputes the scores (2.5,
#: Dao et al. 2022 as :mod:`planner.profiling.analytic.attention` counts it), materialised 2
CORE_BWD_FACTOR = {AttentionKind.FLASH: 2.5, AttentionKind.MATERIALISED: 2.0}
#: micro-batch sizes through which a time with hidden collectives (not a line in ``b``) is fitted
FIT_SIZES = (1, 8)


@dataclass(frozen=True, slots=True)
class ContextView:
    """The per-device profile under ``cp`` and the bytes of one layer's gathered keys and values
    per sample (live on a device while that layer runs)."""

    profile: Profile
    gather_bytes_per_sample: float


def _scaled(fit: TimeFit, scale: float) -> TimeFit:
    return TimeFit(intercept_ms=fit.intercept_ms, per_sample_ms=fit.per_sample_ms * scale)


def _with_collective(rest: TimeFit, core: TimeFit, coll: tuple[float, float], hide: bool) -> TimeFit:
    """``rest + core`` plus a collective of ``coll`` = (fixed ms, ms per sample); with ``hide``
    it runs beside the core, exposed only beyond it (a line through :data:`FIT_SIZES`)."""
    if not hide:
        return TimeFit(intercept_ms=rest.intercept_ms + core.intercept_ms + coll[0],
                       per_sample_ms=rest.per_sample_ms + core.per_sample_ms + coll[1])
    ys = [rest.at(b) + max(core.at(b), coll[0] + coll[1] * b) for b in FIT_SIZES]
    (b0, b1), (y0, y1) = FIT_SIZES, ys
    slope = max(0.0, (y1 - y0) / (b1 - b0))
    return TimeFit(intercept_ms=max(y0 - slope * b0, -slope), per_sample_ms=slope)


def _view_times(layer: Layer, cp: int, r: float, bwd_factor: float, kv: float, line: tuple[float, float],
                stack: Stack) -> tuple[TimeFit, TimeFit, AttentionCore | None]:
    """One device's forward and backward lines of ``layer`` in a ``cp`` group, and its attention
    core's (see the module docstring)."""
    core = layer.attention_core
    token = r / cp
    if core is None:
        return _scaled(layer.fwd, token), _scaled(layer.bwd, token), None
    c_fwd = core.fwd
    c_bwd = TimeFit(intercept_ms=c_fwd.intercept_ms * bwd_factor, per_sample_ms=c_fwd.per_sample_ms * bwd_factor)
    rest_f = TimeFit(intercept_ms=max(0.0, layer.fwd.intercept_ms - c_fwd.intercept_ms),
                     per_sample_ms=max(0.0, layer.fwd.per_sample_ms - c_fwd.per_sample_ms) * token)
    rest_b = TimeFit(intercept_ms=max(0.0, layer.bwd.intercept_ms - c_bwd.intercept_ms),
                     per_sample_ms=max(0.0, layer.bwd.per_sample_ms - c_bwd.per_sample_ms) * token)
    per_byte, fixed = line
    gather = (0.5 * fixed, 0.5 * per_byte * kv)  # an all-gather: half the all-reduce line
    fwd = _with_collective(rest_f, _scaled(c_fwd, 1.0 / cp), gather, stack.cp_overlap)
    # backward: the keys and values gathered again, their gradients reduce-scattered
    bwd = _with_collective(rest_b, _scaled(c_bwd, 1.0 / cp), (2 * gather[0], 2 * gather[1]), stack.cp_overlap)
    return fwd, bwd, AttentionCore(saved_bytes_per_sample=core.saved_bytes_per_sample / cp,
                                   saved_bytes_fixed=core.saved_bytes_fixed, fwd=_scaled(c_fwd, 1.0 / cp))


def _layer_view(layer: Layer, cp: int, times: tuple[TimeFit, TimeFit, AttentionCore | None]) -> Layer:
    fwd, bwd, core = times  # core None: the layer has none
    return dataclasses.replace(
        layer, fwd=fwd, bwd=bwd, measured=(), tp=None,
        saved_bytes_per_sample=layer.saved_bytes_per_sample / cp,
        input_bytes_per_sample=layer.input_bytes_per_sample / cp,
        output_bytes_per_sample=layer.output_bytes_per_sample / cp, attention_core=core,
    )


def gemm_ratio(shape: SequenceShape, cp: int, tp_degree: int = 1) -> float:
    """``r``: the GEMM model's efficiency on ``s`` tokens over that on ``s / cp`` (>= 1)."""
    h = float(shape.hidden)
    full = shape.gemm.efficiency(float(shape.seq), h / tp_degree, h)
    return full / shape.gemm.efficiency(shape.seq / cp, h / tp_degree, h)


def context_parallel_view(profile: Profile, cluster: Cluster, cp: int, tp_degree: int = 1,
                          stack: Stack = DEFAULT_STACK) -> ContextView:
    """One device of a ``cp`` group of ``tp_degree``-device groups (``profile`` is the
    tensor-parallel view already): see the module docstring. ``profile`` itself for ``cp`` = 1."""
    if cp == 1:
        return ContextView(profile, 0.0)
    shape = sequence_shape(profile)
    if shape is None:
        raise PlannerInputError(refusal(profile, cp * tp_degree, tp_degree, cp))
    ranks = tuple(c * tp_degree for c in range(cp))
    if ranks[-1] >= cluster.num_devices:
        raise PlannerInputError(f"context-parallel degree {cp} x {tp_degree} needs more than the {cluster.num_devices} "
                                f"devices of cluster {cluster.name!r}")
    per_byte, fixed = allreduce_line(cluster, ranks)
    speed = cluster.relative_speed  # collective times are on this cluster; layer times are divided by speed later
    kv = shape.kv_bytes_per_sample / tp_degree
    r = gemm_ratio(shape, cp, tp_degree)
    factor = CORE_BWD_FACTOR[profile.attention]
    times: dict[tuple[object, ...], tuple[TimeFit, TimeFit, AttentionCore | None]] = {}  # equal layers: worked out once
    layers = []
    for layer in profile.layers:
        key = (layer.fwd, layer.bwd, layer.attention_core)
        if key not in times:
            times[key] = _view_times(layer, cp, r, factor, kv, (per_byte * speed, fixed * speed), stack)
        layers.append(_layer_view(layer, cp, times[key]))
    view = dataclasses.replace(
        profile,
        layers=tuple(layers),
        edges=tuple(Edge(src=e.src, dst=e.dst, bytes_per_sample=e.bytes_per_sample / cp) for e in profile.edges),
        shared_saved=tuple(
            SharedSaved(first=p.first, second=p.second, bytes_per_sample=p.bytes_per_sample / cp, bytes_fixed=p.bytes_fixed)
            for p in profile.shared_saved
        ),
        metadata={**profile.metadata, "cp_degree": cp},
    )
    return ContextView(view, kv)
