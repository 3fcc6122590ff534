"""Compare plans side by side: one pandas DataFrame row per plan (no torch).

``compare(plans_or_paths, baselines=..., reference=..., reports=...)`` reads every figure
from the plans themselves (their ``predicted`` block, written by the simulator when the plan
was made) -- nothing is re-derived here except ratios between plans.

Columns (units in the names; memory in GiB = 2**30 bytes):

- ``label`` (file stem, or the solver for in-memory plans; the index too), ``solver``,
  ``T`` (tensor-parallel degree), ``sequence_parallel``, ``CP`` (context-parallel degree), ``P``, ``D``, ``M``,
  ``microbatch_size``, ``schedule``, ``zero`` (ZeRO stage),
  ``replicas`` (each stage's copies inside the pipeline, ``2|1|1``; empty when all are 1),
  ``stages`` (layer ranges ``0-5|6-11``), ``recomputed_layers`` (how many, over all stages,
  recomputed whole) and ``selective_layers`` (how many recompute only their attention core);
- ``iteration_ms``, ``throughput_samples_per_s``, ``speedup`` (reference time / time),
  ``peak_memory_gib`` (the simulator's peak per device);
- ``params_gib``, ``grads_gib``, ``optimizer_gib``, ``activations_gib``, ``other_gib``
  (recompute workspace + send/receive buffers): the planned memory of the stage with the
  largest total, by kind;
- ``bubble_fraction``, ``exposed_allreduce_ms``;
- ``machine_bound_ms`` and ``limit_over_time`` (machine bound / iteration time: the fraction
  of the machine's limit the plan reaches, comparable across plans), ``partition_bound_ms``
  and ``partition_bound_over_time`` (1 is optimal only for the plan's own stages);
- ``achieved_tflops_per_device`` and ``mfu`` (transformer profiles; NaN where unknown);
- ``me_index`` against the reference row (``me_reference`` names it): the seed's
  (throughput / reference throughput) / (peak memory / reference peak memory);
- ``note``: why a baseline has no plan (infeasible), else empty;
- with ``reports``: ``measured_runs``, ``measured_iteration_ms`` (median over the matched
  reports of their median step), ``measured_throughput_samples_per_s``,
  ``iteration_rel_error`` ((measured - predicted) / predicted), ``measured_activations_gib``
  (largest per-stage peak of bytes saved for backward) and ``activation_rel_error``
  (against the plan's largest ``activation_bytes_per_microbatch x in-flight``). Plans without
  a report get NaN.

Reports are matched to plans by signature (see :mod:`planner.report.resolve`); or pair them
explicitly with a mapping ``{plan label or index: report or [reports]}``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from planner.artifacts.errors import InfeasibleError, PlannerInputError
from planner.artifacts.plan import Plan
from planner.artifacts.progress import Progress
from planner.artifacts.report import RunReport, relative_error
from planner.report.resolve import (
    ClusterLike,
    PlanLike,
    ProfileLike,
    ReportLike,
    find_cluster,
    find_profile,
    load_plans,
    load_reports,
    match_report,
)
from planner.simulation.bounds import me_index_of
from planner.solve import BASELINES
from planner.solve import plan as solve

__all__ = ["COLUMNS", "MEASURED_COLUMNS", "PlanEntry", "add_baselines", "compare", "compare_entries", "gather_plans"]

GIB = 1024**3

COLUMNS = (
    "label", "solver", "T", "sequence_parallel", "CP", "P", "D", "M", "microbatch_size", "schedule", "zero", "replicas", "stages",
    "recomputed_layers", "selective_layers",
    "iteration_ms", "throughput_samples_per_s", "speedup", "peak_memory_gib",
    "params_gib", "grads_gib", "optimizer_gib", "activations_gib", "other_gib",
    "bubble_fraction", "exposed_allreduce_ms", "machine_bound_ms", "limit_over_time",
    "partition_bound_ms", "partition_bound_over_time", "achieved_tflops_per_device", "mfu",
    "me_index", "me_reference", "note",
)
MEASURED_COLUMNS = (
    "measured_runs", "measured_iteration_ms", "measured_throughput_samples_per_s", "iteration_rel_error",
    "measured_activations_gib", "activation_rel_error",
)

_INT_COLUMNS = ("T", "P", "D", "M", "microbatch_size", "zero", "recomputed_layers", "selective_layers", "measured_runs")

Reports = Sequence[ReportLike] | Mapping[str | int, ReportLike | Sequence[ReportLike]]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlanEntry:
    """One row to be: a labelled plan, or a baseline that found none (``plan`` None, ``note`` why)."""

    label: str
    solver: str = dataclasses.field(metadata={"doc": "the solver's name (SolverKind value): dp, uniform, ..."})
    plan: Plan | None
    note: str = ""


def add_baselines(plan: Plan, profile: ProfileLike | None = None, cluster: ClusterLike | None = None,
                  plan_path: Path | None = None, skip: Sequence[str] = ()) -> list[tuple[str, Plan | None, str]]:
    """Every built-in baseline (``planner.solve.BASELINES``) but those named in ``skip``, for
    ``plan``'s request, profile and cluster: (solver name, plan or None, note). An infeasible
    baseline gets None and the reason."""
    prof = find_profile(plan, profile, plan_path)
    clus = find_cluster(plan, cluster)
    if prof.num_layers != plan.num_layers:
        raise PlannerInputError(f"the profile has {prof.num_layers} layers but the plan covers {plan.num_layers}")
    out: list[tuple[str, Plan | None, str]] = []
    kinds = [kind for kind in BASELINES if kind.value not in skip]
    with Progress("baselines", total=len(kinds), unit="planned") as progress:  # a line every few seconds when long
        for kind in kinds:
            progress.detail = f"planning {kind.value}"
            # the baselines are the peers' methods as published: t = 1 (see planner.solve)
            request = dataclasses.replace(plan.provenance.request, solver=kind, tp_degrees=())
            try:
                out.append((kind.value, solve(prof, clus, request), ""))
            except InfeasibleError as exc:
                out.append((kind.value, None, "infeasible: " + str(exc).splitlines()[0]))
            progress.update(1)
    return out


def _layer_ranges(plan: Plan) -> str:
    return "|".join(f"{s.layer_start}-{s.layer_stop - 1}" for s in plan.stages)


def _plan_row(entry: PlanEntry) -> dict[str, Any]:
    row: dict[str, Any] = {"label": entry.label, "solver": entry.solver, "note": entry.note}
    plan = entry.plan
    if plan is None:
        return row
    p, lay = plan.predicted, plan.layout
    big = max(plan.stages, key=lambda s: s.memory_total_bytes).memory
    row.update(
        T=lay.tp_degree, sequence_parallel=lay.sequence_parallel, CP=lay.cp_degree,
        P=lay.num_stages, D=lay.dp_degree, M=plan.num_microbatches, microbatch_size=plan.microbatch_size,
        schedule=plan.schedule.value, zero=int(lay.zero),
        replicas="|".join(map(str, lay.stage_replicas)),
        stages=_layer_ranges(plan),
        recomputed_layers=sum(len(s.recompute) for s in plan.stages),
        selective_layers=sum(len(s.recompute_selective) for s in plan.stages),
        iteration_ms=p.iteration_ms, throughput_samples_per_s=p.throughput_samples_per_s,
        peak_memory_gib=p.peak_memory_bytes / GIB,
        params_gib=big.param_bytes / GIB, grads_gib=big.grad_bytes / GIB, optimizer_gib=big.optimizer_bytes / GIB,
        activations_gib=big.activation_bytes / GIB,
        other_gib=(big.recompute_workspace_bytes + big.buffer_bytes) / GIB,
        bubble_fraction=p.bubble_fraction, exposed_allreduce_ms=p.exposed_allreduce_ms,
        machine_bound_ms=p.machine_bound_ms if p.machine_bound_ms > 0 else math.nan,
        limit_over_time=p.machine_bound_ms / p.iteration_ms if p.iteration_ms > 0 and p.machine_bound_ms > 0 else math.nan,
        partition_bound_ms=p.partition_bound_ms,
        partition_bound_over_time=p.partition_bound_ms / p.iteration_ms if p.iteration_ms > 0 else math.nan,
        achieved_tflops_per_device=p.achieved_tflops_per_device if p.achieved_tflops_per_device > 0 else math.nan,
        mfu=p.mfu if p.mfu > 0 else math.nan,
    )
    return row


def _reference_index(entries: list[PlanEntry], reference: str | int | None) -> int:
    if reference is None:
        return 0
    if isinstance(reference, int):
        if not 0 <= reference < len(entries):
            raise PlannerInputError(f"reference {reference} is not a row (0..{len(entries) - 1})")
        return reference
    for key in ("label", "solver"):
        for i, e in enumerate(entries):
            if getattr(e, key) == reference:
                return i
    raise PlannerInputError(
        f"reference {reference!r} names no plan (labels: {', '.join(e.label for e in entries)})"
    )


def _measured(plan: Plan, reports: list[RunReport]) -> dict[str, Any]:
    it = statistics.median(r.iteration_ms for r in reports)
    act = statistics.median(max(s.saved_bytes_peak for s in r.stages) for r in reports)
    act_pred = max(s.activation_bytes_per_microbatch * s.inflight_microbatches for s in plan.stages)
    return {
        "measured_runs": len(reports),
        "measured_iteration_ms": it,
        "measured_throughput_samples_per_s": plan.global_batch / it * 1e3 if it > 0 else math.nan,
        "iteration_rel_error": relative_error(it, plan.predicted.iteration_ms),
        "measured_activations_gib": act / GIB,
        "activation_rel_error": relative_error(act, act_pred),
    }


def _pair_reports(entries: list[PlanEntry], reports: Reports) -> dict[int, list[RunReport]]:
    """Plan row index -> its reports: explicit for a mapping, by signature for a sequence."""
    paired: dict[int, list[RunReport]] = {}
    if isinstance(reports, Mapping):
        for key, value in reports.items():
            try:
                idx = _reference_index(entries, key)
            except PlannerInputError:
                raise PlannerInputError(f"reports given for plan {key!r}, which is not among the plans") from None
            if entries[idx].plan is None:
                raise PlannerInputError(f"reports given for {key!r}, which has no plan")
            items = [value] if isinstance(value, (RunReport, str, Path)) else list(value)
            paired.setdefault(idx, []).extend(load_reports(items))
        return paired
    plan_rows = [i for i, e in enumerate(entries) if e.plan is not None]
    plans = [entries[i].plan for i in plan_rows]
    for k, item in enumerate(reports):
        (report,) = load_reports([item])
        source = str(item) if isinstance(item, (str, Path)) else f"run report {k}"
        idx = plan_rows[match_report(plans, report, source)]  # type: ignore[arg-type]
        paired.setdefault(idx, []).append(report)
    return paired


def gather_plans(
    plans_or_paths: Sequence[PlanLike] | PlanLike,
    *,
    baselines: bool = False,
    profile: ProfileLike | None = None,
    cluster: ClusterLike | None = None,
) -> list[PlanEntry]:
    """The plans, labelled, then (``baselines=True``) every built-in baseline for the first
    plan's request; its profile and cluster are ``profile``/``cluster`` or found from its
    provenance. A baseline whose solver is already among the plans is not repeated."""
    loaded = load_plans(plans_or_paths)  # type: ignore[arg-type]
    entries = [PlanEntry(label=label, solver=plan.provenance.solver.value, plan=plan) for label, plan, _ in loaded]
    if baselines:
        _, first, first_path = loaded[0]
        have = tuple(e.solver for e in entries)
        for name, base, note in add_baselines(first, profile, cluster, first_path, skip=have):
            entries.append(PlanEntry(label=name, solver=name, plan=base, note=note))
    return entries


def compare(
    plans_or_paths: Sequence[PlanLike] | PlanLike,
    *,
    baselines: bool = False,
    profile: ProfileLike | None = None,
    cluster: ClusterLike | None = None,
    reference: str | int | None = None,
    reports: Reports | None = None,
) -> pd.DataFrame:
    """One row per plan (see the module docstring for the columns).

    ``plans_or_paths``: plans or plan JSON paths. ``baselines``, ``profile``, ``cluster``: see
    :func:`gather_plans`. ``reference`` (a label, a solver name or a row index; default: the
    first row) is the ME index's and the speedup's reference. ``reports``: run reports (or
    paths) matched by signature, or a mapping ``{label or row index: report(s)}``.
    """
    entries = gather_plans(plans_or_paths, baselines=baselines, profile=profile, cluster=cluster)
    return compare_entries(entries, reference=reference, reports=reports)


def compare_entries(
    entries: list[PlanEntry], *, reference: str | int | None = None, reports: Reports | None = None
) -> pd.DataFrame:
    """:func:`compare` over already gathered rows."""
    ref_idx = _reference_index(entries, reference)
    ref = entries[ref_idx]
    if ref.plan is None:
        raise PlannerInputError(f"reference {ref.label!r} has no plan ({ref.note})")
    rows = [_plan_row(e) for e in entries]
    ref_p = ref.plan.predicted
    for e, row in zip(entries, rows):
        row["me_reference"] = ref.label
        if e.plan is None:
            continue
        p = e.plan.predicted
        row["speedup"] = ref_p.iteration_ms / p.iteration_ms if p.iteration_ms > 0 else math.nan
        row["me_index"] = me_index_of(
            p.throughput_samples_per_s, p.peak_memory_bytes, ref_p.throughput_samples_per_s, ref_p.peak_memory_bytes
        )
    columns = list(COLUMNS)
    if reports is not None:
        for idx, reps in _pair_reports(entries, reports).items():
            rows[idx].update(_measured(entries[idx].plan, reps))  # type: ignore[arg-type]
        columns += list(MEASURED_COLUMNS)
    frame = pd.DataFrame(rows, columns=columns)
    for name in _INT_COLUMNS:
        if name in frame:
            frame[name] = frame[name].astype("Int64")  # integers with NA for rows without a plan
    return frame.set_index("label", drop=False).rename_axis(None)
