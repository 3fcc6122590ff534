"""Shared setup of the emulated-compute benchmarks: a tiny real model with synthetic layer times.

The model is the zoo GPT at toy size (real tensors, real communication, negligible compute);
its Profile is measured by the profiler for the memory figures (bytes saved for backward,
inputs, outputs, edges), and its times are replaced by the synthetic ``LAYER_FWD_MS`` (backward
twice the forward), which ``python -m planner.runtime --emulate --profile`` sleeps. Plans
come from ``planner.solve.build.build_plan``, so their predictions are the simulator's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from planner.artifacts.cluster import load_cluster
from planner.artifacts.kinds import OptimizerKind, ScheduleKind, SolverKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile, TimeFit
from planner.artifacts.request import PlanRequest
from planner.artifacts.stack import DEFAULT_STACK, STACKS, Stack
from planner.cost import CostModel
from planner.solve.build import build_plan
from planner.solve.problem import Problem

MODEL_SPEC = "gpt:layers=6,hidden=16,heads=2,seq=8,vocab=64"  # embed, block0..5, head
LAYER_FWD_MS = (2.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0, 4.0)
BWD_OVER_FWD = 2.0
MICROBATCH_SIZE = 2
CLUSTER = "local-cpu"
BOUNDARIES = {1: (0,), 2: (0, 4), 4: (0, 2, 4, 6), 8: (0, 1, 2, 3, 4, 5, 6, 7)}
#: the benchmark's stacks: the bundled runtime's with 16 KiB buckets (about one block of the toy
#: model each, so that several all-reduces overlap the last backward), and one overlapping nothing
STACK_CHOICES = {
    "": DEFAULT_STACK,
    "16k": Stack(name="planner", grad_reduce_overlap=True, grad_bucket_bytes=16 * 1024),
    "none": STACKS["none"],
}


def emulated_profile(microbatch_size: int = MICROBATCH_SIZE) -> Profile:
    """The toy GPT profiled for memory, with the synthetic times in place of measured ones."""
    from planner.models import load_workload
    from planner.profiling.measured import profile_model

    workload = load_workload(MODEL_SPEC)
    measured = profile_model(
        workload, microbatch_sizes=(microbatch_size,), warmup=0, repeats=1, trace_ops=False, progress=False
    )
    layers = tuple(
        dataclasses.replace(
            layer,
            fwd=TimeFit(intercept_ms=fwd, per_sample_ms=0.0),
            bwd=TimeFit(intercept_ms=BWD_OVER_FWD * fwd, per_sample_ms=0.0),
            measured=(),
        )
        for layer, fwd in zip(measured.layers, LAYER_FWD_MS, strict=True)
    )
    meta = {**measured.metadata, "times": "synthetic, for --emulate"}
    return dataclasses.replace(measured, layers=layers, source="analytic", metadata=meta)


def recompute_sets(boundaries: Sequence[int], num_layers: int, recompute: bool) -> list[tuple[int, ...]]:
    """With ``recompute``, every stage but the last recomputes its transformer blocks."""
    stops = [*boundaries[1:], num_layers]
    sets = []
    for s, (start, stop) in enumerate(zip(boundaries, stops)):
        last = s == len(boundaries) - 1
        sets.append(tuple(i for i in range(start, stop) if 1 <= i <= 6) if recompute and not last else ())
    if recompute and len(boundaries) == 1:
        sets = [tuple(range(1, 7))]  # one stage: recompute the blocks, keep the head (and its loss)
    return sets


def emulated_layout(
    num_stages: int, dp_degree: int, zero: int = 0, replicas: Sequence[int] = (),
    schedule: ScheduleKind = ScheduleKind.ONE_F_ONE_B,
) -> Layout:
    """The benchmark's Layout: ``num_stages`` stages, ``dp_degree`` replicated pipelines or
    per-stage ``replicas`` (then ``dp_degree`` 1), ZeRO stage ``zero``; under ZBV the stages
    are chunks, two per rank in a V."""
    v = 2 if schedule is ScheduleKind.ZBV else 1
    return Layout(num_stages=num_stages, virtual_stages_per_rank=v, dp_degree=dp_degree,
                  stage_replicas=tuple(replicas), zero=ZeroStage(zero), placement=schedule.placement)


def emulated_plan(
    profile: Profile, *, num_stages: int, dp_degree: int, num_microbatches: int, schedule: ScheduleKind, recompute: bool,
    zero: int = 0, replicas: Sequence[int] = (), stack: Stack = DEFAULT_STACK,
) -> Plan:
    """The fixed split of ``BOUNDARIES`` under :func:`emulated_layout` (``num_microbatches``
    per replicated pipeline; global with per-stage ``replicas``), priced with the cost model for
    the training ``stack`` and re-scored by the simulator (``planner.solve.build.build_plan``)."""
    layout = emulated_layout(num_stages, dp_degree, zero, replicas, schedule)
    cluster = load_cluster(CLUSTER)
    request = PlanRequest(
        global_batch=num_microbatches * MICROBATCH_SIZE * dp_degree,
        num_devices=layout.world_size,
        schedules=(schedule,),
        microbatch_sizes=(MICROBATCH_SIZE,),
        optimizer=OptimizerKind.SGD_FP32,
        stack=stack,
    )
    boundaries = BOUNDARIES[num_stages]
    problem = Problem.of(profile, cluster, request, SolverKind.GIVEN, layout.world_size)
    return build_plan(
        problem,
        CostModel(profile, cluster, OptimizerKind.SGD_FP32, stack=stack),
        layout=layout,
        boundaries=boundaries,
        recompute=recompute_sets(boundaries, profile.num_layers, recompute),
        microbatch_size=MICROBATCH_SIZE,
        schedule=schedule,
    )
