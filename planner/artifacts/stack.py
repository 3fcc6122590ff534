"""The training stack a plan is priced for: which communication it overlaps with computation.

Real stacks hide communication behind computation in ways a cost model cannot guess; each is
therefore a stated capability of the stack being planned for, recorded in the request and the
plan, never assumed. Three overlaps are priced (:mod:`planner.cost.overlap`,
:mod:`planner.cost.tensor_parallel`):

- ``grad_reduce_overlap`` (the all-reduce of plain data parallelism) and
  ``zero_reduce_overlap`` (ZeRO's reduce-scatter): the data-parallel gradient reduction runs
  in buckets of ``grad_bucket_bytes``, each started as soon as its gradients are final during
  the stage's last backward (PyTorch DDP, Li et al. 2020 sec. 3.2.3; Megatron-Core
  ``--overlap-grad-reduce``), also with one stage. Without it the stage's whole reduction
  starts when its last backward ends (it still overlaps the other stages' cooldown, the
  pipeline's own hiding, Hippie / TPDS 2024);
- ``param_gather_overlap``: ZeRO's all-gather of the updated weights runs in buckets ahead of
  the next iteration's first forward, each layer waiting only for its own bucket
  (Megatron-Core ``--overlap-param-gather``). Without it the all-gather follows the reduction;
- ``fsdp_prefetch`` (ZeRO 3 / FSDP): each layer's weight all-gather runs one layer ahead, beside
  the previous layer's forward (backward: beside the next layer's backward, with that layer's
  gradient reduce-scatter), as FSDP2's implicit forward and explicit backward prefetching do
  (torch ``fully_shard``, torchtitan; Zhao et al. 2023 "PyTorch FSDP" sec. 3.3). Without it each
  layer's gather and reduce-scatter wait for, and are waited for by, its computation
  (:mod:`planner.cost.fsdp`);
- ``tp_overlap_backward``: each backward tensor-parallel collective (the all-reduce of a
  column-parallel GEMM's input gradient) runs beside that GEMM's weight-gradient GEMM
  (Korthikanti et al. 2022 sec. 6.2; Megatron-LM's asynchronous tensor-parallel all-reduce),
  hiding at most that GEMM's time;
- ``tp_overlap_forward``: each forward tensor-parallel collective runs beside the column- and
  row-parallel GEMMs around it, pipelined in chunks (Transformer Engine's userbuffers behind
  Megatron-Core ``--tp-comm-overlap``), hiding at most their time;
- ``moe`` (:class:`~planner.artifacts.moe.MoeStack`): mixture-of-experts layers' token dispatcher
  (NCCL all-to-all or DeepEP's fused kernels), whether dispatch and combine overlap another
  micro-batch's compute, and how the tokens fall on the experts (forced balance, dropless with a
  skew, a capacity factor).

Presets (:data:`STACKS`): ``none`` (nothing of the above: what plans before version 4 were
priced for), ``planner`` (this package's runtime, ``planner.runtime.grads``: the all-reduce in
25 MiB buckets started from gradient hooks during the last backward; its ZeRO reduce-scatter
starts after the last backward; the default, since plans are run by it), ``megatron-core``
(all of them, FSDP prefetching included, Megatron-Core's default bucket of 40,000,000 gradient
elements in bf16), ``torchtitan`` (FSDP2 per transformer block with its prefetching, the
gradient reduction during backward, ZeRO's gathers ahead of the forward; asynchronous tensor
parallelism off, as by default). ``benchmarks/published_runs.py`` prices each
published run with the stack it ran on (Megatron-LM 2021-22: tensor-parallel backward overlap
only; Megatron-Core: all of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.artifacts.moe import MoeStack

__all__ = ["DEFAULT_STACK", "STACKS", "Stack", "stack_named"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """What a training stack overlaps (see the module docstring)."""

    name: str = field(metadata={"doc": "the preset's name, or any label of a stack described here"})
    grad_reduce_overlap: bool = field(
        default=False,
        metadata={"doc": "the data-parallel gradient all-reduce in buckets started during the stage's last backward"},
    )
    zero_reduce_overlap: bool = field(
        default=False,
        metadata={"doc": "ZeRO's gradient reduce-scatter in buckets started during the stage's last backward"},
    )
    grad_bucket_bytes: int = field(
        default=25 << 20,
        metadata={"doc": "bytes of gradients per bucket of the overlapped reduction (and gather); 25 MiB is PyTorch "
                         "DDP's default bucket_cap_mb (Li et al. 2020 sec. 3.2.3)"},
    )
    param_gather_overlap: bool = field(
        default=False, metadata={"doc": "ZeRO's weight all-gather in buckets ahead of the next iteration's forward"}
    )
    fsdp_prefetch: bool = field(
        default=False,
        metadata={"doc": "ZeRO 3: each layer's weight all-gather (and reduce-scatter) beside the neighbouring layer's "
                         "computation, one layer ahead (FSDP2 prefetching)"},
    )
    tp_overlap_backward: bool = field(
        default=False,
        metadata={"doc": "backward tensor-parallel all-reduces beside the weight-gradient GEMMs (hiding at most their time)"},
    )
    tp_overlap_forward: bool = field(
        default=False,
        metadata={"doc": "forward tensor-parallel collectives beside the GEMMs around them (hiding at most their time)"},
    )
    moe: MoeStack = field(
        default=MoeStack(),
        metadata={"doc": "what the stack does with a mixture-of-experts layer's tokens: dispatcher, all-to-all overlap, "
                         "load balance (planner.artifacts.moe; absent: the default)", "omit_if_default": True},
    )

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a stack needs a name")
        if self.grad_bucket_bytes < 1:
            raise ValueError(f"grad_bucket_bytes must be >= 1 (got {self.grad_bucket_bytes})")

    def reduce_overlap(self, sharded: bool) -> bool:
        """Whether the reduction overlaps the last backward: ZeRO's reduce-scatter (``sharded``)
        or the all-reduce."""
        return self.zero_reduce_overlap if sharded else self.grad_reduce_overlap

    def describe(self) -> str:
        """One line: the name and what it overlaps."""
        reduce = {(True, True): "gradient reduction", (True, False): "gradient all-reduce",
                  (False, True): "ZeRO reduce-scatter"}.get((self.grad_reduce_overlap, self.zero_reduce_overlap), "")
        parts = [what for flag, what in (
            (bool(reduce), f"{reduce} with backward ({self.grad_bucket_bytes / 2**20:.3g} MiB buckets)"),
            (self.param_gather_overlap, "ZeRO all-gather with forward"),
            (self.fsdp_prefetch, "FSDP gathers one layer ahead"),
            (self.tp_overlap_forward and self.tp_overlap_backward, "tensor-parallel collectives with GEMMs"),
            (self.tp_overlap_backward and not self.tp_overlap_forward, "backward tensor-parallel all-reduces with GEMMs"),
            (self.tp_overlap_forward and not self.tp_overlap_backward, "forward tensor-parallel collectives with GEMMs"),
            (self.moe != MoeStack(), self.moe.describe()),
        ) if flag]
        return f"{self.name}: overlaps " + (", ".join(parts) if parts else "nothing beyond the pipeline")


STACKS: dict[str, Stack] = {
    "none": Stack(name="none"),
    "planner": Stack(name="planner", grad_reduce_overlap=True, grad_bucket_bytes=25 << 20),
    "megatron-core": Stack(
        name="megatron-core", grad_reduce_overlap=True, zero_reduce_overlap=True, grad_bucket_bytes=80_000_000,
        param_gather_overlap=True, fsdp_prefetch=True,
        tp_overlap_backward=True, tp_overlap_forward=True,
    ),
    "torchtitan": Stack(
        name="torchtitan", grad_reduce_overlap=True, zero_reduce_overlap=True, param_gather_overlap=True,
        fsdp_prefetch=True,
    ),
}

#: what a request plans for unless it says otherwise: the bundled runtime that runs its plans
DEFAULT_STACK = STACKS["planner"]


def stack_named(name: str) -> Stack:
    """A preset by name (ValueError naming the presets otherwise)."""
    if name not in STACKS:
        raise ValueError(f"unknown stack {name!r} (known: {', '.join(STACKS)})")
    return STACKS[name]
