"""ZeRO in the runtime (planner.runtime.zero), in one process: the flat layout as a literal
table, the shard update equal to the unsharded one bit for bit, ``ShardedState`` on a
one-rank gloo group (ZeRO 3's I and W passes of a split backward too), the checkpoint's
shard-count check, and the model-state figures of the RunReport. The multi-process numerics
(D = 2) are in tests/test_runtime_numerics.py and tests/test_runtime_fsdp.py, the resume in
tests/test_runtime_faults.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import DType, OptimizerFamily, ZeroStage
from planner.artifacts.plan import StageMemory
from planner.models import load_workload
from planner.runtime.checkpoint import load_checkpoint
from planner.runtime.checkpoint_files import CheckpointError
from planner.runtime.collect import build_report
from planner.runtime.options import RuntimeOptions
from planner.runtime.runner import RankMeasure, StepMeasure
from planner.runtime.stage_helpers import optimizer_of
from planner.runtime.summary import format_model_state
from planner.runtime.zero import (
    FlatLayout,
    ShardedState,
    flatten,
    optimizer_state_bytes,
    state_bytes_per_param,
    unflatten_into,
)
from tests.factories import make_plan


def test_flat_layout_pads_to_a_multiple_of_the_shards() -> None:
    # numels, shards -> (shard numel, padded numel, offsets, [start, stop) of each shard)
    table = {
        ((3, 4), 2): (4, 8, (0, 3), [(0, 4), (4, 8)]),
        ((3, 4), 3): (3, 9, (0, 3), [(0, 3), (3, 6), (6, 9)]),
        ((5,), 1): (5, 5, (0,), [(0, 5)]),
        ((2, 2, 2), 4): (2, 8, (0, 2, 4), [(0, 2), (2, 4), (4, 6), (6, 8)]),
    }
    for (numels, n), (shard, padded, offsets, bounds) in table.items():
        layouts = [FlatLayout(numels=numels, num_shards=n, shard_idx=i) for i in range(n)]
        assert [(lay.shard_numel, lay.padded_numel, lay.offsets) for lay in layouts] == [(shard, padded, offsets)] * n
        assert [(lay.shard_start, lay.shard_stop) for lay in layouts] == bounds


def test_flat_layout_refusals() -> None:
    with pytest.raises(ValueError, match="num_shards must be >= 1"):
        FlatLayout(numels=(3,), num_shards=0, shard_idx=0)
    with pytest.raises(ValueError, match=r"shard_idx 2 is outside 0 \.\. 1"):
        FlatLayout(numels=(3,), num_shards=2, shard_idx=2)
    with pytest.raises(ValueError, match="do not match the layout"):
        flatten([torch.zeros(2)], FlatLayout(numels=(3,), num_shards=1, shard_idx=0))


def test_flatten_pads_with_zeros_and_unflatten_copies_back() -> None:
    params = [torch.arange(3.0), torch.arange(4.0).reshape(2, 2) + 10]
    layout = FlatLayout(numels=(3, 4), num_shards=3, shard_idx=0)
    flat = flatten(params, layout)
    assert flat.tolist() == [0, 1, 2, 10, 11, 12, 13, 0, 0]
    targets = [torch.zeros(3), torch.zeros(2, 2)]
    unflatten_into(flat, targets, layout)
    assert all(torch.equal(a, b) for a, b in zip(targets, params))


@pytest.mark.parametrize("kind", list(OptimizerFamily))
def test_stepping_the_shards_equals_stepping_the_parameters_bit_for_bit(kind: OptimizerFamily) -> None:
    """Each of n = 3 ranks steps its shard of the flat parameters with its own optimizer;
    put together they equal one optimizer stepping the parameters (float64, 3 steps)."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(5, 3), (7,), (2, 2)]
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in shapes]
    grads = [[torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes] for _ in range(3)]

    def make(ps: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return optimizer_of(kind, ps, 0.05)  # the runtime's own (AdamW with bf16 moments included)

    layouts = [FlatLayout(numels=tuple(p.numel() for p in params), num_shards=3, shard_idx=i) for i in range(3)]
    flat = flatten(params, layouts[0])
    masters = [torch.nn.Parameter(flat[lay.shard_start : lay.shard_stop].clone()) for lay in layouts]
    whole, shards = make(params), [make([m]) for m in masters]
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        whole.step()
        flat_grad = flatten(step_grads, layouts[0])
        for master, lay, opt in zip(masters, layouts, shards):
            master.grad = flat_grad[lay.shard_start : lay.shard_stop].clone()
            opt.step()
    gathered = torch.cat([m.detach() for m in masters])
    assert torch.equal(gathered[: layouts[0].total_numel], flatten(params, layouts[0])[: layouts[0].total_numel])
    assert torch.equal(gathered[layouts[0].total_numel :], torch.zeros(1, dtype=torch.float64))  # padding stays 0
    sharded_state = sum(optimizer_state_bytes(opt) for opt in shards)
    element_bytes = state_bytes_per_param(kind, 8) * layouts[0].padded_numel
    assert sharded_state == element_bytes + (3 * 4 if kind.moments else 0)  # + a float32 step each


@pytest.fixture
def one_rank_group() -> Iterator[dist.ProcessGroup]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("zero", [1, 2])
def test_sharded_state_trains_as_the_plain_optimizer(one_rank_group: dist.ProcessGroup, zero: int) -> None:
    """One rank, so one shard: backward accumulates into the flat buffer's views, the
    reduce-scatter and all-gather are copies; weights equal plain AdamW's, and what is kept
    after the sync is the buffer (ZeRO 1) or the shard's gradient (ZeRO 2)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
    plain = [p.detach().clone().requires_grad_() for p in model.parameters()]
    state = ShardedState(list(model.parameters()), one_rank_group, zero=zero, grad_divisor=1)
    opt, ref_opt = torch.optim.AdamW([state.master], foreach=False), torch.optim.AdamW(plain, foreach=False)
    x = torch.randn(6, 3, dtype=torch.float64)
    for _ in range(2):
        state.start_iteration()
        for half in x.chunk(2):  # two micro-batches accumulate
            model(half).sum().backward()
        state.launch_sync()
        state.wait_sync()
        assert all(p.grad is None for p in model.parameters())
        opt.step()
        state.gather_params()
        ref_opt.zero_grad()
        out = x @ plain[0].T + plain[1]
        (torch.tanh(out) @ plain[2].T + plain[3]).sum().backward()
        ref_opt.step()
    assert all(torch.equal(p.detach(), q.detach()) for p, q in zip(model.parameters(), plain))
    kept = state._flat_grad if zero == 1 else state.master.grad
    assert kept is not None and kept.numel() == state.layout.padded_numel
    assert (state._flat_grad is None) == (zero == 2)
    with pytest.raises(ValueError, match="one dtype and device"):
        mixed = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))]
        ShardedState(mixed, one_rank_group, zero=1, grad_divisor=1)


def test_resume_refuses_a_checkpoint_of_another_shard_count(tmp_path: Path) -> None:
    (tmp_path / "step_2").mkdir()
    (tmp_path / "latest.json").write_text('{"completed_steps": 2}\n')
    module = torch.nn.Linear(2, 2)
    torch.save({"model": module.state_dict(), "optimizer": {}, "optimizer_shards": 2}, tmp_path / "step_2" / "stage_0.pt")
    with pytest.raises(PlannerInputError, match=r"holds optimizer state in 2 shard\(s\) but this run shards it over 1") as refused:
        load_checkpoint(str(tmp_path), 0, module, None, completed=2)
    assert "\n" not in str(refused.value)
    with pytest.raises(CheckpointError, match=r"stage_0\.optimizer_shard_1\.pt: no such file"):
        load_checkpoint(str(tmp_path), 0, module, torch.optim.SGD(module.parameters()), completed=2, replica=1, optimizer_shards=2)


def test_report_predicts_model_state_from_the_plans_parameters() -> None:
    """P = 1, D = 2, ZeRO 2, AdamW in float64 (16 B of state per parameter): the plan counts
    324 parameters (adam-mixed plans: 2 B of weights each), so 324 / 2 x 16 B of optimizer
    state and 324 / 2 x 8 B of gradients per rank."""
    names = load_workload("tests.factories:mlp").layer_names
    plan = make_plan(names, (), dp_degree=2, zero=2)
    memory = StageMemory(param_bytes=2 * 324, grad_bytes=0, optimizer_bytes=0, activation_bytes=0,
                         recompute_workspace_bytes=0, buffer_bytes=0)
    plan = dataclasses.replace(plan, stages=(dataclasses.replace(plan.stages[0], memory=memory),))
    options = RuntimeOptions(plan_path="p", model_spec="m", num_steps=1, warmup_steps=0, dtype=DType.FLOAT64,
                             optimizer=OptimizerFamily.ADAMW)
    mine = RankMeasure(steps=(StepMeasure(step_idx=0, loss=1.0, wall_ms=1.0),), compute_ms=1.0, idle_ms=0.0,
                       saved_bytes_peak=1, cuda_peak_bytes=0)
    # measured by the D = 2 run: idle, cuda peak, then per stage compute, saved, optimizer and
    # gradient bytes, emulation overrun (total, largest) and emulated ms (none here)
    rows = [[0.0, 0.0, 1.0, 1.0, 2596.0, 1296.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]] * 2  # + saved, hooks, allocator per micro-batch
    report = build_report(plan, options, mine, rows, model="mlp", fingerprint="", backend="gloo", device="cpu")
    stage = report.stages[0]
    assert (report.layout.zero, report.optimizer_state_bytes_per_param, stage.optimizer_shards) == (ZeroStage.GRADIENTS, 16, 2)
    assert (stage.optimizer_state_bytes, stage.optimizer_state_bytes_predicted) == (2596, 2592)
    assert (stage.grad_bytes_after_sync, stage.grad_bytes_predicted, stage.grad_rel_error) == (1296, 1296, 0.0)
    text = format_model_state(report)
    assert "ZeRO 2 (sharded: optimizer state and gradients)" in text and "x 16 B/param" in text
    assert "2596" in text and "2592" in text and "+0.2%" in text


def test_zero3_split_backward_accumulates_each_w_apart(one_rank_group: dist.ProcessGroup) -> None:
    """ZeRO 3 under a split backward (issue zbzero3), one rank: F0 F1 I0 I1 W1 W0 with torch's own
    split (``stage_backward_input`` / ``stage_backward_weight``), each I inside ``input_pass`` and
    each W inside ``weight_pass``; the weights are freed between the passes (and after the next
    forward) and gathered back for each, and the reduced gradients equal one whole backward's."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
    plain = [p.detach().clone().requires_grad_() for p in model.parameters()]
    state = ShardedState(list(model.parameters()), one_rank_group, zero=3, grad_divisor=1)
    state.attach(model)
    xs = [torch.randn(2, 3, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    state.start_iteration()
    assert state.whole_param_bytes() == 0
    outs = [model(x) for x in xs]
    assert state.whole_param_bytes() == 0  # freed after each forward
    groups = []
    for x, out in zip(xs, outs):
        with state.input_pass():
            assert state.whole_param_bytes() > 0
            _, kept = stage_backward_input([out], [torch.ones_like(out)], [x], iter(model.parameters()))
            groups.append(kept)
        assert state.whole_param_bytes() == 0 and all(p.grad is None for p in model.parameters())
    for kept in reversed(groups):
        with state.weight_pass():
            stage_backward_weight(iter(model.parameters()), kept)
        assert state.whole_param_bytes() == 0 and all(p.grad is None for p in model.parameters())
    state.launch_sync()
    state.wait_sync()
    h = torch.tanh(torch.cat(xs).detach() @ plain[0].T + plain[1])
    (h @ plain[2].T + plain[3]).sum().backward()
    expected = flatten([p.grad for p in plain], state.layout)
    assert state.master.grad is not None and torch.allclose(state.master.grad, expected, rtol=1e-12, atol=1e-15)
