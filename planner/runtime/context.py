"""Context parallelism in the runtime: each stage replica's samples split along the sequence
over the mesh's "cp" dimension.

A plan with ``cp_degree`` = c > 1 runs every stage replica (at each tp index) on c ranks, placed
by the plan's :class:`~planner.artifacts.layout.Layout` (rank = ((p D + replica) c + cp index)
t + tp index). The runtime

- builds the cp groups (lines of the ("pp", "dp", "cp", "tp") mesh along "cp",
  ``planner.runtime.topology``) and hands each rank's layers its :class:`SequenceShard`
  (:func:`install`): rank i of a cp group holds chunks i and 2c - 1 - i of the 2c chunks of
  every sample (the load-balanced causal split of Llama 3 and torchtitan);
- splits each step's batch the same way (:func:`split_batch`): token ids and targets along dim
  1, the inputs the workload passes whole (``ContextParallel.whole_inputs``: a padding mask)
  untouched; every token-wise layer then runs on the rank's tokens unchanged, and attention
  all-gathers keys and values over the cp group with the causal mask built from global
  positions (``planner.models.context``: why all-gather rather than ring attention);
- synchronises gradients over a stage's dp x cp ranks (each cp rank holds the same parameters
  and computes the gradient of its part of the sequence; ZeRO shards over the same ranks, as
  torchtitan's ``dp_shard_cp``): a mean loss is averaged over D c equal parts (each rank's
  mean over its S / c tokens), a ``(sum, count)`` loss summed and divided by the step's count
  (``planner.runtime.loss``), so the gradient is one process's either way.

Stage boundaries carry the rank's share of the sequence (1/c of each activation), so the
static ``PipelineStage`` shapes are the local ones: the boundary examples are computed after the
shards are installed (their forward all-gathers over the cp group, as a step's does).

Refused before any compute (:func:`context_parallel_refusal`): a model that declares no
sequence split (``Workload.context_parallel``: the zoo GPT and the Hugging Face llama family
declare one), a sequence 2c does not divide, sequence parallelism with it (both would cut dim
1; not run here), and per-stage replication (not a Layout with c > 1).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from planner.artifacts.layout import Layout
from planner.artifacts.plan import Plan
from planner.models.context import SequenceShard, set_context
from planner.models.workload import Workload

__all__ = ["context_parallel_refusal", "grad_divisor", "install", "split_batch"]


def context_parallel_refusal(plan: Plan, workload: Workload) -> str:
    """Why the runtime cannot run ``plan``'s context parallelism on ``workload`` ("" when it can)."""
    layout = plan.layout
    c = layout.cp_degree
    if c == 1:
        return ""
    spec = workload.context_parallel
    if spec is None:
        return f"cp_degree {c}: model {workload.name!r} declares no context-parallel split (Workload.context_parallel)"
    if layout.sequence_parallel:
        return f"cp_degree {c} with sequence parallelism: both cut the sequence; this runtime runs one at a time"
    return spec.refusal(c)


def grad_divisor(layout: Layout) -> int:
    """What a stage's summed gradients are divided by: its D replicated pipelines x c cp ranks,
    each of which saw an equal share of the batch's tokens (1 when replicated per stage: a
    stage's copies add up to one pipeline, D = c = 1 there)."""
    return layout.dp_degree * layout.cp_degree


def install(layers: Iterable[torch.nn.Module], shard: SequenceShard) -> None:
    """Run ``layers`` on ``shard`` of each sample's sequence (``planner.models.context``)."""
    for layer in layers:
        set_context(layer, shard)


def split_batch(inputs: Any, targets: Any, workload: Workload, shard: SequenceShard) -> tuple[Any, Any]:
    """The rank's share of a batch: every input tensor (a tuple input's, but for the workload's
    ``whole_inputs``) and the targets cut along dim 1 to the rank's two chunks."""
    spec = workload.context_parallel
    whole = spec.whole_inputs if spec is not None else ()
    if isinstance(inputs, tuple):
        inputs = tuple(v if k in whole else shard.split(v, dim=1) for k, v in enumerate(inputs))
    else:
        inputs = shard.split(inputs, dim=1)
    return inputs, shard.split(targets, dim=1)
