"""Offloading (issue 49 item 3): the host link and its sources, the overlap rule, the optimizer
step on the host, a plan that fits only with offload, the plan format, the memory objective's
front below recomputation's, and the runtime's optimizer offload against one process."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from planner.artifacts.cluster import PRESETS, cluster_from_json, cluster_to_json
from planner.artifacts.errors import InfeasibleError
from planner.artifacts.host import OffloadMode, host_link_gb_per_s, host_memory_bytes, host_sources
from planner.artifacts.kinds import Objective, OptimizerKind, RecomputeMode
from planner.artifacts.plan import dumps_plan, plan_from_json
from planner.artifacts.request import PlanRequest
from planner.cost.offload import (
    CPU_ADAM_PARAMS_PER_S,
    DEVICES_PER_HOST,
    exposed_offload_ms,
    offloaded_step_ms,
    with_offload,
)
from planner.cost.tensor_parallel import device_cost_model
from planner.profiling.analytic.gpt import gpt3_profile
from planner.runtime.offload import HostOffloadOptimizer
from planner.solve import plan
from planner.solve.offload import MODES, spread
from tests.runtime_launch import SharedLaunches

GIB = 1024**3
A100 = PRESETS["a100-80gb-x8"]


def test_host_link_by_device_with_its_source() -> None:
    # device -> GB/s per direction: PCIe 4.0 x16 on A100, PCIe 5.0 x16 on H100, NVLink-C2C on Grace parts
    table = {"NVIDIA A100-SXM4-80GB": 25.0, "NVIDIA H100-SXM5-80GB": 50.0, "NVIDIA GB200": 450.0,
             "NVIDIA GH200 480GB": 450.0, "NVIDIA V100-SXM2-16GB": 12.0, "NVIDIA GB200 (NVL72)": 450.0,
             "NVIDIA B200": 50.0, "NVIDIA H200-SXM-141GB": 50.0}
    for name, gbps in table.items():
        cluster = dataclasses.replace(A100, device_name=name)
        assert host_link_gb_per_s(cluster) == gbps
        assert host_sources(cluster)["host_link_gb_per_s"]
    assert host_memory_bytes(A100) == 10**12  # DGX A100: 1 TB
    given = dataclasses.replace(A100, host_link_gb_per_s=12.5, host_memory_bytes=2 * 10**12)
    assert host_link_gb_per_s(given) == 12.5 and host_memory_bytes(given) == 2 * 10**12


def test_old_cluster_files_load_and_the_fields_round_trip() -> None:
    doc = cluster_to_json(A100)
    assert "host_link_gb_per_s" not in doc  # 0 = by device: absent, as in every older file
    assert cluster_from_json(doc) == A100
    given = dataclasses.replace(A100, host_link_gb_per_s=12.5)
    assert cluster_from_json(cluster_to_json(given)).host_link_gb_per_s == 12.5
    with pytest.raises(ValueError, match="host_link_gb_per_s"):
        dataclasses.replace(A100, host_link_gb_per_s=-1.0)


def test_overlap_rule() -> None:
    # 1 GB each way on 25 GB/s = 40 ms of copy per micro-batch, hidden behind f + b of compute
    assert exposed_offload_ms(1e9, 10.0, 20.0, 25.0) == pytest.approx(10.0)
    assert exposed_offload_ms(1e9, 15.0, 25.0, 25.0) == 0.0
    assert exposed_offload_ms(1e9, 30.0, 60.0, 25.0) == 0.0
    assert exposed_offload_ms(1e9, 0.0, 0.0, 50.0) == pytest.approx(20.0)  # nothing to hide behind


def test_host_step_prices_the_link_and_cpu_adam() -> None:
    params = 1e9
    down, up = params * 2 / 25e6, params * 2 / 25e6  # bf16 gradients down, bf16 weights up: 80 ms each
    step = params / (CPU_ADAM_PARAMS_PER_S / DEVICES_PER_HOST) * 1e3  # ZeRO-Offload's CPU-Adam, a device's share
    assert offloaded_step_ms(params, 2, 2, A100) == pytest.approx(down + step + up)
    assert offloaded_step_ms(params, 2, 2, A100, hidden_ms=50.0) == pytest.approx(down - 50.0 + step + up)
    assert offloaded_step_ms(params, 2, 2, A100, hidden_ms=1e6) == pytest.approx(step + up)  # gradients hidden


def _profile() -> Any:
    return gpt3_profile("gpt3-1.3b")


def test_cost_model_moves_state_and_activations_off_the_device() -> None:
    prof = _profile()
    plain = device_cost_model(prof, A100, OptimizerKind.ADAM_MIXED)
    opt = device_cost_model(with_offload(prof, optimizer=True), A100, OptimizerKind.ADAM_MIXED)
    assert plain.state_bytes_per_param() == (2, 2, 12) and opt.state_bytes_per_param() == (2, 2, 0)
    n = prof.num_layers
    assert opt.optimizer_step_ms(0, n) > plain.optimizer_step_ms(0, n)  # PCIe + CPU Adam vs HBM
    blocks = [i for i, layer in enumerate(prof.layers) if layer.attention_core is not None]
    act = device_cost_model(with_offload(prof, optimizer=False, layers=blocks), A100, OptimizerKind.ADAM_MIXED)
    assert all(act.saved_per_sample[i] == 0 for i in blocks) and plain.saved_per_sample[blocks].min() > 0
    # a 2048-wide block saves ~34 s h bytes per sample against ~72 s h^2 FLOP: on PCIe 4 its copies
    # outlast its f + b, and what they do not hide is in its backward, layer by layer (the rule)
    fwd, bwd = plain.at_batch(1).times_ms
    saved = plain.saved_per_sample + plain.saved_fixed
    exposed = sum(exposed_offload_ms(saved[i], fwd[i], bwd[i], 25.0) for i in blocks)
    assert exposed > 0
    # (priced as a fit linear in the micro-batch, bounded by its intercept and slope apart: at least the rule)
    added = act.stage_bwd_ms(0, n, 1) - plain.stage_bwd_ms(0, n, 1)
    assert exposed <= added <= exposed * (1 + 1e-4)


def test_spread_takes_an_even_share() -> None:
    assert spread((1, 2, 3, 4, 5, 6, 7, 8), 0.5) == (2, 4, 6, 8)
    assert spread((1, 2, 3), 1.0) == (1, 2, 3)
    assert spread((1, 2, 3, 4), 0.0) == ()


def _request(**kw: Any) -> PlanRequest:
    return PlanRequest(global_batch=8, num_devices=1, microbatch_sizes=(1,), tp_degrees=(1,), cp_degrees=(1,),
                       per_stage_replication=False, **kw)


def test_a_plan_that_fits_only_with_offload() -> None:
    prof, cluster = _profile(), A100.with_devices(1)
    cap = 19 * GIB  # 1.3 B parameters x 16 bytes: 19.7 GiB of model state, over the cap on one device
    with pytest.raises(InfeasibleError):
        plan(prof, cluster, _request(memory_cap_bytes=cap))
    chosen = plan(prof, cluster, _request(memory_cap_bytes=cap, offload=OffloadMode.AUTO))
    assert chosen.offload is not OffloadMode.NONE and chosen.predicted.peak_memory_bytes <= cap
    stage = chosen.stages[0]
    assert stage.memory.optimizer_bytes == 0 if chosen.offload.optimizer else stage.offload_layers
    assert stage.host_memory_bytes > 0
    again = plan_from_json(__import__("json").loads(dumps_plan(chosen)))
    assert again.offload is chosen.offload and again.stages[0].offload_layers == stage.offload_layers
    assert again.provenance.profile_sha256 == plan(prof, cluster, _request()).provenance.profile_sha256


def test_offload_none_is_the_plan_without_it() -> None:
    prof, cluster = _profile(), A100.with_devices(1)
    assert dumps_plan(plan(prof, cluster, _request(offload=OffloadMode.NONE))) == dumps_plan(plan(prof, cluster, _request()))
    assert '"offload"' not in dumps_plan(plan(prof, cluster, _request()))


def test_memory_front_extends_below_recomputation() -> None:
    prof, cluster = _profile(), A100.with_devices(1)
    # every block recomputed whole: the least recomputation alone reaches (the model state, 19.6 GiB, stays)
    recompute_only = plan(prof, cluster, _request(objective=Objective.MEMORY, time_budget_ms=1e9,
                                                  recompute_mode=RecomputeMode.FULL))
    offloaded = plan(prof, cluster, _request(objective=Objective.MEMORY, time_budget_ms=1e9, offload=OffloadMode.AUTO))
    assert offloaded.offload is OffloadMode.BOTH
    assert offloaded.predicted.peak_memory_bytes < 0.5 * recompute_only.predicted.peak_memory_bytes
    assert {p.offload for p in offloaded.pareto} == set(MODES)  # each mode's leanest plan is on the front


def test_host_optimizer_steps_as_the_plain_one() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3).double()
    twin = torch.nn.Linear(6, 3).double()
    twin.load_state_dict(model.state_dict())
    plain = torch.optim.AdamW(twin.parameters(), lr=0.1, foreach=False)
    host = HostOffloadOptimizer(torch.optim.AdamW(model.parameters(), lr=0.1, foreach=False))
    for _ in range(3):
        x = torch.randn(4, 6, dtype=torch.float64)
        for m, opt in ((model, host), (twin, plain)):
            opt.zero_grad()
            m(x).square().sum().backward()
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
    device, copy = host.pairs[0]
    assert device.data_ptr() != copy.data_ptr()  # a separate buffer, where the state lives
    assert host.host_state_bytes() > 0 and not any(host.state.values())


MLP = "tests.factories:mlp"


def _cfg(name: str, boundaries: list[int], dp: int, zero: int, offload: str = "optimizer") -> dict[str, Any]:
    return {"name": name, "model": MLP, "boundaries": boundaries, "dp_degree": dp, "num_microbatches": 4,
            "microbatch_size": 2, "schedule": "1f1b", "recompute": False, "dtype": "float64", "optimizer": "adamw",
            "steps": 3, "zero": zero, "offload": offload}


CONFIGS = {2: [_cfg("offload-mlp-P2-D1-1f1b", [2], 1, 0), _cfg("offload-mlp-P1-D2-zero1", [], 2, 1),
               _cfg("offload-both-mlp-P2-D1-1f1b", [2], 1, 0, "both"),
               _cfg("offload-none-mlp-P2-D1-1f1b", [2], 1, 0, "none")]}


@pytest.mark.slow
@pytest.mark.driver(configs=CONFIGS.__getitem__)
@pytest.mark.parametrize("world", [2])
def test_optimizer_offload_matches_one_process(world: int, driven: SharedLaunches) -> None:
    """AdamW with its state on the host, P = 2 and D = 2 with ZeRO 1, and with every layer's
    activations on the host too, float64: losses and final parameters equal one process's (the
    same AdamW) to 1e-12; the device holds no optimizer state, and with activations offloaded none
    of the layers' saves the plain run's meter counts (the last stage's loss keeps its own)."""
    results = {r["name"]: r for r in driven.results(world, CONFIGS[world])}
    for name, r in results.items():
        assert len(r["losses"]) == 3
        assert r["loss_abs_diff"] <= 1e-12 and r["param_abs_diff"] <= 1e-12, r
        state = [chunk["optimizer_bytes"] for rank in r["model_state"] for chunk in rank]
        assert all(b == 0 for b in state) if "none" not in name else all(b > 0 for b in state), (name, state)
    plain, offloaded = results["offload-none-mlp-P2-D1-1f1b"], results["offload-both-mlp-P2-D1-1f1b"]
    # per rank, its stage's largest: the first stage keeps none; the last only what the loss saves
    kept, saved = offloaded["saved_bytes_per_microbatch"], plain["saved_bytes_per_microbatch"]
    assert kept[0] == 0 < saved[0] and kept[1] < saved[1], (kept, saved)
