"""Calibrate a profile and a cluster from measured runs (RunReports of the bundled runtime).

The loop DESIGN.md section 3 closes: ``Plan --runtime--> RunReport --calibrate--> Profile``.
No torch.

Inputs: run reports, the plans they ran (each report is matched to its plan by signature,
:mod:`planner.report.resolve`), and the profile and cluster the plans were made from.

1. **Compute time scale.** Every (report, stage) pair ``r`` gives the stage's measured compute
   ``m_r`` (``StageRecord.compute_ms``: the time its ranks spent in forward and backward) and
   the plan's prediction ``p_r = M x (F + B + RC)`` (``compute_ms_predicted``). Every term of
   ``p_r`` is a sum of layer times, so scaling the layers of the stage by ``x`` scales ``p_r``
   by ``x``. The least-squares scale through the origin is ``x = sum m p / sum p^2``:

   - ``granularity="global"``: one ``x`` over all pairs, applied to every layer;
   - ``granularity="stage"`` (default): layer ``l`` gets the least-squares scale of the pairs
     whose stage holds it (with one report: its stage's ``m / p``); a layer no run measured
     gets the global scale.

   Each layer's forward and backward fits (intercept and per-sample slope) and its measured
   points are multiplied by its scale: the shape in the micro-batch size is kept.
2. **The rest of the iteration.** With the calibrated profile each plan is re-predicted
   (same partition, recomputation, replication, micro-batch size and schedule;
   :func:`repredict`) and the time the simulator still misses is given to one of two
   one-parameter models, each fitted by minimising ``sum (log re-predicted - log measured)^2``
   over the runs' iteration times (a 25-point grid, then golden-section search):

   - ``links``: every link's latency multiplied and bandwidth divided by ``c`` in
     ``[1/64, 64]`` (all communication times scale by ``c``). Only links the runs used change:
     intra-node always, inter-node when a plan spans nodes. Runs without communication keep
     ``c = 1``.
   - ``overhead``: ``o >= 0`` ms added to every layer's forward and backward per micro-batch
     (the framework's cost per layer and action, serial on the rank). In a pipeline, transfers
     overlap compute, so slower links lengthen the iteration only on its critical path; a
     per-action cost outside the measured compute windows (a loaded machine, Python between
     actions) is not communication and only this model can absorb it.

   ``residual="auto"`` (default) takes ``links`` unless ``overhead`` fits at least twice as
   well (half the log-loss); ``"links"``, ``"overhead"`` or ``"none"`` force a choice. What
   neither models (optimizer step, noise) stays as error.

The calibrated profile has ``source="calibrated"`` and records in its metadata the global
time scale, the per-layer scales (``calibration.layer_time_scales``: one per layer in layer
order, comma-separated), the residual model with its link scale and per-layer overhead, the
granularity, the number of runs and the sha256 of the profile it came from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from planner.artifacts import codec
from planner.artifacts.cluster import Cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import CALIBRATION_GRANULARITIES, CALIBRATION_RESIDUALS
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Layer, Profile, TimeFit, TimePoint, profile_to_json
from planner.artifacts.report import RunReport, relative_error
from planner.cost.groups import refusal
from planner.cost.offload import plan_profile
from planner.report.resolve import match_report
from planner.solve.build import rebuild_plan

__all__ = ["Calibration", "CalibrationResult", "add_layer_overhead", "calibrate", "fit_layer_overhead", "fit_link_scale",
           "fit_time_scales", "repredict", "scale_cluster_links", "scale_profile_times"]

GRANULARITIES = CALIBRATION_GRANULARITIES
RESIDUALS = CALIBRATION_RESIDUALS
LINK_SCALE_RANGE = (1 / 64, 64.0)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """The fitted factors and the prediction errors they leave, per run."""

    granularity: str
    time_scale: float = dataclasses.field(metadata={"doc": "global least-squares compute scale"})
    layer_time_scales: tuple[float, ...]
    residual: str = dataclasses.field(metadata={"doc": "what explained the rest: links | overhead | none"})
    link_scale: float = dataclasses.field(metadata={"doc": "communication time multiplier (1: unchanged)"})
    overhead_ms_per_layer: float = dataclasses.field(metadata={"doc": "added to each layer's fwd and bwd"})
    num_reports: int
    iteration_ms_measured: tuple[float, ...] = dataclasses.field(metadata={"doc": "per run, its median step"})
    iteration_rel_error_before: tuple[float, ...] = dataclasses.field(
        metadata={"doc": "per run, (measured - predicted) / predicted with the input profile and cluster"}
    )
    iteration_rel_error_after: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES} (got {self.granularity!r})")
        if self.residual not in RESIDUALS[1:]:
            raise ValueError(f"residual must be one of {RESIDUALS[1:]} (got {self.residual!r})")
        if not (self.time_scale > 0 and self.link_scale > 0 and self.overhead_ms_per_layer >= 0):
            raise ValueError(f"scales must be > 0 (got {self.time_scale}, {self.link_scale})")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationResult:
    profile: Profile
    cluster: Cluster
    calibration: Calibration
    plans: tuple[Plan, ...] = dataclasses.field(metadata={"doc": "the measured plans re-predicted after calibration"})


# ---------------------------------------------------------------- compute


def _least_squares_scale(pairs: Sequence[tuple[float, float]]) -> float:
    """``sum m p / sum p^2`` over (measured, predicted) pairs."""
    den = sum(p * p for _, p in pairs)
    if den <= 0:
        raise PlannerInputError("the runs predicted no compute time; nothing to calibrate against")
    scale = sum(m * p for m, p in pairs) / den
    if not scale > 0:
        raise PlannerInputError(f"the runs measured no compute time (least-squares scale {scale})")
    return scale


def fit_time_scales(
    runs: Sequence[tuple[Plan, RunReport]], num_layers: int, granularity: str = "stage"
) -> tuple[float, tuple[float, ...]]:
    """(global scale, per-layer scales) of the compute times; see the module docstring."""
    if granularity not in GRANULARITIES:
        raise PlannerInputError(f"granularity must be one of {', '.join(GRANULARITIES)} (got {granularity!r})")
    pairs_of_layer: list[list[tuple[float, float]]] = [[] for _ in range(num_layers)]
    everything: list[tuple[float, float]] = []
    for plan, report in runs:
        for stage, rec in zip(plan.stages, report.stages):
            pair = (rec.compute_ms, rec.compute_ms_predicted)
            everything.append(pair)
            for layer_idx in range(stage.layer_start, stage.layer_stop):
                pairs_of_layer[layer_idx].append(pair)
    overall = _least_squares_scale(everything)
    if granularity == "global":
        return overall, (overall,) * num_layers
    per_layer = tuple(
        _least_squares_scale(pairs) if sum(p for _, p in pairs) > 0 else overall for pairs in pairs_of_layer
    )
    return overall, per_layer


def _scaled_fit(fit: TimeFit, scale: float) -> TimeFit:
    return TimeFit(intercept_ms=fit.intercept_ms * scale, per_sample_ms=fit.per_sample_ms * scale)


def _scaled_layer(layer: Layer, scale: float) -> Layer:
    points = tuple(
        TimePoint(microbatch_size=q.microbatch_size, fwd_ms=q.fwd_ms * scale, bwd_ms=q.bwd_ms * scale)
        for q in layer.measured
    )
    return dataclasses.replace(layer, fwd=_scaled_fit(layer.fwd, scale), bwd=_scaled_fit(layer.bwd, scale), measured=points)


def scale_profile_times(profile: Profile, scales: Sequence[float]) -> Profile:
    """``profile`` with layer ``i``'s times multiplied by ``scales[i]`` (memory untouched)."""
    if len(scales) != profile.num_layers:
        raise PlannerInputError(f"{len(scales)} scales for {profile.num_layers} layers")
    if any(not (math.isfinite(s) and s > 0) for s in scales):
        raise PlannerInputError(f"time scales must be positive and finite (got {list(scales)})")
    return dataclasses.replace(profile, layers=tuple(_scaled_layer(l, s) for l, s in zip(profile.layers, scales)))


# ---------------------------------------------------------------- re-prediction and links


def repredict(plan: Plan, profile: Profile, cluster: Cluster) -> Plan:
    """``plan``'s layout (replication, tensor parallelism, ZeRO), partition, recomputation,
    micro-batching and schedule, priced again on ``profile`` and ``cluster`` and replayed by the
    simulator (:func:`planner.solve.build.rebuild_plan`; the plan keeps its solver). A rank's
    several chunks (interleaved 1F1B, ZBV's and DualPipe-V's V, DualPipe's mirrored copies) are
    priced as the search prices them."""
    if profile.num_layers != plan.num_layers:
        raise PlannerInputError(f"the profile has {profile.num_layers} layers but the plan covers {plan.num_layers}")
    why = refusal(profile, cluster, plan.num_devices, plan.layout.tp_degree)
    if why:
        raise PlannerInputError(why)
    return rebuild_plan(
        plan_profile(plan, profile), cluster, plan.provenance.request, layout=plan.layout,
        boundaries=[s.layer_start for s in plan.stages], recompute=[s.recompute for s in plan.stages],
        microbatch_size=plan.microbatch_size, schedule=plan.schedule, solver=plan.provenance.solver,
        selective=[s.recompute_selective for s in plan.stages],
    )


def scale_cluster_links(cluster: Cluster, scale: float, *, inter_node: bool) -> Cluster:
    """Communication ``scale`` times slower: latency x scale, bandwidth / scale (intra-node
    links; inter-node too when ``inter_node``)."""
    changes: dict[str, float] = {
        "intra_node_latency_us": cluster.intra_node_latency_us * scale,
        "intra_node_bandwidth_gb_per_s": cluster.intra_node_bandwidth_gb_per_s / scale,
    }
    if inter_node:
        changes.update(
            inter_node_latency_us=cluster.inter_node_latency_us * scale,
            inter_node_bandwidth_gb_per_s=cluster.inter_node_bandwidth_gb_per_s / scale,
        )
    return dataclasses.replace(cluster, **changes)  # type: ignore[arg-type]


def _has_communication(plan: Plan) -> bool:
    return any(s.send_fwd_ms > 0 or s.send_bwd_ms > 0 or s.allreduce_ms > 0 for s in plan.stages)


def _spans_nodes(plan: Plan, cluster: Cluster) -> bool:
    return plan.num_devices > cluster.devices_per_node


def _log_loss(runs: Sequence[tuple[Plan, RunReport]], profile: Profile, cluster: Cluster) -> float:
    """``sum (log re-predicted - log measured)^2`` of the iteration times."""
    return sum(
        (math.log(repredict(p, profile, cluster).predicted.iteration_ms) - math.log(r.iteration_ms)) ** 2
        for p, r in runs
    )


def _minimise(loss: Callable[[float], float], lo: float, hi: float) -> tuple[float, float]:
    """(argmin, min) of ``loss`` on ``[lo, hi]``: a 25-point grid, then golden-section search
    inside the cells around the best grid point (ties to the lower end)."""
    grid = [lo + (hi - lo) * i / 24 for i in range(25)]
    values = [loss(x) for x in grid]
    best = min(range(len(grid)), key=lambda i: (values[i], i))
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(30):
        x1, x2 = b - ratio * (b - a), a + ratio * (b - a)
        if loss(x1) <= loss(x2):
            b = x2
        else:
            a = x1
    x = (a + b) / 2
    return (x, loss(x)) if loss(x) <= values[best] else (grid[best], values[best])


def fit_link_scale(runs: Sequence[tuple[Plan, RunReport]], profile: Profile, cluster: Cluster) -> tuple[float, float]:
    """(communication multiplier ``c``, its log-loss); ``(1, loss)`` without communication."""
    runs = [(p, r) for p, r in runs if r.iteration_ms > 0]
    if not any(_has_communication(p) for p, _ in runs):
        return 1.0, _log_loss(runs, profile, cluster)
    inter = any(_spans_nodes(p, cluster) for p, _ in runs)
    lo, hi = (math.log(v) for v in LINK_SCALE_RANGE)
    log_c, value = _minimise(
        lambda x: _log_loss(runs, profile, scale_cluster_links(cluster, math.exp(x), inter_node=inter)), lo, hi
    )
    if abs(log_c) < 1e-12:
        return 1.0, value
    return math.exp(log_c), value


def add_layer_overhead(profile: Profile, overhead_ms: float) -> Profile:
    """``profile`` with ``overhead_ms`` added to every layer's forward and backward (per micro-batch)."""
    if not (math.isfinite(overhead_ms) and overhead_ms >= 0):
        raise PlannerInputError(f"overhead must be >= 0 ms (got {overhead_ms})")

    def shifted(fit: TimeFit) -> TimeFit:
        return TimeFit(intercept_ms=fit.intercept_ms + overhead_ms, per_sample_ms=fit.per_sample_ms)

    layers = tuple(
        dataclasses.replace(
            layer, fwd=shifted(layer.fwd), bwd=shifted(layer.bwd),
            measured=tuple(dataclasses.replace(q, fwd_ms=q.fwd_ms + overhead_ms, bwd_ms=q.bwd_ms + overhead_ms)
                           for q in layer.measured),
        )
        for layer in profile.layers
    )
    return dataclasses.replace(profile, layers=layers)


def fit_layer_overhead(runs: Sequence[tuple[Plan, RunReport]], profile: Profile, cluster: Cluster) -> tuple[float, float]:
    """(per-layer, per-micro-batch overhead ms ``o`` >= 0, its log-loss); see the module docstring."""
    runs = [(p, r) for p, r in runs if r.iteration_ms > 0]
    hi = max(r.iteration_ms / (p.num_microbatches * p.num_layers) for p, r in runs)
    return _minimise(lambda o: _log_loss(runs, add_layer_overhead(profile, o), cluster), 0.0, hi)


# ---------------------------------------------------------------- the whole calibration


def _pair(plans: Sequence[Plan], reports: Sequence[RunReport], names: Sequence[str]) -> list[tuple[Plan, RunReport]]:
    return [(plans[match_report(plans, r, name)], r) for r, name in zip(reports, names)]


def calibrate(
    reports: Sequence[RunReport],
    plans: Sequence[Plan],
    profile: Profile,
    cluster: Cluster,
    *,
    granularity: str = "stage",
    residual: str = "auto",
    report_names: Sequence[str] = (),
) -> CalibrationResult:
    """Refit ``profile``'s layer times and ``cluster``'s links to the measured ``reports`` of
    ``plans`` (each report matched to its plan by signature; ``report_names`` name them in
    errors). ``residual``: what explains the time left after the compute scale (``auto``,
    ``links``, ``overhead``, ``none``). See the module docstring."""
    if not reports:
        raise PlannerInputError("calibration needs at least one run report")
    if residual not in RESIDUALS:
        raise PlannerInputError(f"residual must be one of {', '.join(RESIDUALS)} (got {residual!r})")
    names = list(report_names) or [f"run report {k}" for k in range(len(reports))]
    for name, report in zip(names, reports):
        if report.iteration_ms <= 0:  # what the residual models fit (was max() of an empty sequence)
            raise PlannerInputError(f"{name}: iteration_ms: {report.iteration_ms:g}: the run measured no iteration "
                                    "time, so there is nothing to calibrate against")
    runs = _pair(plans, reports, names)
    for plan, _ in runs:
        if plan.num_layers != profile.num_layers:
            raise PlannerInputError(f"the profile has {profile.num_layers} layers but a plan covers {plan.num_layers}")
    before = tuple(relative_error(r.iteration_ms, p.predicted.iteration_ms) for p, r in runs)
    overall, per_layer = fit_time_scales(runs, profile.num_layers, granularity)
    new_profile = scale_profile_times(profile, per_layer)
    link, overhead, chosen = 1.0, 0.0, "none"
    if residual in ("auto", "links"):
        link, link_loss = fit_link_scale(runs, new_profile, cluster)
        chosen = "links"
    if residual in ("auto", "overhead"):
        overhead, overhead_loss = fit_layer_overhead(runs, new_profile, cluster)
        if residual == "overhead" or (link_loss > 1e-6 and overhead_loss < 0.5 * link_loss):
            link, chosen = 1.0, "overhead"
        else:
            overhead = 0.0
    inter = any(_spans_nodes(p, cluster) for p, _ in runs)
    new_cluster = scale_cluster_links(cluster, link, inter_node=inter) if link != 1.0 else cluster
    new_profile = add_layer_overhead(new_profile, overhead) if overhead else new_profile
    calibration = Calibration(
        granularity=granularity, time_scale=overall, layer_time_scales=per_layer, residual=chosen,
        link_scale=link, overhead_ms_per_layer=overhead,
        num_reports=len(runs), iteration_ms_measured=tuple(r.iteration_ms for _, r in runs),
        iteration_rel_error_before=before, iteration_rel_error_after=(),
    )
    new_profile = dataclasses.replace(
        new_profile,
        source="calibrated",
        metadata={**profile.metadata, **_metadata(calibration, profile)},
    )
    if link != 1.0:
        note = f"calibrated from {len(runs)} run(s): communication x {link:.6g} (latency x c, bandwidth / c)"
        new_cluster = dataclasses.replace(new_cluster, sources={**cluster.sources, "calibration": note})
    after_plans = tuple(repredict(p, new_profile, new_cluster) for p, _ in runs)
    after = tuple(relative_error(r.iteration_ms, q.predicted.iteration_ms) for q, (_, r) in zip(after_plans, runs))
    return CalibrationResult(
        profile=new_profile,
        cluster=new_cluster,
        calibration=dataclasses.replace(calibration, iteration_rel_error_after=after),
        plans=after_plans,
    )


def _metadata(c: Calibration, source: Profile) -> dict[str, str | int | float | bool]:
    return {
        "calibration.granularity": c.granularity,
        "calibration.time_scale": c.time_scale,
        "calibration.layer_time_scales": ",".join(repr(s) for s in c.layer_time_scales),
        "calibration.residual": c.residual,
        "calibration.link_scale": c.link_scale,
        "calibration.overhead_ms_per_layer": c.overhead_ms_per_layer,
        "calibration.reports": c.num_reports,
        "calibration.from_profile_sha256": codec.sha256_of(profile_to_json(source)),
        "calibration.from_source": source.source,
    }
