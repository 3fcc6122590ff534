"""Mixture-of-experts in the cost model: the routed experts as one device of an expert layout sees them.

A plan's MoE layers have their experts laid out apart from attention over the same ranks
(:class:`~planner.artifacts.layout.Layout`: ``ep`` x ``etp`` x ``edp``, "parallel folding").
The per-device profile a :class:`~planner.cost.model.CostModel` prices is built in three steps
(:func:`planner.cost.tensor_parallel.device_cost_model`): the tensor-parallel view takes each MoE
layer's routed experts out (their times, parameters and saved bytes, ``Layer.moe``:
:func:`planner.cost.tensor_parallel.strip_experts`) and prices the rest, as the context-parallel
view does after it; :func:`expert_view` adds the experts back as one device of the group runs
them. The expert layouts a search covers are :mod:`planner.cost.expert_degrees`'. Per MoE layer
and micro-batch of ``b`` samples, on one device
(``s`` tokens per sample, ``k`` of ``E`` experts per token, width ``h``, expert FFN width ``F``;
tokens per device ``T = b s / (t cp)`` with sequence parallelism, ``b s / cp`` without, since
then every tensor-parallel rank routes all of them; ``L`` the busiest rank's load over the mean,
:attr:`~planner.artifacts.moe.MoeStack.load_factor`: 1 forced balance, ``1 + skew`` dropless,
the capacity factor when padded to capacity):

- experts' compute: the device holds ``E / ep`` experts, each receiving ``m = L T k ep etp / E``
  tokens (expert tensor parallelism all-gathers the ``etp`` ranks' tokens and splits ``F``): the
  grouped GEMMs at the GEMM model's efficiency for ``m x h . h x 2F/etp`` and
  ``m x F/etp . F/etp x h`` (:func:`planner.profiling.analytic.moe.expert_gemm_ms`; the profile's
  constants, as :mod:`planner.cost.context` reads them; a profile without them: its own expert
  time x the device's share), plus the profile's element-wise expert work (permutation,
  activation, un-permutation) x ``L T / (b s)``;
- dispatch and combine, each an all-to-all of ``T k`` token copies of ``h x 2`` bytes over the
  expert-parallel group, forward (dispatch, combine) and backward (their gradients: combine,
  dispatch), the busiest rank receiving ``L`` times the mean:

  * NCCL's all-to-all (:attr:`MoeDispatcher.ALLTOALL`): every copy on its own; of a device's
    copies ``(g - 1) / ep`` go to the ``g - 1`` other group ranks of its node (NVLink) and
    ``(ep - g) / ep`` to other nodes (its network interface); the two at once:
    ``max(intra / B_intra, inter / B_inter) + alpha``, on the cluster's links;
  * DeepEP (:attr:`MoeDispatcher.DEEPEP`; DeepSeek-AI 2025, github.com/deepseek-ai/DeepEP): a
    token crosses the network once per remote node holding one of its experts, then is forwarded
    over NVLink: inter-node bytes per token ``h x 2`` x the expected remote nodes it reaches,
    ``n (1 - C(E - E/n, k) / C(E, k)) (n - 1) / n`` over ``n`` nodes of the group (node-limited
    routing, ``MoeLayer.max_nodes_per_token`` = M: its ``k`` experts within ``M`` nodes, the same
    count over ``M``), NVLink bytes ``(g - 1) / g`` of the copies; at the fractions of the links
    DeepEP's normal kernels reached on H800 (V1 README: 153 of ~160 GB/s NVLink, EP 8, and 43 of
    ~50 GB/s RDMA, EP 16: :data:`DEEPEP_NVLINK_FRACTION`, :data:`DEEPEP_RDMA_FRACTION`); where
    the group spans nodes, each forward dispatch (the one that is not cached: the backward's
    reuse its layout) first runs the internode ``notify_dispatch``, three NVSHMEM barriers over
    the group and the token counts' exchange, and the host waits for its result before it can
    allocate the received tokens and issue the rest of the layer (DeepEP's
    ``Buffer.internode_dispatch`` polls the counts on the CPU: "timeout (dispatch CPU)"):
    :data:`DEEPEP_INTERNODE_NOTIFY_MS` (deepseek-ai/DeepEP#94, "about 1ms" in DeepSeek's
    published training profile, deepseek-ai/profile-data: EP 64, 4K sequence, balanced routing),
    on the forward's critical path before the dispatch (with the 1F1B overlap: hidden, below) and
    on the host's (:func:`deepep_notify_ms`; the profile's ``moe_notify_ms``, read by
    :func:`planner.cost.host.host_floor_ms`); within a node the notify is a barrier over
    NVLink and is not priced;
  * with ``etp`` > 1 the dispatched tokens are all-gathered over the expert tensor-parallel group
    and the experts' outputs reduce-scattered (Megatron-Core's all-to-all dispatcher), each half
    that group's all-reduce line (:func:`planner.cost.collectives.allreduce_line`);

  with :attr:`MoeStack.a2a_overlap` (Megatron-Core's 1F1B all-to-all overlap,
  ``--overlap-moe-expert-parallel-comm``; DeepSeek-AI 2024 sec. 3.2.1's pairing: one
  micro-batch's forward merged with another's backward, each all-to-all beside a computation of
  the other pass) a layer's forward and backward take ``sum over four phases of max(compute,
  a)``: the forward's attention beside the backward's combine, the backward's experts beside the
  forward's dispatch, the forward's experts beside the backward's dispatch, the backward's
  attention beside the forward's combine; each ms hidden costs ``Cluster.overlap_compute_loss`` of
  a ms of compute (the SMs the communication kernels hold); DeepEP's internode notify runs before
  the forward's dispatch, beside the backward's experts, and is taken as hidden there (a fixed
  cost, kept out of the phases' maxima: those are fitted as lines in the micro-batch size, and a
  fixed time exposed at small micro-batches only would tilt them), but it still holds the host.
  Steady state only: the pipeline's
  warm-up and cool-down passes, a few of its ``2 v M`` per rank, are priced as merged too;
- memory: the experts' parameters ``/ (ep etp)``; their saved bytes ``L T / (b s)`` of the
  profile's, the token-wide part (``2 h + 4`` bytes per copy: the permuted input, the fp32
  probability) x ``etp`` (gathered), the ``F``-wide part unchanged in total (``etp`` times the
  tokens at ``1 / etp`` of the width);
- the selective recompute level of an MoE layer (:mod:`planner.artifacts.moe`): the experts'
  activation and the norms re-run in backward, freeing ``MoeLayer.act_saved_bytes_per_sample``
  and ``norm_saved_bytes_per_sample`` at the device's share, for ``MoeLayer.recompute_fwd`` at that
  share: the view's ``Layer.attention_core`` of the layer (the attention core keeps its own level
  in dense layers only).

Gradients of the experts' parameters are synchronised, and their ZeRO state sharded, over the
expert data-parallel group (:meth:`Layout.edp_group`): the cost model's expert terms
(:mod:`planner.cost.model`). Collective times are on this cluster; like the tensor-parallel
view's they are multiplied by ``relative_speed`` so that the cost model's division leaves them
as they are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from planner.artifacts.cluster import Cluster
from planner.artifacts.layout import DeviceGroup
from planner.artifacts.moe import MoeDispatcher, MoeLayer, MoeStack
from planner.artifacts.profile import AttentionCore, Layer, Profile, TimeFit
from planner.artifacts.stack import Stack
from planner.cost.collectives import allreduce_line
from planner.profiling.analytic.gemm import GemmModel
from planner.profiling.analytic.grouped import FIT_SIZES, expert_gemm_ms, line_through

__all__ = ["DEEPEP_INTERNODE_NOTIFY_MS", "DEEPEP_NVLINK_FRACTION", "DEEPEP_RDMA_FRACTION", "ExpertLinks", "alltoall_ms",
           "deepep_notify_ms", "expert_links", "expert_view", "remote_nodes"]

#: DeepEP's normal kernels' bottleneck bandwidth over the link's (V1 README, H800: intranode EP 8
#: dispatch 153 GB/s of ~160 GB/s NVLink)
DEEPEP_NVLINK_FRACTION = 153.0 / 160.0
#: likewise across nodes (V1 README, H800 with CX7 400 Gb/s: internode EP 16 dispatch 43 GB/s of
#: ~50 GB/s RDMA; EP 32 and 64 report 58 and 51 "logical" GB/s, local traffic included)
DEEPEP_RDMA_FRACTION = 43.0 / 50.0
#: bytes of the fp32 router probability each token copy carries
PROB_BYTES = 4
#: ms of DeepEP's internode ``notify_dispatch`` before each non-cached dispatch (three NVSHMEM global
#: barriers over the group's ranks and the token counts' exchange; the host waits for its result):
#: "about 1ms" in DeepSeek's published training profile (deepseek-ai/DeepEP#94 reading
#: deepseek-ai/profile-data's train.json: H800, EP 64, TP 1, 4K sequence, balanced routing); cited, not fitted
DEEPEP_INTERNODE_NOTIFY_MS = 1.0


def _add(a: TimeFit, b: TimeFit) -> TimeFit:
    return TimeFit(intercept_ms=a.intercept_ms + b.intercept_ms, per_sample_ms=a.per_sample_ms + b.per_sample_ms)


@dataclass(frozen=True, slots=True)
class ExpertLinks:
    """Where an expert-parallel group's ranks sit: ``ep`` ranks, ``nodes`` nodes, at most
    ``per_node`` of them in one node; ``etp`` line: the expert tensor-parallel group's all-reduce
    line (ms per byte, ms)."""

    ep: int
    nodes: int
    per_node: int
    etp_line: tuple[float, float]


def expert_links(cluster: Cluster, group: DeviceGroup) -> ExpertLinks:
    """The expert-parallel group of ``group``'s layouts: ``ep`` ranks ``etp`` apart from a node's
    first device (a pipeline rank's block starts a node when it spans nodes)."""
    ep, etp = group.ep_degree, group.etp_degree
    counts: dict[int, int] = {}
    for j in range(ep):
        node = cluster.node_of(min(j * etp, cluster.num_devices - 1))
        counts[node] = counts.get(node, 0) + 1
    return ExpertLinks(ep, len(counts), max(counts.values()), allreduce_line(cluster, tuple(range(etp))))


def remote_nodes(num_experts: int, top_k: int, nodes: int, max_nodes: int = 0) -> float:
    """Expected nodes other than its own that one token's ``top_k`` experts (drawn evenly from
    ``num_experts`` spread over ``nodes``) fall on; node-limited to ``max_nodes`` (0: any)."""
    if nodes <= 1:
        return 0.0
    reach = nodes if not max_nodes or max_nodes >= nodes else max_nodes
    pool = num_experts * reach // nodes  # the experts of the nodes a token may reach
    per_node = num_experts // nodes
    miss = math.comb(pool - per_node, top_k) / math.comb(pool, top_k) if pool - per_node >= top_k else 0.0
    distinct = reach * (1.0 - miss)
    return distinct * (nodes - 1) / nodes


def alltoall_ms(cluster: Cluster, links: ExpertLinks, moe: MoeLayer, stack: MoeStack, copies: float) -> float:
    """One dispatch (or combine) of ``copies`` token copies from one device over its expert-parallel
    group (module docstring), the busiest receiver's load included; 0 with one rank."""
    ep = links.ep
    if ep <= 1 or copies <= 0:
        return 0.0
    nbytes = copies * moe.token_bytes * stack.load_factor
    intra_bw, inter_bw = cluster.intra_node_bandwidth_gb_per_s * 1e6, cluster.inter_node_bandwidth_gb_per_s * 1e6
    g = links.per_node
    latency = (cluster.inter_node_latency_us if links.nodes > 1 else cluster.intra_node_latency_us) / 1e3
    if stack.dispatcher is MoeDispatcher.ALLTOALL:
        intra = nbytes * (g - 1) / ep / intra_bw
        inter = nbytes * (ep - g) / ep / inter_bw
        return max(intra, inter) + latency
    tokens = nbytes / moe.top_k
    remote = remote_nodes(moe.num_experts, moe.top_k, links.nodes, moe.max_nodes_per_token)
    inter = tokens * remote / (inter_bw * DEEPEP_RDMA_FRACTION)
    intra = nbytes * (g - 1) / g / (intra_bw * DEEPEP_NVLINK_FRACTION)
    return max(intra, inter) + latency


def _gemm_model(meta: Mapping[str, object]) -> tuple[GemmModel, float] | None:
    """The GEMM model and peak FLOPs per ms an analytic profile records (None: a measured one)."""
    peak = meta.get("peak_bf16_tflops")
    if not isinstance(peak, float):
        return None
    model = GemmModel.of_metadata(meta)
    return None if model is None else (model, peak * 1e9)


@dataclass(frozen=True, slots=True)
class _Device:
    """What one device of the group does of an MoE layer (module docstring)."""

    share: float  # T / (b s): the device's tokens over a sample's
    load: float  # L
    etp: int
    ep: int


def _expert_times(moe: MoeLayer, dev: _Device, gemm: tuple[GemmModel, float] | None) -> tuple[TimeFit, TimeFit]:
    """The experts' forward and backward on one device (module docstring)."""
    if gemm is None:
        scale = dev.share * dev.load
        return (TimeFit(intercept_ms=moe.expert_fwd.intercept_ms * scale, per_sample_ms=moe.expert_fwd.per_sample_ms * scale),
                TimeFit(intercept_ms=moe.expert_bwd.intercept_ms * scale, per_sample_ms=moe.expert_bwd.per_sample_ms * scale))
    model, peak = gemm
    s, k, e, h, f = moe.tokens_per_sample, moe.top_k, moe.num_experts, moe.hidden, moe.expert_ffn_hidden

    def grouped(b: int, tokens: float, experts: float, ffn: float, backward: bool) -> float:
        return expert_gemm_ms(model, peak, tokens_per_expert=tokens, experts=experts, hidden=h, ffn=ffn, backward=backward)

    def at(b: int, backward: bool) -> float:
        whole = (moe.expert_bwd if backward else moe.expert_fwd).at(b)
        elementwise = max(0.0, whole - grouped(b, b * s * k / e, e, f, backward))
        per_expert = dev.load * b * s * dev.share * k * dev.ep * dev.etp / e
        return grouped(b, per_expert, e / dev.ep, f / dev.etp, backward) + elementwise * dev.share * dev.load

    return line_through({b: at(b, False) for b in FIT_SIZES}), line_through({b: at(b, True) for b in FIT_SIZES})


def _comm(cluster: Cluster, links: ExpertLinks, moe: MoeLayer, stack: MoeStack, dev: _Device) -> TimeFit:
    """One direction's dispatch + combine (and the expert tensor-parallel gather and scatter) of
    the layer on one device, a line in the micro-batch size (x ``relative_speed``: module
    docstring)."""
    def at(b: int) -> float:
        copies = b * moe.tokens_per_sample * dev.share * moe.top_k
        a2a = 2.0 * alltoall_ms(cluster, links, moe, stack, copies)
        per_byte, fixed = links.etp_line
        gathered = copies * dev.etp * moe.token_bytes * stack.load_factor
        etp = (per_byte * gathered + fixed) if dev.etp > 1 else 0.0  # half a line each, a gather and a scatter
        return (a2a + etp) * cluster.relative_speed

    return line_through({b: at(b) for b in FIT_SIZES})


def _overlapped(rest: tuple[TimeFit, TimeFit], experts: tuple[TimeFit, TimeFit], comm: TimeFit,
                loss: float) -> tuple[TimeFit, TimeFit, TimeFit, TimeFit]:
    """(forward, backward, exposed forward comm, exposed backward comm) of a layer whose forward
    runs merged with another micro-batch's backward (module docstring): in four phases, each one
    computation beside one all-to-all ``a`` of the other pass (the forward's attention beside
    the backward's combine, the backward's experts beside the forward's dispatch, the forward's
    experts beside the backward's dispatch, the backward's attention beside the forward's
    combine), ``sum max(compute, a)``, plus ``loss`` x the communication hidden; the exposed
    part split evenly between the two passes."""
    fwd, bwd, xf, xb = {}, {}, {}, {}
    for b in FIT_SIZES:
        a = comm.at(b) / 2.0  # one dispatch or combine (with its share of the etp gather/scatter)
        parts = (rest[0].at(b), experts[1].at(b), experts[0].at(b), rest[1].at(b))
        exposed = sum(max(0.0, a - c) for c in parts)
        hidden = 4.0 * a - exposed
        xf[b] = xb[b] = exposed / 2.0
        fwd[b] = parts[0] + parts[2] + xf[b] + loss * hidden / 2.0
        bwd[b] = parts[1] + parts[3] + xb[b] + loss * hidden / 2.0
    return line_through(fwd), line_through(bwd), line_through(xf), line_through(xb)


def _expert_fields(layer: Layer, moe: MoeLayer, dev: _Device, comm: TimeFit, stack: Stack, loss: float,
                   gemm: tuple[GemmModel, float] | None, notify: float = 0.0) -> dict[str, object]:
    """The fields of ``layer`` (the rest, as one device runs it) with its experts added (module
    docstring), for ``dataclasses.replace``."""
    e_fwd, e_bwd = _expert_times(moe, dev, gemm)
    compute = (_add(layer.fwd, e_fwd), _add(layer.bwd, e_bwd))
    if stack.moe.a2a_overlap:
        fwd, bwd, a_fwd, a_bwd = _overlapped((layer.fwd, layer.bwd), (e_fwd, e_bwd), comm, loss)  # notify: the host's
    else:
        a_fwd = _add(comm, TimeFit(intercept_ms=notify, per_sample_ms=0.0))
        fwd, bwd, a_bwd = _add(compute[0], a_fwd), _add(compute[1], comm), comm
    scale = dev.share * dev.load
    copies = moe.tokens_per_sample * moe.top_k
    token_part = min(moe.expert_saved_bytes_per_sample, copies * (moe.token_bytes + PROB_BYTES))
    saved = scale * (token_part * dev.etp + moe.expert_saved_bytes_per_sample - token_part)
    params = -(-moe.expert_param_count // (dev.ep * dev.etp))
    level = AttentionCore(
        saved_bytes_per_sample=scale * moe.act_saved_bytes_per_sample + dev.share * moe.norm_saved_bytes_per_sample,
        fwd=TimeFit(intercept_ms=moe.recompute_fwd.intercept_ms * scale, per_sample_ms=moe.recompute_fwd.per_sample_ms * scale))
    per_device = dataclasses.replace(moe, expert_param_count=params, alltoall_fwd=a_fwd, alltoall_bwd=a_bwd,
                                     expert_fwd=e_fwd, expert_bwd=e_bwd, recompute_fwd=level.fwd,
                                     expert_saved_bytes_per_sample=saved,
                                     act_saved_bytes_per_sample=scale * moe.act_saved_bytes_per_sample,
                                     norm_saved_bytes_per_sample=dev.share * moe.norm_saved_bytes_per_sample)
    total_saved = layer.saved_bytes_per_sample + saved
    return dict(
        fwd=fwd, bwd=bwd, param_count=layer.param_count + params,
        param_bytes=layer.param_bytes + params * (layer.param_bytes // layer.param_count if layer.param_count else 2),
        saved_bytes_per_sample=total_saved,
        attention_core=dataclasses.replace(level, saved_bytes_per_sample=min(level.saved_bytes_per_sample, total_saved)),
        moe=per_device)


def expert_view(view: Profile, profile: Profile, cluster: Cluster, group: DeviceGroup, stack: Stack) -> Profile:
    """``view`` (:func:`~planner.cost.tensor_parallel.strip_experts` of ``profile`` through the tensor- and context-parallel
    views of ``group``) with ``profile``'s routed experts added as one device of ``group`` runs
    them (module docstring); ``view`` itself without experts."""
    if all(layer.moe is None for layer in profile.layers):
        return view
    links = expert_links(cluster, group)
    gemm = _gemm_model(profile.metadata)
    t_tokens = group.tp_degree if group.sequence_parallel else 1
    dev = _Device(share=1.0 / (t_tokens * group.cp_degree), load=stack.moe.load_factor, etp=group.etp_degree,
                  ep=group.ep_degree)
    notify = deepep_notify_ms(links, stack.moe)
    comms: dict[MoeLayer, TimeFit] = {}
    fields: dict[tuple[object, ...], dict[str, object]] = {}  # equal layers (but their names): worked out once
    layers = []
    for layer, original in zip(view.layers, profile.layers):
        moe = original.moe
        if moe is None:
            layers.append(layer)
            continue
        if moe not in comms:
            comms[moe] = _comm(cluster, links, moe, stack.moe, dev)
        key = (layer.fwd, layer.bwd, layer.param_count, layer.param_bytes, layer.saved_bytes_per_sample, moe)
        if key not in fields:
            fields[key] = _expert_fields(layer, moe, dev, comms[moe], stack, cluster.overlap_compute_loss, gemm,
                                         notify * cluster.relative_speed)
        layers.append(dataclasses.replace(layer, **fields[key]))  # type: ignore[arg-type]
    meta = {**view.metadata, "ep_degree": group.ep_degree, "etp_degree": group.etp_degree}
    if notify:
        meta["moe_notify_ms"] = notify  # the host waits for it too (planner.cost.host.host_floor_ms)
    return dataclasses.replace(view, layers=tuple(layers), metadata=meta)


def deepep_notify_ms(links: ExpertLinks, stack: MoeStack) -> float:
    """The ms one MoE layer's forward spends in DeepEP's internode notify before its dispatch
    (:data:`DEEPEP_INTERNODE_NOTIFY_MS`; module docstring): with DeepEP over an expert-parallel
    group that spans nodes, else 0."""
    if stack.dispatcher is not MoeDispatcher.DEEPEP or links.ep <= 1 or links.nodes <= 1:
        return 0.0
    return DEEPEP_INTERNODE_NOTIFY_MS
