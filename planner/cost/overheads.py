"""Overheads a training run pays besides its kernels and its modelled communication, each priced
from a cited measurement, never a fitted factor (issue 47). Four named terms; a plan's
:attr:`~planner.artifacts.plan_summary.Prediction.overheads` says how much each adds to its
iteration (:func:`planner.solve.account.with_accounts` prices the plan with each one off):

- :attr:`OverheadKind.NCCL_COLLECTIVES`: collectives priced by NCCL's own tuning model where the
  cluster says its collectives are NCCL's (``Cluster.collective_model``): data-parallel ones across
  nodes pay its per-step network latency of rings, or the tree it switches to past a few dozen
  nodes at 92% or less of the bandwidth; inside a node its NVLink step latency, below the
  alpha-beta ring's per-step small-message latency (:mod:`planner.cost.collectives`). The term is
  the iteration with NCCL's model less with alpha-beta rings: it can be negative where the plan's
  collectives are mostly inside nodes, and large on a tensor-parallel plan. There the alpha-beta
  ring is the model that is off for NCCL, not NCCL's: it charges the link's small-message latency
  (10 us on the A100 presets, nccl-tests' time of a whole small all-reduce on NVLink) at every one
  of its ``2 (t - 1)`` steps, 140 us per all-reduce over 8 GPUs, as a ring of separate messages
  (gloo's) pays it; NCCL runs the ring's steps in one kernel, pipelined, and its tuning model prices
  them 8.4 us + 14 x 3.4 us = 56 us at the Simple protocol it uses for messages of megabytes (its
  LL protocol, for small ones, 6.6 + 14 x 0.6 = 15 us: the nccl-tests figure). Llama-3 70B at T = 8
  on 16 A100s (seq 8192, 128 MiB per collective, M = 512): ~119,000 tensor-parallel collectives on
  the busiest rank x 84 us = -10.0 s, 1.2% of the iteration; the printed line names the cause;
- :attr:`OverheadKind.P2P_LATENCY`: a pipeline send or receive between nodes takes NCCL's measured
  send/recv time for a small message (``Cluster.inter_node_p2p_latency_us``, 31 us on InfiniBand
  where the link's own latency is 5 us), every micro-batch and chunk boundary;
- :attr:`OverheadKind.HOST`: the CPU issues every kernel (Python, the framework's dispatcher, the
  launch), ``Stack.host_us_per_kernel`` each; a layer's forward or backward pass cannot end before
  its kernels are issued, so it takes ``max(GPU time, kernels x host time)``
  (:func:`planner.cost.host.host_floor_ms`): small micro-batches and small layers become host-bound;
- :attr:`OverheadKind.STRAGGLER`: a synchronous job runs at the pace of its slowest GPU. GPUs of one
  model differ in speed (Sinha et al. SC'22: 8% average spread between a cluster's slowest and
  fastest GPU, ``Cluster.gpu_speed_variation``); taken as normally distributed, the spread over
  the ``K`` GPUs a study measured is about ``2 sigma z(K)`` and the slowest of a job's ``N`` GPUs is
  ``sigma z(N)`` behind the median, ``z(N)`` the expected largest of ``N`` standard normal draws
  (Blom's approximation, ``Phi^-1((N - 0.375) / (N + 0.25))``). So the iteration grows by the share
  ``variation / 2 x z(N) / z(K)`` (:func:`straggler_fraction`): 1.4% on 8 GPUs, 2.4% on 64, 3.8%
  on 16,384 (K = 27,648, Summit's GPUs, the largest cluster Sinha et al. measured).

The host's kernel counts behind :attr:`OverheadKind.HOST` (per analytic layer kind, FP8's
quantisation kernels, an MoE layer's per-expert GEMMs and host times, DeepEP's internode notify) are
:mod:`planner.cost.host`'s; this module prices the stragglers.
"""

from __future__ import annotations

from statistics import NormalDist

from planner.artifacts.cluster import Cluster
from planner.artifacts.kinds import OverheadKind

__all__ = [
    "OverheadKind",
    "straggler_fraction",
    "z_max",
]


#: the GPUs of the cluster Sinha et al. 2022 measured the 8% spread over (Summit: 4,608 nodes x 6 V100s)
SINHA_CLUSTER_GPUS = 27_648


def z_max(n: int) -> float:
    """The expected largest of ``n`` standard normal draws (Blom's approximation; 0 for one)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def straggler_fraction(cluster: Cluster, num_devices: int, variation: float | None = None) -> float:
    """The share by which a synchronous job on ``num_devices`` GPUs of ``cluster`` runs slower than
    its median GPU would (module docstring); ``variation``: the spread to use instead of the
    cluster's."""
    spread = cluster.gpu_speed_variation if variation is None else variation
    if not spread or num_devices <= 1:
        return 0.0
    return spread / 2.0 * z_max(num_devices) / z_max(SINHA_CLUSTER_GPUS)
