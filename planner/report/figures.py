"""Figures of a simulated plan (matplotlib, Agg backend, no torch).

- :func:`plot_timeline`: a Gantt chart, one row per pipeline rank; compute (forward,
  recompute, backward) fills the row, transfers and all-reduces run in a thin lane under it
  (they overlap compute, DESIGN.md section 5); micro-batch numbers sit on bars wide enough.
- :func:`plot_memory`: each stage's memory over the iteration (a step function), peaks marked.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from planner.simulation import SegmentKind, Timeline

__all__ = ["COLORS", "plot_memory", "plot_timeline"]

COLORS: dict[SegmentKind, str] = {
    SegmentKind.FORWARD: "#4C72B0",
    SegmentKind.RECOMPUTE: "#8172B2",
    SegmentKind.BACKWARD: "#55A868",
    SegmentKind.BACKWARD_INPUT: "#55A868",  # zero bubble's B (torch's I): the backward's colour ...
    SegmentKind.BACKWARD_WEIGHT: "#A1C9A4",  # ... and its W, lighter
    SegmentKind.SEND_FWD: "#64B5CD",
    SegmentKind.SEND_BWD: "#CCB974",
    SegmentKind.ALLREDUCE: "#C44E52",
    SegmentKind.REDUCE_SCATTER: "#DD8452",
    SegmentKind.ALL_GATHER: "#937860",
    SegmentKind.OPTIMIZER: "#333333",
}
_COMPUTE = (SegmentKind.FORWARD, SegmentKind.RECOMPUTE, SegmentKind.BACKWARD, SegmentKind.BACKWARD_INPUT,
            SegmentKind.BACKWARD_WEIGHT)
_MAIN_H = 0.56  # compute band height; the comm lane sits below it
_LANE_H = 0.2


def _finish(fig: Figure, own: bool, path: str | Path | None) -> Figure:
    if path is not None:
        fig.savefig(path, dpi=150, bbox_inches="tight")
    if own and path is not None:
        plt.close(fig)
    return fig



def _group_note(t: int, cp: int) -> str:
    """What one rank of the figure stands for: a tensor-parallel group, cp of them splitting the
    sequence (their collectives are inside the stage's times, as tensor parallelism's are)."""
    if cp > 1:
        groups = f"{cp} tensor-parallel groups of {t}" if t > 1 else f"{cp} devices"
        return f" (each {groups} splitting the sequence)"
    return f" (each a tensor-parallel group of {t} devices)" if t > 1 else ""

def plot_timeline(
    timeline: Timeline, path: str | Path | None = None, ax: Axes | None = None, *, title: str = "", time_max_ms: float = 0.0
) -> Figure:
    """Gantt chart of ``timeline``; saved to ``path`` when given. Returns the figure.

    ``time_max_ms`` widens the time axis (to draw several timelines on one scale).
    """
    span_ms = max(timeline.iteration_ms, time_max_ms)
    own = ax is None
    if ax is None:
        height = max(2.2, 0.55 * timeline.num_ranks + 1.4)
        fig, ax = plt.subplots(figsize=(12, min(height, 24)))
    else:
        fig = ax.figure  # type: ignore[assignment]
    bars: dict[tuple[SegmentKind, int, int], list[tuple[float, float]]] = defaultdict(list)
    segments = timeline.segments()
    for seg in segments:
        chunk = seg.stage_idx // timeline.num_ranks if seg.stage_idx >= 0 else 0
        bars[(seg.kind, seg.rank, chunk)].append((seg.start_ms, seg.end_ms - seg.start_ms))
    # white separators between bars only where bars are several pixels wide (else they wash out)
    edge = 0.4 if _ms_per_px(ax, span_ms) * 4 < _median_compute_ms(timeline) else 0.0
    for (kind, rank, chunk), spans in bars.items():
        y = rank  # row centre; rank 0 at the top (axis inverted below)
        color = _tint(COLORS[kind], chunk, timeline.layout.virtual_stages_per_rank)
        if kind in _COMPUTE:
            ax.broken_barh(spans, (y - _MAIN_H / 2, _MAIN_H), facecolors=color, edgecolors="white", linewidths=edge)
        else:
            ax.broken_barh(spans, (y + _MAIN_H / 2 + 0.02, _LANE_H), facecolors=color, alpha=0.85, linewidths=0)
    _label_microbatches(ax, timeline, segments, span_ms)
    ax.set_ylim(timeline.num_ranks - 0.5 + _LANE_H, -0.6)
    ax.set_xlim(0, span_ms * 1.01)
    ax.set_yticks(range(timeline.num_ranks))
    ax.set_yticklabels([f"rank {r}" for r in range(timeline.num_ranks)])
    ax.set_xlabel("time (ms)")
    present = {s.kind for s in segments}
    handles = [Patch(color=COLORS[k], label=k.value) for k in SegmentKind if k in present]
    if timeline.layout.virtual_stages_per_rank > 1:
        handles.append(Patch(color=_tint("#777777", 1, 2), label="lighter: later virtual stage"))
    ax.legend(
        handles=handles,
        loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False, fontsize=8,
    )
    ax.set_title(
        title
        or f"{timeline.schedule.value}: {timeline.layout.num_stages} stages on {timeline.num_ranks} ranks"
        f"{_group_note(timeline.layout.tp_degree, timeline.layout.cp_degree)}, "
        f"M = {timeline.num_microbatches}; iteration {timeline.iteration_ms:.3g} ms, "
        f"bubble {timeline.bubble_fraction:.1%}, exposed all-reduce {timeline.exposed_allreduce_ms:.3g} ms",
        fontsize=9,
    )
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    return _finish(fig, own, path)


def _ms_per_px(ax: Axes, span_ms: float) -> float:
    fig = ax.figure
    width_px = fig.get_figwidth() * fig.dpi * ax.get_position().width
    return max(span_ms, 1e-12) * 1.01 / max(width_px, 1.0)


def _median_compute_ms(timeline: Timeline) -> float:
    widths = sorted(s.fwd_ms for s in timeline.stages) + sorted(s.bwd_ms for s in timeline.stages)
    return widths[len(widths) // 2]


def _tint(color: str, chunk: int, num_chunks: int) -> tuple[float, float, float]:
    """Lighter shades for later virtual stages of a rank (interleaved schedules)."""
    rgb = matplotlib.colors.to_rgb(color)
    mix = 0.45 * chunk / (num_chunks - 1) if num_chunks > 1 else 0.0
    return tuple(c + (1.0 - c) * mix for c in rgb)  # type: ignore[return-value]


def _label_microbatches(ax: Axes, timeline: Timeline, segments: tuple, span_ms: float) -> None:
    """Put the micro-batch number on compute bars at least ~2 characters wide."""
    ms_per_px = _ms_per_px(ax, span_ms)
    interleaved = timeline.layout.virtual_stages_per_rank > 1
    for seg in segments:
        if seg.kind not in (SegmentKind.FORWARD, SegmentKind.BACKWARD, SegmentKind.BACKWARD_INPUT,
                            SegmentKind.BACKWARD_WEIGHT):
            continue
        text = str(seg.mb_idx)
        if (seg.end_ms - seg.start_ms) / ms_per_px < 6.0 * len(text) + 2:
            continue
        ax.text((seg.start_ms + seg.end_ms) / 2, seg.rank, text, ha="center", va="center", fontsize=7,
                color="white" if not interleaved or seg.stage_idx < timeline.num_ranks else "black")


def _unit(peak: float) -> tuple[float, str]:
    for scale, name in ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
        if peak >= scale:
            return float(scale), name
    return 1.0, "B"


def plot_memory(
    timeline: Timeline,
    path: str | Path | None = None,
    ax: Axes | None = None,
    *,
    cap_bytes: int = 0,
    title: str = "",
) -> Figure:
    """Memory of each stage over the iteration, with its peak; ``cap_bytes`` draws the cap."""
    own = ax is None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 4.5))
    else:
        fig = ax.figure  # type: ignore[assignment]
    # a cap far above the peak would flatten the curves: then it is named in the title only
    cap_on_scale = 0 < cap_bytes <= 2 * timeline.peak_memory_bytes
    scale, unit = _unit(max(timeline.peak_memory_bytes, cap_bytes if cap_on_scale else 0))
    cmap = plt.get_cmap("viridis")
    n = timeline.layout.num_stages
    for trace in timeline.memory:
        color = cmap(trace.stage_idx / max(n - 1, 1) * 0.9)
        times = list(trace.times_ms) + [timeline.iteration_ms]
        values = [b / scale for b in trace.bytes_] + [trace.bytes_[-1] / scale]
        label = f"stage {trace.stage_idx} (peak {trace.peak_bytes / scale:.3g} {unit})"
        ax.step(times, values, where="post", color=color, lw=1.3, label=label)
        peak_at = trace.times_ms[trace.bytes_.index(trace.peak_bytes)]
        ax.plot([peak_at], [trace.peak_bytes / scale], marker="o", ms=3.5, color=color)
    if cap_on_scale:
        ax.axhline(cap_bytes / scale, color="#C44E52", ls="--", lw=1, label=f"cap {cap_bytes / scale:.3g} {unit}")
    ax.set_xlim(0, timeline.iteration_ms * 1.01)
    ax.set_ylim(0, max(timeline.peak_memory_bytes, cap_bytes if cap_on_scale else 0) / scale * 1.12)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel(f"memory per device ({unit})")
    ax.set_title(
        title
        or f"{timeline.schedule.value}: memory per stage, peak {timeline.peak_memory_bytes / scale:.3g} {unit}"
        + (f" (cap {cap_bytes / scale:.3g} {unit}, off scale)" if cap_bytes and not cap_on_scale else ""),
        fontsize=9,
    )
    if n <= 16:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.grid(alpha=0.3)
    return _finish(fig, own, path)
