"""Published mixture-of-experts training runs priced by the cost model, and the planner's own plan beside each.

Rows (``../shared/reference/published_runs/README.md``): section 5, the Megatron-MoE-ModelZoo
Qwen3-235B-A22B table on 256 H100s (step seconds), and section 6's BF16 GPT-OSS 120B row on 64
H100s (tokens/s/GPU, as step seconds; its FP8 rows belong to the precision work). Each is priced
with its published layout forced (``rebuild_plan``): TP, EP, ETP (EDP derived), PP with VPP
chunks per rank, DP, FSDP (ZeRO 3 over DP for the rest, over EDP for the experts) or the
distributed optimizer (ZeRO 1), micro-batch size, recomputation ("norm, act": every MoE layer's
selective level, Megatron-Core's ``--recompute-modules moe_act layernorm``; "full": every block
recomputed), the dispatcher (DeepEP or NCCL's all-to-all) and the 1F1B all-to-all overlap, tokens
force-balanced (benchmark mode), on the ``megatron-core`` stack; what the source leaves out is
assumed and printed. The profiles are analytic from the published Hugging Face configs
(``configs/qwen3-235b-a22b.json``, ``configs/gpt-oss-120b.json``; ``planner.profiling.analytic.moe``),
the H100 GEMM model and the cluster's links as shipped.

Constants: two MoE constants, each fitted on one row (:data:`FIT_ROWS`, a third of the six; least
squares in log ratio), the other four out of sample: the host time of an MoE layer's forward +
backward in eager Megatron-Core beyond issuing its kernels (``MoeStack.host_ms_per_layer`` of the
``megatron-core`` preset, ``planner.artifacts.stack.MCORE_MOE_HOST_MS_PER_LAYER``; with the layer's
kernels at the stack's host time per kernel, the floor of its passes, ``planner.cost.overheads``),
on the DeepEP row whose GPU time is least (TP 4), and what the alltoall dispatcher adds to it
(``MoeStack.alltoall_host_ms_per_layer``, ``MCORE_ALLTOALL_HOST_MS_PER_LAYER``) on the ModelZoo's
alltoall row; ``--fit`` refits them and prints leave-one-source-out (Megatron-Bridge's GPT-OSS row at
the constants fitted on the ModelZoo's rows, and the ModelZoo's rows at one floor fitted on GPT-OSS).
The two DeepEP link fractions are DeepEP's published micro-benchmarks, and DeepEP's internode
notify before each forward dispatch (on the GPU's forward, hidden under the 1F1B overlap, and on
the host's, where the expert group spans nodes: the two EP 32 rows) DeepSeek's published training
profile's "about 1 ms" (``planner.cost.experts.DEEPEP_INTERNODE_NOTIFY_MS``, cited, not fitted;
``--fit`` prints what a fit on the row without the overlap would take and the overlapped row at
it); everything else is the dense model's (the H100 GEMM model fitted on 3 of the 9 Megatron-LM
README rows, the cluster preset's datasheet links).

Layer splits: Megatron places the embedding and the head with the first and last decoder layers
unless told otherwise; the Qwen3 layouts divide the profile's 96 layers (embedding, 94 blocks,
head) evenly (PP 8 x VPP 4: 3 each; PP 32 x VPP 3: one each, the embedding and the head pipeline
slots of their own, ``--pipeline-model-parallel-layout``), GPT-OSS's 36 blocks split 9 per
stage. The planner's own plan: the default search (TP, CP, EP, ETP, PP, VPP, DP, ZeRO,
recomputation) with the row's dispatcher and overlap, on the memory the published configuration
is held to (the usable memory, or its own peak where that is more), priced by the same model.

Last line: ``published MoE runs: N rows, median |error| X%, worst Y%, fits F/N, ours faster on K/N`` (all rows;
the line before it: the out-of-sample rows alone).

Run: ``python benchmarks/published_moe.py [--rows LABEL,...] [--no-plan] [--fit]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.artifacts.cluster import PRESETS, Cluster
from planner.artifacts.errors import PlannerError
from planner.artifacts.kinds import OptimizerKind, ScheduleKind, SolverKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.moe import MoeDispatcher
from planner.artifacts.plan import Plan
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.artifacts.stack import STACKS, Stack
from planner.cost import experts
from planner.cost.host import host_floor_ms
from planner.cost.tensor_parallel import device_cost_model
from planner.profiling.analytic.moe import moe_profile
from planner.solve import plan as solve
from planner.solve.build import rebuild_plan

GIB = 1024**3
#: memory a training process holds outside PyTorch's allocator (as benchmarks/published_runs.py)
RUNTIME_RESERVE_BYTES = GIB


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeRun:
    """One published MoE figure and the layout it was measured under (``dp`` = GPUs / (tp pp))."""

    label: str
    source: str
    config: str  # configs/<name>.json
    gpus: int
    batch: int
    microbatch: int
    seq: int
    tp: int
    ep: int
    etp: int
    pp: int
    vpp: int
    fsdp: bool
    recompute: str  # "norm,act" | "full" | "none"
    optimizer: OptimizerKind = OptimizerKind.ADAM_MIXED_FP32_GRAD
    microbatches: tuple[int, ...] = ()  # where the source's micro-batch is in doubt: tried, the faster that fits
    dispatcher: MoeDispatcher
    overlap: bool
    published_s: float  # step seconds (GPT-OSS: from tokens/s/GPU)
    published_tflops: float
    assumed: tuple[str, ...] = ()
    moe_host_ms: float | None = None  # the MoE layers' host time to price with (None: the stack preset's); the fit's
    a2a_host_ms: float | None = None  # the alltoall dispatcher's extra host ms per local expert (None: the preset's); the fit's
    fp8_host_us: float | None = None  # the FP8 expert GEMMs' host us (None: the stack preset's); published_fp8's fit

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def edp(self) -> int:
        return self.tp * self.dp // (self.ep * self.etp)


_QWEN = dict(source="MoE-ModelZoo Qwen3", config="qwen3-235b-a22b", gpus=256, batch=2048, seq=4096)
_QWEN_ASSUMED = ("bf16 with fp32 gradients, distributed optimizer (ZeRO 1; FSDP: ZeRO 3) over DP, the experts' over EDP",
                 "layers split evenly over the chunks (embedding and head in the first and last)",
                 "inter-node fabric: the h100 preset's 50 GB/s per GPU (the source: 8 x 50 GB/s per node)")

ROWS = (
    MoeRun(label="Q DeepEP EP32 PP8", **_QWEN, microbatch=1, tp=2, ep=32, etp=1, pp=8, vpp=4, fsdp=False,
           recompute="norm,act", dispatcher=MoeDispatcher.DEEPEP, overlap=False, published_s=19.7, published_tflops=245,
           assumed=_QWEN_ASSUMED),
    MoeRun(label="Q DeepEP EP32 ovl", **_QWEN, microbatch=1, tp=2, ep=32, etp=1, pp=8, vpp=4, fsdp=False,
           recompute="norm,act", dispatcher=MoeDispatcher.DEEPEP, overlap=True, published_s=17.6, published_tflops=276,
           assumed=_QWEN_ASSUMED),
    MoeRun(label="Q DeepEP FSDP", **_QWEN, microbatch=4, tp=2, ep=8, etp=1, pp=1, vpp=1, fsdp=True,
           recompute="full", dispatcher=MoeDispatcher.DEEPEP, overlap=False, published_s=17.6, published_tflops=276,
           optimizer=OptimizerKind.ADAM_MIXED,
           assumed=("bf16 gradients reduce-scattered (--grad-reduce-in-bf16: the Megatron-FSDP user guide's recommended "
                    "configuration; the row's Megatron-FSDP flags are not in the ModelZoo's scripts), ZeRO 3 over DP, "
                    "the experts' over EDP", *_QWEN_ASSUMED[1:])),
    MoeRun(label="Q A2A PP32", **_QWEN, microbatch=1, tp=2, ep=8, etp=1, pp=32, vpp=3, fsdp=False,
           recompute="norm,act", dispatcher=MoeDispatcher.ALLTOALL, overlap=False, published_s=24.2, published_tflops=200,
           assumed=_QWEN_ASSUMED),
    MoeRun(label="Q DeepEP TP4 EDP4", **_QWEN, microbatch=1, tp=4, ep=8, etp=1, pp=8, vpp=4, fsdp=False,
           recompute="none", dispatcher=MoeDispatcher.DEEPEP, overlap=False, published_s=29.0, published_tflops=167,
           assumed=_QWEN_ASSUMED),
    MoeRun(label="GPT-OSS 120B", source="Megatron-Bridge 25.11", config="gpt-oss-120b", gpus=64, batch=512, microbatch=4,
           seq=4096, tp=1, ep=8, etp=1, pp=4, vpp=1, fsdp=False, recompute="norm,act", dispatcher=MoeDispatcher.ALLTOALL,
           overlap=False, published_s=512 * 4096 / (5630 * 64), published_tflops=153, optimizer=OptimizerKind.ADAM_MIXED,
           microbatches=(4, 1),
           assumed=("published 5,630 tokens/s/GPU read as step seconds: 512 x 4,096 / (5,630 x 64)",
                    "micro-batch in doubt: the table's 4 (with GA 2, which the layout's 16 replicas contradict: 512 / "
                    "(4 x 16) = 8) or the recipe's 1 (GA 32); the faster that fits",
                    "recomputation not given: layernorm + moe_act, and bf16 gradient reduction, as Megatron-Bridge's "
                    "scripts/performance/configs/gpt_oss (GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V1, "
                    "set_gpt_oss_common_configs) set them", "dispatcher not given: alltoall (NCCL)",
                    "distributed optimizer (ZeRO 1)", "9 blocks per stage, embedding and head with the first and last")),
)


#: the rows the stack preset's MoE host times are fitted on (planner.artifacts.stack.MCORE_MOE_HOST_MS_PER_LAYER
#: on the DeepEP one, MCORE_ALLTOALL_HOST_MS_PER_LAYER on the NCCL all-to-all one): one of each dispatcher, the
#: ModelZoo's; the Megatron-Bridge row (another source, model and layout) and the other three out of sample
FIT_ROWS = ("Q DeepEP TP4 EDP4", "Q A2A PP32")


def usable_bytes() -> int:
    """What one H100's tensors may take: the memory the CUDA runtime reports less the runtime's reserve."""
    return PRESETS["h100-80gb-x8"].device_memory_bytes - RUNTIME_RESERVE_BYTES


@lru_cache(maxsize=8)
def profile_for(config: str, seq: int) -> Profile:
    path = REPO / "configs" / f"{config}.json"
    return moe_profile(json.loads(path.read_text()), seq=seq, device_preset="h100-80gb", model=config,
                       source=f"configs/{config}.json")


def cluster_for(run: MoeRun) -> Cluster:
    return PRESETS["h100-80gb-x8"].with_devices(run.gpus)


def stack_for(run: MoeRun) -> Stack:
    base = STACKS["megatron-core-0.8"]
    host = base.moe.host_ms_per_layer if run.moe_host_ms is None else run.moe_host_ms
    a2a = base.moe.alltoall_host_ms_per_local_expert if run.a2a_host_ms is None else run.a2a_host_ms
    fp8 = base.moe.fp8_host_us_per_expert_gemm if run.fp8_host_us is None else run.fp8_host_us
    return dataclasses.replace(base, moe=dataclasses.replace(base.moe, dispatcher=run.dispatcher, a2a_overlap=run.overlap,
                                                             host_ms_per_layer=host, alltoall_host_ms_per_local_expert=a2a,
                                                             fp8_host_us_per_expert_gemm=fp8))


def request_for(run: MoeRun, **kw: object) -> PlanRequest:
    return PlanRequest(global_batch=run.batch, num_devices=run.gpus, optimizer=run.optimizer,
                       stack=stack_for(run), **kw)  # type: ignore[arg-type]


def partition(run: MoeRun, profile: Profile) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """Stage starts and each stage's fully and selectively recomputed layers (module docstring)."""
    chunks, n = run.pp * run.vpp, profile.num_layers
    if n % chunks == 0:
        starts = [i * n // chunks for i in range(chunks)]
    else:  # decoder layers evenly, the embedding with the first and the head with the last
        blocks = n - 2
        q, rem = divmod(blocks, chunks)
        sizes = [q + (1 if i < rem else 0) for i in range(chunks)]
        starts = [0] + [1 + sum(sizes[:i]) for i in range(1, chunks)]
    stops = starts[1:] + [n]
    full, sel = [], []
    for a, z in zip(starts, stops):
        blocks_in = [i for i in range(a, z) if profile.layers[i].moe is not None or profile.layers[i].name.startswith("block")]
        full.append(blocks_in if run.recompute == "full" else [])
        sel.append([i for i in blocks_in if profile.layers[i].moe is not None] if run.recompute == "norm,act" else [])
    return starts, full, sel


def config_plan(run: MoeRun) -> Plan:
    """The published configuration priced by the cost model and the simulator (of its micro-batch
    sizes in doubt, the faster that fits)."""
    options = [_config_plan(dataclasses.replace(run, microbatch=b)) for b in run.microbatches or (run.microbatch,)]
    fitting = [p for p in options if p.predicted.peak_memory_bytes <= usable_bytes()]
    return min(fitting or options, key=lambda p: p.predicted.iteration_ms)


def _config_plan(run: MoeRun) -> Plan:
    profile = profile_for(run.config, run.seq)
    layout = Layout(num_stages=run.pp * run.vpp, virtual_stages_per_rank=run.vpp, dp_degree=run.dp, tp_degree=run.tp,
                    sequence_parallel=run.tp > 1, zero=ZeroStage.PARAMETERS if run.fsdp else ZeroStage.OPTIMIZER,
                    ep_degree=run.ep, etp_degree=run.etp)
    starts, full, sel = partition(run, profile)
    schedule = ScheduleKind.INTERLEAVED_1F1B if run.vpp > 1 else ScheduleKind.ONE_F_ONE_B
    request = request_for(run, tp_degrees=(run.tp,), ep_degrees=(run.ep,), etp_degrees=(run.etp,))
    return rebuild_plan(profile, cluster_for(run), request, layout=layout, boundaries=starts, recompute=full,
                        selective=sel, microbatch_size=run.microbatch, schedule=schedule, solver=SolverKind.GIVEN)


def own_plan(run: MoeRun, theirs: Plan) -> Plan:
    """The planner's own plan for the row's model, GPUs, batch and stack, on the memory the
    published configuration is held to."""
    cap = max(usable_bytes(), theirs.predicted.peak_memory_bytes)
    return solve(profile_for(run.config, run.seq), cluster_for(run), request_for(run, memory_cap_bytes=cap))


def describe(p: Plan) -> str:
    full = sum(len(s.recompute) for s in p.stages)
    sel = sum(len(s.recompute_selective) for s in p.stages)
    a2a = sum(s.alltoall_ms for s in p.stages[: p.layout.pipeline_size])
    return (f"{p.layout.describe(pipeline_ranks=True)}, {p.schedule.value}, b={p.microbatch_size}, "
            f"M={p.num_microbatches}, recompute {full} full + {sel} sel, a2a {a2a:.1f} ms/mb over a replica's ranks, "
            f"{p.predicted.iteration_ms / 1e3:.2f} s")


def alltoall_share(p: Plan) -> float:
    """The all-to-all's share of a pipeline rank's compute per micro-batch (rank 0's chunks)."""
    stages = [p.stages[i] for i in p.layout.stage_indices(0)]
    compute = sum(s.fwd_ms + s.bwd_ms for s in stages)
    return sum(s.alltoall_ms for s in stages) / compute if compute else 0.0


def ratio(run: MoeRun, host_ms: float | None = None, a2a_ms: float | None = None) -> float:
    """Predicted over published step time of ``run`` (its MoE layers' host time ``host_ms`` and the
    alltoall dispatcher's extra ``a2a_ms``; None: the stack preset's)."""
    priced = dataclasses.replace(run, moe_host_ms=host_ms if host_ms is not None else run.moe_host_ms,
                                 a2a_host_ms=a2a_ms if a2a_ms is not None else run.a2a_host_ms)
    return config_plan(priced).predicted.iteration_ms / 1e3 / run.published_s


def _balance(total: Callable[[float], float], lo: float = 0.0, hi: float = 40.0, tol: float = 0.01) -> float:
    """The value in [lo, hi] where the increasing ``total`` crosses zero: bisection to ``tol``;
    ``lo``/``hi`` when no value in between balances it."""
    if total(lo) >= 0:
        return lo
    if total(hi) <= 0:
        return hi
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) < 0 else (lo, mid)
    return round((lo + hi) / 2, max(0, -math.floor(math.log10(tol))))


def fit_host_ms(rows: tuple[MoeRun, ...]) -> tuple[float, float]:
    """The MoE layers' host time and the alltoall dispatcher's extra (ms per layer's forward +
    backward; the extra per local expert) at which ``rows``' log ratios sum to zero (least squares in log ratio where one value
    fits): the first on the rows with DeepEP, the second then on those with NCCL's all-to-all (0
    without any; with no DeepEP row, the first on all rows and no extra)."""
    deepep = tuple(r for r in rows if r.dispatcher is MoeDispatcher.DEEPEP)
    nccl = tuple(r for r in rows if r.dispatcher is MoeDispatcher.ALLTOALL)
    if not deepep:
        return _balance(lambda h: sum(math.log(ratio(r, h, 0.0)) for r in rows)), 0.0
    h = _balance(lambda x: sum(math.log(ratio(r, x, 0.0)) for r in deepep))
    a = _balance(lambda x: sum(math.log(ratio(r, h, x)) for r in nccl), hi=4.0, tol=0.001) if nccl else 0.0
    return h, a


def fit_report(rows: tuple[MoeRun, ...] = ROWS) -> None:
    """The shipped constants refitted on :data:`FIT_ROWS`, and leave-one-source-out: for each
    source, the constants fitted on the other sources' fitting rows (or, where none, its first two)
    and the left-out source's errors at them."""
    fit = tuple(r for r in rows if r.label in FIT_ROWS)
    moe = STACKS["megatron-core-0.8"].moe
    h, a = fit_host_ms(fit)
    print(f"fit on {', '.join(FIT_ROWS)}: moe host {h:.2f} ms per layer, alltoall dispatcher +{a:.3f} ms per local expert "
          f"(shipped: {moe.host_ms_per_layer:g}, +{moe.alltoall_host_ms_per_local_expert:g})")
    for source in sorted({r.source for r in rows}):
        others = tuple(r for r in rows if r.source != source)
        train = tuple(r for r in others if r.label in FIT_ROWS) or others[:2]
        h, a = fit_host_ms(train)
        errs = [abs(ratio(r, h, a) - 1) for r in rows if r.source == source]
        print(f"leave out {source}: fitted on {', '.join(r.label for r in train)}: {h:.2f} ms, +{a:.3f} ms; "
              f"{source}'s rows median |error| {100 * statistics.median(errs):.1f}%, worst {100 * max(errs):.1f}%")


#: the rows DeepEP's internode notify prices (expert group over 4 nodes): the one whose notify is on the GPU's
#: critical path (no overlap) and the one where the overlap hides it and only the host's wait remains
NOTIFY_ROWS = ("Q DeepEP EP32 PP8", "Q DeepEP EP32 ovl")


def ratio_at_notify(run: MoeRun, notify_ms: float) -> float:
    """:func:`ratio` of ``run`` with DeepEP's internode notify at ``notify_ms`` instead of the cited value."""
    cited = experts.DEEPEP_INTERNODE_NOTIFY_MS
    experts.DEEPEP_INTERNODE_NOTIFY_MS = notify_ms
    try:
        return ratio(run)
    finally:
        experts.DEEPEP_INTERNODE_NOTIFY_MS = cited


def notify_report(rows: tuple[MoeRun, ...] = ROWS) -> None:
    """DeepEP's internode notify: the two EP 32 rows without it and at the cited value; the value at
    which the row without the overlap is priced exactly (bisection on its log ratio) and the
    overlapped row at it (out of sample: there the notify reaches the step through the host's wait)."""
    plain, overlapped = (next(r for r in rows if r.label == label) for label in NOTIFY_ROWS)
    cited = experts.DEEPEP_INTERNODE_NOTIFY_MS
    fitted = _balance(lambda ms: math.log(ratio_at_notify(plain, ms)), hi=5.0, tol=0.01)
    cells = "; ".join(f"{ms:g} ms: {plain.label} {ratio_at_notify(plain, ms):.3f}, {overlapped.label} "
                      f"{ratio_at_notify(overlapped, ms):.3f}" for ms in (0.0, cited, fitted))
    print(f"DeepEP internode notify (cited {cited:g} ms; fitted on {plain.label}: {fitted:g} ms): {cells}")


def terms_report(rows: tuple[MoeRun, ...] = ROWS, plan_of: Callable[[MoeRun], Plan] = config_plan,
                 profile_of: Callable[[MoeRun], Profile] | None = None) -> None:
    """Per row, one MoE layer's pass on one device at the row's micro-batch (ms, forward / backward):
    the rest of the block (attention, router, norms, tensor-parallel collectives), the routed
    experts, the dispatch and combine on the critical path, the host floor, and what the layer
    takes; beside it, the published step over the layer passes a pipeline rank runs (an upper
    bound on a published layer pass, bubble and head included). ``plan_of`` and ``profile_of``: how
    a row is planned and profiled (published_fp8's FP8 rows: at their precision)."""
    print(f"{'row':<19} {'b':>1} {'rest f/b':>11} {'experts f/b':>11} {'a2a f/b':>11} {'host f/b':>11} "
          f"{'layer f+b':>9} | {'published s / passes':>20}")
    for run in rows:
        plan = plan_of(run)
        b = plan.microbatch_size
        profile = profile_of(run) if profile_of else profile_for(run.config, run.seq)
        cm = device_cost_model(profile, cluster_for(run), run.optimizer, plan.layout.group, stack_for(run))
        i = next(j for j, layer in enumerate(cm.profile.layers) if layer.moe is not None)
        layer, moe = cm.profile.layers[i], cm.profile.layers[i].moe
        assert moe is not None
        host_f, host_b = host_floor_ms(cm.profile, cm.stack.host_us_per_kernel, cm.stack.moe)
        f, bw = cm.at_batch(b).times_ms
        ef, eb, af, ab = moe.expert_fwd.at(b), moe.expert_bwd.at(b), moe.alltoall_fwd.at(b), moe.alltoall_bwd.at(b)
        rest = (layer.fwd.at(b) - ef - af, layer.bwd.at(b) - eb - ab)
        blocks = sum(1 for x in cm.profile.layers if x.moe is not None) / (run.pp * run.vpp) * run.vpp
        passes = blocks * plan.num_microbatches
        print(f"{run.label:<19} {b:>1} {rest[0]:>5.2f}/{rest[1]:<5.2f} {ef:>5.2f}/{eb:<5.2f} {af:>5.2f}/{ab:<5.2f} "
              f"{host_f[i]:>5.2f}/{host_b[i]:<5.2f} {f[i] + bw[i]:>9.2f} | {1e3 * run.published_s / passes:>20.2f}")


def report(rows: tuple[MoeRun, ...] = ROWS, plans: bool = True) -> list[float]:
    """Print the table and its summary line; the |errors|."""
    head = (f"{'row':<19} {'TP':>2} {'EP':>2} {'ETP':>3} {'EDP':>3} {'PP':>2} {'VPP':>3} {'DP':>3} {'b':>1} {'rc':<8} "
            f"{'disp':<8} {'ovl':<3} {'published s':>11} {'predicted':>9} {'ratio':>6} {'a2a':>5} {'GiB':>5} {'fits':>4} | "
            f"{'ours/theirs':>11}  our plan")
    print(head)
    print("-" * len(head))
    errors: list[float] = []
    fits = faster = 0
    slower: list[str] = []
    for run in rows:
        t0 = time.perf_counter()
        theirs = config_plan(run)
        secs = theirs.predicted.iteration_ms / 1e3
        ratio = secs / run.published_s
        errors.append(abs(ratio - 1))
        peak = theirs.predicted.peak_memory_bytes
        fit = peak <= usable_bytes()
        fits += fit
        line = (f"{run.label:<19} {run.tp:>2} {run.ep:>2} {run.etp:>3} {run.edp:>3} {run.pp:>2} {run.vpp:>3} {run.dp:>3} "
                f"{theirs.microbatch_size:>1} {run.recompute:<8} {run.dispatcher.value:<8} {'yes' if run.overlap else 'no':<3} "
                f"{run.published_s:>11.3f} {secs:>9.3f} {ratio:>6.3f} {100 * alltoall_share(theirs):>4.0f}% "
                f"{peak / GIB:>5.1f} {'yes' if fit else 'NO':>4} |")
        if plans:
            try:
                ours = own_plan(run, theirs)
                rel = ours.predicted.iteration_ms / theirs.predicted.iteration_ms
                faster += rel <= 1 + 1e-9
                if rel > 1 + 1e-9:
                    slower.append(f"{run.label} {rel:.3f}")
                line += f" {rel:>11.3f}  {describe(ours)}"
            except PlannerError as exc:
                line += f" {'-':>11}  no plan: {str(exc).splitlines()[0]}"
        print(line + f" ({time.perf_counter() - t0:.1f} s)", flush=True)
        print(f"{'':<19} assumed: {'; '.join(run.assumed)}")
    n = len(rows)
    held = [e for r, e in zip(rows, errors) if r.label not in FIT_ROWS]
    print(f"\nfitted on {', '.join(FIT_ROWS)} (the MoE layers' host time, the alltoall dispatcher's); out of sample ({len(held)} rows): "
          + (f"median |error| {100 * statistics.median(held):.1f}%, worst {100 * max(held):.1f}%" if held else "none"))
    print(f"over 10%: {', '.join(f'{r.label} {100 * e:.1f}%' for r, e in zip(rows, errors) if e > 0.10) or 'none'}")
    if plans:
        print(f"ours slower (ours/theirs > 1): {', '.join(slower) or 'none'}")
    print(f"published MoE runs: {n} rows, median |error| {100 * statistics.median(errors):.1f}%, "
          f"worst {100 * max(errors):.1f}%, fits {fits}/{n}, ours faster on {faster if plans else '-'}/{n}")
    return errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="", help="comma-separated row labels (default: all)")
    ap.add_argument("--no-plan", action="store_true", help="skip the planner's own plans")
    ap.add_argument("--fit", action="store_true", help="refit the MoE layers' host time and print leave-one-source-out")
    ap.add_argument("--terms", action="store_true", help="print one MoE layer's terms per row")
    args = ap.parse_args()
    rows = ROWS
    if args.rows:
        wanted = {x.strip() for x in args.rows.split(",")}
        rows = tuple(r for r in ROWS if r.label in wanted)
    report(rows, plans=not args.no_plan)
    if args.fit:
        print()
        fit_report()
        notify_report()
    if args.terms:
        print()
        terms_report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
