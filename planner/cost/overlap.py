"""Data-parallel communication overlapped with computation, as the stack planned for does it.

A stage's gradient synchronisation (:meth:`planner.cost.CostModel.stage_sync`) is a reduction
(ring all-reduce of the gradients, or with ZeRO a reduce-scatter: half the all-reduce's line,
Patarasuk & Yuan 2009) and, with ZeRO, an all-gather of the updated weights (the other half).
What the :class:`~planner.artifacts.stack.Stack` overlaps decides when each part may run:

- without ``grad_reduce_overlap`` the reduction is one collective started when the stage's
  last backward ends (it overlaps the other stages' cooldown only);
- with it, the stage's layers' gradients are cut into buckets of at most
  ``grad_bucket_bytes`` in the order backward finishes them (last layer first; a larger layer
  is one bucket, priced as ``ceil(bytes / cap)`` collectives), and bucket ``k`` is reduced as
  soon as it is final in the last micro-batch's backward and the previous bucket is done (one
  communication stream, PyTorch DDP, Li et al. 2020 sec. 3.2.3; Megatron-Core
  ``--overlap-grad-reduce``). :func:`overlapped_reduce` replays that on the last backward's
  per-layer times and returns how long before the backward's end the reduction may start
  (``early``); the simulator ends it at ``max(stream free, last backward end - early) +
  total``, which is the replay's own end when the stream is free;
- with ``param_gather_overlap`` (ZeRO) the weights' all-gather leaves the end of the
  iteration: its buckets run in forward order at the start of the next iteration, and each
  layer of the stage's first forward waits only for its own bucket. :func:`overlapped_gather`
  gives the earliest end of that forward after the gather starts: ``max_k (a_k + F_{>=k})``,
  ``a_k`` the end of bucket ``k``'s gather and ``F_{>=k}`` the forward of its layers and
  those after them.

Layer granularity: a layer's gradients are taken as final when its backward (with its
recomputation, re-run just before it) ends, and its weights as needed when its forward
starts. Not modelled: the slowdown of compute kernels that share the GPU with these
concurrent collectives (charged only where tensor-parallel collectives hide behind GEMMs,
``Cluster.overlap_compute_loss``, :mod:`planner.cost.tensor_parallel`: the data-parallel buckets
cross the inter-node fabric at a ninth of NVLink's bandwidth and hold fewer SMs), and buckets
that a framework pads or aligns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["buckets", "overlapped_gather", "overlapped_reduce"]


def buckets(nbytes: Sequence[float], cap_bytes: int) -> list[tuple[int, int, float, int]]:
    """Consecutive items of ``nbytes`` (in the order they become ready) cut into buckets of at
    most ``cap_bytes`` (an item larger than the cap alone): ``(first, last, bytes, collectives)``
    per bucket, ``collectives`` = ``ceil(bytes / cap)`` (1 for a bucket under the cap)."""
    out: list[tuple[int, int, float, int]] = []
    first, size = 0, 0.0
    for i, b in enumerate(nbytes):
        if i > first and size + b > cap_bytes:
            out.append((first, i - 1, size, max(1, math.ceil(size / cap_bytes))))
            first, size = i, 0.0
        size += b
    if nbytes:
        out.append((first, len(nbytes) - 1, size, max(1, math.ceil(size / cap_bytes))))
    return [bk for bk in out if bk[2] > 0]


def overlapped_reduce(
    bwd_ms: Sequence[float], grad_bytes: Sequence[float], ms_per_byte: float, fixed_ms: float, cap_bytes: int
) -> tuple[float, float]:
    """(total ms, early ms) of a bucketed reduction during one backward (see the module
    docstring). ``bwd_ms`` and ``grad_bytes`` per layer in the order backward runs them (last
    layer first); a collective of ``x`` bytes costs ``ms_per_byte x + fixed_ms``."""
    ready = 0.0
    ready_at: list[float] = []
    for t in bwd_ms:
        ready += t
        ready_at.append(ready)
    end = total = 0.0
    for _, last, nbytes, count in buckets(grad_bytes, cap_bytes):
        comm = ms_per_byte * nbytes + fixed_ms * count
        end = max(end, ready_at[last]) + comm
        total += comm
    if total == 0.0:
        return 0.0, 0.0
    tail = end - ready  # after the backward's end
    return total, max(0.0, total - tail)


def overlapped_gather(
    fwd_ms: Sequence[float], weight_bytes: Sequence[float], ms_per_byte: float, fixed_ms: float, cap_bytes: int
) -> tuple[float, float]:
    """(total ms, bound ms) of a bucketed all-gather ahead of one forward: ``bound`` is the
    earliest end of that forward after the gather starts (see the module docstring).
    ``fwd_ms`` and ``weight_bytes`` per layer in forward order."""
    suffix = [0.0] * (len(fwd_ms) + 1)
    for i in range(len(fwd_ms) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + fwd_ms[i]
    done = bound = 0.0
    for first, _, nbytes, count in buckets(weight_bytes, cap_bytes):
        done += ms_per_byte * nbytes + fixed_ms * count
        bound = max(bound, done + suffix[first])
    return done, bound
