"""ZeRO stage 3 (FSDP): the parameters sharded too, gathered layer by layer every micro-batch.

What is priced (Rajbhandari et al. 2020 sec. 5, ``P_os+g+p``; Zhao et al. 2023 "PyTorch FSDP"
sec. 3; torch's ``fully_shard`` (FSDP2) as torchtitan applies it, one unit per transformer
block): a stage's weights, gradients and optimizer state are sharded over its ``d``
data-parallel ranks. Each micro-batch, layer ``k`` all-gathers its weights before its forward
(``a_k``), frees them after it (``reshard_after_forward=True``), gathers them again before its
backward (``a_k``) and reduce-scatters its gradients after its backward (``r_k``), so gradients
are never whole at the peak (as under ZeRO 2, :mod:`planner.cost.sharding`): ``a_k = (d-1)/d x w N_k / beta + (d-1) alpha``, half the ring
all-reduce line of the data-parallel group (Patarasuk & Yuan 2009), ``r_k`` the same with the
gradient bytes ``g N_k``; ``w``, ``g`` bytes per parameter of weights and gradients, ``N_k`` the
layer's parameters (a layer without parameters moves nothing). One line for the whole layout:
its slowest data-parallel group's, so that every stage of a configuration is priced alike.

Times per micro-batch (one communication stream; a layer's weights are needed when its
forward or backward starts, its gradients final when its backward ends):

- without :attr:`~planner.artifacts.stack.Stack.fsdp_prefetch`: each collective waits for and
  is waited for by its layer: ``F' = F + sum_k a_k``, ``B' = B + sum_k (a_k + r_k)``;
- with it (FSDP2's implicit forward and explicit backward prefetch of one unit): layer
  ``k + 1``'s gather runs beside layer ``k``'s forward, and layer ``k``'s backward runs beside
  the gather of layer ``k - 1`` and the reduce-scatter of layer ``k + 1``:

      F'(i, j) = a_i + sum_{k=i}^{j-2} max(f_k, a_{k+1}) + f_{j-1}
      B'(i, j) = a_{j-1} + sum_{k=i}^{j-1} max(b_k, [k > i] a_{k-1} + [k < j-1] r_{k+1}) + r_i

Both are a sum over the stage's layers of one per-layer term plus terms at its first and last
layer (and a correction for a one-layer stage): :class:`FsdpTerms` holds them, so the chain DP
(prefix sums), the CP-SAT model (linear in its first/last indicators) and the brute force (via
:func:`replay`, an event replay written separately) price the same.

A recomputed layer re-runs its forward (or its selective level) inside its backward with the
weights gathered for that backward (no extra gather; torch.utils.checkpoint, Megatron's
``--recompute-granularity full``: the re-run precedes the layer's backward on the compute
stream), so with prefetching it runs beside the same collectives as that backward: inside a
stage layer ``k`` takes ``max(b_k + rc_k, a_{k-1} + r_{k+1})``, i.e. ``max(b_k, ...)`` plus what
the backward's slack leaves of ``rc_k``. The price every solver reads
(:meth:`CostModel.recompute_prices <planner.cost.stage.StageCosts.recompute_prices>`) is
``max(0, rc_k - s_k)`` with

    s_k = max(0, min(a_{k-1}, r_k) + min(r_{k+1}, a_k) - b_k)     (:attr:`FsdpTerms.slack`),

per layer, so additive as the solvers' recompute prices are. Where a layer's gather and
reduce-scatter move the same bytes as its neighbours' (blocks alike, gradients in the weights'
precision) this is the interior's slack exactly; otherwise less. The ``min`` keeps the price
sound at a stage's edges, where one of the two collectives is not beside the backward: the
first layer's own exposed reduce-scatter ``r_k`` and the last layer's own exposed gather
``a_k`` stand in for the missing one, so a stage never costs less than its layers' compute and
recomputation alone (what the search's floors assume). Without prefetching nothing runs beside
a backward: no slack.

Memory per device of a stage of ``N`` parameters (FSDP2 frees a unit's gathered weights after
its forward and after its backward, and its whole gradient after the reduce-scatter):

    (w + g + o) N / d  +  u x max_k N_k x (w + g),

``u`` = 2 units in flight with prefetching (the one computing, the one gathered ahead; FSDP2
prefetches one unit), 1 without, each bounded by the stage's largest layer.

Under a split backward (ZB-H1, ZB-H2, ZBV, DualPipe-V: the input-gradient pass ``I`` and the
weight-gradient pass ``W`` of a micro-batch run apart, other micro-batches' passes between them)
the weights are gathered a third time, for ``W`` (:func:`weight_pass_gather_ms`): ``W`` computes
``dW`` from the saved inputs and output gradients, but torch's autograd nodes read the saved
weight there too -- the CPU kernels of LayerNorm, GroupNorm and BatchNorm take its data pointer
in a backward asked for the weight's gradient alone, a weight that enters nonlinearly needs its
value, and torch's own action runtime asserts the stage unsharded before ``BACKWARD_WEIGHT``
(``_assert_unsharded``). ``W``'s gathers are priced as a forward's are against its compute
(``w_k`` = ``b_k`` x the layer's weight-gradient share): ``sum_k a_k`` without prefetching,
``a_{j-1} + sum max(w_k, a_{k-1}) - sum w_k`` with it. The first stage runs no ``I`` in torch (its
``W`` is one whole backward, with ``I``'s gather) unless it rebuilds recomputed layers there
(``planner.runtime.recompute``): two gathers there, three where it recomputes. The chain
solvers' tables price two gathers (the plan's stages and the simulator three).

Not priced as ZeRO 3: weights kept gathered across a stage's micro-batches (FSDP's
``reshard_after_forward=False``): whole weights, gradients reduce-scattered every micro-batch --
ZeRO 2 here (:mod:`planner.cost.sharding`), and ZeRO 3 is the resharding one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.artifacts.layout import Layout

__all__ = ["FsdpTerms", "fsdp_terms", "gathers_per_microbatch", "hsdp_groups", "replay", "units_in_flight",
           "weight_pass_gather_ms", "working_set_matrix"]


def hsdp_groups(layout: Layout, stage_idx: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """HSDP's two groups of stage ``stage_idx`` at tensor-parallel shard 0 (``Layout.shard_group_size``):
    the first shard group (consecutive ranks of the gradient group: gathers and reduce-scatters
    run inside it) and the ranks holding its first rank's shard in every group (the all-reduce
    of the gradient shards across them)."""
    ranks = layout.grad_group(stage_idx)
    g = layout.shard_group_size or len(ranks)
    return ranks[:g], ranks[::g]


def units_in_flight(prefetch: bool) -> int:
    """Layers whose weights are gathered at once: 2 with prefetching, else 1."""
    return 2 if prefetch else 1


@dataclass(frozen=True, slots=True)
class FsdpTerms:
    """Per-layer terms of ``F'`` and ``B'`` (module docstring): for a stage ``[i, j)``,
    ``base[i:j].sum() + head[i] + tail[j - 1] + ([j - 1 == i] solo[i])``."""

    fwd_base: np.ndarray
    fwd_head: np.ndarray
    fwd_tail: np.ndarray
    fwd_solo: np.ndarray
    bwd_base: np.ndarray
    bwd_head: np.ndarray
    bwd_tail: np.ndarray
    bwd_solo: np.ndarray
    gather: np.ndarray  # a_k, per layer
    scatter: np.ndarray  # r_k, per layer
    slack: np.ndarray  # s_k: the collectives beside layer k's backward beyond it (module docstring), per layer

    @property
    def base(self) -> np.ndarray:
        out: np.ndarray = self.fwd_base + self.bwd_base
        return out

    @property
    def head(self) -> np.ndarray:
        out: np.ndarray = self.fwd_head + self.bwd_head
        return out

    @property
    def tail(self) -> np.ndarray:
        out: np.ndarray = self.fwd_tail + self.bwd_tail
        return out

    @property
    def solo(self) -> np.ndarray:
        out: np.ndarray = self.fwd_solo + self.bwd_solo
        return out

    def stage(self, start: int, stop: int) -> tuple[float, float]:
        """(F', B') of the stage ``[start, stop)``, ms per micro-batch."""
        last = stop - 1
        one = start == last
        fwd = float(self.fwd_base[start:stop].sum() + self.fwd_head[start] + self.fwd_tail[last])
        bwd = float(self.bwd_base[start:stop].sum() + self.bwd_head[start] + self.bwd_tail[last])
        if one:
            fwd += float(self.fwd_solo[start])
            bwd += float(self.bwd_solo[start])
        return fwd, bwd

    def matrix(self) -> np.ndarray:
        """``F' + B'`` of every stage ``[i, j)`` as an ``(L + 1) x (L + 1)`` matrix (``j > i``
        meaningful)."""
        L = len(self.fwd_base)
        prefix = np.concatenate([[0.0], np.cumsum(self.base)])
        head = np.concatenate([self.head, [0.0]])
        tail = np.concatenate([[0.0], self.tail])  # tail of layer j - 1, indexed by j
        out = prefix[None, :] - prefix[:, None] + head[:, None] + tail[None, :]
        idx = np.arange(L)
        out[idx, idx + 1] += self.solo
        result: np.ndarray = out
        return result


def fsdp_terms(
    fwd: np.ndarray, bwd: np.ndarray, gather: np.ndarray, scatter: np.ndarray, prefetch: bool
) -> FsdpTerms:
    """The terms of ``F'`` and ``B'`` from per-layer forward, backward, gather and
    reduce-scatter times (module docstring)."""
    zero = np.zeros_like(fwd)
    if not prefetch:
        return FsdpTerms(fwd + gather, zero, zero, zero, bwd + gather + scatter, zero, zero, zero, gather, scatter, zero)
    nxt_a = np.concatenate([gather[1:], [0.0]])  # a_{k+1}
    prev_a = np.concatenate([[0.0], gather[:-1]])  # a_{k-1}
    nxt_r = np.concatenate([scatter[1:], [0.0]])  # r_{k+1}
    mf = np.maximum(fwd, nxt_a)
    mb = np.maximum(bwd, prev_a + nxt_r)
    f_head, f_tail = gather, fwd - mf
    b_head = np.maximum(bwd, nxt_r) + scatter - mb  # layer i: no gather of i - 1 beside it
    b_tail = gather + np.maximum(bwd, prev_a) - mb  # layer j - 1: no reduce-scatter of j beside it
    # one layer: a + f (forward) and a + b + r (backward), less what base + head + tail gave
    f_solo = (gather + fwd) - (mf + f_head + f_tail)
    b_solo = (gather + bwd + scatter) - (mb + b_head + b_tail)
    own_a, own_r = gather, scatter
    slack = np.maximum(0.0, np.minimum(prev_a, own_r) + np.minimum(nxt_r, own_a) - bwd)
    return FsdpTerms(mf, f_head, f_tail, f_solo, mb, b_head, b_tail, b_solo, gather, scatter, slack)


def replay(
    fwd: list[float], bwd: list[float], gather: list[float], scatter: list[float], prefetch: bool
) -> tuple[float, float]:
    """(F', B') of one stage replayed event by event: the layers' computation and one FIFO
    communication stream (the oracle :class:`FsdpTerms` is checked against). A layer starts
    when the previous one ended and its gather is done; with ``prefetch`` the next layer's
    gather is issued when a layer starts, else when it ends; a layer's reduce-scatter is issued
    when its backward ends."""
    n = len(fwd)
    comm = ready = gather[0]
    end = 0.0
    for k in range(n):
        start = max(end, ready)
        end = start + fwd[k]
        if k + 1 < n:
            comm = max(comm, start if prefetch else end) + gather[k + 1]
            ready = comm
    fwd_total = end
    comm = ready = gather[n - 1]
    end = 0.0
    for k in range(n - 1, -1, -1):
        start = max(end, ready)
        if prefetch and k > 0:
            comm = max(comm, start) + gather[k - 1]
            ready = comm
        end = start + bwd[k]
        comm = max(comm, end) + scatter[k]
        if not prefetch and k > 0:
            comm = comm + gather[k - 1]
            ready = comm
    return fwd_total, max(end, comm)


def working_set_matrix(param_count: np.ndarray, bytes_per_param: float, prefetch: bool) -> np.ndarray:
    """``u x max_{k in [i, j)} N_k x (w + g)`` for every stage ``[i, j)`` (module docstring)."""
    L = len(param_count)
    out = np.zeros((L + 1, L + 1))
    counts = param_count.astype(float)
    for i in range(L):
        out[i, i + 1:] = np.maximum.accumulate(counts[i:])
    result: np.ndarray = out * units_in_flight(prefetch) * bytes_per_param
    return result


def gathers_per_microbatch(split_backward: bool, first_stage: bool, rebuilds: bool) -> int:
    """Times a stage's weights are gathered per micro-batch: for its forward and its backward,
    and under a split backward once more for ``W``, but on the first stage only where it
    ``rebuilds`` recomputed layers at its ``I`` (module docstring)."""
    return 2 + int(split_backward and (not first_stage or rebuilds))


def weight_pass_gather_ms(wgrad: np.ndarray, gather: np.ndarray, prefetch: bool, start: int, stop: int) -> float:
    """What the third gather of a split backward (module docstring) adds to the W pass of the
    stage ``[start, stop)``, ms per micro-batch: its gathers against its per-layer compute
    ``wgrad`` as a forward's (``F'`` less the compute)."""
    zero = np.zeros_like(wgrad)
    with_gathers, _ = fsdp_terms(wgrad, zero, gather, zero, prefetch).stage(start, stop)
    return max(0.0, with_gathers - float(wgrad[start:stop].sum()))
