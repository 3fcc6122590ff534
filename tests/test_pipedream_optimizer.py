"""PipeDream's optimizer reimplemented (planner.solve.pipedream_optimizer): the antichain DAG and
the DP by hand on a small graph, and the ``pipedream`` baseline turning the choice into a plan
(planner.solve.pipedream_baseline) on a graph the project writes (tests/graph_fixtures.py). The
same choices as the real optimizer on its own profiles (read from ``../shared/reference/pipedream``)
are checked by ``benchmarks/pipedream_profiles.py`` against its recorded choices and by
``benchmarks/pipedream_replication.py --reproduce`` beside the running optimizer."""

from __future__ import annotations

import dataclasses
import math

import pytest

from planner.artifacts.cluster import PRESETS
from planner.artifacts.errors import InfeasibleError
from planner.artifacts.kinds import SolverKind
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.profiling.imported.pipedream import import_pipedream
from planner.solve import plan
from planner.solve.pipedream_baseline import choose
from planner.solve.pipedream_optimizer import (
    NodeGraph,
    OptimizerArgs,
    antichain_states,
    objective_of,
    optimize,
    prefix_bounds,
    restricted,
)
from tests.graph_fixtures import graph_path

A, B, C, D, E = range(5)


def diamond(param_e: float = 1.0) -> NodeGraph:
    """a -> b -> d -> e and a -> c -> d; compute 1, 4, 1, 1, 4 s; only e has parameters."""
    return NodeGraph(names=("a", "b", "c", "d", "e"), compute_s=(1.0, 4.0, 1.0, 1.0, 4.0),
                     activation_bytes=(1.0,) * 5, param_bytes=(0.0, 0.0, 0.0, 0.0, param_e),
                     succ=((B, C), (D,), (D,), (E,), ()))


def mask(*nodes: int) -> int:
    return sum(1 << n for n in nodes)


def test_antichain_dag_of_a_diamond_by_hand() -> None:
    """States {a}, {b}, {c}, {b, c}, {d}, {e} (breadth-first from a); {b} is augmented with a
    (a still feeds c), and from {b} replacing b by d reaches {d} (a drops out: an ancestor of d)."""
    states = antichain_states(diamond())
    assert states.downsets == (mask(A), mask(A, B), mask(A, C), mask(A, B, C), mask(A, B, C, D), mask(A, B, C, D, E))
    assert states.augmented[1] == {A, B} and states.augmented[3] == {A, B, C} and states.augmented[4] == {D}
    assert states.ancestors == ((), (0,), (0,), (0, 1, 2), (0, 1, 2, 3), (0, 1, 2, 3, 4))


def test_dp_on_a_diamond_by_hand() -> None:
    """Parameters only on e, |w| / B = 1 s, no transfers, no memory limit.

    2 machines: one stage twice costs (11 + 4 x 1 x 1 / 2) / 2 = 6.5; {a, b} | {c, d, e} and
    {a, b, c} | {d, e} both cost 6: the first found (the earlier state) stays.
    3 machines: {a, b, c, d} twice (3.5, nothing to synchronise) then {e} once (4): 4."""
    args = dict(bandwidth_bytes_per_s=1.0, use_memory_constraint=False, activation_compression_ratio=None)
    graph = diamond()
    two = optimize(graph, OptimizerArgs(num_machines=2, **args))
    assert two is not None
    assert two.stage_nodes == ({A, B}, {C, D, E}) and two.replicas == (1, 1) and two.objective_s == 6.0
    other = objective_of(graph, OptimizerArgs(num_machines=2, **args), [frozenset({A, B, C}), frozenset({D, E})], (1, 1))
    assert other == 6.0  # the tie the DP broke
    three = optimize(graph, OptimizerArgs(num_machines=3, **args))
    assert three is not None
    assert three.stage_nodes == ({A, B, C, D}, {E}) and three.replicas == (2, 1) and three.objective_s == 4.0
    assert prefix_bounds(three) == (0, 4)
    one = optimize(graph, OptimizerArgs(num_machines=1, **args))
    assert one is not None and one.stage_nodes == ({A, B, C, D, E},) and one.replicas == (1,) and one.objective_s == 11.0
    assert objective_of(graph, OptimizerArgs(num_machines=3, **args), three.stage_nodes, three.replicas) == 4.0
    # {a, c} is not a prefix of the order a, b, c, d, e; a cut there is no layer range
    assert objective_of(graph, OptimizerArgs(num_machines=2, **args), [frozenset({A, C}), frozenset({B, D, E})],
                        (1, 1)) == pytest.approx(max(2.0, 9.0))


def test_a_cut_that_is_no_layer_prefix_and_the_prefix_only_rerun() -> None:
    """c heavy (8 s), b holding parameters (100 bytes at 1 B/s): the best cut on 2 machines is
    after {a, c} (9 s), which is no prefix of the order a, b, c, d, e; over the prefix states
    only, {a, b} | {c, d, e} (10 s; {a, b, c} | {d, e} ties at 10, the earlier state stays)."""
    graph = dataclasses.replace(diamond(param_e=0.0), compute_s=(1.0, 1.0, 8.0, 1.0, 1.0),
                                param_bytes=(0.0, 100.0, 0.0, 0.0, 0.0))
    args = OptimizerArgs(num_machines=2, bandwidth_bytes_per_s=1.0, use_memory_constraint=False,
                         activation_compression_ratio=None)
    states = antichain_states(graph)
    full = optimize(graph, args, states)
    assert full is not None and full.stage_nodes == ({A, C}, {B, D, E}) and full.objective_s == 9.0
    assert prefix_bounds(full) is None
    keep = [not (d & (d + 1)) for d in states.downsets]
    assert keep == [True, True, False, True, True, True]
    prefix = optimize(graph, args, restricted(states, keep))
    assert prefix is not None and prefix.stage_nodes == ({A, B}, {C, D, E}) and prefix.objective_s == 10.0
    assert prefix_bounds(prefix) == (0, 2)


def test_memory_constraint_and_transfers_by_hand() -> None:
    """Transfers: a stage's input and output cross at 2 x bytes / (B x copies); the memory
    constraint drops a stage whose stashed bytes (activations + parameters) x ceil((N - used) /
    copies) exceed the memory size."""
    graph = dataclasses.replace(diamond(param_e=0.0), activation_bytes=(1.0, 1.0, 1.0, 10.0, 1.0))
    # one machine each: the cut after d sends 2 x 10 / 1 = 20 s: worse than any cut before d
    args = OptimizerArgs(num_machines=2, bandwidth_bytes_per_s=1.0, use_memory_constraint=False)
    got = optimize(graph, args)
    assert got is not None and got.objective_s == 11.0 / 2  # one stage on both beats every cut
    # one stage on 2 stashes ceil(0 / 2) = 0: allowed; a 2-stage split's first stage stashes
    # its bytes x ceil((2 - 1) / 1): with memory 4, only cuts with at most 4 bytes up front
    tight = OptimizerArgs(num_machines=2, bandwidth_bytes_per_s=1.0, memory_bytes=4.0,
                          activation_compression_ratio=None)
    assert objective_of(graph, tight, [frozenset({A, B, C, D}), frozenset({E})], (1, 1)) == float("inf")
    assert objective_of(graph, tight, [frozenset({A, B}), frozenset({C, D, E})], (1, 1)) == 6.0


def test_pipedream_baseline_plans_the_optimizers_choice() -> None:
    """On the AlexNet-shaped fixture at 16 V100s (two servers) the baseline's plan has the
    optimizer's stages and copies (no longer pure data parallelism: at 8 it is); where no
    micro-batch count suits the copies it refuses, saying so."""
    prof = import_pipedream(graph_path("cnn"))
    cluster = PRESETS["v100-16gb-2x8"].with_devices(16)
    cm = CostModel(prof, cluster)
    eight = PRESETS["v100-16gb-2x8"].with_devices(8)
    assert choose(prof, eight, PlanRequest(), CostModel(prof, eight), 8).replicas == (8,)  # type: ignore[union-attr]
    split = choose(prof, cluster, PlanRequest(), cm, 16)
    assert split is not None and len(split.replicas) > 1 and not split.prefix_only, split
    step = math.lcm(*split.replicas)
    b0 = prof.microbatch_sizes[0]
    got = plan(prof, cluster, PlanRequest(global_batch=b0 * step, solver=SolverKind.PIPEDREAM))
    assert tuple(s.layer_start for s in got.stages) == split.starts
    assert got.layout.stage_replicas == split.replicas
    assert got.num_microbatches % step == 0 and got.predicted.iteration_ms > 0
    if step > 1:
        with pytest.raises(InfeasibleError, match="round-robin over its copies"):
            plan(prof, cluster, PlanRequest(global_batch=b0 * step + 1, solver=SolverKind.PIPEDREAM))
