"""Tensor parallelism in the cost model: the profile as one device of a tensor-parallel group sees it.

A plan with tensor-parallel degree ``t`` (Shoeybi et al. 2019, Megatron-LM) runs every stage
replica on ``t`` devices of one node (the "tp" axis of its
:class:`~planner.artifacts.layout.Layout`). Each of those devices runs the per-device shard of
every layer: :func:`tensor_parallel_view` builds that per-device profile, and
:func:`device_cost_model` the cost model that prices it on the cluster's real links and ranks
(each layout it prices places its stages on real devices). The rest of the machinery (the
DP / CP-SAT / brute-force solvers, the simulator, the bounds) is the same for every t: t is
one more dimension of the same search.

A layer that declares a :class:`~planner.artifacts.profile.TensorSplit` becomes, on each of
the ``t`` devices (``f`` = split_time_fraction, ``S`` = split parameters, ``A`` = split saved
bytes; with sequence parallelism ``f`` = 1 and everything saved is split):

- forward / backward time ``T x ((1 - f) + f / t)`` (see the split work below) plus its
  collectives, each an all-reduce of
  ``collective_bytes_per_sample x b`` over the ``t`` devices on the intra-node ring
  (:func:`planner.cost.allreduce_line`): ``alpha`` terms in the intercept, bytes in the
  per-sample slope, so the time stays a line in the micro-batch size. With sequence
  parallelism each all-reduce is a reduce-scatter + all-gather of the same bytes, which a
  ring does in the same time (Korthikanti et al. 2022 section 4.2.2). They are on the
  critical path of every layer unless the stack overlaps them (``comm_overlap``: forward,
  backward; :class:`~planner.artifacts.stack.Stack`'s ``tp_overlap_*``): then each hides behind the GEMMs the
  profile names beside it at this degree (``TensorSplit.degrees``: forward, the column- and
  row-parallel GEMMs around it, as Megatron-Core's ``--tp-comm-overlap`` pipelines them;
  backward, the weight-gradient GEMM of the layer whose input gradient it reduces, Korthikanti
  et al. 2022 sec. 6.2), at most that GEMM time: ``min(c, window)`` per collective (the time
  is then fitted as a line through micro-batch sizes 1 and 8), and the GEMMs beside it run
  slower by ``Cluster.overlap_compute_loss`` of the time hidden (the SMs the collective's
  kernels hold: each hidden ms costs that share of a ms back);
- the split work's time: ``f T / t`` by the rule, or ``time_scale x f T / t`` where the profile
  lists the degree (GEMMs whose per-device shape runs at another efficiency,
  :mod:`planner.profiling.analytic.gemm`); the rest ``(1 - f) T`` whole, or ``/ t`` with
  sequence parallelism;
- parameters ``P - S + ceil(S / t)``; saved activations ``(saved - A) + A / t`` (Korthikanti et
  al. 2022 eq. 2), ``A / t`` being the degree's measured figure where the profile lists one
  (``SplitDegree.split_saved_bytes_per_sample``; what it saves below ``A / t`` is taken off the
  attention core); with sequence parallelism ``saved / t`` on Megatron-LM (eq. 4), or on torch's
  DTensor split (``TensorSplit.sequence_runtime``) ``(saved - A - Q) + (A + Q) / t`` with ``Q``
  the sequence-split bytes (``sequence_saved_bytes_per_sample``): the all-gathered input of
  each column split, and masks, stay whole there; the input kept by a recomputed layer is
  whole, or ``1 / t`` with sequence parallelism;
- the recompute levels (Korthikanti et al. 2022 Table 2): the attention core runs per head,
  so its saved bytes and its forward time divide by ``t`` with or without sequence parallelism
  (its bytes are part of ``A``): the selective level keeps ``(saved - A) + (A - C) / t``, e.g.
  ``s b h (10 + 24 / t)`` for a GPT block, or ``(saved - C) / t`` with sequence parallelism
  (``34 s b h / t``); saved bytes that do not grow with the micro-batch (``saved_bytes_fixed``)
  are whole, or ``1 / t`` with Megatron-LM's sequence parallelism (torch's keeps them whole:
  rotary tables and masks built for the whole sequence); storages two layers share
  (``Profile.shared_saved``) are counted ``1 / t`` (exact with sequence parallelism, and
  without it never more than a device holds).

A layer without a declaration runs whole on every device of the group (replicated; same time,
same parameters, no collective). An MoE layer's routed experts are taken out before the view
(:func:`strip_experts`: they follow the expert layout, not ``t``) and added back as one device of
the group runs them after the context-parallel view (:func:`planner.cost.experts.expert_view`).
Tensors crossing a stage boundary are sent ``1 / t`` by each of the group's devices over its
own link (Narayanan et al. 2021 section 4.1, the scatter/gather optimisation); the all-gather
after the receive, over NVLink, is not priced. A tied tensor whose every layer splits it
(vocabulary-parallel embedding and head) is divided by ``t``.

Devices: a group is ``t`` consecutive ranks (inside a node). Per-device memory, link
bandwidths and latencies are unchanged: every device of the group drives its own NVLink port
and its own network interface (the cluster presets give per-device inter-node bandwidth), so
the ``t`` gradient all-reduces of a tensor-parallel stage (one per shard, across its
data-parallel replicas, :meth:`Layout.dp_group`) run side by side, each on its own devices'
links, at the cost priced for one.

Which ``t`` a search covers (it divides the devices per node and every head count a layer
declares) and the groups it forms with the other axes are :mod:`planner.cost.groups`'.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence

from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.host import host_link_gb_per_s
from planner.artifacts.kinds import OptimizerKind, SequenceParallelRuntime
from planner.artifacts.layout import ONE_DEVICE, DeviceGroup
from planner.artifacts.profile import AttentionCore, Edge, Layer, Profile, SharedSaved, TiedParams, TimeFit
from planner.artifacts.stack import DEFAULT_STACK, Stack
from planner.cost.attention_kernels import attention_view
from planner.cost.collectives import allreduce_line
from planner.cost.context import ContextView, context_parallel_view
from planner.cost.experts import expert_view
from planner.cost.model import CostModel
from planner.cost.offload import offload_view
from planner.cost.recompute_view import forced_view


def _line(fit: TimeFit, scale: float, collectives: int, fixed_ms: float, per_sample_ms: float) -> TimeFit:
    return TimeFit(
        intercept_ms=fit.intercept_ms * scale + collectives * fixed_ms,
        per_sample_ms=fit.per_sample_ms * scale + collectives * per_sample_ms,
    )


def _core_view(core: AttentionCore | None, t: int, time_scale: float = 1.0, fewer: float = 0.0) -> AttentionCore | None:
    """The attention core on one of ``t`` devices: its heads, bytes and time divided by ``t``
    (the time also scaled as the layer's split work is, ``SplitDegree.time_scale``), its bytes
    less ``fewer``: what the layer's measured degree saves below ``1/t`` of its split bytes (the
    grouped-query keys and values a device keeps as views, ``SplitDegree``)."""
    if core is None:
        return None
    return AttentionCore(
        saved_bytes_per_sample=max(0.0, core.saved_bytes_per_sample / t - fewer),
        saved_bytes_fixed=core.saved_bytes_fixed / t,
        fwd=TimeFit(intercept_ms=core.fwd.intercept_ms * time_scale / t, per_sample_ms=core.fwd.per_sample_ms * time_scale / t),
    )


#: micro-batch sizes through which a time with hidden collectives (not a line in ``b``) is fitted
FIT_SIZES = (1, 8)


def _overlapped(
    fit: TimeFit, rest: float, split: float, collectives: int, fixed_ms: float, per_sample_ms: float,
    windows: tuple[float, ...], loss: float,
) -> TimeFit:
    """``fit`` on one device (``rest`` and ``split``: the shares of its time that run there) plus
    ``collectives`` collectives, each hiding up to its window (a fraction of the split work's
    time) of GEMM beside it, the GEMM slowed by ``loss`` x the time hidden
    (``Cluster.overlap_compute_loss``): ``min(c, w x split time)`` is not a line in the
    micro-batch size, so the line through :data:`FIT_SIZES` is taken."""
    ys = []
    for b in FIT_SIZES:
        t_split = split * fit.at(b)
        coll = fixed_ms + per_sample_ms * b
        hidden = (1.0 - loss) * sum(min(coll, w * t_split) for w in windows)
        ys.append(rest * fit.at(b) + t_split + collectives * coll - hidden)
    (b0, b1), (y0, y1) = FIT_SIZES, ys
    slope = max(0.0, (y1 - y0) / (b1 - b0))
    return TimeFit(intercept_ms=max(y0 - slope * b0, -slope), per_sample_ms=slope)


def _layer_view(
    layer: Layer, t: int, sp: bool, ms_per_byte: float, fixed_ms: float, comm_overlap: tuple[bool, bool], loss: float
) -> Layer:
    split = layer.tp
    if split is None:
        # a layer that does not split keeps its attention core whole (it runs every head)
        return dataclasses.replace(layer, output_bytes_per_sample=layer.output_bytes_per_sample / t, measured=())
    entry = split.degree(t)
    f = split.split_time_fraction
    rest = (1.0 - f) / t if sp else 1.0 - f
    split_share = f * (entry.time_scale if entry is not None else 1.0) / t
    scale = rest + split_share
    per_sample = ms_per_byte * split.collective_bytes_per_sample
    params = layer.param_count - split.split_param_count + math.ceil(split.split_param_count / t)
    divided = split.sp_divided_bytes_per_sample(layer.saved_bytes_per_sample) if sp else split.split_saved_bytes_per_sample
    # the split bytes on one device: 1/t of them, or what the profile measured at this degree
    heads = split.device_split_bytes_per_sample(t)
    fewer = split.split_saved_bytes_per_sample / t - heads  # what a measured degree saves below 1/t (the core's K/V)
    saved = layer.saved_bytes_per_sample - divided + (divided - split.split_saved_bytes_per_sample) / t + heads
    fixed_divided = sp and split.sequence_runtime is SequenceParallelRuntime.MEGATRON
    if comm_overlap[0] and entry is not None and any(entry.fwd_overlap):
        fwd = _overlapped(layer.fwd, rest, split_share, split.collectives_fwd, fixed_ms, per_sample, entry.fwd_overlap,
                          loss)
    else:
        fwd = _line(layer.fwd, scale, split.collectives_fwd, fixed_ms, per_sample)
    if comm_overlap[1] and entry is not None and any(entry.bwd_overlap):
        bwd = _overlapped(layer.bwd, rest, split_share, split.collectives_bwd, fixed_ms, per_sample, entry.bwd_overlap,
                          loss)
    else:
        bwd = _line(layer.bwd, scale, split.collectives_bwd, fixed_ms, per_sample)
    return dataclasses.replace(
        layer,
        fwd=fwd,
        bwd=bwd,
        measured=(),
        param_count=params,
        param_bytes=round(layer.param_bytes * params / layer.param_count) if layer.param_count else 0,
        saved_bytes_per_sample=saved,
        saved_bytes_fixed=layer.saved_bytes_fixed / t if fixed_divided else layer.saved_bytes_fixed,
        input_bytes_per_sample=layer.input_bytes_per_sample / t if sp else layer.input_bytes_per_sample,
        output_bytes_per_sample=layer.output_bytes_per_sample / t,
        tp=None,
        fp8=None if layer.fp8 is None else dataclasses.replace(layer.fp8, param_count=math.ceil(layer.fp8.param_count / t)),
        attention_core=_core_view(layer.attention_core, t, entry.time_scale if entry is not None else 1.0, fewer),
    )


def _tie_view(profile: Profile, tie: TiedParams, t: int) -> TiedParams:
    layers = [profile.layers[i] for i in tie.layers]
    if all(layer.tp is not None and layer.tp.split_param_count >= tie.param_count for layer in layers):
        count = math.ceil(tie.param_count / t)
        return dataclasses.replace(tie, param_count=count, param_bytes=round(tie.param_bytes * count / tie.param_count))
    return tie


def tensor_parallel_view(
    profile: Profile, cluster: Cluster, t: int, sp: bool = False, comm_overlap: tuple[bool, bool] = (False, False)
) -> Profile:
    """The model as one device of a tensor-parallel group of ``t`` devices on ``cluster`` runs
    it (see the module docstring); ``profile`` itself for ``t`` = 1."""
    if t == 1:
        if sp:
            raise PlannerInputError("sequence parallelism needs a tensor-parallel degree > 1")
        return profile
    if cluster.devices_per_node % t:
        raise PlannerInputError(
            f"tensor-parallel degree {t} does not divide the {cluster.devices_per_node} devices per node "
            f"of cluster {cluster.name!r}"
        )
    ms_per_byte, fixed_ms = allreduce_line(cluster, tuple(range(t)))
    speed = cluster.relative_speed  # collective times are on this cluster; layer times are divided by speed later
    layers = tuple(_layer_view(layer, t, sp, ms_per_byte * speed, fixed_ms * speed, comm_overlap,
                               cluster.overlap_compute_loss) for layer in profile.layers)
    edges = tuple(Edge(src=e.src, dst=e.dst, bytes_per_sample=e.bytes_per_sample / t) for e in profile.edges)
    return dataclasses.replace(
        profile,
        layers=layers,
        edges=edges,
        tied=tuple(_tie_view(profile, tie, t) for tie in profile.tied),
        shared_saved=tuple(
            SharedSaved(first=p.first, second=p.second, bytes_per_sample=p.bytes_per_sample / t, bytes_fixed=p.bytes_fixed / t)
            for p in profile.shared_saved
        ),
        metadata={**profile.metadata, "tp_degree": t, "sequence_parallel": sp},
    )


def _minus(a: TimeFit, b: TimeFit) -> TimeFit:
    """``a - b``, its slope at least 0 (an expert's time taken out of its layer's)."""
    intercept, slope = a.intercept_ms - b.intercept_ms, max(0.0, a.per_sample_ms - b.per_sample_ms)
    return TimeFit(intercept_ms=max(intercept, -slope), per_sample_ms=slope)


def strip_experts(profile: Profile) -> Profile:
    """``profile`` with each MoE layer's routed experts taken out (its times, parameters and saved
    bytes less theirs, no ``moe``): what the tensor- and context-parallel views price (the experts
    follow the expert layout, not ``t``: :func:`planner.cost.experts.expert_view` adds them back)."""
    if all(layer.moe is None for layer in profile.layers):
        return profile
    layers = []
    for layer in profile.layers:
        moe = layer.moe
        if moe is None:
            layers.append(layer)
            continue
        params = layer.param_count - moe.expert_param_count
        layers.append(dataclasses.replace(
            layer, fwd=_minus(layer.fwd, moe.expert_fwd), bwd=_minus(layer.bwd, moe.expert_bwd), measured=(),
            param_count=params, param_bytes=round(layer.param_bytes * params / layer.param_count) if layer.param_count else 0,
            saved_bytes_per_sample=layer.saved_bytes_per_sample - moe.expert_saved_bytes_per_sample, moe=None))
    return dataclasses.replace(profile, layers=tuple(layers))


def stack_tp_view(profile: Profile, cluster: Cluster, tp_degree: int, sequence_parallel: bool, stack: Stack) -> Profile:
    """:func:`tensor_parallel_view` with ``stack``'s tensor-parallel overlap (what
    :func:`device_cost_model` prices) of the profile without its routed experts
    (:func:`strip_experts`: they follow the expert layout, not ``t``)."""
    return tensor_parallel_view(
        strip_experts(profile), cluster, tp_degree, sequence_parallel, (stack.tp_overlap_forward, stack.tp_overlap_backward)
    )


def device_cost_model(
    profile: Profile, cluster: Cluster, optimizer: OptimizerKind, group: DeviceGroup = ONE_DEVICE,
    stack: Stack = DEFAULT_STACK, *, tp_view: Profile | None = None, cp_view: ContextView | None = None,
) -> CostModel:
    """The cost model of one device of ``group`` (a tensor-parallel group of ``tp_degree``
    devices, with sequence parallelism, inside a context-parallel group of ``cp_degree`` such
    groups, :mod:`planner.cost.context`; its routed experts laid out over ``ep_degree`` x
    ``etp_degree`` devices, :mod:`planner.cost.experts`) on ``cluster``: the per-device view of ``profile``
    priced on the cluster's own links and ranks, for the training ``stack`` (its tensor-parallel
    overlap in the view, the rest in the model). ``tp_view``: :func:`stack_tp_view` of these
    arguments, when the caller has it already (a search builds it once for every
    context-parallel degree); ``cp_view``: :func:`context_parallel_view` of that, likewise (the
    same for every expert layout of the group). The stack's attention kernel prices the attention
    (:mod:`planner.cost.attention_kernels`), and a recompute level the profile forces is folded
    into the device's view last (:mod:`planner.cost.recompute_view`)."""
    t, sp = group.tp_degree, group.sequence_parallel
    view = tp_view if tp_view is not None else stack_tp_view(profile, cluster, t, sp, stack)
    ctx = cp_view if cp_view is not None else context_parallel_view(view, cluster, group.cp_degree, t, stack)
    experts = expert_view(ctx.profile, profile, cluster, group, stack)
    device, forced_workspace = forced_view(attention_view(experts, stack.attention_kernel, stack.attention_efficiency),
                                           ctx.profile)
    offloaded = offload_view(device, host_link_gb_per_s(cluster), cluster.relative_speed)
    return CostModel(offloaded.profile, cluster, optimizer, group=group, stack=stack, offload_optimizer=offloaded.optimizer_on_host,
                     gather_bytes_per_sample=ctx.gather_bytes_per_sample + forced_workspace + offloaded.workspace_bytes_per_sample)


def device_cost_models(profile: Profile, base: Cluster, optimizer: OptimizerKind, groups: Sequence[DeviceGroup],
                       stack: Stack) -> Iterator[CostModel]:
    """:func:`device_cost_model` of each of ``groups`` in order, built as it is asked for: the
    tensor-parallel view of each ``(t, sp)`` built once for all its context-parallel degrees,
    the context-parallel view of each ``(t, sp, cp)`` once for all its expert layouts."""
    views: dict[tuple[int, bool], Profile] = {}
    contexts: dict[tuple[int, bool, int], ContextView] = {}  # per (t, sp, cp): the same for every expert layout
    for group in groups:
        t, sp, cp = group.tp_degree, group.sequence_parallel, group.cp_degree
        if (t, sp) not in views:
            views[(t, sp)] = stack_tp_view(profile, base, t, sp, stack)
        if (t, sp, cp) not in contexts:
            contexts[(t, sp, cp)] = context_parallel_view(views[(t, sp)], base, cp, t, stack)
        yield device_cost_model(profile, base, optimizer, group, stack, tp_view=views[(t, sp)],
                                cp_view=contexts[(t, sp, cp)])
