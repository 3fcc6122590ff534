"""``Layer.moe`` of a measured layer: its routed experts' share of the layer, measured.

For every layer holding :class:`~planner.models.experts.RoutedExperts` (the zoo's ``moe`` blocks,
any model built on them), at each micro-batch size the profiler measures
(:class:`~planner.artifacts.moe.MoeLayer`'s fields, ``planner.artifacts.moe``):

- ``expert_fwd`` / ``expert_bwd``: the routed experts' part of the layer -- permutation, the
  grouped GEMMs and GELU, un-permutation and the gate-weighted sum
  (:func:`planner.models.experts.run_experts`, every expert local) -- replayed on the tokens and
  gates one forward of the model handed the layer's experts, with the tokens spread evenly
  over the experts as the field defines (row r takes experts (r k + j) mod E: the routing of
  ``router=balanced``), timed forward and backward (median of repeats after warm-up, as the
  layers are: :mod:`planner.profiling.measured.timing`); recorded as that share of the layer's
  own fitted time (the median over the sizes of replay / layer, at most 1), so the part never
  exceeds the whole it is timed apart from;
- ``expert_saved_bytes_per_sample``: what that replay saves for backward (once per storage,
  the expert weights excluded, as the layer's own count: :mod:`planner.profiling.measured.memory`),
  and ``act_saved_bytes_per_sample`` what it no longer saves with the GELUs' outputs
  recomputed (Megatron's ``moe_act``: :func:`planner.models.dropped.recomputed`);
- ``norm_saved_bytes_per_sample``: what the layer's selective level frees beyond that (the
  norms' outputs: ``layernorm``), from the profiler's two passes over the model (the layer's
  saved bytes and its selective saved bytes, :func:`planner.profiling.measured.memory.measure_model_bytes`);
- ``recompute_fwd``: the forward time of what that level re-runs in backward: the experts' GELUs
  on their recorded inputs and the layer's norms on theirs;
- the shapes: ``hidden``, ``tokens_per_sample`` (the rows one sample hands the experts: its
  sequence), ``expert_ffn_hidden``, ``num_experts``, ``top_k`` (the router's),
  ``shared_experts`` (``RoutedExperts.shared_experts``, set by the layer holding them),
  ``expert_param_count`` (``w1`` and ``w2`` of all E), and
  ``dispatch_bytes_per_element`` the element size of the profiled dtype (what a dispatched token
  carries here).

Decision: the replay routes evenly even where the model's router does not (``router=topk``
on random data): the field is the balanced cost, and imbalance is the stack's stated skew
(``MoeStack``), not a property of one profiled batch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from planner.artifacts.moe import MoeLayer
from planner.artifacts.timefit import TimeFit
from planner.models.experts import RoutedExperts, expert_modules, run_experts
from planner.models.workload import Workload
from planner.profiling.measured.fit import fit_bytes, fit_time
from planner.profiling.measured.memory import ModelBytes, saved_span, union_bytes
from planner.profiling.measured.timing import Clock

__all__ = ["ExpertCalls", "measure_experts", "record_expert_calls"]


@dataclass(slots=True)
class ExpertCalls:
    """What one forward of a layer handed its routed experts and norms."""

    experts: list[tuple[RoutedExperts, torch.Tensor, torch.Tensor, int]] = field(default_factory=list)  # module, tokens, gates, topk
    norms: list[tuple[torch.nn.Module, torch.Tensor]] = field(default_factory=list)


def record_expert_calls(workload: Workload, inputs: Any) -> list[ExpertCalls | None]:
    """Per layer, the inputs of its routed experts and norms in one no-grad forward (None: no experts)."""
    out: list[ExpertCalls | None] = []
    handles = []
    x = inputs
    try:
        with torch.no_grad():
            for layer in workload.layers:
                found = expert_modules(layer)
                calls = ExpertCalls() if found else None
                if calls is not None:
                    for module in found:
                        handles.append(module.register_forward_pre_hook(
                            lambda m, args, calls=calls: calls.experts.append((m, args[0], args[2], args[1].size(1)))))
                    for norm in (m for m in layer.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))):
                        handles.append(norm.register_forward_pre_hook(
                            lambda m, args, calls=calls: calls.norms.append((m, args[0]))))
                x = layer(x)
                for handle in handles:
                    handle.remove()
                handles.clear()
                out.append(calls)
    finally:
        for handle in handles:
            handle.remove()
    return out


def _balanced(num_tokens: int, topk: int, num_experts: int) -> torch.Tensor:
    rows = torch.arange(num_tokens)[:, None] * topk + torch.arange(topk)
    return rows % num_experts


def _replay(calls: ExpertCalls, recompute_act: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The experts' part forward (with grad) on fresh leaves: outputs and the leaves."""
    outs, leaves = [], []
    for module, tokens, gates, topk in calls.experts:
        t, g = tokens.detach().requires_grad_(), gates.detach().requires_grad_()
        choices = _balanced(t.size(0), topk, module.num_experts).to(t.device)
        outs.append(run_experts(t, choices, g, module.w1, module.w2, None, recompute_act))
        leaves += [t, g]
    return outs, leaves


def _time(clock: Clock, calls: ExpertCalls, warmup: int, repeats: int) -> tuple[float, float]:
    """Median forward and backward ms of the experts' part."""
    fwd, bwd = [], []
    for _ in range(warmup + repeats):
        with torch.enable_grad():
            (outs, _), f_ms = clock.measure(lambda: _replay(calls))
            _, b_ms = clock.measure(lambda outs=outs: torch.autograd.backward(outs, [torch.ones_like(o) for o in outs]))
        fwd.append(f_ms)
        bwd.append(b_ms)
    for module, _, _, _ in calls.experts:
        module.zero_grad(set_to_none=True)
    return statistics.median(fwd[warmup:]), statistics.median(bwd[warmup:])


def _recompute_ms(clock: Clock, calls: ExpertCalls, warmup: int, repeats: int) -> float:
    """Median forward ms of the GELUs on the experts' hidden units and of the layer's norms."""
    with torch.no_grad():
        hidden = [tokens.repeat_interleave(topk, dim=0) @ m.w1[0] for m, tokens, _, topk in calls.experts]

    def run() -> None:
        with torch.no_grad():
            for h in hidden:
                F.gelu(h)
            for norm, x in calls.norms:
                norm(x)

    times = [clock.measure(run)[1] for _ in range(warmup + repeats)]
    return statistics.median(times[warmup:])


def _saved(calls: ExpertCalls, recompute_act: bool) -> int:
    """Bytes the experts' part saves for backward (once per storage, weights excluded)."""
    weights = {p.untyped_storage().data_ptr() for m, _, _, _ in calls.experts for p in m.parameters()}
    spans: dict[int, list[tuple[int, int]]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        span = saved_span(tensor)
        if span is not None and span[0] not in weights:
            spans.setdefault(span[0], []).append((span[1], span[2]))
        return tensor

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _replay(calls, recompute_act)
    return sum(union_bytes(v) for v in spans.values())


def _share(sizes: list[int], part_ms: list[float], whole_ms: list[float]) -> TimeFit:
    """The part's time as its share of the whole's line: the median over the sizes of part / whole
    (at most 1: a part timed alone on a busy machine can exceed the layer it is part of) times
    the whole's fitted line."""
    whole = fit_time(sizes, whole_ms)
    share = min(1.0, statistics.median(p / w if w > 0 else 1.0 for p, w in zip(part_ms, whole_ms)))
    return TimeFit(intercept_ms=whole.intercept_ms * share, per_sample_ms=whole.per_sample_ms * share)


def measure_experts(
    workload: Workload, batches: dict[int, Any], by_size: dict[int, ModelBytes], layer_ms: dict[int, list[tuple[float, float]]],
    clock: Clock, *, warmup: int, repeats: int, element_bytes: int,
) -> list[MoeLayer | None]:
    """Per layer its :class:`MoeLayer` (None for a layer without routed experts), from the
    forwards of ``batches`` (micro-batch size -> inputs), the model's saved bytes ``by_size`` and
    the layers' (forward, backward) ms ``layer_ms`` at each size (module docstring; the experts'
    times are their share of the layer's, :func:`_share`)."""
    sizes = sorted(batches)
    calls = {b: record_expert_calls(workload, batches[b]) for b in sizes}
    out: list[MoeLayer | None] = []
    for idx, layer in enumerate(workload.layers):
        if calls[sizes[0]][idx] is None:
            out.append(None)
            continue
        per = {b: calls[b][idx] for b in sizes}
        times = {b: _time(clock, per[b], warmup, repeats) for b in sizes}  # type: ignore[arg-type]
        saved = [_saved(per[b], False) for b in sizes]  # type: ignore[arg-type]
        act = [s - _saved(per[b], True) for b, s in zip(sizes, saved)]  # type: ignore[arg-type]
        selective = [by_size[b].layers[idx].saved_bytes - by_size[b].layers[idx].selective_saved_bytes for b in sizes]
        norms = [max(0, f - a) for f, a in zip(selective, act)]
        fits = tuple(_share(sizes, [times[b][k] for b in sizes], [layer_ms[b][idx][k] for b in sizes]) for k in (0, 1))
        out.append(_moe_layer(layer, per[sizes[-1]], sizes, fits, saved, act, norms,  # type: ignore[arg-type]
                              [_recompute_ms(clock, per[b], warmup, repeats) for b in sizes], element_bytes))  # type: ignore[arg-type]
    return out


def _moe_layer(
    layer: torch.nn.Module, calls: ExpertCalls, sizes: list[int], times: tuple[TimeFit, TimeFit], saved: list[int],
    act: list[int], norms: list[int], recompute_ms: list[float], element_bytes: int,
) -> MoeLayer:
    module, tokens, _, topk = calls.experts[0]
    experts = expert_modules(layer)
    return MoeLayer(
        num_experts=module.num_experts,
        top_k=topk,
        shared_experts=module.shared_experts,
        hidden=int(tokens.size(1)),
        tokens_per_sample=int(tokens.size(0)) // sizes[-1],
        expert_ffn_hidden=int(module.w1.size(-1)),
        expert_param_count=sum(p.numel() for m in experts for p in m.parameters()),
        expert_fwd=times[0],
        expert_bwd=times[1],
        expert_saved_bytes_per_sample=fit_bytes(sizes, saved)[1],
        act_saved_bytes_per_sample=fit_bytes(sizes, act)[1],
        norm_saved_bytes_per_sample=fit_bytes(sizes, norms)[1],
        recompute_fwd=fit_time(sizes, recompute_ms),
        dispatch_bytes_per_element=element_bytes,
    )
