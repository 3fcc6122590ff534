"""The published FP8 rows priced with a measured FP8 GEMM efficiency (issue 49 item 5).

Megatron-Bridge's DGX-H100 table (``../shared/reference/published_runs/README.md`` section 6;
the rows: ``benchmarks/published_rows.py``'s :func:`megatron_bridge_rows`): Llama 3 8B (FSDP),
Llama 3 70B and Llama 3.1 405B trained with FP8 current scaling. Each is priced as
``benchmarks/published_runs.py`` prices every row (the published configuration forced, the
shipped bf16 GEMM constants, which never saw these rows), its profile re-priced at
``fp8-current`` by :func:`planner.cost.precision.at_precision` with the settings of
Megatron-Bridge 25.11's performance scripts: every block in FP8 (``first_last_layers_bf16``
off), Transformer Engine's fused cross entropy.

No constant is fitted: the FP8 GEMMs' fraction of the FP8 peak relative to the bf16 GEMMs' of
the bf16 peak (``planner.cost.precision.FP8_GEMM_EFFICIENCY``) is the H100's measured maximum
achievable matmul FLOPS in FP8 over that in BF16 (``FP8_EFFICIENCY_SOURCE``); every row is out
of sample. ``--fit`` prints, for comparison only, the value a fit on all three rows would take
(golden-section search on the squared log time ratio) and the rows at it; it ships nothing.

Then the section's two MoE FP8 rows (Qwen3 30B-A3B on 16 GPUs, Qwen3 235B-A22B on 256) priced as
``benchmarks/published_moe.py`` prices its rows (the published layout forced, the stack preset's
MoE host time, the H100 GEMM constants), the analytic MoE profile at ``fp8-current`` (the routed
experts' grouped GEMMs too: ``planner.cost.precision``), with the settings of Megatron-Bridge
25.11's Qwen3 perf scripts (``scripts/performance/configs/qwen``: no recomputation, the all-to-all
overlapped with the other micro-batch, alltoall dispatch, bf16 gradient reduction, expert TP 1,
every block in FP8); out of sample, like the rest.

``--terms``: per dense row, where its predicted time goes: a transformer block's forward at micro-batch
1 on one GPU of TP 1 split into the FP8 GEMMs, their casts and the rest (attention core, element-wise
bytes), their shares; the busiest pipeline rank's compute per micro-batch; the bubble and the exposed
data-parallel synchronisation of the iteration.

``--bounds``: what no uniform FP8 pricing can do (issue 49/47, the dense rows): each row's ratio with the FP8 GEMMs
at the H100's measured best FP8 matmul (MAMF: 1,402.6 of 1,979 TFLOPS, :data:`MAMF_FP8_TFLOPS`, over the shipped
bf16 ``e_max``), then with that and the quantisation passes free, then at the MAMF times the row's ``--shapes`` wave estimate (a
what-if: no FP8 GEMM is priced by shape); and the relative FP8 efficiency that would price
each row exactly on its own (:func:`fit` on that row). A uniform change of the FP8 GEMMs' or the casts' price moves
every row the same way; the 8B row (predicted slow) and the 405B row (predicted fast) need opposite moves, so the
lines bound what any such change can reach.

``--breakdown``: per dense row, each term's share of the predicted iteration, found by pricing the row again with
that term removed (its marginal seconds; the terms overlap, so they need not add up): the FP8 GEMMs (at a thousand
times their efficiency), the quantisation passes, the collectives inside a node (tensor-parallel; the 8B's ZeRO-3
gathers: NVLink a thousand times faster, no latency), those across nodes (data-parallel, pipeline, context-parallel:
the network likewise), the straggler share (no GPU speed variation), the attention kernel (three times what it saves
at 1.5 x its rate); then the bubble and the optimizer step as the plan reports them, and what is left (element-wise
work, the head, the recomputed blocks' bf16 work), against the published time.

``--shapes``: per dense row, the per-device shapes of a block's FP8 GEMMs (forward, input gradient, weight gradient;
m tokens, n outputs, k the reduction) as Megatron-Core with Transformer Engine runs them: with TP overlap
(Megatron-Bridge's userbuffers configurations) the ring-exchanged GEMMs (the four forward ones, proj's and fc2's input
gradients) run in ``t`` chunks of ``s / (cp t)`` tokens, the bulk-overlapped ones (QKV's and fc1's input gradients) and
the weight gradients whole; each GEMM's share of the block's FP8 FLOPs, the GEMM model's efficiency at the shape (flat:
its fitted ``I_half``) and a wave-quantisation estimate, not measured and not used in any price: the fraction of full
waves of :data:`WAVE_TILE` output tiles over :data:`H100_SMS` SMs.

``--settings``: the 8B row with one of its source's settings undone at a time (Megatron-Bridge v0.2.1, the tag whose
``docs/performance-summary.md`` holds the 25.11 table: ``scripts/performance/configs/llama3/workload_base_configs.py``'s
``LLAMA3_8B_H100_FP8_CS_BASE_CONFIG`` sets ``recompute_num_layers=5``, which ``utils/helpers.py``'s
``set_recompute_overrides`` runs as full recomputation of 5 blocks, method ``block``; the table's FSDP column is the run's
``use_megatron_fsdp`` override, ``optim_grads_params`` sharding, ZeRO 3 here; ``set_common_perf_overrides`` sets
``cross_entropy_fusion_impl = "te"``): whether a setting the row is priced with explains its error.

``--waves``: the H100 rows of every source (bf16 and FP8) with ``--shapes``' FLOP-weighted wave estimate beside their
predicted / published time (GPT blocks: QKV ``3h``, proj, fc1 ``4h``, fc2, split and ring-chunked as ``--shapes`` does):
whether a wave term the FP8 rows would want is borne out by the bf16 rows it would also move.

``--speedup``: each dense row priced in bf16 at the same layout beside its FP8 price and the published time: the FP8
speedup the model prices against the one the published time implies over the bf16 price (the bf16 price holds the
constants the bf16 rows fitted; the FP8 rows' spread is in what FP8 changes).

``--torchao``: an external check of the FP8 pricing itself, by another stack's measurement (not a row of the
table, nothing fitted on it): torchao's float8 README, "Training benchmarks" (pytorch/ao ``torchao/float8/README.md``:
torchtitan, Llama3-8B on 8 H100, batch 1 per GPU, sequence 8,192, ``torch.compile``, FSDP2, per-op SAC; bf16 6,150
tokens/s, tensorwise float8 with float8 all-gather 7,689.5, +25.03%). Priced as torchtitan's rows are (ZeRO 3 over the
8 GPUs, torchtitan's op-level recomputation, the torchtitan-2024 stack, fp32 gradient reduction) on the H100, at bf16
and at fp8-current (Transformer Engine's current scaling: the closest recipe; torchao's tensorwise dynamic scaling is
the same per-tensor scaling, with the casts fused by ``torch.compile``): the FP8 speedup the model prices against the
measured one.

Run: ``python benchmarks/published_fp8.py [--fit] [--terms] [--bounds] [--breakdown] [--shapes] [--settings] [--waves]
[--speedup] [--torchao]``
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import published_moe as pm
import published_runs as pr
from published_rows import Metric, PublishedRun, Recompute, all_rows, megatron_bridge_rows, torchtitan_rows

from planner.artifacts.kinds import OptimizerKind, Precision, ScheduleKind, SolverKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.moe import MoeDispatcher
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.stack import STACKS
from planner.cost import precision
from planner.cost.attention_kernels import efficiency_of
from planner.solve.build import rebuild_plan

GIB = 1024**3
#: the H100 SXM's maximum achievable FP8 matmul (TFLOPS), the FP8 half of precision.FP8_EFFICIENCY_SOURCE
MAMF_FP8_TFLOPS = 1402.6
#: ``--shapes``' wave estimate: the H100 SXM's SMs and a representative cuBLAS output tile (mamf-finder.py's
#: ``gemm_tile_hint`` for NVIDIA, stas00/ml-engineering compute/accelerator/benchmarks)
H100_SMS, WAVE_TILE = 132, (128, 256)
#: ``--bounds``' what-if rate of the quantisation passes: TransformerEngine PR #998's multi-tensor cast-transpose on an
#: H100 ("80% of peak memory bandwidth"; closed unmerged, and not the single-tensor kernel the activations' casts run:
#: an upper end, not a measurement of the shipped kernel, whose PR #101 timing is 39-46%)
CAST_HBM_FRACTION = 0.80
#: ``--breakdown``: the attention kernel's speed-up whose saving, x 3, is its time (a rate 1.5 x: a third off)
ATTENTION_SPEEDUP = 1.5


def priced_ratio(run: PublishedRun, efficiency: float) -> float:
    """Predicted / published time of ``run`` with the FP8 constant at ``efficiency``."""
    precision.FP8_GEMM_EFFICIENCY[run.precision] = efficiency
    pr.profile_for.cache_clear()
    return pr.time_ratio(run, pr.price(run, pr.DEVICE_GEMM[run.device]))


def fit(rows: list[PublishedRun], lo: float = 0.3, hi: float = 2.0, iters: int = 40) -> float:
    """The constant minimising the fit rows' squared log time ratios (golden-section search)."""
    def loss(e: float) -> float:
        return sum(math.log(priced_ratio(r, e)) ** 2 for r in rows)

    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = loss(d)
    return (a + b) / 2


def table(rows: list[PublishedRun], efficiency: float, fitted_on: tuple[str, ...] = precision.FP8_FIT_ROWS) -> list[float]:
    """Print every row at ``efficiency``; the time ratios - 1 of the rows out of sample (not in ``fitted_on``)."""
    print(f"{'row':<18} {'t':>2} {'p':>2} {'v':>2} {'cp':>2} {'d':>3} {'ZeRO':>4} {'published':>10} {'predicted':>10} "
          f"{'ratio':>6} {'GiB':>5} {'fits':>4}  fit?")
    out = []
    for r in rows:
        precision.FP8_GEMM_EFFICIENCY[r.precision] = efficiency
        pr.profile_for.cache_clear()
        p = pr.price(r, pr.DEVICE_GEMM[r.device])
        ratio = pr.time_ratio(r, p)
        fitted = r.label in fitted_on
        if not fitted:
            out.append(ratio - 1)
        print(f"{r.label:<18} {r.t:>2} {r.p:>2} {r.chunks[0]:>2} {r.cp:>2} {r.d:>3} {r.zero:>4} {r.published:>10.5g} "
              f"{p.predicted:>10.5g} {ratio:>6.3f} {p.peak_bytes / GIB:>5.1f} {'yes' if p.fits else 'NO':>4}  "
              f"{'fitted' if fitted else 'out of sample'}")
    return out


_MB_MOE = dict(source="Megatron-Bridge 25.11 (H100)", seq=4096, etp=1, fsdp=False, recompute="none",
               dispatcher=MoeDispatcher.ALLTOALL, overlap=True, optimizer=OptimizerKind.ADAM_MIXED)
_MB_MOE_ASSUMED = ("FP8 current scaling on every block's linear layers and the routed experts' grouped GEMMs "
                   "(first_last_layers_bf16 off: scripts/performance/utils/precision.py); attention core, router, "
                   "embedding and head bf16; tokens dispatched in bf16",
                   "Megatron-Bridge's Qwen3 perf settings (scripts/performance/configs/qwen, 25.11): no recomputation, "
                   "moe_a2a_overlap, alltoall dispatch (no flex backend on H100), bf16 gradient reduction, ETP 1",
                   "distributed optimizer (ZeRO 1); layers split evenly, the embedding and head with the first and last")
#: section 6's MoE FP8-CS rows: step seconds from tokens/s/GPU (GBS x seq / (tokens/s/GPU x GPUs))
MOE_ROWS = (
    pm.MoeRun(label="MB Qwen3 30B-A3B fp8", config="qwen3-30b-a3b", gpus=16, batch=512, microbatch=2, tp=1, ep=8, pp=2,
              vpp=24, published_s=512 * 4096 / (5275 * 16), published_tflops=121,
              assumed=_MB_MOE_ASSUMED + ("VP 24 and MBS 2 as the table gives them (the 25.11 perf preset "
                                         "QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS says VP 12, MBS 1)",), **_MB_MOE),
    pm.MoeRun(label="MB Qwen3 235B fp8", config="qwen3-235b-a22b", gpus=256, batch=2048, microbatch=1, tp=2, ep=32, pp=8,
              vpp=4, published_s=2048 * 4096 / (1575 * 256), published_tflops=233,
              assumed=_MB_MOE_ASSUMED + ("GBS 2,048 (the previous container's figure for the row)",), **_MB_MOE),
)


def moe_profile(run: pm.MoeRun) -> Profile:
    """``run``'s analytic MoE profile re-priced at fp8-current, every block in FP8."""
    return precision.at_precision(pm.profile_for(run.config, run.seq), pm.cluster_for(run), Precision.FP8_CURRENT, 0)


def moe_plan(run: pm.MoeRun) -> Plan:
    """``run``'s published configuration priced at fp8-current (published_moe's pricing, its profile re-priced)."""
    cluster = pm.cluster_for(run)
    profile = moe_profile(run)
    layout = Layout(num_stages=run.pp * run.vpp, virtual_stages_per_rank=run.vpp, dp_degree=run.dp, tp_degree=run.tp,
                    sequence_parallel=run.tp > 1, zero=ZeroStage.OPTIMIZER, ep_degree=run.ep, etp_degree=run.etp)
    starts, full, sel = pm.partition(run, profile)
    request = pm.request_for(run, tp_degrees=(run.tp,), ep_degrees=(run.ep,), etp_degrees=(run.etp,))
    return rebuild_plan(profile, cluster, request, layout=layout, boundaries=starts, recompute=full, selective=sel,
                        microbatch_size=run.microbatch, schedule=ScheduleKind.INTERLEAVED_1F1B, solver=SolverKind.GIVEN)


#: the FP8 MoE row the stack preset's host time per FP8 expert GEMM is fitted on
#: (planner.artifacts.stack.MCORE_FP8_HOST_US_PER_EXPERT_GEMM): 16 experts per device, its floor three
#: times its GPU time, so the constant is identified there whatever the GPU model's error; the 235B row
#: (4 per device) out of sample
FP8_MOE_FIT_ROW = "MB Qwen3 30B-A3B fp8"


def moe_ratio(run: pm.MoeRun, fp8_host_us: float | None = None) -> float:
    """Predicted / published step time of ``run`` with the FP8 expert GEMMs' host time ``fp8_host_us``
    (None: the stack preset's)."""
    priced = run if fp8_host_us is None else dataclasses.replace(run, fp8_host_us=fp8_host_us)
    return moe_plan(priced).predicted.iteration_ms / 1e3 / run.published_s


def fit_fp8_host(rows: tuple[pm.MoeRun, ...]) -> float:
    """The host us per FP8 expert GEMM at which ``rows``' log time ratios sum to zero (bisection)."""
    return pm._balance(lambda us: sum(math.log(moe_ratio(r, us)) for r in rows), hi=2000.0, tol=0.1)


def moe_table() -> list[float]:
    """Print the MoE FP8 rows; the time ratios - 1 of those out of sample."""
    print(f"\n{'row':<21} {'TP':>2} {'EP':>2} {'PP':>2} {'VPP':>3} {'DP':>3} {'b':>1} {'published s':>11} {'predicted':>9} "
          f"{'ratio':>6} {'GiB':>5} {'fits':>4}  fit?")
    out = []
    for run in MOE_ROWS:
        p = moe_plan(run)
        secs = p.predicted.iteration_ms / 1e3
        peak = p.predicted.peak_memory_bytes
        fitted = run.label == FP8_MOE_FIT_ROW
        if not fitted:
            out.append(secs / run.published_s - 1)
        print(f"{run.label:<21} {run.tp:>2} {run.ep:>2} {run.pp:>2} {run.vpp:>3} {run.dp:>3} {run.microbatch:>1} "
              f"{run.published_s:>11.3f} {secs:>9.3f} {secs / run.published_s:>6.3f} {peak / GIB:>5.1f} "
              f"{'yes' if peak <= pm.usable_bytes() else 'NO':>4}  "
              f"{'fitted (FP8 expert GEMMs host time)' if fitted else 'out of sample'}")
    return out


def terms(rows: list[PublishedRun]) -> None:
    """Print where each row's predicted time goes (module docstring, ``--terms``)."""
    print(f"\n{'row':<16} {'block fwd ms':>12} {'FP8 GEMMs':>9} {'casts':>6} {'rest':>6} {'non-GEMM':>8} | "
          f"{'rank ms/mb':>10} {'x M':>4} {'bubble':>6} {'exposed DP ms':>13} {'iteration s':>11} {'published s':>11}")
    for r in rows:
        pr.profile_for.cache_clear()
        bf16 = pr.profile_for(dataclasses.replace(r, precision=Precision.BF16), pr.DEVICE_GEMM[r.device])
        fp8 = pr.profile_for(r, pr.DEVICE_GEMM[r.device])
        blocks = [j for j, layer in enumerate(bf16.layers) if layer.fp8 is not None]
        i = blocks[len(blocks) // 2]  # a block in the middle: FP8 under every recipe
        view = bf16.layers[i].fp8
        assert view is not None
        speedup = 1979 / 989 * precision.FP8_GEMM_EFFICIENCY[r.precision]
        whole, gemm = fp8.layers[i].fwd.at(1), view.fwd.at(1) / speedup
        cast = view.input_bytes_per_sample * precision.QUANTISE_BYTES[r.precision] / (
            3350e9 * float(fp8.metadata["memory_efficiency"]) / 1e3)
        rest = whole - gemm - cast
        plan = pr.price(r, pr.DEVICE_GEMM[r.device]).plan
        lay = plan.layout
        busiest = max(sum(plan.stages[k].fwd_ms + plan.stages[k].bwd_ms + plan.stages[k].recompute_ms
                          for k in lay.stage_indices(rank)) for rank in range(lay.pipeline_size))
        pred = plan.predicted
        print(f"{r.label:<16} {whole:>12.2f} {gemm:>9.2f} {cast:>6.2f} {rest:>6.2f} {(cast + rest) / whole:>8.0%} | "
              f"{busiest:>10.1f} {plan.num_microbatches:>4} {max(0.0, pred.bubble_fraction):>6.1%} {pred.exposed_allreduce_ms:>13.1f} "
              f"{pred.iteration_ms / 1e3:>11.3f} {pr.published_time(r):>11.3f}")


def bounds(rows: list[PublishedRun]) -> None:
    """Print each dense row's time ratio at the two uniform limits of ``--bounds`` (module docstring)."""
    shipped = precision.FP8_GEMM_EFFICIENCY[Precision.FP8_CURRENT]
    quantise = precision.QUANTISE_BYTES[Precision.FP8_CURRENT]
    best = MAMF_FP8_TFLOPS / 1979 / pr.DEVICE_GEMM["h100-80gb"].max_efficiency  # FP8 GEMMs at the FP8 MAMF
    print(f"\n{'predicted / published time':<44} " + " ".join(f"{r.label:>15}" for r in rows))
    try:
        hbm = float(pr.DEVICE_GEMM["h100-80gb"].memory_efficiency)
        for label, eff, q in ((f"shipped (relative efficiency {shipped:.3f})", shipped, quantise),
                              (f"quantisation at {CAST_HBM_FRACTION:.0%} of HBM, not the fit's {hbm:.0%}", shipped,
                               quantise * hbm / CAST_HBM_FRACTION),
                              (f"FP8 GEMMs at the FP8 MAMF ({best:.3f})", best, quantise),
                              ("  and the quantisation passes free", best, 0.0)):
            precision.QUANTISE_BYTES[Precision.FP8_CURRENT] = q
            print(f"{label:<44} " + " ".join(f"{priced_ratio(r, eff):>15.3f}" for r in rows))
        precision.QUANTISE_BYTES[Precision.FP8_CURRENT] = quantise
        waves = [block_wave_fraction(r) for r in rows]
        label = "FP8 GEMMs at the MAMF x each row's waves"
        print(f"{label:<44} "
              + " ".join(f"{priced_ratio(r, best * w):>15.3f}" for r, w in zip(rows, waves))
              + "   (" + " / ".join(f"{w:.3f}" for w in waves) + ": --shapes' estimate, not priced)")
        own = [fit([r], 0.3, 3.0) for r in rows]
        print(f"{'relative efficiency each row alone needs':<44} " + " ".join(f"{e:>15.3f}" for e in own))
    finally:
        precision.QUANTISE_BYTES[Precision.FP8_CURRENT] = quantise
        precision.FP8_GEMM_EFFICIENCY[Precision.FP8_CURRENT] = shipped
        pr.profile_for.cache_clear()


def _seconds(run: PublishedRun) -> float:
    pr.profile_for.cache_clear()
    return pr.price(run, pr.DEVICE_GEMM[run.device]).seconds


def breakdown(rows: list[PublishedRun]) -> None:
    """Print each dense row's terms as ``--breakdown`` finds them (module docstring)."""
    shipped = precision.FP8_GEMM_EFFICIENCY[Precision.FP8_CURRENT]
    quantise = precision.QUANTISE_BYTES[Precision.FP8_CURRENT]
    cluster_for = pr.cluster_for
    fast = 1000.0

    def with_cluster(run: PublishedRun, **fields: float) -> float:
        pr.cluster_for = lambda r: dataclasses.replace(cluster_for(r), **fields)  # type: ignore[assignment]
        try:
            return _seconds(run)
        finally:
            pr.cluster_for = cluster_for

    print(f"\n{'row':<16} {'predicted s':>11} {'FP8 GEMMs':>9} {'casts':>6} {'attention':>9} {'NVLink':>7} {'network':>7} "
          f"{'straggler':>9} {'bubble':>6} {'optimizer':>9} {'rest':>6} | {'published s':>11}")
    for r in rows:
        whole = _seconds(r)
        try:
            precision.FP8_GEMM_EFFICIENCY[Precision.FP8_CURRENT] = shipped * fast
            gemms = whole - _seconds(r)
            precision.FP8_GEMM_EFFICIENCY[Precision.FP8_CURRENT] = shipped
            precision.QUANTISE_BYTES[Precision.FP8_CURRENT] = 0.0
            casts = whole - _seconds(r)
        finally:
            precision.FP8_GEMM_EFFICIENCY[Precision.FP8_CURRENT] = shipped
            precision.QUANTISE_BYTES[Precision.FP8_CURRENT] = quantise
        nominal = efficiency_of(r.stack.attention_kernel, r.device)
        attention = 0.0
        if nominal is not None:  # the attention kernel 1.5 x as fast takes a third of its time off
            faster = dataclasses.replace(r, stack=dataclasses.replace(r.stack, attention_efficiency=(
                nominal[0] * ATTENTION_SPEEDUP, nominal[1])))
            attention = (whole - _seconds(faster)) * ATTENTION_SPEEDUP / (ATTENTION_SPEEDUP - 1.0)
        base = cluster_for(r)
        tp = whole - with_cluster(r, intra_node_bandwidth_gb_per_s=base.intra_node_bandwidth_gb_per_s * fast,
                                  intra_node_latency_us=0.0)
        net = whole - with_cluster(r, inter_node_bandwidth_gb_per_s=base.inter_node_bandwidth_gb_per_s * fast,
                                   inter_node_latency_us=0.0, inter_node_p2p_latency_us=0.0)
        straggler = whole - with_cluster(r, gpu_speed_variation=0.0)
        plan = pr.price(r, pr.DEVICE_GEMM[r.device]).plan
        bubble = max(0.0, plan.predicted.bubble_fraction) * whole
        lay = plan.layout
        optimizer = max(sum(plan.stages[k].optimizer_ms for k in lay.stage_indices(rank))
                        for rank in range(lay.pipeline_size)) / 1e3
        rest = whole - gemms - casts - attention - tp - net - straggler - bubble - optimizer
        print(f"{r.label:<16} {whole:>11.3f} {gemms:>9.3f} {casts:>6.3f} {attention:>9.3f} {tp:>7.3f} {net:>7.3f} {straggler:>9.3f} "
              f"{bubble:>6.3f} {optimizer:>9.3f} {rest:>6.3f} | {pr.published_time(r):>11.3f}")
    pr.profile_for.cache_clear()


def wave_fraction(m: int, n: int) -> float:
    """The fraction of full waves an ``m x n`` output keeps (``--shapes``): tiles / (waves x SMs)."""
    tiles = math.ceil(m / WAVE_TILE[0]) * math.ceil(n / WAVE_TILE[1])
    return tiles / (math.ceil(tiles / H100_SMS) * H100_SMS)


def block_gemm_shapes(run: PublishedRun) -> list[tuple[str, int, int, int, int]]:
    """(name, chunks, m, n, k) of a block's FP8 GEMMs on one device of ``run`` (``--shapes``)."""
    t, cp, h, d = run.t, run.cp, run.hidden, run.hidden // run.heads
    qkv, attn, ffn = (run.heads + 2 * run.kv_heads) * d // t, run.heads * d // t, run.ffn // t
    tokens = run.seq * run.microbatch // cp
    ring = t if t > 1 and run.stack.tp_overlap_forward else 1
    return [("qkv fwd", ring, tokens, qkv, h), ("proj fwd", ring, tokens, h, attn),
            ("fc1 fwd", ring, tokens, 2 * ffn, h), ("fc2 fwd", ring, tokens, h, ffn),
            ("qkv dgrad", 1, tokens, h, qkv), ("proj dgrad", ring, tokens, attn, h),
            ("fc1 dgrad", 1, tokens, h, 2 * ffn), ("fc2 dgrad", ring, tokens, ffn, h),
            ("qkv wgrad", 1, h, qkv, tokens), ("proj wgrad", 1, attn, h, tokens),
            ("fc1 wgrad", 1, h, 2 * ffn, tokens), ("fc2 wgrad", 1, ffn, h, tokens)]


def block_wave_fraction(run: PublishedRun) -> float:
    """The FLOP-weighted fraction of full waves of a block's FP8 GEMMs on one device of ``run`` (``--shapes``)."""
    parts = block_gemm_shapes(run)
    total = sum(2.0 * m * n * k for _, _, m, n, k in parts)
    return 1.0 / sum(2.0 * m * n * k / total / wave_fraction(m // chunks, n) for _, chunks, m, n, k in parts)


def shapes(rows: list[PublishedRun]) -> None:
    """Print each dense row's block GEMM shapes (``--shapes``, module docstring)."""
    for r in rows:
        gemm = pr.DEVICE_GEMM[r.device]
        parts = block_gemm_shapes(r)
        total = sum(2.0 * m * n * k for _, _, m, n, k in parts)
        print(f"\n{r.label} (t {r.t}, cp {r.cp}): {'GEMM':<10} {'chunks':>6} {'m':>6} {'n':>6} {'k':>6} {'FLOPs':>6} "
              f"{'model eff':>9} {'waves':>6}")
        for name, chunks, m, n, k in parts:
            rows_each = m // chunks
            share = 2.0 * m * n * k / total
            waves = wave_fraction(rows_each, n)
            print(f"{'':<{len(r.label) + 19}}{name:<10} {chunks:>6} {rows_each:>6} {n:>6} {k:>6} {share:>6.1%} "
                  f"{gemm.efficiency(rows_each, n, k):>9.3f} {waves:>6.2f}")
        print(f"{'':<{len(r.label) + 19}}FLOP-weighted fraction of full waves: {block_wave_fraction(r):.3f} (estimate, not priced)")


def settings(rows: list[PublishedRun]) -> None:
    """Print the 8B row with each of its source's settings undone in turn (``--settings``, module docstring)."""
    run = next(r for r in rows if r.t == 1 and r.p == 1)
    cases = (("as the source ran it (5 blocks recomputed, FSDP, TE cross entropy)", run),
             ("no recomputation", dataclasses.replace(run, recompute=Recompute.NONE, recompute_layers=0)),
             ("ZeRO 1 (distributed optimizer) in place of FSDP", dataclasses.replace(run, zero=1)),
             ("torch's fp32 cross entropy in place of TE's fused one", dataclasses.replace(run, fused_cross_entropy=False)))
    print(f"\n{run.label}: {'setting':<66} {'ratio':>6} {'GiB':>5}")
    for label, case in cases:
        pr.profile_for.cache_clear()
        p = pr.price(case, pr.DEVICE_GEMM[case.device])
        print(f"{'':<{len(run.label) + 2}}{label:<66} {pr.time_ratio(case, p):>6.3f} {p.peak_bytes / GIB:>5.1f}")
    pr.profile_for.cache_clear()


def gpt_block_shapes(run: PublishedRun) -> list[tuple[str, int, int, int, int]]:
    """(name, chunks, m, n, k) of a GPT block's GEMMs on one device of ``run``, as :func:`block_gemm_shapes` splits them."""
    t, h = run.t, run.hidden
    tokens = run.seq * run.microbatch // run.cp
    ring = t if t > 1 and run.stack.tp_overlap_forward else 1
    return [("qkv fwd", ring, tokens, 3 * h // t, h), ("proj fwd", ring, tokens, h, h // t),
            ("fc1 fwd", ring, tokens, 4 * h // t, h), ("fc2 fwd", ring, tokens, h, 4 * h // t),
            ("qkv dgrad", 1, tokens, h, 3 * h // t), ("proj dgrad", ring, tokens, h // t, h),
            ("fc1 dgrad", 1, tokens, h, 4 * h // t), ("fc2 dgrad", ring, tokens, 4 * h // t, h),
            ("qkv wgrad", 1, h, 3 * h // t, tokens), ("proj wgrad", 1, h // t, h, tokens),
            ("fc1 wgrad", 1, h, 4 * h // t, tokens), ("fc2 wgrad", 1, 4 * h // t, h, tokens)]


def waves(device: str = "h100-80gb") -> None:
    """Print every ``device`` row's wave estimate beside its predicted / published time (``--waves``)."""
    print(f"\n{'row':<22} {'t':>2} {'cp':>2} {'b':>2} {'precision':>12} {'waves':>6} {'ratio':>6}")
    bf16: list[tuple[float, float]] = []
    for r in all_rows():
        if r.device != device:
            continue
        pr.profile_for.cache_clear()
        priced = pr.price(r, pr.DEVICE_GEMM[r.device])
        ratio = pr.time_ratio(r, priced)
        at = dataclasses.replace(r, microbatch=priced.plan.microbatch_size)  # the micro-batch the priced plan runs
        parts = block_gemm_shapes(at) if r.arch == "llama" else gpt_block_shapes(at)
        total = sum(2.0 * m * n * k for _, _, m, n, k in parts)
        fraction = 1.0 / sum(2.0 * m * n * k / total / wave_fraction(m // chunks, n) for _, chunks, m, n, k in parts)
        print(f"{r.label:<22} {r.t:>2} {r.cp:>2} {at.microbatch:>2} {r.precision.value:>12} {fraction:>6.3f} {ratio:>6.3f}")
        if not r.precision.fp8:
            bf16.append((fraction, ratio))
    pr.profile_for.cache_clear()
    if len(bf16) > 2:
        print(f"the bf16 rows' wave estimate against their ratio: Pearson r = "
              f"{statistics.correlation(*zip(*bf16)):+.2f} over {len(bf16)} rows (an unpriced wave loss would make it "
              "positive: the rows with fewer full waves predicted fast)")


def speedup(rows: list[PublishedRun]) -> None:
    """Print each dense row's bf16 and FP8 prices at its layout and the published time (``--speedup``)."""
    print(f"\n{'row':<16} {'bf16 priced s':>13} {'FP8 priced s':>12} {'published s':>11} {'priced speedup':>14} "
          f"{'published / bf16 priced':>23}")
    for r in rows:
        pr.profile_for.cache_clear()
        bf16 = pr.price(dataclasses.replace(r, precision=Precision.BF16), pr.DEVICE_GEMM[r.device]).seconds
        pr.profile_for.cache_clear()
        fp8 = pr.price(r, pr.DEVICE_GEMM[r.device]).seconds
        published = pr.published_time(r)
        print(f"{r.label:<16} {bf16:>13.3f} {fp8:>12.3f} {published:>11.3f} {bf16 / fp8:>14.3f} {bf16 / published:>23.3f}")
    pr.profile_for.cache_clear()


#: torchao's float8 training benchmark on 8 H100 (``--torchao``): tokens/s per GPU... as the README gives them
#: (median tokens/second of the run), bf16 and tensorwise float8 with float8 all-gather
TORCHAO_TOKENS_PER_S = {Precision.BF16: 6150.0, Precision.FP8_CURRENT: 7689.5}


def torchao_run(precision_: Precision) -> PublishedRun:
    """torchao's Llama3-8B float8 benchmark (``--torchao``) as a :class:`PublishedRun` at ``precision_``: torchtitan's
    op-level-SAC Llama 3 8B row moved to 8 H100s."""
    base = next(r for r in torchtitan_rows() if r.label == "T L3 8B b1 sel-op")
    return dataclasses.replace(base, source="torchao float8 README (8 H100)", publication="torchao float8 README",
                               label=f"torchao L3 8B {precision_.value}", device="h100-80gb", d=8, batch=8,
                               metric=Metric.TOKENS_PER_S, published=TORCHAO_TOKENS_PER_S[precision_],
                               flops_per_iteration=base.flops_per_iteration * 8 / 64, precision=precision_,
                               bf16_edge_blocks=0 if precision_.fp8 else None, published_mfu=0.0)


def _torchao_seconds(p: Precision) -> float:
    run = torchao_run(p)
    pr.profile_for.cache_clear()
    return pr.price(run, pr.DEVICE_GEMM[run.device]).seconds


def torchao_check() -> tuple[float, float]:
    """Print the ``--torchao`` check; (priced FP8 speedup, measured FP8 speedup). Then, for comparison only, the
    priced speedup with the quantisation passes' amax read fused away (2 bytes moved per bf16 byte, as
    ``torch.compile`` fuses the amax into the producer) and with the passes free."""
    print(f"\n{'torchao Llama3-8B, 8 H100':<26} {'published tok/s':>15} {'predicted':>9} {'ratio':>6} {'GiB':>5}")
    seconds = {}
    for p in (Precision.BF16, Precision.FP8_CURRENT):
        run = torchao_run(p)
        pr.profile_for.cache_clear()
        priced = pr.price(run, pr.DEVICE_GEMM[run.device])
        seconds[p] = priced.seconds
        print(f"{run.label:<26} {run.published:>15.1f} {priced.predicted:>9.1f} {pr.time_ratio(run, priced):>6.3f} "
              f"{priced.peak_bytes / GIB:>5.1f}")
    ours = seconds[Precision.BF16] / seconds[Precision.FP8_CURRENT]
    theirs = TORCHAO_TOKENS_PER_S[Precision.FP8_CURRENT] / TORCHAO_TOKENS_PER_S[Precision.BF16]
    print(f"FP8 speedup over bf16: priced {ours:.3f}, measured {theirs:.3f} ({100 * (ours / theirs - 1):+.1f}%)")
    quantise = precision.QUANTISE_BYTES[Precision.FP8_CURRENT]
    try:
        for label, q in (("the amax read fused (2.0 bytes per bf16 byte)", 2.0), ("the quantisation passes free", 0.0)):
            precision.QUANTISE_BYTES[Precision.FP8_CURRENT] = q
            print(f"  for comparison, not shipped: with {label}: priced "
                  f"{seconds[Precision.BF16] / _torchao_seconds(Precision.FP8_CURRENT):.3f}")
    finally:
        precision.QUANTISE_BYTES[Precision.FP8_CURRENT] = quantise
        pr.profile_for.cache_clear()
    return ours, theirs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="also print what a fit on the dense rows would give (not shipped)")
    ap.add_argument("--terms", action="store_true", help="also print where each row's time goes (the MoE rows: one layer)")
    ap.add_argument("--bounds", action="store_true", help="also print the dense rows at the uniform limits of FP8 pricing")
    ap.add_argument("--breakdown", action="store_true", help="also print each dense row's terms (marginal seconds)")
    ap.add_argument("--shapes", action="store_true", help="also print each dense row's per-device FP8 GEMM shapes")
    ap.add_argument("--settings", action="store_true", help="also print the 8B row with each source setting undone")
    ap.add_argument("--waves", action="store_true", help="also print every H100 row's wave estimate beside its ratio")
    ap.add_argument("--speedup", action="store_true", help="also print each dense row's bf16 price beside its FP8 one")
    ap.add_argument("--torchao", action="store_true", help="also check the priced FP8 speedup against torchao's measured one")
    args = ap.parse_args()
    rows = megatron_bridge_rows()
    shipped = precision.FP8_GEMM_EFFICIENCY[Precision.FP8_CURRENT]
    edges = sorted({precision.BF16_EDGE_BLOCKS[r.precision] if r.bf16_edge_blocks is None else r.bf16_edge_blocks
                    for r in rows})
    print(f"fp8-current: FP8 GEMMs at {shipped:.4f} x the bf16 GEMMs' fraction of peak (measured: "
          f"{precision.FP8_EFFICIENCY_SOURCE}), x {1979 / 989:.3f} the H100's bf16 peak; quantisation "
          f"{precision.QUANTISE_BYTES[Precision.FP8_CURRENT]:.2f} bytes moved per bf16 byte; "
          f"{'/'.join(map(str, edges))} block(s) bf16 at each end\n")
    errors = table(rows, shipped)
    moe = moe_table()
    print()
    for name, errs, fitted in (("dense FP8 rows", errors, 0), ("all FP8 rows (with the MoE ones)", errors + moe, 1)):
        mags = [abs(e) for e in errs]
        print(f"{name}: {len(errs) + fitted}, fitted on {fitted}, out of sample median |error| "
              f"{100 * statistics.median(mags):.1f}%, worst {100 * max(mags):.1f}%, mean signed "
              f"{100 * statistics.fmean(errs):+.1f}%")
    if args.terms:
        terms(rows)
        print()
        pm.terms_report(MOE_ROWS, plan_of=moe_plan, profile_of=moe_profile)
    if args.bounds:
        bounds(rows)
    if args.breakdown:
        breakdown(rows)
    if args.shapes:
        shapes(rows)
    if args.settings:
        settings(rows)
    if args.waves:
        waves()
    if args.speedup:
        speedup(rows)
    if args.torchao:
        torchao_check()
    if args.fit:
        moe = STACKS["megatron-core-0.8"].moe
        fit_rows = tuple(r for r in MOE_ROWS if r.label == FP8_MOE_FIT_ROW)
        us = fit_fp8_host(fit_rows)
        others = "; ".join(f"{r.label} {moe_ratio(r, us):.3f}" for r in MOE_ROWS if r.label != FP8_MOE_FIT_ROW)
        print(f"\nFP8 expert GEMMs' host time fitted on {FP8_MOE_FIT_ROW}: {us:.1f} us "
              f"(shipped {moe.fp8_host_us_per_expert_gemm:g}); out of sample at it: {others}")
        fitted = fit(rows)
        print(f"\nfor comparison, not shipped: FP8_GEMM_EFFICIENCY fitted on the {len(rows)} dense rows: {fitted:.4f}\n")
        table(rows, fitted, tuple(r.label for r in rows))
        precision.FP8_GEMM_EFFICIENCY[Precision.FP8_CURRENT] = shipped
    return 0


if __name__ == "__main__":
    sys.exit(main())
