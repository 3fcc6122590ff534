"""The Layout: one value for every parallel axis, its rank formula, its checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.artifacts.kinds import ZeroStage
from planner.artifacts.layout import MESH_DIMS, Layout, Sharding


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    if draw(st.booleans()):
        reps = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=4)))
        return Layout(num_stages=len(reps), stage_replicas=reps, zero=draw(st.sampled_from(list(ZeroStage))))
    p, v = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    t = draw(st.sampled_from([1, 2, 4]))
    return Layout(num_stages=p * v, virtual_stages_per_rank=v, dp_degree=draw(st.integers(1, 4)), tp_degree=t,
                  sequence_parallel=t > 1 and draw(st.booleans()), zero=draw(st.sampled_from(list(ZeroStage))))


@settings(max_examples=200, deadline=None)
@given(layout=layouts())
def test_every_device_has_one_place(layout: Layout) -> None:
    """Each rank of the world holds one position (pipeline rank, replica, tp index); a pipeline
    rank's chunks all sit on its devices; coordinates() inverts rank_of()."""
    devices: dict[int, set[int]] = {}
    for s in range(layout.num_stages):
        ranks = layout.stage_ranks(s)
        assert list(ranks) == sorted(ranks) and len(ranks) == layout.data_parallel_size(s) * layout.tp_degree
        for rank in ranks:
            devices.setdefault(rank, set()).add(layout.pipeline_rank(s))
        for k in range(layout.tp_degree):
            group = layout.dp_group(s, k)
            assert set(group) <= set(ranks) and len(group) == layout.data_parallel_size(s)
    assert sorted(devices) == list(range(layout.world_size))
    assert all(len(p) == 1 for p in devices.values()), "a device runs chunks of one pipeline rank only"
    for rank in range(layout.world_size):
        a, r, k = layout.coordinates(rank)
        stage = a if layout.stage_replicas else layout.stage_indices(a)[0]
        assert layout.rank_of(stage_idx=stage, replica=r, tp_index=k) == rank
    if not layout.stage_replicas:
        shape = layout.mesh_shape
        assert shape[0] * shape[1] * shape[2] == layout.world_size and len(MESH_DIMS) == 3


def test_uniform_ranks_are_the_row_major_mesh() -> None:
    lay = Layout(num_stages=4, virtual_stages_per_rank=2, dp_degree=2, tp_degree=2)
    assert lay.pipeline_size == 2 and lay.world_size == 8 and lay.mesh_shape == (2, 2, 2)
    # chunk 2 runs on pipeline rank 0 again: ranks (0 x 2 + r) x 2 + k
    assert lay.stage_ranks(2) == (0, 1, 2, 3) and lay.stage_ranks(1) == (4, 5, 6, 7)
    assert lay.dp_group(1, tp_index=1) == (5, 7)
    assert lay.stage_indices(1) == (1, 3)


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
