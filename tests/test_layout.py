"""The Layout: one value for every parallel axis, its rank formula, its checks."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.artifacts.kinds import ZeroStage
from planner.artifacts.layout import MESH_DIMS, ONE_DEVICE, DeviceGroup, Layout, Sharding


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    if draw(st.booleans()):
        reps = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=4)))
        return Layout(num_stages=len(reps), stage_replicas=reps, zero=draw(st.sampled_from(list(ZeroStage))))
    p, v = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    t = draw(st.sampled_from([1, 2, 4]))
    return Layout(num_stages=p * v, virtual_stages_per_rank=v, dp_degree=draw(st.integers(1, 4)), tp_degree=t,
                  sequence_parallel=t > 1 and draw(st.booleans()), cp_degree=draw(st.sampled_from([1, 2, 3, 4])),
                  zero=draw(st.sampled_from(list(ZeroStage))))


@settings(max_examples=200, deadline=None)
@given(layout=layouts())
def test_every_device_has_one_place(layout: Layout) -> None:
    """Each rank of the world holds one position (pipeline rank, replica, cp index, tp index); a
    pipeline rank's chunks all sit on its devices; coordinates() inverts rank_of(); a stage's
    gradient group is its dp x cp ranks at one tp index, the union of its data-parallel groups
    (one per cp index) and of its context-parallel groups (one per replica); ZeRO shards over it."""
    devices: dict[int, set[int]] = {}
    cp = layout.cp_degree
    for s in range(layout.num_stages):
        ranks = layout.stage_ranks(s)
        dp = layout.data_parallel_size(s)
        assert list(ranks) == sorted(ranks) and len(ranks) == dp * cp * layout.tp_degree
        for rank in ranks:
            devices.setdefault(rank, set()).add(layout.pipeline_rank(s))
        for k in range(layout.tp_degree):
            grads = layout.grad_group(s, k)
            assert list(grads) == sorted(grads) and len(grads) == layout.grad_group_size(s) == dp * cp
            assert set(grads) <= set(ranks)
            by_cp = [layout.dp_group(s, k, cp_index=c) for c in range(cp)]
            by_replica = [layout.cp_group(s, replica=r, tp_index=k) for r in range(dp)]
            assert sorted(r for g in by_cp for r in g) == list(grads) == sorted(r for g in by_replica for r in g)
            assert all(len(g) == dp for g in by_cp) and all(len(g) == cp for g in by_replica)
        if layout.zero is not ZeroStage.NONE:
            edp = dp * cp * layout.tp_degree  # the routed experts' group (ep = etp = 1): every rank of the stage
            assert layout.sharding(s) == Sharding(layout.zero, dp * cp, edp if edp != dp * cp else 0)
    assert sorted(devices) == list(range(layout.world_size))
    assert all(len(p) == 1 for p in devices.values()), "a device runs chunks of one pipeline rank only"
    for rank in range(layout.world_size):
        a, r, c, k = layout.coordinates(rank)
        stage = a if layout.stage_replicas else layout.stage_indices(a)[0]
        assert layout.rank_of(stage_idx=stage, replica=r, cp_index=c, tp_index=k) == rank
    if not layout.stage_replicas:
        shape = layout.mesh_shape
        assert shape[0] * shape[1] * shape[2] * shape[3] == layout.world_size and len(MESH_DIMS) == len(shape) == 4
        assert shape[2] == cp


def test_uniform_ranks_are_the_row_major_mesh() -> None:
    lay = Layout(num_stages=4, virtual_stages_per_rank=2, dp_degree=2, tp_degree=2)
    assert lay.pipeline_size == 2 and lay.world_size == 8 and lay.mesh_shape == (2, 2, 1, 2)
    # chunk 2 runs on pipeline rank 0 again: ranks (0 x 2 + r) x 2 + k
    assert lay.stage_ranks(2) == (0, 1, 2, 3) and lay.stage_ranks(1) == (4, 5, 6, 7)
    assert lay.dp_group(1, tp_index=1) == (5, 7)
    assert lay.stage_indices(1) == (1, 3)


def test_cp_sits_between_dp_and_tp() -> None:
    """The ("pp", "dp", "cp", "tp") mesh: rank = ((p D + r) cp + c) t + k; a tp group is
    consecutive, a cp group strides by t, the gradient group (dp x cp) by t; ZeRO shards over
    dp x cp; the plan's text names CP."""
    lay = Layout(num_stages=2, dp_degree=2, cp_degree=2, tp_degree=2, zero=ZeroStage.OPTIMIZER)
    assert MESH_DIMS == ("pp", "dp", "cp", "tp") and lay.mesh_shape == (2, 2, 2, 2) and lay.world_size == 16
    assert lay.rank_of(stage_idx=1, replica=1, cp_index=1, tp_index=1) == ((1 * 2 + 1) * 2 + 1) * 2 + 1 == 15
    assert lay.coordinates(13) == (1, 1, 0, 1)
    assert lay.stage_ranks(0) == tuple(range(8)) and lay.stage_ranks(1) == tuple(range(8, 16))
    assert lay.cp_group(0, replica=1, tp_index=1) == (5, 7)
    assert lay.dp_group(0, tp_index=1, cp_index=1) == (3, 7)
    assert lay.grad_group(1, tp_index=0) == (8, 10, 12, 14)
    assert lay.data_parallel_size(0) == 2 and lay.grad_group_size(0) == 4
    assert lay.sharding(1) == Sharding(ZeroStage.OPTIMIZER, 4, 8)  # the routed experts: all 8 ranks of the stage
    assert lay.describe() == "T=2 x CP=2 x P=2 x D=2, ZeRO-1"
    assert Layout(num_stages=2, dp_degree=4, cp_degree=4, tp_degree=8).describe() == "T=8 x CP=4 x P=2 x D=4, no ZeRO"
    assert Layout(num_stages=1, cp_degree=2).describe() == "CP=2 x P=1 x D=1, no ZeRO"


def test_replicated_stages_are_consecutive_blocks() -> None:
    lay = Layout(num_stages=3, stage_replicas=(1, 2, 3), zero=ZeroStage.OPTIMIZER)
    assert [lay.stage_ranks(s) for s in range(3)] == [(0,), (1, 2), (3, 4, 5)]
    assert lay.sharding(2) == Sharding(ZeroStage.OPTIMIZER, 3) and lay.world_size == 6
    assert Layout(num_stages=2, stage_replicas=(1, 1)).stage_replicas == ()  # one copy each is uniform
    assert lay.describe() == "P=3 replicated 1+2+3, ZeRO-1"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_stages=0), "num_stages"),
        (dict(num_stages=3, virtual_stages_per_rank=2), "divide num_stages"),
        (dict(num_stages=2, sequence_parallel=True), "sequence_parallel needs tp_degree"),
        (dict(num_stages=2, stage_replicas=(2,)), "1 entries for 2 stages"),
        (dict(num_stages=2, stage_replicas=(2, 1), tp_degree=2), "per-stage replication"),
        (dict(num_stages=2, stage_replicas=(2, 1), dp_degree=2), "per-stage replication"),
        (dict(num_stages=2, stage_replicas=(2, 1), cp_degree=2), "cp_degree 2"),
        (dict(num_stages=2, cp_degree=0), "cp_degree must be >= 1"),
        (dict(num_stages=1, dp_degree=0), "dp_degree"),
    ],
)
def test_checks_name_the_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Layout(**kwargs)  # type: ignore[arg-type]


def test_sharding_follows_zero() -> None:
    assert Layout(num_stages=2, dp_degree=4).sharding(0) == Sharding()
    assert Layout(num_stages=2, dp_degree=4, zero=ZeroStage.GRADIENTS).sharding(1) == Sharding(ZeroStage.GRADIENTS, 4)
    assert Layout(num_stages=1, dp_degree=4, tp_degree=2, sequence_parallel=True,
                  zero=ZeroStage.OPTIMIZER).describe() == "T=2 (seq-par) x P=1 x D=4, ZeRO-1"
    interleaved = Layout(num_stages=8, virtual_stages_per_rank=2, tp_degree=2)
    assert interleaved.describe() == "T=2 x P=8 x D=1, no ZeRO"
    assert interleaved.describe(pipeline_ranks=True) == "T=2 x 8 stages on P=4 pipeline ranks (2 each) x D=1, no ZeRO"


def test_plan_file_writes_cp_only_when_above_one() -> None:
    """A plan without context parallelism reads and writes the bytes it did before the field
    (no ``cp_degree`` key; the golden corpus checks this on 98 plans); one with it round-trips,
    its stages hold dp x cp x t ranks, the shipped schema admits it, and a bad value is refused
    naming the field."""
    jsonschema = pytest.importorskip("jsonschema")
    from planner.artifacts.errors import PlannerInputError
    from planner.artifacts.plan import plan_from_json, plan_to_json
    from planner.schemas import HERE
    from tests.factories import make_plan

    names = tuple(f"l{i}" for i in range(4))
    plain = plan_to_json(make_plan(names, (2,), dp_degree=2))
    assert "cp_degree" not in plain and plan_from_json(plain).layout.cp_degree == 1
    plan = make_plan(names, (2,), dp_degree=2, cp_degree=2, tp_degree=2)
    doc = plan_to_json(plan)
    keys = list(doc)
    assert doc["cp_degree"] == 2 and keys.index("cp_degree") == keys.index("sequence_parallel") + 1
    assert plan_from_json(doc) == plan and [len(s.ranks) for s in plan.stages] == [8, 8]
    schema = json.loads((HERE / f"plan.v{doc['version']}.schema.json").read_text())
    jsonschema.validate(doc, schema)
    with pytest.raises(PlannerInputError, match=r"p.json: .*cp_degree must be >= 1 \(got 0\)"):
        plan_from_json(dict(doc, cp_degree=0), "p.json")


@settings(max_examples=300, deadline=None)
@given(layout=layouts(), per_node=st.sampled_from([1, 2, 3, 4, 8]), nodes=st.integers(1, 64))
def test_gradient_group_line_without_listing_ranks(layout: Layout, per_node: int, nodes: int) -> None:
    """The cost model's line of a stage's gradient group (worked out from where the group's
    arithmetic progression of ranks falls in the nodes, cached per shape) is the all-reduce line
    over the group's ranks themselves, on clusters whose nodes the groups fill in any way; the
    layout's StageLinks hold it, the group's ring line and the link to the next stage's rank."""
    import dataclasses

    from planner.artifacts.cluster import PRESETS
    from planner.artifacts.kinds import CollectiveModel
    from planner.cost.collectives import allreduce_line, grad_group_line, link_of, stage_links

    for model in CollectiveModel:
        cluster = dataclasses.replace(PRESETS["a100-80gb-x8"], num_nodes=nodes, devices_per_node=per_node,
                                      collective_model=model)
        links = stage_links(cluster, layout)
        for s in range(layout.num_stages):
            assert grad_group_line(cluster, layout, s) == allreduce_line(cluster, layout.grad_group(s)) == links.grad_lines[s]
            assert links.ring_lines[s] == allreduce_line(cluster, layout.grad_group(s), ring_only=True)
            src, dst = layout.rank_of(stage_idx=s), layout.rank_of(stage_idx=min(s + 1, layout.num_stages - 1))
            assert links.next_links[s] == (None if src == dst else link_of(cluster, src, dst))


@settings(max_examples=100, deadline=None)
@given(layout=layouts())
def test_device_group_is_the_layouts_inner_axes(layout: Layout) -> None:
    """A layout's group (tensor x context parallel) gives the devices a stage replica spans: its
    size divides the world into the layout's groups, its strides are the rank distances of the
    rank formula along cp and tp, and the group builds the same layout back."""
    group = layout.group
    assert group == DeviceGroup(tp_degree=layout.tp_degree, cp_degree=layout.cp_degree,
                                sequence_parallel=layout.sequence_parallel)
    assert group.size * layout.num_groups == layout.world_size == group.size * group.groups_in(layout.world_size)
    if not layout.stage_replicas:
        cp_stride, tp_stride = group.strides
        base = layout.rank_of(stage_idx=0)
        if layout.cp_degree > 1:
            assert layout.rank_of(stage_idx=0, cp_index=1) - base == cp_stride
        if layout.tp_degree > 1:
            assert layout.rank_of(stage_idx=0, tp_index=1) - base == tp_stride
    again = group.layout(num_stages=layout.num_stages, virtual_stages_per_rank=layout.virtual_stages_per_rank,
                         dp_degree=layout.dp_degree, stage_replicas=layout.stage_replicas, zero=layout.zero,
                         placement=layout.placement)
    assert again == layout


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tp_degree": 0}, "tp_degree must be >= 1 \\(got 0\\)"),
    ({"cp_degree": 0}, "cp_degree must be >= 1 \\(got 0\\)"),
    ({"sequence_parallel": True}, "sequence_parallel needs tp_degree > 1"),
])
def test_device_group_checks_name_the_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DeviceGroup(**kwargs)  # type: ignore[arg-type]
    assert ONE_DEVICE.size == 1 and ONE_DEVICE.describe() == "tensor-parallel degree 1"
    assert DeviceGroup(tp_degree=2, cp_degree=4, sequence_parallel=True).describe() == (
        "tensor-parallel degree 2 (seq-par), context-parallel 4")


@pytest.mark.parametrize(("placement", "chunks", "dp"), [("loop", (1, 2, 3, 4), 1), ("v", (2, 4), 1), ("mirror", (2,), 2)])
def test_stage_indices_are_the_chunks_pipeline_rank_places(placement: str, chunks: tuple[int, ...], dp: int) -> None:
    """:meth:`Layout.stage_indices` (worked out round by round) lists, in order, the chunks
    :meth:`Layout.pipeline_rank` puts on the rank, on every placement, 1-6 ranks."""
    from planner.artifacts.kinds import ChunkPlacement

    for p in range(1, 7):
        for v in chunks:
            lay = Layout(num_stages=p * v, virtual_stages_per_rank=v, dp_degree=dp, placement=ChunkPlacement(placement))
            for r in range(p):
                assert lay.stage_indices(r) == tuple(s for s in range(p * v) if lay.pipeline_rank(s) == r)
