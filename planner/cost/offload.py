"""Offloading to host memory, priced on the host link (no torch).

Two levers (:class:`~planner.artifacts.host.OffloadMode`), each carried by the profile a search
prices (its metadata, :func:`with_offload`, as a forced recompute level is:
:mod:`planner.cost.recompute_view`), so that every cost model the search builds
(:func:`planner.cost.tensor_parallel.device_cost_model`) prices it:

- optimizer offload (ZeRO-Offload, Ren et al., USENIX ATC 2021): the optimizer state and the fp32
  master weights live on the host, the step runs there. On the device: the 16-bit weights and
  gradients only (``optim_bytes_per_param`` 0). Per iteration, after the stage's last backward,
  each device sends its gradients down (``params x grad bytes / link``), the host steps them
  (``params / host rate``, :data:`CPU_ADAM_PARAMS_PER_S`), the device receives the new 16-bit weights
  (``params x weight bytes / link``). Assumed overlap: the gradients go down bucket by bucket
  during the last micro-batch's backward (ZeRO-Offload's overlapped gradient offload), so only
  what that backward cannot hide is exposed; the host step and the weights' return are exposed
  (no one-step delayed update). :func:`offloaded_step_ms`.
- activation offload per layer (Megatron-Core's fine-grained activation offloading): an offloaded
  layer's saved tensors go to the host once its forward ends and come back before its backward.
  Device memory: none of them per micro-batch in flight, but a working set of
  :data:`WORKSPACE_LAYERS` layers' saves (the layer being copied out behind the next layer's
  forward, the layer whose backward runs, and the next one being copied in ahead of it).
  Time, the overlap rule (:func:`exposed_offload_ms`): in a pipeline's steady state each
  micro-batch's forward and backward run back to back with the other micro-batches' on the stage,
  and the link is full duplex, so the copies of one layer must fit, each way, in that layer's
  ``f + b`` of compute; what does not is exposed, added to the layer's backward. Priced per
  layer, ``max(0, A_l / link - (f_l + b_l))`` (summed over a stage it is at least the stage's
  own ``max(0, A / link - (F + B))``: an upper bound, equal for identical blocks), and, linear in
  the micro-batch as the profile's times are, bounded by its intercept and slope apart. Not
  modelled: the warm-up, where forwards run without backwards beside them (their copies go
  down behind the forwards alone), and the last layer of the last stage, whose backward follows
  its forward at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from planner.artifacts.host import OffloadMode, host_link_gb_per_s
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Layer, Profile, TimeFit

__all__ = [
    "ACTIVATIONS_KEY",
    "CPU_ADAM_PARAMS_PER_S",
    "OPTIMIZER_KEY",
    "WORKSPACE_LAYERS",
    "OffloadView",
    "carry_offload",
    "exposed_offload_ms",
    "offload_view",
    "offloadable_layers",
    "offloaded_layers",
    "offloaded_step_ms",
    "optimizer_offloaded",
    "plan_profile",
    "with_offload",
]

#: the profile metadata keys the levers travel in
OPTIMIZER_KEY = "offload_optimizer"
ACTIVATIONS_KEY = "offload_activations"

#: Adam steps on a host, parameters per second: ZeRO-Offload's CPU-Adam updates 10 billion
#: parameters in 2.57 s on the two Xeon sockets of a DGX-2 host (Ren et al. 2021, Table 2; 1 billion
#: in 0.22 s), 3.9e9 parameters/s
CPU_ADAM_PARAMS_PER_S = 10e9 / 2.57
#: the devices that share one host's CPU-Adam rate (a DGX-class node: two sockets, 8 GPUs); a
#: device's step runs at its share
DEVICES_PER_HOST = 8
#: layers' saves an offloading stage holds at once (module docstring)
WORKSPACE_LAYERS = 3


def with_offload(profile: Profile, *, optimizer: bool, layers: Iterable[int] = ()) -> Profile:
    """``profile`` carrying the offload choice: the optimizer state on the host or not, the layers
    whose activations are offloaded."""
    meta = {k: v for k, v in profile.metadata.items() if k not in (OPTIMIZER_KEY, ACTIVATIONS_KEY)}
    if optimizer:
        meta[OPTIMIZER_KEY] = True
    chosen = sorted(set(layers))
    if chosen:  # metadata holds scalars: the indices comma-separated
        meta[ACTIVATIONS_KEY] = ",".join(map(str, chosen))
    return dataclasses.replace(profile, metadata=meta)


def carry_offload(source: Profile, target: Profile) -> Profile:
    """``target`` carrying ``source``'s offload choice (a profile rebuilt from its generator)."""
    return with_offload(target, optimizer=optimizer_offloaded(source), layers=offloaded_layers(source))


def plan_profile(plan: Plan, profile: Profile) -> Profile:
    """``profile`` carrying what ``plan`` offloads (to price the plan again); ``profile`` itself for
    a plan that records no offload."""
    if plan.offload is OffloadMode.NONE:
        return profile
    layers = [i for s in plan.stages for i in s.offload_layers]
    return with_offload(profile, optimizer=plan.offload.optimizer, layers=layers)


def optimizer_offloaded(profile: Profile) -> bool:
    return bool(profile.metadata.get(OPTIMIZER_KEY))


def offloaded_layers(profile: Profile) -> tuple[int, ...]:
    value = str(profile.metadata.get(ACTIVATIONS_KEY, "") or "")
    return tuple(int(i) for i in value.split(",")) if value else ()


def offloadable_layers(profile: Profile) -> tuple[int, ...]:
    """The layers that save anything for their backward (what offloading one would move)."""
    return tuple(i for i, layer in enumerate(profile.layers)
                 if layer.saved_bytes_per_sample > 0 or layer.saved_bytes_fixed > 0)


def exposed_offload_ms(saved_bytes: float, fwd_ms: float, bwd_ms: float, link_gb_per_s: float) -> float:
    """The overlap rule (module docstring): of one micro-batch's copy of ``saved_bytes`` each way
    on a full-duplex link of ``link_gb_per_s``, what its ``fwd_ms + bwd_ms`` of compute does not hide."""
    return max(0.0, saved_bytes / (link_gb_per_s * 1e6) - (fwd_ms + bwd_ms))


def _exposed_fit(layer: Layer, ms_per_byte: float) -> TimeFit:
    """:func:`exposed_offload_ms` of ``layer`` as a time fit in the profile's units, bounded by its
    intercept and slope apart (each at least 0: at least the rule at every micro-batch size)."""
    fixed = max(0.0, layer.saved_bytes_fixed * ms_per_byte - layer.fwd.intercept_ms - layer.bwd.intercept_ms)
    slope = max(0.0, layer.saved_bytes_per_sample * ms_per_byte - layer.fwd.per_sample_ms - layer.bwd.per_sample_ms)
    return TimeFit(intercept_ms=fixed, per_sample_ms=slope)


def _offloaded_layer(layer: Layer, ms_per_byte: float) -> Layer:
    extra = _exposed_fit(layer, ms_per_byte)
    bwd = TimeFit(intercept_ms=layer.bwd.intercept_ms + extra.intercept_ms,
                  per_sample_ms=layer.bwd.per_sample_ms + extra.per_sample_ms)
    return dataclasses.replace(layer, saved_bytes_per_sample=0.0, saved_bytes_fixed=0.0, bwd=bwd, attention_core=None,
                               measured=(), tp=None)


@dataclass(frozen=True, slots=True)
class OffloadView:
    """The offload choice as one device's cost model takes it (:func:`offload_view`): the profile
    it prices, the bytes per sample of an offloading stage's working set, and whether the optimizer
    state and master weights live on the host (``CostModel.offload_optimizer``)."""

    profile: Profile
    workspace_bytes_per_sample: float
    optimizer_on_host: bool


def offload_view(profile: Profile, link_gb_per_s: float, relative_speed: float = 1.0) -> OffloadView:
    """A device's view with the offload choice ``profile`` carries applied (module docstring): its
    offloaded layers folded in (no saves kept per micro-batch, the exposed copies in their backward,
    in profile units: ``relative_speed`` x ms; a storage two layers share is no longer shared once
    either is offloaded; ``profile`` itself when it offloads none), the working set of an offloading
    stage (:func:`_workspace_per_sample` of ``profile``), and the optimizer's place."""
    chosen = set(offloaded_layers(profile))
    workspace, on_host = _workspace_per_sample(profile), optimizer_offloaded(profile)
    if not chosen:
        return OffloadView(profile, workspace, on_host)
    ms_per_byte = relative_speed / (link_gb_per_s * 1e6)
    layers = tuple(_offloaded_layer(layer, ms_per_byte) if i in chosen else layer
                   for i, layer in enumerate(profile.layers))
    shared = tuple(p for p in profile.shared_saved if p.first not in chosen and p.second not in chosen)
    return OffloadView(dataclasses.replace(profile, layers=layers, shared_saved=shared), workspace, on_host)


def _workspace_per_sample(profile: Profile) -> float:
    """Bytes per sample of an offloading stage's working set: :data:`WORKSPACE_LAYERS` x the
    largest offloaded layer's saves (0 when none is offloaded). ``profile``: before the fold."""
    chosen = offloaded_layers(profile)
    largest = max((profile.layers[i].saved_bytes_per_sample for i in chosen if i < profile.num_layers), default=0.0)
    return WORKSPACE_LAYERS * largest


def offloaded_step_ms(params: float, weight_bytes: float, grad_bytes: float, cluster: object,
                      hidden_ms: float = 0.0) -> float:
    """One device's optimizer step on the host for ``params`` parameters (module docstring):
    gradients down (less the ``hidden_ms`` of backward they overlap), the host's Adam at the
    device's share of :data:`CPU_ADAM_PARAMS_PER_S`, the 16-bit weights back up."""
    if params <= 0:
        return 0.0
    link = host_link_gb_per_s(cluster) * 1e6  # bytes per ms
    down = max(0.0, params * grad_bytes / link - hidden_ms)
    step = params / (CPU_ADAM_PARAMS_PER_S / DEVICES_PER_HOST) * 1e3
    return down + step + params * weight_bytes / link
