"""Figures render: PNGs exist, are non-trivial, and show each kind's colour."""

from __future__ import annotations

import dataclasses
import math

import matplotlib.colors as mcolors
import matplotlib.image as mimage
import matplotlib.pyplot as plt
import numpy as np
import pytest

from planner.artifacts.kinds import ScheduleKind, ZeroStage
from planner.report.figures import COLORS, _tint, plot_memory, plot_timeline
from planner.simulation import SegmentKind, simulate
from tests.plan_factory import make_plan


def busy_plan(kind=ScheduleKind.ONE_F_ONE_B, **kw):
    return make_plan(
        kind, 6, [1.0, 1.2, 0.9], [2.0, 2.2, 1.8], recompute_ms=[0.6, 0.0, 0.0], send_fwd_ms=[0.2] * 3,
        send_bwd_ms=[0.2] * 3, allreduce_ms=[3.0] * 3, workspace_bytes=[300, 0, 0], **kw,
    )


def has_colour(pixels: np.ndarray, colour: str, tol: float = 0.02) -> bool:
    rgb = np.array(mcolors.to_rgb(colour))
    return bool((np.abs(pixels[..., :3] - rgb).max(axis=-1) < tol).sum() > 50)


def test_timeline_png(tmp_path):
    path = tmp_path / "timeline.png"
    plot_timeline(simulate(busy_plan()), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 20_000
    pixels = mimage.imread(path)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 1000
    zero_kinds = (SegmentKind.REDUCE_SCATTER, SegmentKind.ALL_GATHER)
    split = (SegmentKind.BACKWARD_INPUT, SegmentKind.BACKWARD_WEIGHT)  # 1F1B's backward is whole
    for kind in SegmentKind:
        if kind is not SegmentKind.OPTIMIZER and kind not in zero_kinds + split:  # no optimizer time, no ZeRO here
            assert has_colour(pixels, COLORS[kind]), kind
    for kind in zero_kinds + (SegmentKind.BACKWARD_WEIGHT,):
        assert not has_colour(pixels, COLORS[kind]), kind


def test_zero_bubble_timeline_shows_f_b_and_w(tmp_path):
    """A ZB-H1 plan draws its input-gradient (B) and weight-gradient (W) passes as their own bars."""
    base = busy_plan(ScheduleKind.ZB_H1)
    plan = dataclasses.replace(base, stages=tuple(dataclasses.replace(st, wgrad_ms=st.bwd_ms / 2, wgrad_bytes_per_microbatch=400)
                                                  for st in base.stages))
    path = tmp_path / "zb.png"
    timeline = simulate(plan)
    plot_timeline(timeline, path)
    pixels = mimage.imread(path)
    for kind in (SegmentKind.FORWARD, SegmentKind.BACKWARD_INPUT, SegmentKind.BACKWARD_WEIGHT, SegmentKind.RECOMPUTE):
        assert has_colour(pixels, COLORS[kind]), kind
    w = [seg for seg in timeline.segments() if seg.kind is SegmentKind.BACKWARD_WEIGHT]
    assert len(w) == 3 * 6 and all(math.isclose(seg.end_ms - seg.start_ms, plan.stages[seg.stage_idx].wgrad_ms) for seg in w)


@pytest.mark.parametrize("kind", [ScheduleKind.ZBV, ScheduleKind.ZB_H2])
def test_zbv_and_zb_h2_timelines_show_f_i_and_w(tmp_path, kind):
    """ZBV (two chunks per rank in a V: the later chunk lighter) and ZB-H2 draw F, I and W
    bars; ZBV's rank 0 runs the first and the last chunk."""
    v = 2 if kind is ScheduleKind.ZBV else 1
    n = 4 if v == 2 else 3
    base = make_plan(kind, 6, [1.0] * n, [2.0] * n, send_fwd_ms=[0.2] * n, send_bwd_ms=[0.2] * n,
                     virtual_stages_per_rank=v)
    plan = dataclasses.replace(base, stages=tuple(dataclasses.replace(st, wgrad_ms=1.0) for st in base.stages))
    timeline = simulate(plan)
    path = tmp_path / f"{kind.value}.png"
    plot_timeline(timeline, path)
    pixels = mimage.imread(path)
    for seg_kind in (SegmentKind.FORWARD, SegmentKind.BACKWARD_INPUT, SegmentKind.BACKWARD_WEIGHT):
        assert has_colour(pixels, COLORS[seg_kind]), seg_kind
    segs = timeline.segments()
    assert sum(seg.kind is SegmentKind.BACKWARD_WEIGHT for seg in segs) == n * 6
    if v == 2:
        assert {seg.stage_idx for seg in segs if seg.rank == 0 and seg.kind is SegmentKind.FORWARD} == {0, 3}
        assert has_colour(pixels, mcolors.to_hex(_tint(COLORS[SegmentKind.FORWARD], 1, 2)))


def test_zero_plan_draws_reduce_scatter_and_all_gather(tmp_path):
    """A ZeRO plan's gradient synchronisation is drawn as its two collectives, each half of the
    time (planner.cost prices the pair on the all-reduce line), in place of the all-reduce."""
    path = tmp_path / "zero.png"
    plan = busy_plan()
    timeline = simulate(dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, zero=ZeroStage.GRADIENTS)))
    segs = timeline.segments()
    rs = [s for s in segs if s.kind is SegmentKind.REDUCE_SCATTER]
    ag = [s for s in segs if s.kind is SegmentKind.ALL_GATHER]
    assert len(rs) == len(ag) == 3 and not any(s.kind is SegmentKind.ALLREDUCE for s in segs)
    for a, b in zip(rs, ag):
        assert a.end_ms == b.start_ms and a.end_ms - a.start_ms == pytest.approx(1.5)
    plot_timeline(timeline, path)
    pixels = mimage.imread(path)
    for kind in (SegmentKind.REDUCE_SCATTER, SegmentKind.ALL_GATHER):
        assert has_colour(pixels, COLORS[kind]), kind
    assert not has_colour(pixels, COLORS[SegmentKind.ALLREDUCE])


def test_memory_png(tmp_path):
    path = tmp_path / "memory.png"
    timeline = simulate(busy_plan(ScheduleKind.GPIPE))
    plot_memory(timeline, path, cap_bytes=12_000)
    assert path.stat().st_size > 20_000
    pixels = mimage.imread(path)
    assert has_colour(pixels, "#C44E52")  # the cap line
    assert len(np.unique((pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 50


def test_plots_draw_into_given_axes_and_handle_interleaving(tmp_path):
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6))
    plan = make_plan(ScheduleKind.INTERLEAVED_1F1B, 4, [1.0] * 4, [2.0] * 4, virtual_stages_per_rank=2)
    timeline = simulate(plan)
    assert plot_timeline(timeline, ax=top) is fig
    plot_memory(timeline, ax=bottom)
    labels = [t.get_text() for t in top.texts]
    assert labels.count("0") == 2 * 2 * 2  # micro-batch 0: F and B on both virtual stages of both ranks
    assert len(top.collections) >= 4  # forward/backward bars, two shades
    fig.savefig(tmp_path / "both.png")
    plt.close(fig)
    assert (tmp_path / "both.png").stat().st_size > 10_000
