"""Optimizer-state precision (issue 49 item 2): the bytes per parameter and the step's streamed
bytes of each kind, and AdamW with bf16 moments trained on 2 gloo processes against the same
recipe in one process (tests/runtime_driver.py)."""

from __future__ import annotations

import pytest
import torch

from planner.artifacts.kinds import OptimizerFamily, OptimizerKind
from planner.runtime.lean_adamw import Bf16MomentsAdamW
from planner.runtime.zero import optimizer_state_bytes, state_bytes_per_param
from tests.runtime_launch import SharedLaunches

MLP = "tests.factories:mlp"


@pytest.mark.parametrize(("kind", "state", "step"), [
    (OptimizerKind.ADAM_MIXED, (2, 2, 12), 28),  # fp32 master + fp32 moments (today)
    (OptimizerKind.ADAM_MIXED_BF16_MOMENTS, (2, 2, 8), 20),  # fp32 master + bf16 moments
    (OptimizerKind.ADAM_BF16_FP32_MOMENTS, (2, 2, 8), 22),  # no master, fp32 moments: weights read and written
    (OptimizerKind.ADAM_BF16, (2, 2, 4), 14),  # no master, bf16 moments
])
def test_bytes_per_parameter_and_step_bytes(kind: OptimizerKind, state: tuple[int, int, int], step: int) -> None:
    assert kind.state_bytes_per_param == state
    assert kind.step_bytes_per_param == step
    assert kind.family is (OptimizerFamily.ADAMW_BF16_MOMENTS if kind.moment_bytes == 2 else OptimizerFamily.ADAMW)


def test_bf16_moments_are_kept_in_bf16_and_counted() -> None:
    layer = torch.nn.Linear(16, 8)
    opt = Bf16MomentsAdamW(layer.parameters(), lr=1e-2)
    layer(torch.randn(4, 16)).sum().backward()
    opt.step()
    assert {opt.state[p]["exp_avg"].dtype for p in layer.parameters()} == {torch.bfloat16}
    n = sum(p.numel() for p in layer.parameters())
    assert optimizer_state_bytes(opt) == 2 * 2 * n + 4 * 2  # two bf16 moments + a float32 step per tensor
    assert state_bytes_per_param(OptimizerFamily.ADAMW_BF16_MOMENTS, 4) == 4
    assert state_bytes_per_param(OptimizerFamily.ADAMW, 4) == 8


def test_bf16_moments_track_fp32_adamw_and_differ_from_it() -> None:
    """Same seed, same data: the bf16-moment run follows AdamW to bf16's rounding, not exactly."""
    torch.manual_seed(0)
    a, b = torch.nn.Linear(32, 8), torch.nn.Linear(32, 8)
    b.load_state_dict(a.state_dict())
    oa, ob = torch.optim.AdamW(a.parameters(), lr=1e-2, foreach=False), Bf16MomentsAdamW(b.parameters(), lr=1e-2)
    x, y = torch.randn(64, 32), torch.randn(64, 8)
    for _ in range(20):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
    diff = (a.weight - b.weight).abs().max().item()
    assert 0 < diff < 5e-3  # 20 steps of lr 1e-2: each parameter moved ~0.2


_BASE = {"model": MLP, "boundaries": [], "dp_degree": 2, "num_microbatches": 2, "microbatch_size": 2,
         "schedule": "1f1b", "recompute": False, "dtype": "float32", "optimizer": "adamw-bf16-moments", "steps": 3}
#: D = 2, and ZeRO 1 (the moments sharded)
CONFIGS = [dict(_BASE, name="bf16m-mlp-P1-D2"), dict(_BASE, name="bf16m-zero1-mlp-P1-D2", zero=1)]


@pytest.mark.slow
@pytest.mark.driver(configs=lambda world: CONFIGS, world=2)
def test_bf16_moments_on_two_processes_match_one_process(driven: SharedLaunches) -> None:
    """Data parallel D = 2 (and ZeRO 1: the moments sharded) against the same recipe in one process
    (in the session's one 2-process launch of tests/runtime_driver.py)."""
    results = driven.results(2, CONFIGS)
    for cfg, res in zip(CONFIGS, results, strict=True):
        assert len(res["losses"]) == 3
        # float32 data-parallel sums differ from one process's in the last bits; bf16 moments round
        # both runs' states alike, so the losses agree to float32's rounding, not bf16's
        assert res["loss_rel_diff"] < 1e-5, (cfg["name"], res["loss_rel_diff"])
        assert res["param_rel_diff"] < 1e-4, (cfg["name"], res["param_rel_diff"])
