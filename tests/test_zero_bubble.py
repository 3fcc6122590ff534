"""Zero-bubble pipelines (Qi et al., ICLR 2024): the backward split into I (input gradient)
and W (weight gradient) in profiles, schedules, the simulator and the solver."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import Layout
from planner.artifacts.profile import DEFAULT_WEIGHT_GRAD_FRACTION, profile_from_json, profile_to_json
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.schedule import (
    Action,
    ActionKind,
    ScheduleError,
    build_schedule,
    inflight_counts,
    parse_action,
    validate_schedule,
    weight_pending_counts,
)
from planner.simulation import SegmentKind, simulate, simulate_iteration_ms
from planner.solve import plan
from planner.solve.bruteforce import solve_chain_bruteforce
from planner.solve.chain_dp import solve_chain
from planner.solve.prices import StageTable
from tests.chains import DP_REL_TOL, chain_profile, layer_dicts, small_cluster
from tests.plan_factory import stage_terms

ZB = ScheduleKind.ZB_H1


def as_text(schedule):
    return [" ".join(str(a) for a in rank) for rank in schedule]


def test_input_and_weight_actions_print_and_parse_as_torch_does():
    assert parse_action("1I3") == Action(stage_idx=1, kind=ActionKind.BACKWARD_INPUT, mb_idx=3)
    assert str(Action(stage_idx=0, kind=ActionKind.BACKWARD_WEIGHT, mb_idx=2)) == "0W2"
    from torch.distributed.pipelining.schedules import _Action

    for text in ("1I3", "0W2", "2F0", "3B1"):
        assert str(_Action.from_str(text)) == text


def test_zb_h1_order_literal():
    # rank 1 (last) runs W from its first step; rank 0 warms up with P - 1 forwards
    assert as_text(build_schedule(ZB, 2, 4)) == [
        "0F0 0F1 0I0 0W0 0F2 0I1 0W1 0F3 0I2 0W2 0I3 0W3",
        "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1F3 1I3 1W2 1W3",
    ]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 6, 8, 10])
def test_zb_h1_matches_torch_interleaved_zero_bubble_with_one_stage_per_rank(ranks, m):
    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble

    rounds = max(1, m // ranks)
    if m % rounds:
        with pytest.raises(PlannerInputError, match="multiple of the number of rounds"):
            build_schedule(ZB, ranks, m)
        return
    sched = ScheduleInterleavedZeroBubble.__new__(ScheduleInterleavedZeroBubble)
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = ranks, 1, m
    sched.number_of_rounds = rounds
    sched.microbatches_per_round = m // rounds
    theirs = [" ".join(str(a) for a in sched._calculate_single_rank_operations(r) if a is not None) for r in range(ranks)]
    ours = build_schedule(ZB, ranks, m)
    assert as_text(ours) == theirs
    grid = validate_schedule(ours, ranks, m)
    assert sum(a is not None for row in grid for a in row) == 3 * ranks * m


def test_dry_run_rejects_w_before_i_and_mixed_backwards():
    bad = ((Action(stage_idx=0, kind=ActionKind.FORWARD, mb_idx=0), Action(stage_idx=0, kind=ActionKind.BACKWARD_WEIGHT, mb_idx=0),
            Action(stage_idx=0, kind=ActionKind.BACKWARD_INPUT, mb_idx=0)),)
    with pytest.raises(ScheduleError, match="weight gradient 0W0 runs before its input gradient 0I0"):
        validate_schedule(bad, 1, 1)
    # a stage may run some micro-batches' backwards whole and others split (DualPipe-V does), not one both ways
    mixed = tuple(tuple(parse_action(t) for t in row.split()) for row in ("0F0 0F1 0B0 0I1 0W1",))
    assert len(validate_schedule(mixed, 1, 2)) == 5
    both = tuple(tuple(parse_action(t) for t in row.split()) for row in ("0F0 0B0 0I0 0W0",))
    with pytest.raises(PlannerInputError, match="micro-batch 0's backward both whole"):
        validate_schedule(both, 1, 1)
    missing = tuple(tuple(parse_action(t) for t in row.split()) for row in ("0F0 0I0",))
    with pytest.raises(PlannerInputError, match=r"missing 1 action.*0W0"):
        validate_schedule(missing, 1, 1)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("m", [1, 2, 4, 6, 12])
def test_inflight_counted_until_w(p, m):
    try:
        sched = build_schedule(ZB, p, m)
    except PlannerInputError:
        return
    layout = Layout(num_stages=p)
    ks = inflight_counts(ZB, layout, m)
    pending = weight_pending_counts(ZB, layout, m)
    # counted independently here: the peak of (forwards - W passes) along each rank's order
    for s, order in enumerate(sched):
        live = peak = 0
        for a in order:
            live += 1 if a.kind is ActionKind.FORWARD else -1 if a.kind is ActionKind.BACKWARD_WEIGHT else 0
            peak = max(peak, live)
        assert ks[s] == peak
    assert ks == tuple(min(p, m) for _ in range(p))
    assert pending[0] == 0  # stage 0's peak holds whole micro-batches only: the count is exact there
    assert weight_pending_counts(ScheduleKind.ONE_F_ONE_B, layout, max(m, p)) == (0,) * p


def test_simulated_zb_h1_bubble_is_the_papers():
    """Uniform stages, F = B(input) = W, no communication: 1F1B takes (M + P - 1)(F + B + W),
    ZB-H1 M (F + B + W) + (P - 1)(F + B - W) (Qi et al. 2024 sec. 3.1, table 1)."""
    p, m, f = 4, 8, 1.0
    one = simulate_iteration_ms(ScheduleKind.ONE_F_ONE_B, m, stage_terms([f] * p, [2 * f] * p))
    zb = simulate_iteration_ms(ZB, m, stage_terms([f] * p, [2 * f] * p, wgrad_ms=[f] * p))
    assert math.isclose(one, (m + p - 1) * 3 * f)
    assert math.isclose(zb, m * 3 * f + (p - 1) * (f + f - f))
    # without a W time the split changes nothing but the order
    assert simulate_iteration_ms(ZB, m, stage_terms([f] * p, [2 * f] * p)) >= one - 1e-9


def _zb_profile():
    layers = [dict(fwd=1.0, bwd=2.0, params=1000, saved=1e6, inp=1e5, out=1e5, wfrac=0.5, wsaved=0.4)] * 8
    return chain_profile(layers)


def test_solver_picks_zb_h1_when_asked_and_it_is_faster():
    prof = _zb_profile()
    request = PlanRequest(global_batch=8, schedules=(ScheduleKind.ONE_F_ONE_B, ZB), num_stages=4, dp_degree=1)
    best = plan(prof, small_cluster(4), request)
    assert best.schedule is ZB
    one = plan(prof, small_cluster(4), dataclasses.replace(request, schedules=(ScheduleKind.ONE_F_ONE_B,)))
    assert best.predicted.iteration_ms < one.predicted.iteration_ms
    assert best.predicted.bubble_fraction < one.predicted.bubble_fraction
    for st_ in best.stages:
        assert math.isclose(st_.wgrad_ms, 0.5 * st_.bwd_ms)
        assert st_.wgrad_bytes_per_microbatch == round(0.4 * st_.activation_bytes_per_microbatch)
    assert all(st_.wgrad_ms == 0.0 for st_ in one.stages)
    timeline = simulate(best)
    kinds = {seg.kind for seg in timeline.segments()}
    assert {SegmentKind.FORWARD, SegmentKind.BACKWARD_INPUT, SegmentKind.BACKWARD_WEIGHT} <= kinds
    assert SegmentKind.BACKWARD not in kinds
    # memory over time: never above the planner's count of whole micro-batches, equal on stage 0
    for s, st_ in enumerate(best.stages):
        act = st_.activation_bytes_per_microbatch
        static = timeline.memory[s].static_bytes
        assert timeline.memory[s].peak_bytes <= static + st_.inflight_microbatches * act
        if s == 0:
            assert timeline.memory[s].peak_bytes == static + st_.inflight_microbatches * act
    # the last stage holds one whole micro-batch and P - 1 waiting for W at its peak
    last = best.stages[-1]
    assert timeline.memory[-1].peak_bytes == timeline.memory[-1].static_bytes + last.activation_bytes_per_microbatch + (
        3 * last.wgrad_bytes_per_microbatch)


ZB_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@ZB_SETTINGS
@given(
    layers=layer_dicts(6),
    wfracs=st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6),
    num_stages=st.integers(1, 4),
    num_microbatches=st.integers(1, 8),
    microbatch_size=st.sampled_from([1, 2]),
    cap_gb=st.floats(0.05, 2.0),
)
def test_zb_h1_dp_equals_brute_force(layers, wfracs, num_stages, num_microbatches, microbatch_size, cap_gb):
    """ZB-H1's objective (chain_dp's module docstring) with recomputation and the memory cap:
    the DP equals the brute force over every cut set and recompute mask."""
    layers = [dict(d, wfrac=w) for d, w in zip(layers, wfracs)]
    cm = CostModel(chain_profile(layers), small_cluster(8))
    layout = Layout(num_stages=num_stages)
    table = StageTable(cm, microbatch_size, cap_gb * 1e9)
    kw = dict(layout=layout, num_microbatches=num_microbatches, schedule=ZB)
    try:
        build_schedule(ZB, num_stages, num_microbatches)
    except PlannerInputError:
        return
    assert_dp_is_bruteforce(table, kw, microbatch_size)



def assert_dp_is_bruteforce(table, kw, microbatch_size):
    """The chain DP and the brute force agree on ``kw``'s request (both none, or equal
    objectives), and the DP's stages fit the table's cap with the schedule's in-flight counts."""
    cm, layout, num_microbatches = table.cm, kw["layout"], kw["num_microbatches"]
    dp = solve_chain(table, **kw)
    bf = solve_chain_bruteforce(table.question, **kw)  # priced from the cost model, not the table
    if bf is None:
        assert dp is None
        return
    assert dp is not None
    assert math.isclose(dp.objective_ms, bf.objective_ms, rel_tol=DP_REL_TOL, abs_tol=1e-9)
    ks = inflight_counts(kw["schedule"], layout, num_microbatches)
    stops = list(dp.boundaries[1:]) + [cm.num_layers]
    for s, (a, z) in enumerate(zip(dp.boundaries, stops)):
        assert cm.stage_memory(a, z, dp.recompute[s], microbatch_size, ks[s]).total_bytes <= table.cap


def test_profile_split_fields_default_and_bounds():
    prof = _zb_profile()
    data = profile_to_json(prof)
    assert profile_from_json(data).layers[0].weight_grad_fraction == 0.5
    for layer in data["layers"]:
        layer.pop("weight_grad_fraction")
        layer.pop("weight_grad_saved_fraction")
    old = profile_from_json(data)  # files without the fields load, with the stated default
    assert old.layers[0].wgrad_fraction == DEFAULT_WEIGHT_GRAD_FRACTION and old.layers[0].wgrad_saved_fraction == 1.0
    data["layers"][0]["param_count"] = 0
    data["layers"][0]["param_bytes"] = 0
    assert profile_from_json(data).layers[0].wgrad_fraction == 0.0
    data["layers"][1]["weight_grad_fraction"] = 1.5
    with pytest.raises(PlannerInputError, match=r"weight_grad_fraction must be in \[0, 1\] \(got 1.5\)"):
        profile_from_json(data, "p.json")


def test_analytic_split_per_gemm():
    """Each weighted GEMM's W is one product of its forward's shape (Qi et al. 2024): a GPT
    block's W is its four weight GEMMs' forward time, under half its backward (attention's
    products and the element-wise work are all B); W keeps the 14 s h bytes of their inputs."""
    from planner.profiling.analytic.common import FIT_SIZES, device_rates
    from planner.profiling.analytic.gpt import block_gemms, gpt_profile

    prof = gpt_profile(layers=2, hidden=1024, heads=16, seq=1024, vocab=5000)
    block = prof.layers[1]
    rates = device_rates("a100-80gb")
    big = FIT_SIZES[-1]
    # W by its definition: each weighted GEMM's forward product, once
    w = sum(rates.gemm_ms(g, big) for g in block_gemms(1024, 1024, 16, True) if g.weighted)
    assert 0.0 < block.weight_grad_fraction < 0.5
    assert math.isclose(block.weight_grad_fraction * block.bwd.at(big), w, rel_tol=1e-9)
    assert math.isclose(block.weight_grad_saved_fraction * block.saved_bytes_per_sample, 14.0 * 1024 * 1024)
    assert prof.layers[0].weight_grad_fraction == 0.0  # the embedding's gradient is a scatter: B


def test_run_refuses_a_zero_bubble_shape_torch_cannot_run_in_one_line():
    from planner.runtime.check import check_schedule
    from tests.plan_factory import make_plan

    check_schedule(make_plan(ZB, 8, [1.0] * 4, [2.0] * 4))  # torch's ScheduleInterleavedZeroBubble runs it
    with pytest.raises(PlannerInputError) as exc:
        check_schedule(make_plan(ZB, 9, [1.0] * 4, [2.0] * 4), "plan.json")
    assert "\n" not in str(exc.value)
    assert str(exc.value).startswith("plan.json: zb-h1 needs num_microbatches a multiple of the number of rounds")


def test_measured_profile_times_the_input_gradient_pass_apart():
    """The profiler times each layer's input-gradient pass alone (autograd.grad w.r.t. its
    inputs): W's share is the rest of the backward; the first layer, whose input (the batch)
    needs no gradient, is all W. What W keeps is measured: 1 but for the last layer (its loss's
    saves are freed by torch's I, its GEMM's input kept)."""
    from planner.models import load_workload
    from planner.profiling.measured import profile_model

    work = load_workload("tests.factories:mlp")
    prof = profile_model(work, microbatch_sizes=(2,), warmup=1, repeats=3, num_threads=1, progress=False, trace_ops=False)
    fractions = [layer.weight_grad_fraction for layer in prof.layers]
    assert all(f is not None and 0.0 <= f <= 1.0 for f in fractions)
    assert fractions[0] == 1.0
    # what W keeps, measured (planner.profiling.measured.wgrad): all but the last layer, whose loss's saves I frees
    kept = [layer.weight_grad_saved_fraction for layer in prof.layers]
    assert kept[:-1] == [1.0] * (len(kept) - 1) and kept[-1] is not None and 0.0 < kept[-1] < 1.0, kept


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layers=layer_dicts(5),
    fractions=st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)), min_size=5, max_size=5),
    schedule=st.sampled_from([ScheduleKind.ZB_H1, ScheduleKind.ZB_H2]),
    num_stages=st.integers(2, 3),
    num_microbatches=st.integers(2, 6),
    cap_gb=st.floats(0.05, 1.0),
)
def test_zero_bubble_ilp_equals_the_dp(layers, fractions, schedule, num_stages, num_microbatches, cap_gb):
    """CP-SAT prices a zero-bubble stage as the DP does: its memory at the schedule's held
    counts (whole micro-batches and those past I keeping W's inputs, not every one in flight
    whole) and its bubble fill ``Z_s``, so the two find plans for the same caps and the same
    optimum (to the ILP's rounding to nanoseconds)."""
    from planner.solve.ilp import solve_chain_ilp

    layers = [dict(d, wfrac=w, wsaved=k) for d, (w, k) in zip(layers, fractions)]
    cm = CostModel(chain_profile(layers), small_cluster(8))
    try:
        build_schedule(schedule, num_stages, num_microbatches)
    except PlannerInputError:
        return
    table = StageTable(cm, 1, cap_gb * 1e9)
    kw = dict(layout=Layout(num_stages=num_stages), num_microbatches=num_microbatches, schedule=schedule)
    dp, ilp = solve_chain(table, **kw), solve_chain_ilp(table, **kw)
    assert (dp is None) == (ilp is None), (dp, ilp)
    if dp is not None:
        assert math.isclose(dp.objective_ms, ilp.objective_ms, rel_tol=1e-6, abs_tol=1e-6), (dp, ilp)


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2"])
def test_refusal_prices_zero_bubble_as_the_plan_and_the_simulator(schedule):
    """A request for a zero-bubble schedule alone that fits nowhere is explained with that
    schedule's own held counts (whole micro-batches, and those past I keeping W's inputs), not
    every micro-batch in flight whole, nor 1F1B: the least memory it names is the cap at which
    the planner then plans, and the simulated peak of that plan's busiest stage equals it, as
    does the tightest stage's figure."""
    from planner.simulation import simulate
    from planner.solve.infeasible import explain_infeasible

    layers = [dict(fwd=1.0 + (i % 3), bwd=2.0 + (i % 2), params=200_000 * (1 + i % 2), saved=6e6 + 1e6 * (i % 4),
                   inp=1e6, out=1e6, wfrac=0.5, wsaved=0.3) for i in range(8)]
    prof = chain_profile(layers)
    cluster = small_cluster(4, memory_bytes=4 * 10**9)
    cm = CostModel(prof, cluster)
    request = PlanRequest(global_batch=8, microbatch_sizes=(1,), num_stages=4, schedules=(ScheduleKind(schedule),),
                          tp_degrees=(1,), recompute=False, memory_cap_bytes=10**6)
    exc = explain_infeasible(cm, request, 4, float(request.memory_cap_bytes))
    need = exc.need_bytes
    assert f"{schedule}," in str(exc) and "not asked" not in str(exc), str(exc)
    fitted = plan(prof, cluster, dataclasses.replace(request, memory_cap_bytes=math.ceil(need)))
    timeline = simulate(fitted)
    peaks = [st_.peak_memory_bytes for st_ in timeline.stages]
    assert max(peaks) == pytest.approx(need, abs=2.0)
    gib = 1024**3
    tight = max(range(4), key=lambda s: peaks[s])
    assert f"needs {peaks[tight] / gib:.2f} GiB." in str(exc)
    # the old accounting (every micro-batch in flight whole) asks for more on a later stage
    whole = max(st_.memory.total_bytes + (st_.inflight_microbatches * st_.activation_bytes_per_microbatch
                                          - st_.memory.activation_bytes) for st_ in fitted.stages)
    assert whole > need * 1.05


def _stage_kept_bytes(work, start: int, stop: int, inputs, targets) -> int:
    """Bytes stage ``[start, stop)`` of ``work`` (``start`` > 0) still holds, once per storage,
    between torch's split backward's input-gradient and weight-gradient passes (the runtime's
    ``stage_backward_input`` / ``stage_backward_weight``), one micro-batch."""
    import torch
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    from planner.models.workload import split_loss
    from planner.profiling.measured.memory import SavedBytesMeter
    from planner.profiling.measured.tensors import flatten, fresh_like

    x = inputs
    for layer in work.layers[:start]:
        x = layer(fresh_like(x))
    x = fresh_like(x)
    received = [t for t in flatten(x) if t.requires_grad]
    params = [p for layer in work.layers[start:stop] for p in layer.parameters()]
    live = SavedBytesMeter(t for layer in work.layers for t in (*layer.parameters(), *layer.buffers()))
    with live.hooks():
        for layer in work.layers[start:stop]:
            x = layer(x)
        if stop == len(work.layers):
            x = split_loss(work.loss_fn(x, targets))[0]
    outputs = [t for t in flatten(x) if t.requires_grad]
    grads = None if stop == len(work.layers) else [torch.ones_like(t) for t in outputs]
    del x
    _, groups = stage_backward_input(outputs, grads, received, iter(params))
    del outputs, grads
    kept = live.live_bytes
    stage_backward_weight(iter(params), groups)
    return kept


@pytest.mark.parametrize("model", ["gpt", "vgg"])
def test_every_stage_keeps_at_most_what_the_measured_profile_prices(model):
    """What W keeps, measured per layer by the profiler (the last layer's own fraction, 1
    elsewhere; the shipped zoo profiles carry it, ``benchmarks/make_profiles.py --refresh-keep``),
    against every stage ``[i, j)`` after the first run through torch's split backward as one
    stage: never below what torch keeps (a stage's inner layers keep all they saved: the next
    layer's intermediates hold them), equal on the zoo GPT (its blocks keep all they saved as a
    stage's last too), above on the zoo VGG where a stage ends in a conv block whose ReLU and
    pooling saves torch frees at I."""
    from planner.artifacts.cluster import load_cluster
    from planner.artifacts.profile import load_profile
    from planner.models import load_workload, workload_fingerprint

    work = load_workload(model)
    prof = load_profile(Path(__file__).resolve().parents[1] / "profiles" / f"zoo-{model}-cpu.json")
    assert workload_fingerprint(work) == prof.fingerprint_sha256
    assert prof.layers[-1].weight_grad_saved_fraction is not None  # measured, not the default
    b = int(prof.metadata["bytes_measured_at_microbatch_size"])
    inputs, targets = work.make_batch(b, 0)
    cm = CostModel(prof, load_cluster("local-cpu"))
    L, above = prof.num_layers, 0
    for i in range(1, L):
        for j in range(i + 1, L + 1):
            measured, priced = _stage_kept_bytes(work, i, j, inputs, targets), cm.keep_bytes(i, j, b)
            assert measured <= priced * (1 + 1e-9) + 1, (i, j, measured, priced)
            above += measured < priced * (1 - 1e-6)
            if model == "gpt":
                assert measured == pytest.approx(priced, abs=1), (i, j, measured, priced)
    assert (above == 0) == (model == "gpt")


def test_torch_split_backward_recomputes_in_w_and_holds_nothing_recomputed_between():
    """What torch's non-reentrant checkpoint does under torch's split backward
    (``stage_backward_input`` then ``stage_backward_weight``), which is why the runtime does not
    recompute with it there (``planner.runtime.recompute``, tested below): I re-runs the forward
    and frees what it recomputed once used, so between I and W none of the layer's
    intermediates is alive (only its checkpoint inputs); and W re-runs the forward once per
    parameter group (one ``autograd.grad`` each). Pins torch's facts the docs state
    (docs/zero-bubble.md), so a torch that changes them fails here."""
    import gc
    import weakref

    import torch
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    from torch.utils.checkpoint import checkpoint

    made: list[weakref.ref] = []
    runs = [0]

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)

        def forward(self, x):
            runs[0] += 1
            u = self.a(x)
            g = torch.nn.functional.gelu(u)
            made.extend((weakref.ref(u), weakref.ref(g)))
            return self.b(g)

    def alive() -> int:
        gc.collect()
        return sum(r() is not None for r in made)

    block = Block()
    x = torch.randn(4, 8, requires_grad=True)
    params = list(block.parameters())
    out = block(x)  # not recomputed: I keeps the intermediates for W
    _, groups = stage_backward_input([out], [torch.ones_like(out)], [x], iter(params))
    del out
    assert alive() == 2
    stage_backward_weight(iter(params), groups)
    del groups
    assert alive() == 0
    made.clear()
    runs[0] = 0
    out = checkpoint(block, x, use_reentrant=False)
    _, groups = stage_backward_input([out], [torch.ones_like(out)], [x], iter(params))
    del out
    assert alive() == 0 and runs[0] == 2  # the forward and I's recomputation, nothing of it kept
    stage_backward_weight(iter(params), groups)
    assert runs[0] == 2 + len(groups) == 4  # one recomputation per parameter group (a's, b's)



def _split_stage(work, start: int, stop: int, recompute: tuple[bool, ...], inputs, targets) -> tuple[int, int, int, list, list]:
    """Stage ``[start, stop)`` of ``work`` as the runtime builds it under a split backward
    (``StageModule(split_backward=True)``, ``recompute`` its flags), one micro-batch run
    as ``planner.runtime.engine.TimedStage`` runs a zero-bubble schedule's F, I and W (I cut after
    the last recomputed layer where layers or the loss follow it; the first stage: torch runs no
    I, the stage rebuilds its recomputation there; its W is one whole backward). Returns (forward
    runs of the stage's layers by the end of I, by the end of W, saved bytes held between I and W,
    the parameters' gradients, the inputs' gradients)."""
    import gc

    import torch
    from torch.distributed.pipelining._backward import stage_backward, stage_backward_input, stage_backward_weight

    from planner.models.workload import split_loss
    from planner.profiling.measured.tensors import flatten
    from planner.runtime.recompute import input_pass_in_two
    from planner.runtime.stage import StageModule

    layers = list(work.layers[start:stop])
    runs = [0]
    handles = [layer.register_forward_pre_hook(lambda *_: runs.__setitem__(0, runs[0] + 1)) for layer in layers]
    module = StageModule(layers, list(recompute), split_backward=True)
    ledger = module.ledger
    assert (ledger is not None) == any(recompute)
    if ledger is not None:
        ledger.loss_follows = stop == len(work.layers)  # as the executor marks the last stage
    params = list(module.parameters())
    for p in params:
        p.grad = None
    x = inputs
    with torch.no_grad():
        for layer in work.layers[:start]:
            x = layer(x)
    x = tuple(t.detach().requires_grad_(start > 0 and t.is_floating_point()) for t in flatten(x))
    runs[0] = 0
    with ledger.forward_of(0) if ledger is not None else contextlib.nullcontext():
        out = module(*x)
    if stop == len(work.layers):
        out = split_loss(work.loss_fn(out, targets))[0]
    out = [t for t in flatten(out) if t.requires_grad]
    grads = None if stop == len(work.layers) else [torch.ones_like(t) for t in out]
    if start > 0:  # I (cut after the last recomputed layer where something follows it), then W
        cut = ledger.cuts.pop(0, None) if ledger is not None else None
        with ledger.backward_of(splitting=True) if ledger is not None else contextlib.nullcontext():
            if cut is not None:
                _, groups = input_pass_in_two(cut, out, grads, list(x), params)
            else:
                _, groups = stage_backward_input(out, grads, list(x), iter(params))
        del cut  # the engine drops it after the pass likewise
        del out
        gc.collect()
        kept, by_i = module.meter.live_bytes, runs[0]
        stage_backward_weight(iter(params), groups)
        if ledger is not None:
            ledger.weight(0)
    else:  # torch's first stage: no I (the ledger rebuilds), W one whole backward
        if ledger is not None:
            ledger.rebuild(0)
        gc.collect()
        kept, by_i = module.meter.live_bytes, runs[0]
        stage_backward(out, grads or [torch.ones_like(t) for t in out], list(x))
        if ledger is not None:
            ledger.release(0)
    for handle in handles:
        handle.remove()
    gc.collect()
    assert module.meter.live_bytes == 0  # everything freed after W
    return by_i, runs[0], kept, [p.grad.clone() for p in params], [t.grad for t in x]


@pytest.mark.parametrize(("start", "stop", "last"), [(1, 4, True), (0, 3, True), (3, 6, True), (3, 6, False), (1, 4, False)])
def test_runtime_recomputes_once_in_i_and_keeps_w_inputs_until_w(start, stop, last):
    """The runtime's recomputation under a split backward (``planner.runtime.recompute``): each
    recomputed zoo GPT layer runs its forward twice per micro-batch (its forward and one
    recomputation by the end of I; torch's checkpoint ran a block 10 times: 2 + once per each
    of its 8 parameter groups in W, above), holds between I and W exactly what the same stage
    holds without recomputation (W's inputs, what the plan prices: ``CostModel.keep_bytes``),
    and its gradients are the non-recomputed stage's bit for bit. A stage after the first
    (torch's split), the first (I rebuilt by the stage, W one whole backward; its embedding
    takes token ids) and the head's (with the loss), its last layer recomputed or not (then its
    I is cut after the last recomputed layer: the head's and the loss's tail is freed before the
    blocks are rebuilt, where one torch pass would hold both)."""
    import torch

    from planner.models import load_workload

    work = load_workload("gpt")
    inputs, targets = work.make_batch(2, 0)
    n = stop - start
    flags = (True,) * (n - 1) + (last,)
    by_i, runs, kept, grads, dx = _split_stage(work, start, stop, flags, inputs, targets)
    plain_i, plain_runs, plain_kept, plain_grads, plain_dx = _split_stage(work, start, stop, (False,) * n, inputs, targets)
    assert (plain_i, plain_runs) == (n, n)
    assert by_i == runs == n + sum(flags)
    assert kept == plain_kept > 0
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))
    assert all((a is None) == (start == 0) and (a is None or torch.equal(a, b)) for a, b in zip(dx, plain_dx, strict=True))


@pytest.mark.parametrize(("start", "stop"), [(0, 2), (2, 3), (4, 5), (7, 8)])
def test_recomputed_resnet_blocks_hold_what_the_stage_holds_without(start, stop):
    """The zoo ResNet's recomputed blocks under the runtime's split backward hold between I and W
    what the same stage holds without recomputation, gradients bit for bit: the first stage's
    chain (stem, block0.a), rebuilt in order at its I, shares one storage per boundary (the
    stem's ReLU output was held twice: 131,072 bytes over at micro-batch 2), and single blocks
    (``block{k}.b`` takes a skip its graph only adds). This harness retains nothing of the
    stage's graph past I; in the runtime, whose split retained the node to W, a ``block{k}.b``
    also held its skip input there before its record kept the inputs instead (benchmarks/RESULTS.md,
    chunk 1 of ZBV at P = 4: 131,072 bytes over before, equal now)."""
    import torch

    from planner.models import load_workload

    work = load_workload("resnet")
    inputs, targets = work.make_batch(2, 0)
    n = stop - start
    by_i, runs, kept, grads, dx = _split_stage(work, start, stop, (True,) * n, inputs, targets)
    plain_i, plain_runs, plain_kept, plain_grads, plain_dx = _split_stage(work, start, stop, (False,) * n, inputs, targets)
    assert by_i == runs == 2 * n and (plain_i, plain_runs) == (n, n)
    assert kept == plain_kept > 0
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))
    assert all((a is None) == (b is None) and (a is None or torch.equal(a, b)) for a, b in zip(dx, plain_dx, strict=True))


def test_recomputed_inner_layer_frees_its_tail_at_i():
    """What is left (docs/zero-bubble.md): a recomputed layer followed by another layer of its
    stage is split on its own graph, so at I it frees what follows its last weight operation (the
    zoo ResNet's block3.b: its ReLU output, 65,536 bytes at micro-batch 2), which torch's one pass
    over the stage keeps for the head's W: the recomputing stage holds less than the plan's
    ``keep`` (priced as without recomputation) by that tail per micro-batch past I."""
    from planner.models import load_workload

    work = load_workload("resnet")
    inputs, targets = work.make_batch(2, 0)
    kept = _split_stage(work, 8, 10, (True, True), inputs, targets)[2]
    plain = _split_stage(work, 8, 10, (False, False), inputs, targets)[2]
    assert plain - kept == 2 * 32 * 16 * 16 * 4  # block3.b's output: 32 channels at 16 x 16, float32
