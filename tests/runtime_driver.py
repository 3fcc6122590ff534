"""Run many runtime configurations in one torchrun launch and compare each with
one-process training on the same global batches (the reference is computed on every rank).

Usage (what tests/test_runtime_numerics.py does)::

    torchrun --nproc-per-node N tests/runtime_driver.py CONFIGS.json OUT.json

CONFIGS.json is a list of objects with: name, model (factory spec), boundaries, dp_degree,
num_microbatches, microbatch_size, schedule, recompute, dtype, optimizer, steps, and
optionally selective (selective recomputation of the layers not fully recomputed),
virtual_stages_per_rank (interleaved 1F1B), zero (ZeRO stage), tp_degree and
sequence_parallel (tensor parallelism; split parameters are compared whole), cp_degree
(context parallelism: each sequence split over the cp ranks), ep_degree and etp_degree (the
routed experts folded over the ranks; expert shards are compared whole), stack (the
fields of a planner.artifacts.stack.Stack: how the all-reduce is bucketed and overlapped), and checkpoint_dir
with resume_at = k (train k steps with a checkpoint, then a fresh runner resumes); or, instead
of the layout's fields, plan (a plan as ``planner plan`` writes it) with model, dtype,
optimizer and steps, whose result adds the runtime's run report (``planner run --report``'s
JSON); or tp_profile (a model spec: tests/tp_profile_driver.py's rows of its split layers, in the
result's rows). Every config must use all N processes. Rank 0 writes OUT.json: per config, the losses of both runs, the
max absolute and relative differences of losses, of every stage's final gradients (with
ZeRO, of each rank's gradient shard) and of the final parameters, and per rank the bytes one
forward of a micro-batch saved for backward (the saved-tensor hooks' count), the
optimizer state bytes, gradient bytes after the sync, and the data-parallel parameters'
element and tensor counts.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.artifacts.host import OffloadMode
from planner.artifacts.kinds import DType, OptimizerFamily, ScheduleKind
from planner.artifacts.plan import Plan, plan_from_json
from planner.artifacts.report import report_to_json
from planner.artifacts.stack import DEFAULT_STACK, Stack
from planner.models.context import observing_regathers
from planner.models.workload import split_loss
from planner.runtime.collect import build_report, gather_measures
from planner.runtime.engine import RankRunner
from planner.runtime.model import cast_batch, cast_workload, load_workload, workload_fingerprint
from planner.runtime.options import RuntimeOptions
from planner.runtime.stage_helpers import optimizer_of
from planner.runtime.tensor import full, local
from planner.runtime.zero import flatten
from tests.factories import make_plan

LR = 0.05


def _optimizer(kind: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return optimizer_of(OptimizerFamily(kind), params, LR)  # the runtime's own (bf16 moments included)


def reference(
    cfg: dict[str, Any], global_batch: int
) -> tuple[list[float], list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    """One process, whole model, whole global batch: losses per step, the last grads and the
    final parameters per layer."""
    dtype = DType(cfg["dtype"])
    workload = load_workload(cfg["model"], 0, dtype)
    cast_workload(workload, dtype)
    unique = list({id(p): p for layer in workload.layers for p in layer.parameters()}.values())
    opt = _optimizer(cfg["optimizer"], unique)
    losses = []
    for step in range(cfg["steps"]):
        opt.zero_grad(set_to_none=True)
        inputs, targets = workload.make_batch(global_batch, step)
        x = cast_batch(inputs, dtype)
        for layer in workload.layers:
            x = layer(x)
        total, count = split_loss(workload.loss_fn(x, targets))
        loss = total if count is None else total / count  # (sum, count): the mean over the batch's units
        loss.backward()
        opt.step()
        losses.append(float(loss.detach().double()))
    grads = [[p.grad.detach().clone() for p in layer.parameters()] for layer in workload.layers]
    params = [[p.detach().clone() for p in layer.parameters()] for layer in workload.layers]
    return losses, grads, params


def _max_diff(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max |got - ref|, max |ref|)."""
    return float((got.double() - ref.double()).abs().max()), float(ref.double().abs().max())


def local_reference(param: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """This rank's part of the whole reference tensor ``ref`` of a (tensor-parallel) parameter."""
    if not isinstance(param, DTensor):
        return ref
    placements = [Replicate() if p.is_partial() else p for p in param.placements]
    return distribute_tensor(ref, param.device_mesh, placements, src_data_rank=None).to_local()


def compare(runner: RankRunner, ref_grads: list[list[torch.Tensor]], ref_params: list[list[torch.Tensor]]) -> list[float]:
    """Max abs grad diff and scale, max abs param diff and scale, over every stage the rank ran
    (several with interleaved 1F1B). A parameter whose gradient ZeRO keeps only as the shard's
    (``param.grad`` None) is compared through the shard: ``master.grad`` against the same slice
    of the flattened reference gradients."""
    out = [0.0, 0.0, 0.0, 0.0]

    def add(at: int, diff: tuple[float, float]) -> None:
        out[at], out[at + 1] = max(out[at], diff[0]), max(out[at + 1], diff[1])

    for chunk in runner.chunks:
        ref_grad_of = {}
        for k, layer in enumerate(chunk.module.layers):
            refs = zip(layer.parameters(), ref_grads[chunk.stage_plan.layer_start + k], ref_params[chunk.stage_plan.layer_start + k])
            for p, ref_grad, ref_param in refs:
                ref_grad_of[id(p)] = ref_grad
                add(2, _max_diff(full(p.detach()), ref_param))  # full: a split parameter, gathered
                if p.grad is not None:
                    add(0, _max_diff(full(p.grad), ref_grad))
        if chunk.zero is not None:
            layout = chunk.zero.layout
            flat = flatten([local_reference(p, ref_grad_of[id(p)]) for p in chunk.zero.params], layout)
            assert chunk.zero.master.grad is not None
            add(0, _max_diff(chunk.zero.master.grad, flat[layout.shard_start : layout.shard_stop]))
    return out


STATE_KEYS = ("optimizer_bytes", "grad_bytes", "numel", "tensors", "param_bytes_between", "stage_idx", "gathers")


def model_state(runner: RankRunner, measure: Any) -> list[float]:
    """Per stage chunk of this rank: optimizer state bytes, gradient bytes after the sync, and
    the elements and tensors of the parameters its optimizer steps (for ZeRO: the
    parameters behind the shard), and under ZeRO 3 the most bytes its sharded parameters held
    while the chunk was not computing (the master shard plus any whole weights, measured when
    each forward starts; 0 otherwise), the chunk's stage and its ZeRO 3 weight gathers inside
    the schedules."""
    out: list[float] = []
    for chunk, optim, grads in zip(runner.chunks, measure.stage_optimizer_state_bytes, measure.stage_grad_bytes):
        params = [] if chunk.optimizer is None else list(chunk.optimizer.param_groups[0]["params"])
        if chunk.zero is not None:
            params = [p for p in params if p is not chunk.zero.master] + chunk.zero.params
        between = float(chunk.zero.between_bytes_peak) if chunk.zero is not None else 0.0
        gathers = float(chunk.zero.gathers) if chunk.zero is not None else 0.0
        out += [float(optim), float(grads), float(sum(local(p).numel() for p in params)), float(len(params)), between,
                float(chunk.stage_idx), gathers]
    return out


def _train(cfg: dict[str, Any], plan: Any, rank: int, *, num_steps: int, **kw: Any) -> tuple[RankRunner, Any]:
    dtype = DType(cfg["dtype"])
    workload = load_workload(cfg["model"], 0, dtype)
    cast_workload(workload, dtype)
    options = RuntimeOptions(
        plan_path="<driver>",
        model_spec=cfg["model"],
        num_steps=num_steps,
        dtype=dtype,
        optimizer=OptimizerFamily(cfg["optimizer"]),
        lr=LR,
        warmup_steps=0,
        timeout_s=60.0,
        checkpoint_dir=cfg.get("checkpoint_dir", ""),
        **kw,
    )
    runner = RankRunner(plan, workload, options, rank, torch.device("cpu"))
    return runner, runner.run()


class RegatherMeter:
    """Bytes of the keys and values re-gathered in backward (``planner.models.context``) live
    at once. Each is live from its all-gather until autograd drops it (after its kernel's
    backward): the meter keeps each one's storage and, at every new one, counts those some
    tensor still uses besides the meter (the storage's use count; the Python tensor objects
    die at once, autograd's C++ copies do not), then lets the others go."""

    def __init__(self) -> None:
        self.held: list[torch.UntypedStorage] = []
        self.peak_bytes = 0

    def observe(self, tensor: torch.Tensor) -> None:
        self.held = [s for s in self.held if torch._C._storage_Use_Count(s._cdata) > 1]
        self.held.append(tensor.untyped_storage())
        self.peak_bytes = max(self.peak_bytes, sum(s.nbytes() for s in self.held))


def _plan_of(cfg: dict[str, Any], layer_names: tuple[str, ...]) -> Plan:
    """The config's plan: ``planner plan``'s own (``plan``, its JSON), or one made of its fields."""
    if "plan" in cfg:
        return plan_from_json(cfg["plan"], source=cfg["name"])
    if "offload" in cfg:  # host memory (planner.runtime.offload): activations of every layer, when offloaded
        plain = _plan_of({k: v for k, v in cfg.items() if k != "offload"}, layer_names)
        mode = OffloadMode(cfg["offload"])
        stages = tuple(dataclasses.replace(s, offload_layers=tuple(range(s.layer_start, s.layer_stop)))
                       for s in plain.stages) if mode.activations else plain.stages
        return dataclasses.replace(plain, offload=mode, stages=stages)
    return make_plan(
        layer_names,
        tuple(cfg["boundaries"]),
        dp_degree=cfg["dp_degree"],
        num_microbatches=cfg["num_microbatches"],
        microbatch_size=cfg["microbatch_size"],
        schedule=ScheduleKind(cfg["schedule"]),
        recompute=cfg["recompute"],
        selective=cfg.get("selective", False),
        virtual_stages_per_rank=cfg.get("virtual_stages_per_rank", 1),
        tp_degree=cfg.get("tp_degree", 1),
        sequence_parallel=cfg.get("sequence_parallel", False),
        cp_degree=cfg.get("cp_degree", 1),
        ep_degree=cfg.get("ep_degree", 1),
        etp_degree=cfg.get("etp_degree", 1),
        zero=cfg.get("zero", 0),
        stack=Stack(**cfg["stack"]) if "stack" in cfg else DEFAULT_STACK,
    )


def run_config(cfg: dict[str, Any], rank: int) -> dict[str, Any]:
    if "tp_profile" in cfg:  # tests/tp_profile_driver.py's rows of one spec over every rank (tests/test_tp_profile.py)
        from torch.distributed.device_mesh import init_device_mesh

        from tests.tp_profile_driver import measure

        t = dist.get_world_size()
        return {"name": cfg["name"], "rows": measure(cfg["tp_profile"], t, init_device_mesh("cpu", (t,), mesh_dim_names=("tp",)))}
    workload = load_workload(cfg["model"], 0, DType(cfg["dtype"]))
    plan = _plan_of(cfg, workload.layer_names)
    if plan.num_devices != dist.get_world_size():
        raise ValueError(f"config {cfg['name']} needs {plan.num_devices} processes")
    resume_at = cfg.get("resume_at", 0)
    earlier: list[float] = []
    if resume_at:  # train to the checkpoint, then a fresh runner (new model, new optimizer) resumes
        _, first_measure = _train(cfg, plan, rank, num_steps=resume_at, checkpoint_every=resume_at)
        earlier = [s.loss for s in first_measure.steps]
    regathered = RegatherMeter()
    with observing_regathers(regathered.observe):
        runner, measure = _train(cfg, plan, rank, num_steps=cfg["steps"], resume=bool(resume_at))
    ref_losses, ref_grads, ref_params = reference(cfg, plan.global_batch)
    grad_abs, grad_scale, param_abs, param_scale = compare(runner, ref_grads, ref_params)
    stats = torch.tensor(
        [grad_abs, grad_abs / grad_scale if grad_scale else 0.0, param_abs, param_abs / param_scale if param_scale else 0.0],
        dtype=torch.float64,
    )
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    state = torch.tensor(model_state(runner, measure), dtype=torch.float64)
    per_rank = [torch.zeros_like(state) for _ in range(dist.get_world_size())]
    dist.all_gather(per_rank, state)
    saved = torch.tensor([float(max(measure.stage_saved_bytes_per_microbatch, default=0))], dtype=torch.float64)
    saved_per_rank = [torch.zeros_like(saved) for _ in range(dist.get_world_size())]
    dist.all_gather(saved_per_rank, saved)
    peaks = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(peaks, torch.tensor([float(regathered.peak_bytes)], dtype=torch.float64))
    regathered.held.clear()
    report = None
    if "plan" in cfg:  # the runtime's own report of a planner-made plan, as ``planner run --report`` writes it
        rows = gather_measures(measure, dist.get_world_size(), torch.device("cpu"))
        report = report_to_json(build_report(plan, runner.options, measure, rows, model=workload.name,
                                             fingerprint=workload_fingerprint(workload), backend="gloo", device="cpu"))
    losses = earlier + [s.loss for s in measure.steps]
    loss_abs = max(abs(a - b) for a, b in zip(losses, ref_losses))
    loss_rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    return {
        "name": cfg["name"],
        "losses": losses,
        "ref_losses": ref_losses,
        "loss_abs_diff": loss_abs,
        "loss_rel_diff": loss_rel,
        "grad_abs_diff": float(stats[0]),
        "grad_rel_diff": float(stats[1]),
        "param_abs_diff": float(stats[2]),
        "param_rel_diff": float(stats[3]),
        "saved_bytes_peak": measure.saved_bytes_peak,
        "saved_bytes_per_microbatch": [int(t.item()) for t in saved_per_rank],  # per rank, its largest chunk's
        "regathered_bytes_peak": [int(t.item()) for t in peaks],  # per rank, K/V re-gathered in backward live at once
        "report": report,  # a planner-made plan's run report (``plan`` configs), else None
        "model_state": [  # per rank, per chunk
            [dict(zip(STATE_KEYS, map(int, chunk.tolist()))) for chunk in r.view(-1, len(STATE_KEYS))] for r in per_rank
        ],
    }


def serve(run: Callable[[dict[str, Any], int], dict[str, Any]]) -> None:
    """``torchrun ... DRIVER CONFIGS.json OUT.json``: ``run`` every config on every rank in one
    gloo process group; rank 0 writes the results (those so far, after each config)."""
    configs = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    torch.set_default_dtype(torch.float32)
    results, part = [], out.with_suffix(".part")
    for cfg in configs:  # written after each: a launch that fails part-way keeps what finished
        results.append(run(cfg, rank))
        if rank == 0:
            part.write_text(json.dumps(results, indent=2))
            part.replace(out)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    serve(run_config)


if __name__ == "__main__":
    main()
