"""Zero-bubble schedules in the default search (issue 50 items 2 and 5): the default request
searches them, a grouped profile solves them over its layers, their memory is priced at every
point of their walk, and a tie inside one rank (ZBV's embedding and head) is one copy with no
exchange."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from planner.artifacts.cluster import PRESETS, load_cluster
from planner.artifacts.kinds import ChunkPlacement, ScheduleKind
from planner.artifacts.layout import Layout
from planner.artifacts.profile import load_profile
from planner.artifacts.request import PlanRequest
from planner.schedule import held_bytes, held_counts, layout_schedule
from planner.schedule.actions import ActionKind
from planner.solve import plan

REPO = Path(__file__).resolve().parents[1]
BEFORE = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B)
ZERO_BUBBLE = (ScheduleKind.ZB_H1, ScheduleKind.ZB_H2, ScheduleKind.ZBV)


def test_default_request_and_cli_search_zero_bubble() -> None:
    """PlanRequest's default searches every schedule the runtime runs, zero bubble included, and
    ``planner plan``'s ``--schedules`` default is the request's."""
    from planner.commands.cli import build_parser
    from planner.commands.plan import request_from_args

    assert set(PlanRequest().schedules) == set(BEFORE + ZERO_BUBBLE + (ScheduleKind.DUALPIPE_V,))
    args = build_parser().parse_args(["plan"])
    assert request_from_args(args).schedules == PlanRequest().schedules


@pytest.mark.parametrize("kind", ZERO_BUBBLE)
@pytest.mark.parametrize("P,M", [(2, 2), (2, 6), (4, 4), (4, 12), (3, 9), (3, 2)])
def test_held_states_cover_every_point_of_the_walk(kind: ScheduleKind, P: int, M: int) -> None:
    """Every (whole, past I) point of each stage's walk is at most one of its Held.states in both
    counts, the peak of the count among them; so ``held_bytes`` is the walk's peak in bytes for
    any activation and keep sizes (a recomputing stage's keep above its activations included)."""
    layout = (Layout(num_stages=2 * P, virtual_stages_per_rank=2, placement=ChunkPlacement.V)
              if kind is ScheduleKind.ZBV else Layout(num_stages=P))
    held = held_counts(kind, layout, M)
    whole = [0] * layout.num_stages
    past = [0] * layout.num_stages
    walks: list[list[tuple[int, int]]] = [[] for _ in range(layout.num_stages)]
    for order in layout_schedule(kind, layout, M):
        for a in order:
            s = a.stage_idx
            if a.kind is ActionKind.FORWARD:
                whole[s] += 1
            elif a.kind is ActionKind.BACKWARD_INPUT:
                whole[s], past[s] = whole[s] - 1, past[s] + 1
            elif a.kind is ActionKind.BACKWARD_WEIGHT:
                past[s] -= 1
            walks[s].append((whole[s], past[s]))
    for s, points in enumerate(walks):
        states = held[s].states
        assert (held[s].whole, held[s].pending) in states
        assert all(any(w <= x and p <= y for x, y in states) for w, p in points), (s, states)
        for act, keep in ((10.0, 3.0), (2.0, 9.0)):
            assert held_bytes(held[s], act, keep) == max(w * act + p * keep for w, p in points)


def test_grouped_profile_solves_zero_bubble_over_its_layers() -> None:
    """GPT-3 175B on 64 A100s, global batch 512, 8 stages (its 98 layers searched over 64 groups):
    ZB-H1 over the groups recomputed where a layer more or less would fit, 7% slower than 1F1B
    there and never refined; over the layers the default request picks a zero-bubble plan faster
    than the best GPipe / 1F1B / interleaved plan."""
    profile = load_profile(REPO / "profiles" / "gpt3-175b-a100.json")
    cluster = PRESETS["a100-80gb-x8"].with_devices(64)
    request = PlanRequest(global_batch=512, num_stages=8, tp_degrees=(4,))
    now = plan(profile, cluster, request)
    before = plan(profile, cluster, dataclasses.replace(request, schedules=BEFORE))
    assert now.schedule in ZERO_BUBBLE
    assert now.predicted.iteration_ms < before.predicted.iteration_ms
    assert now.predicted.peak_memory_bytes <= now.stages[0].memory_cap_bytes


def test_zbv_tied_embedding_and_head_on_one_rank() -> None:
    """ZBV puts the first and last chunk on rank 0: the zoo GPT's tied embedding and head there are
    one copy (the rank's parameters are the model's once) with no exchange of their gradients
    (one replica: no synchronisation at all), and ``repredict`` prices the plan as the search did."""
    from planner.report.calibrate import repredict

    profile = load_profile(REPO / "profiles" / "zoo-gpt-cpu.json")
    assert profile.tied
    cluster = load_cluster("local-cpu")
    p = plan(profile, cluster, PlanRequest(global_batch=8, num_devices=2, num_stages=2,
                                           schedules=(ScheduleKind.ZBV,)))
    assert p.layout.pipeline_rank(0) == p.layout.pipeline_rank(p.layout.num_stages - 1) == 0
    assert all(s.allreduce_ms == 0.0 for s in p.stages)
    from planner.cost import CostModel

    cm = CostModel(profile, cluster, p.optimizer)
    per_param = cm.weight_bytes_per_param
    assert sum(s.memory.param_bytes for s in p.stages) == cm.stage_param_count(0, profile.num_layers) * per_param
    again = repredict(p, profile, cluster)
    assert again.predicted.iteration_ms == pytest.approx(p.predicted.iteration_ms, rel=1e-12)
    assert [s.memory_total_bytes for s in again.stages] == [s.memory_total_bytes for s in p.stages]
