"""What both executors do to the stages of a rank the same way (``planner.runtime.engine`` on
``torch.distributed.pipelining``, ``planner.runtime.replicated`` for plans replicated per stage):

- the stage boundary's example tensors: a no-grad forward of the layers before and in the
  stage on one micro-batch (:func:`boundary_examples`), from which static ``PipelineStage``
  metadata or the replicated executor's receive buffers take shapes and dtypes, so no
  metadata crosses ranks at run time;
- the :class:`Chunk` s a rank runs (one stage each: its plan entry, ``StageModule``, timer,
  optimizer and ZeRO shard), and their optimizers with the rank's gradient synchronisation
  (:func:`build_sync`): each parameter stepped once by the first chunk holding it; with ZeRO
  1 / 2 (and two or more ranks to shard over) each chunk's optimizer steps its master shard
  plus the parameters left whole (tied across pipeline ranks, or frozen); otherwise the
  bucketed all-reduce hooks over the rank's parameters;
- the parameters tied across pipeline ranks (:func:`tied_holders`, :func:`tied_params`);
- a micro-batch's loss, its saved tensors metered with the last stage's (:func:`micro_loss`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from planner.artifacts.kinds import OptimizerFamily, ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.plan import Plan, PlanStage
from planner.artifacts.stack import DEFAULT_STACK, Stack
from planner.models.workload import Workload
from planner.runtime.context import grad_divisor
from planner.runtime.emulate import ChunkTimer
from planner.runtime.experts import ExpertGroups, ExpertSync, expert_parameters
from planner.runtime.grads import DataParallelHooks, GradientSync
from planner.runtime.lean_adamw import Bf16MomentsAdamW
from planner.runtime.loss import LossCounts
from planner.runtime.options import RuntimeOptions
from planner.runtime.stage import StageModule
from planner.runtime.tensor import local
from planner.runtime.topology import Groups
from planner.runtime.zero import ShardedState

__all__ = [
    "Chunk",
    "as_args",
    "boundary_examples",
    "build_sync",
    "emulated_readiness",
    "grad_examples",
    "held_grad_bytes",
    "make_optimizer",
    "micro_loss",
    "microbatch",
    "stage_module",
    "tied_holders",
    "tied_params",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Chunk:
    """One stage run by a rank: its plan entry, module, timer, optimizer and ZeRO shard."""

    stage_plan: PlanStage
    module: StageModule
    timer: ChunkTimer
    optimizer: torch.optim.Optimizer | None  # None when another chunk of the rank owns all its parameters
    zero: ShardedState | None = None  # ZeRO >= 1: the optimizer steps this shard (and the tied parameters)
    expert_zero: ShardedState | None = None  # ZeRO >= 1, experts folded: their shard over the edp group

    @property
    def stage_idx(self) -> int:
        return self.stage_plan.stage_idx


def as_args(value: Any) -> tuple[Any, ...]:
    """A stage's input or output as positional arguments (a tuple as it is, a tensor as one)."""
    return tuple(value) if isinstance(value, tuple) else (value,)


def microbatch(value: Any, mb_idx: int, size: int) -> Any:
    """Samples [mb_idx x size, (mb_idx + 1) x size) of a batch (tensor or tuple of tensors)."""
    if isinstance(value, tuple):
        return tuple(microbatch(v, mb_idx, size) for v in value)
    return value[mb_idx * size : (mb_idx + 1) * size]


def boundary_examples(workload: Workload, start: int, stop: int, mb_inputs: Any) -> tuple[Any, Any]:
    """Input of layer ``start`` and output of layer ``stop - 1`` for one micro-batch (no grad)."""
    x = mb_inputs
    stage_input = None
    with torch.no_grad():
        for idx in range(stop):
            if idx == start:
                stage_input = x
            x = workload.layers[idx](x)
    return stage_input, x


def grad_examples(value: Any) -> tuple[Any, ...]:
    """Example tensors marked as needing grad where floating (activations, not token ids):
    static ``PipelineStage`` metadata decides from them which gradients cross stages. Contiguous,
    as the stage module's outputs are: receive buffers are allocated like them, and gloo sends
    and receives only contiguous tensors."""
    return tuple(t.detach().contiguous().requires_grad_(t.is_floating_point()) for t in as_args(value))


def stage_module(workload: Workload, stage: PlanStage, device: torch.device, split_backward: bool = False) -> StageModule:
    """The stage's layers with the plan's recomputation (full and selective; under a split
    backward, ``split_backward``, recomputed by the stage itself) and activation offload, on ``device``."""
    layers = range(stage.layer_start, stage.layer_stop)
    recompute = [i in stage.recompute for i in layers]
    selective = [i in stage.recompute_selective for i in layers]
    offload = [i in stage.offload_layers for i in layers]
    return StageModule(list(workload.layers[stage.layer_start : stage.layer_stop]), recompute, selective,
                       offload, split_backward=split_backward).to(device)


def emulated_readiness(
    modules: Sequence[StageModule], offsets_ms: Sequence[Sequence[float]], timers: Sequence[ChunkTimer]
) -> Callable[[torch.Tensor], float]:
    """For emulated compute: a parameter's gradient is final ``offsets_ms[c][l]`` after the
    start of the backward of chunk ``c`` holding it in layer ``l`` (a parameter two chunks
    share: the first, whose backward runs last); see ``planner.runtime.emulate``."""
    when: dict[int, tuple[ChunkTimer, float]] = {}
    for module, offsets, timer in zip(modules, offsets_ms, timers, strict=True):
        for layer, offset in zip(module.layers, offsets, strict=True):
            for param in layer.parameters():
                when.setdefault(id(param), (timer, offset / 1000.0))

    def ready_at(param: torch.Tensor) -> float:
        timer, offset = when[id(param)]
        return timer.bwd_start_s + offset

    return ready_at


def make_optimizer(options: RuntimeOptions, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The run's optimizer (``--optimizer``, ``--lr``) over ``params`` (``foreach=False``: the
    ZeRO shard's update then equals the unsharded one bit for bit, ``planner.runtime.zero``)."""
    return optimizer_of(options.optimizer, params, options.lr)


def optimizer_of(family: OptimizerFamily, params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """SGD, AdamW, or AdamW with bf16 moments (:class:`planner.runtime.lean_adamw.Bf16MomentsAdamW`)."""
    if family is OptimizerFamily.ADAMW_BF16_MOMENTS:
        return Bf16MomentsAdamW(params, lr=lr)
    if family is OptimizerFamily.ADAMW:
        return torch.optim.AdamW(params, lr=lr, foreach=False)
    return torch.optim.SGD(params, lr=lr, foreach=False)


def held_grad_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of the storages holding the gradients of the optimizer's parameters (each
    storage once: with ZeRO 1 the shard's gradient is a view of the kept flat buffer)."""
    if optimizer is None:
        return 0
    storages = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                storage = local(param.grad).untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def micro_loss(workload: Workload, counts: LossCounts, module: StageModule, out: Any, target: Any) -> torch.Tensor:
    """What one micro-batch back-propagates (``LossCounts.micro_loss``); its saved tensors are
    metered with ``module``'s (the last stage's, as in the profile: part of the micro-batch's
    forward record) while it meters."""
    if not module.metering:
        return counts.micro_loss(workload.loss_fn(out, target))
    with module.measured((out, target), merge=True) as box:
        box.append(counts.micro_loss(workload.loss_fn(out, target)))
    loss: torch.Tensor = box[0]
    return loss


def tied_holders(plan: Plan, workload: Workload) -> tuple[tuple[int, ...], ...]:
    """Per tied parameter group of the workload: the pipeline ranks whose stages hold one of
    its layers (``Layout.pipeline_rank``; the stage itself when replicated per stage)."""
    return tuple(
        tuple(sorted({
            plan.layout.pipeline_rank(s.stage_idx) for s in plan.stages for i, _ in group if s.layer_start <= i < s.layer_stop
        }))
        for group in workload.tied
    )


def tied_params(
    plan: Plan, workload: Workload, stage_indices: Sequence[int], holders: tuple[tuple[int, ...], ...]
) -> list[torch.nn.Parameter | None]:
    """Per tied group: this rank's copy (a rank running ``stage_indices``) when the group spans
    two or more pipeline ranks, else None (a tie inside one rank is one tensor: plain data
    parallel)."""
    mine: list[torch.nn.Parameter | None] = []
    stages = [plan.stages[s] for s in stage_indices]
    for group, held_by in zip(workload.tied, holders):
        here = [(i, name) for i, name in group for st in stages if st.layer_start <= i < st.layer_stop]
        mine.append(workload.layers[here[0][0]].get_parameter(here[0][1]) if here and len(held_by) >= 2 else None)
    return mine


def build_sync(
    modules: Sequence[StageModule],
    *,
    options: RuntimeOptions,
    layout: Layout,
    groups: Groups,
    tied: list[torch.nn.Parameter | None],
    stack: Stack = DEFAULT_STACK,
    ready_at: Callable[[torch.Tensor], float] | None = None,
    experts: ExpertGroups | None = None,
) -> tuple[GradientSync, list[tuple[torch.optim.Optimizer | None, ShardedState | None, ShardedState | None]]]:
    """The rank's gradient synchronisation, and per module (stage chunk) its optimizer, ZeRO
    shard and its experts' ZeRO shard (see the module docstring). Gradients are divided by ``layout.dp_degree`` x
    ``layout.cp_degree`` before the sums: the mean over replicated pipelines and the ranks
    splitting their sequences (1 over a stage's copies). The all-reduce runs as
    the plan's ``stack`` says (its buckets, overlapped with the last backward or not);
    ``ready_at``: see :class:`DataParallelHooks`. ``experts`` (experts folded apart from attention,
    ``planner.runtime.experts``): the routed experts' parameters are left out of the rest's
    synchronisation and synchronised (or ZeRO-sharded) over their own edp group."""
    divisor = grad_divisor(layout)  # the mean over a stage's D x c ranks (1 over its copies)
    tied_ids = {id(p) for p in tied if p is not None}
    expert_ids = {id(p) for p in expert_parameters(modules)} if experts is not None else set()
    shard_group = groups.data_parallel if layout.zero > ZeroStage.NONE else None
    seen: set[int] = set()
    uses: dict[int, int] = {}
    states: list[tuple[torch.optim.Optimizer | None, ShardedState | None, ShardedState | None]] = []
    for module in modules:
        own = []
        for param in module.parameters():
            uses[id(param)] = uses.get(id(param), 0) + 1
            if id(param) not in seen:  # a parameter two chunks share is stepped once
                seen.add(id(param))
                own.append(param)
        sharded = [p for p in own if id(p) not in tied_ids and id(p) not in expert_ids and p.requires_grad]
        zero = None
        if shard_group is not None and sharded:
            zero = ShardedState(sharded, shard_group, zero=int(layout.zero), grad_divisor=divisor)
            zero.attach(module)  # ZeRO 3: gathers around the chunk's forward and backward
            own = [zero.master] + [p for p in own if id(p) in tied_ids or id(p) in expert_ids or not p.requires_grad]
        own, expert_zero = _shard_experts(own, expert_ids, experts, layout.zero, divisor)
        states.append((make_optimizer(options, own) if own else None, zero, expert_zero))
    hooks = None
    if groups.data_parallel is not None and shard_group is None:
        synced = [p for opt, _, _ in states if opt is not None for p in opt.param_groups[0]["params"]
                  if id(p) not in tied_ids and id(p) not in expert_ids and p.requires_grad]
        hooks = DataParallelHooks(
            synced, groups.data_parallel, divisor, stack.grad_bucket_bytes, uses=uses,
            overlap=stack.grad_reduce_overlap, ready_at=ready_at,
        ) if synced else None
    whole_experts = [p for opt, _, _ in states if opt is not None for p in opt.param_groups[0]["params"] if id(p) in expert_ids]
    sync = GradientSync(
        hooks=hooks,
        shards=[z for _, dense, experts_zero in states for z in (dense, experts_zero) if z is not None],
        tied_params=tied,
        tied_groups=list(groups.tied),
        divisor=divisor,
        experts=None if experts is None else ExpertSync(
            whole_experts, experts.edp, divisor, bucket_bytes=stack.grad_bucket_bytes, overlap=stack.grad_reduce_overlap),
    )
    return sync, states


def _shard_experts(
    own: list[torch.nn.Parameter], expert_ids: set[int], experts: ExpertGroups | None, zero: ZeroStage, divisor: int,
) -> tuple[list[torch.nn.Parameter], ShardedState | None]:
    """A chunk's optimizer parameters with its routed experts' replaced by their ZeRO shard over
    the edp group, where there is one (``ExpertSync.shard``), and that shard."""
    mine = [p for p in own if id(p) in expert_ids and p.requires_grad]
    state = ExpertSync.shard(mine, experts.edp, zero, divisor) if experts is not None else None
    if state is None:
        return own, None
    return [p for p in own if id(p) not in expert_ids or not p.requires_grad] + [state.master], state
