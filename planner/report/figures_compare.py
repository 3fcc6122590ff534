"""Figures that put several plans side by side (matplotlib, Agg backend, no torch).

- :func:`plot_timelines`: one Gantt chart per plan (:func:`planner.report.figures.plot_timeline`)
  stacked on a shared time axis, so lengths compare directly;
- :func:`plot_stage_memory`: planned memory of each stage as stacked bars (parameters,
  gradients, optimizer state, activations, other = recompute workspace + send/receive
  buffers), one panel per plan on a shared scale, the memory cap dashed;
- :func:`plot_pareto`: the plan's Pareto front of iteration time vs peak memory
  (``plan.pareto``, from the solver's search) with the chosen plan starred, and other plans
  (e.g. baselines) as labelled markers.

Every number is read from the plans or from :func:`planner.simulation.simulate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from planner.artifacts.plan import Plan
from planner.report.figures import _finish, _unit, plot_timeline
from planner.report.table import pareto_label
from planner.simulation import simulate

__all__ = ["MEMORY_COLORS", "plot_pareto", "plot_stage_memory", "plot_timelines"]

MEMORY_COLORS = {
    "parameters": "#4C72B0",
    "gradients": "#DD8452",
    "optimizer": "#8172B2",
    "activations": "#55A868",
    "other": "#999999",
}


def _labels(plans: Sequence[Plan], labels: Sequence[str] | None) -> list[str]:
    if labels is None:
        return [p.provenance.solver.value for p in plans]
    if len(labels) != len(plans):
        raise ValueError(f"{len(labels)} labels for {len(plans)} plans")
    return list(labels)


def _ms(value: float) -> str:
    """A time for a label: 4 significant digits, no exponent."""
    return f"{value:,.0f}" if value >= 1e4 else f"{value:.4g}"


def _describe(plan: Plan) -> str:
    rc = sum(len(s.recompute) for s in plan.stages)
    sel = sum(len(s.recompute_selective) for s in plan.stages)
    return (f"{plan.layout.describe()}, {plan.schedule.value}, M={plan.num_microbatches} x "
            f"mb {plan.microbatch_size}, {rc} recomputed" + (f" + {sel} selective" if sel else ""))


def plot_timelines(
    plans: Sequence[Plan], labels: Sequence[str] | None = None, path: str | Path | None = None
) -> Figure:
    """One Gantt chart per plan, stacked, on one time axis. Returns the figure."""
    names = _labels(plans, labels)
    timelines = [simulate(p) for p in plans]
    heights = [max(1.6, 0.42 * t.num_ranks + 1.0) for t in timelines]
    fig, axes = plt.subplots(
        len(plans), 1, figsize=(12, min(sum(heights), 60)), sharex=True, squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    longest = max(t.iteration_ms for t in timelines)
    for ax, plan, tl, name in zip(axes[:, 0], plans, timelines, names):
        title = (f"{name}: {_describe(plan)} -- schedule replay {_ms(tl.iteration_ms)} ms "
                 f"(predicted iteration {_ms(plan.predicted.iteration_ms)} ms with the straggler share), "
                 f"bubble {tl.bubble_fraction:.1%}, exposed all-reduce {tl.exposed_allreduce_ms:.3g} ms")
        plot_timeline(tl, ax=ax, title=title, time_max_ms=longest)
        ax.set_xlabel("")
    axes[-1, 0].set_xlabel("time (ms)")
    fig.tight_layout()
    return _finish(fig, True, path)


def plot_stage_memory(
    plans: Sequence[Plan], labels: Sequence[str] | None = None, path: str | Path | None = None
) -> Figure:
    """Planned memory per stage, stacked by kind, one panel per plan (shared y scale)."""
    names = _labels(plans, labels)
    peak = max(s.memory_total_bytes for p in plans for s in p.stages)
    cap = min(s.memory_cap_bytes for p in plans for s in p.stages)
    cap_on_scale = 0 < cap <= 1.5 * peak
    scale, unit = _unit(max(peak, cap if cap_on_scale else 0))
    widths = [max(1.6, 0.45 * p.layout.num_stages + 0.8) for p in plans]
    fig, axes = plt.subplots(
        1, len(plans), figsize=(min(sum(widths) + 1.8, 40), 4.2), sharey=True, squeeze=False,
        gridspec_kw={"width_ratios": widths},
    )
    for ax, plan, name in zip(axes[0], plans, names):
        _stage_bars(ax, plan, scale)
        if cap_on_scale:
            ax.axhline(cap / scale, color="#C44E52", ls="--", lw=1)
        ax.set_title(f"{name}\n{plan.layout.describe()}, {plan.schedule.value}", fontsize=8)
        ax.set_xlabel("stage")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    axes[0, 0].set_ylabel(f"planned memory per device ({unit})")
    axes[0, 0].set_ylim(0, max(peak, cap if cap_on_scale else 0) / scale * 1.08)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in MEMORY_COLORS.values()]
    names_legend = list(MEMORY_COLORS)
    if cap_on_scale:
        handles.append(plt.Line2D([0], [0], color="#C44E52", ls="--"))
        names_legend.append(f"cap {cap / scale:.3g} {unit}")
    axes[0, -1].legend(handles, names_legend, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=8)
    fig.tight_layout()
    return _finish(fig, True, path)


def _stage_bars(ax: Axes, plan: Plan, scale: float) -> None:
    xs = list(range(plan.layout.num_stages))
    bottom = [0.0] * plan.layout.num_stages
    for kind, color in MEMORY_COLORS.items():
        values = []
        for s in plan.stages:
            m = s.memory
            values.append({
                "parameters": m.param_bytes, "gradients": m.grad_bytes, "optimizer": m.optimizer_bytes,
                "activations": m.activation_bytes, "other": m.recompute_workspace_bytes + m.buffer_bytes,
            }[kind] / scale)
        ax.bar(xs, values, bottom=bottom, color=color, width=0.7)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(xs)
    ax.set_xlim(-0.6, plan.layout.num_stages - 0.4)


def plot_pareto(
    plan: Plan,
    path: str | Path | None = None,
    ax: Axes | None = None,
    *,
    others: Mapping[str, Plan] | None = None,
    title: str = "",
) -> Figure:
    """``plan.pareto`` (iteration time vs peak memory per device), the chosen plan starred,
    ``others`` (label -> plan) as labelled markers."""
    own = ax is None
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 5))
    else:
        fig = ax.figure  # type: ignore[assignment]
    others = dict(others or {})
    mems = [q.peak_memory_bytes for q in plan.pareto] + [plan.predicted.peak_memory_bytes]
    mems += [o.predicted.peak_memory_bytes for o in others.values()]
    scale, unit = _unit(max(mems))
    front = sorted(plan.pareto, key=lambda q: q.iteration_ms)
    if front:
        xs = [q.iteration_ms for q in front]
        ys = [q.peak_memory_bytes / scale for q in front]
        ax.step(xs, ys, where="post", color="#4C72B0", lw=1, alpha=0.6)
        ax.scatter(xs, ys, color="#4C72B0", s=28, zorder=3, label="Pareto front (solver's search)")
        # numbers at the points, their layouts listed beside the axes: full labels at the points overlap
        for i, q in enumerate(front, start=1):
            ax.annotate(str(i), (q.iteration_ms, q.peak_memory_bytes / scale), textcoords="offset points",
                        xytext=(4, 3), fontsize=7, color="#4C72B0")
        ax.text(1.02, 1.0, "\n".join(f"{i}: {pareto_label(q)}" for i, q in enumerate(front, start=1)),
                transform=ax.transAxes, va="top", ha="left", fontsize=6.5, color="#4C72B0", family="monospace")
    markers = "osD^vP<>Xh"
    for i, (name, other) in enumerate(others.items()):
        ax.scatter([other.predicted.iteration_ms], [other.predicted.peak_memory_bytes / scale], marker=markers[i % len(markers)],
                   s=40, facecolors="none", edgecolors=plt.get_cmap("tab10")((i + 1) % 10), lw=1.3, zorder=4,
                   label=f"{name}: {_ms(other.predicted.iteration_ms)} ms, {other.predicted.peak_memory_bytes / scale:.3g} {unit}")
    ax.scatter([plan.predicted.iteration_ms], [plan.predicted.peak_memory_bytes / scale], marker="*", s=220,
               color="#C44E52", zorder=5, edgecolors="black", lw=0.5,
               label=f"chosen ({plan.provenance.solver.value}): {_ms(plan.predicted.iteration_ms)} ms, "
               f"{plan.predicted.peak_memory_bytes / scale:.3g} {unit}")
    ax.set_xlabel("predicted iteration time (ms)")
    ax.set_ylabel(f"peak memory per device ({unit})")
    ax.set_title(title or f"{plan.provenance.model}: iteration time vs peak memory", fontsize=9)
    ax.grid(alpha=0.3)
    ax.margins(x=0.12, y=0.12)
    ax.legend(fontsize=7, loc="best", frameon=False)
    return _finish(fig, own, path)
