"""Published training runs priced by the cost model, out of source, with a band, and the planner's
own plan beside each.

Every row of ``benchmarks/published_rows.py`` (Narayanan et al. 2021 Table 1, Korthikanti et al.
2022 Tables 4 and 5, the Megatron-LM README's H100 table, torchtitan's 64-A100 FSDP table; the
numbers and what each source leaves out: ``../shared/reference/published_runs/README.md``) is
priced with its published configuration forced -- t, p, d, cp, micro-batch, schedule and chunks,
stage split, recomputation and sequence parallelism as published, the stack it ran on
(``planner.artifacts.stack``: what it overlaps, its host time per kernel) and the cluster's
overheads (``planner.cost.overheads``: NCCL's collective latencies across nodes, send/receive
latency, the slowest GPU of the job); what the source leaves out is assumed and printed -- and
compared with the published figure as an iteration time (TFLOP/s per GPU and tokens/s per GPU
converted by the source's own FLOP and token counts; Table 4's one layer forward + backward).

Constants. The GEMM model (``planner.profiling.analytic.gemm``: the largest GEMMs' fraction of
peak ``e_max``, the intensity at half of it ``I_half``, the achieved HBM fraction) is one set of
three numbers for both devices: the A100's ``e_max``, the H100's that times the ratio of the two
devices' largest measured matmuls (``MAMF_FRACTION``: 80.1% and 85.9% of peak); the HBM
fraction a fraction of each datasheet's bandwidth; ``I_half`` the A100's, scaled to the H100 by
the ratio of their ridge points (the roofline's knee moves with peak / HBM bandwidth). It is fitted (Nelder-Mead on the squared log
time ratios) on the fit rows (``FIT_ROWS``: at most a third of each source's rows, marked ``*``).

Leave-one-source-out (``--fit``): for each source, the constants are fitted on the fit rows of
every other source and that source's rows are priced with them; the per-source error is printed.
The shipped constants (``DEVICE_GEMM``) are the fit on every source's fit rows, the same
procedure on all the data (that discipline chooses them: no constant is tuned per row or per
source), and the leave-one-source-out fits are shipped beside them (``DEVICE_GEMM_LOSO``): every
row's out-of-source prediction uses the fit that left its source out, and every band takes the
spread of those fits. ``--fit`` prints both for pasting.

Band (``planner.cost.band``, ``planner.solve.account``): the configuration priced with each
uncertain input at the ends of its range (the leave-one-source-out fits that saw no row of the
row's source -- :func:`unseen_fits`: for a source with fit rows none but its own prediction's,
so no GEMM range; the FP8 rows every fit --, the host time per
kernel, the attention kernel's measured efficiency, the GPUs' speed variation, NCCL's model
against plain rings, send/receive latency), and, for what the source leaves out (micro-batch,
chunks per rank, recomputation: ``PublishedRun.recompute_options``), every option that fits;
and the model's own error out of source, all in quadrature. The model term is the nine-in-ten
(:data:`planner.cost.band.BAND_COVERAGE`) conformal quantile of the other sources' rows' errors
left after their own inputs' ranges (:func:`planner.cost.band.residual_score`: a row's band never
uses its own source's errors, and an error the inputs already allow is not counted again); over
every source it is the shipped :data:`~planner.cost.band.MODEL_ERROR` (printed, and by ``--fit``
for pasting). A published figure is inside when its time lies in the band (of the out-of-source
prediction); the rows outside are listed with the deviation, the band's sides and its largest
terms; ``--scores`` prints every row's score by source, largest first (the rows that set the
term).

``fits``: the configuration's per-GPU peak (the simulator's, the largest over devices) at the
band's top (the peak plus 1 GiB held outside PyTorch's allocator) within the memory CUDA reports
(79.14 GiB on an A100-SXM4-80GB, 79.11 GiB on an H100 80GB). A row whose configuration trained
must fit; the configuration torchtitan reports running out of memory must not; Table 4's rows time
one layer and claim nothing of the whole model's memory (not counted). A row that does not fit
is named with the GiB over and the terms of its tightest device (the simulator's peak of that
pipeline rank, its chunks' terms beside it).

Then, per row, the planner's own plan for the same GPUs, batch and stack (default request), held
to the memory the published configuration is held to (:func:`own_plan`), its predicted time
against the published configuration's under the same model ("ours/theirs" <= 1: no slower).

Last line: ``published runs: N rows from S sources, median |error| X%, worst Y%,
leave-one-source-out median X'% worst Y'%, mean signed Z%, inside band B/N (median width W%),
fits F/N', ours faster on K/N''`` -- errors of the iteration time (predicted / published - 1),
the first pair with the shipped constants, the second and the signed mean (positive: predicted
slower) out of source; N' the rows with a memory claim, N'' the rows with a plan. Then the mixture-of-experts rows' own table and
line (``benchmarks/published_moe.py``).

Run: ``python benchmarks/published_runs.py [--rows LABEL,...] [--no-plan] [--fit] [--jobs N] [--scores]``
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from functools import lru_cache, partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import published_moe
from published_rows import Metric, PublishedRun, Recompute, all_rows

from planner.artifacts.cluster import PRESETS, Cluster
from planner.artifacts.errors import PlannerError
from planner.artifacts.kinds import ScheduleKind, SelectiveUnit, SolverKind, ZeroStage
from planner.artifacts.layout import DeviceGroup, Layout
from planner.artifacts.plan import Plan, PlanStage
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost.band import (
    BAND_COVERAGE,
    MODEL_ERROR,
    MODEL_ERROR_SOURCE,
    RUNTIME_RESERVE_BYTES,
    combine,
    conformal_quantile,
    residual_score,
)
from planner.cost.precision import at_precision
from planner.cost.tensor_parallel import device_cost_model
from planner.profiling.analytic.common import DEVICE_PRESETS
from planner.profiling.analytic.gemm import DEVICE_GEMM, DEVICE_GEMM_LOSO, MAMF_FRACTION, GemmModel, fit_source
from planner.profiling.analytic.gpt import gpt_profile
from planner.profiling.analytic.llama import llama_profile
from planner.simulation import simulate
from planner.solve import plan as solve
from planner.solve.account import with_accounts
from planner.solve.build import rebuild_plan

#: the rows the constants are fitted on: at most a third of each source's rows
FIT_ROWS: dict[str, tuple[str, ...]] = {
    "Narayanan et al. 2021": ("N1 1.7B", "N6 76.1B", "N9 529.6B"),
    "Korthikanti et al. 2022": ("K4 baseline", "K4 seq-par", "K5 175B full", "K5 530B sp+sel"),
    "Megatron-LM README": ("M 1.7B", "M 32B", "M 462B"),
    "torchtitan 2024": ("T L3 8B b1 sel-layer", "T L2 13B b2 none", "T L2 70B b2 full"),
}
FIT_LABELS = frozenset(itertools.chain.from_iterable(FIT_ROWS.values()))
DEVICES = ("a100-80gb", "h100-80gb")
GIB = 1024**3


def usable_bytes(run: PublishedRun) -> int:
    """What the row's tensors may take on one GPU: the memory CUDA reports less what the process
    holds outside PyTorch's allocator (the band's memory top, ``planner.cost.band``)."""
    return PRESETS[run.preset].device_memory_bytes - RUNTIME_RESERVE_BYTES


@dataclasses.dataclass(frozen=True)
class Priced:
    """A row priced: its predicted time (s; Table 4's rows one layer's ms) and figure in the row's
    metric, the configuration's plan, the other options that fit (what the source leaves out),
    Table 4's forward and backward."""

    seconds: float
    predicted: float
    plan: Plan
    usable_bytes: int
    options: tuple[Plan, ...] = ()
    fwd_ms: float = 0.0
    bwd_ms: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def peak_bytes(self) -> int:
        return self.plan.predicted.peak_memory_bytes

    @property
    def over_bytes(self) -> int:
        """Peak - usable memory (<= 0 when it fits)."""
        return self.peak_bytes - self.usable_bytes

    @property
    def fits(self) -> bool:
        return self.over_bytes <= 0

    @property
    def reason(self) -> str:
        """Why it does not fit ("" when it does): the terms of the tightest device."""
        return "" if self.fits else tightest(self.plan)


def tightest(plan: Plan) -> str:
    """The tightest device of a plan (the pipeline rank with the largest simulated peak) and its
    memory terms, largest first (its chunks' terms, each at its own peak: they need not coincide)."""
    layout = plan.layout
    peaks = simulate(plan).rank_peak_memory_bytes  # per pipeline rank of one replica
    rank = max(range(layout.pipeline_size), key=lambda r: peaks[r])
    chunks = [plan.stages[i] for i in layout.stage_indices(rank)]
    ids = ", ".join(str(c.stage_idx) for c in chunks)
    where = f"stage {ids}" if len(chunks) == 1 else f"pipeline rank {rank} (chunks {ids})"
    peak = peaks[rank]
    return f"{where}, simulated peak {peak / GIB:.1f} GiB: " + memory_terms(chunks)


def memory_terms(chunks: list[PlanStage]) -> str:
    """A device's memory by kind (summed over its chunks), largest first."""
    def total(*fields: str) -> int:
        return sum(getattr(c.memory, f) for c in chunks for f in fields)

    k = "+".join(str(c.inflight_microbatches) for c in chunks)
    parts = {
        f"activations of {k} micro-batch{'' if k == '1' else 'es'} in flight": total("activation_bytes"),
        "model state (weights, gradients, optimizer)": total("param_bytes", "grad_bytes", "optimizer_bytes"),
        "recompute workspace and send/receive buffers": total("recompute_workspace_bytes", "buffer_bytes"),
    }
    return ", ".join(f"{k} {v / GIB:.1f} GiB" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))


def cluster_for(run: PublishedRun) -> Cluster:
    base = PRESETS[run.preset]
    return dataclasses.replace(base, name=f"{base.name.rsplit('-x', 1)[0]}-x{run.gpus}").with_devices(run.gpus)


@lru_cache(maxsize=256)
def profile_for(run: PublishedRun, gemm: GemmModel) -> Profile:
    """The row's model on its device: the analytic GPT or Llama profile (torchtitan's op-level
    recomputation as the blocks' selective unit where the row recomputes so)."""
    name = f"{run.source}: {run.label}"
    if run.arch == "llama":
        unit = SelectiveUnit.OPS if run.recompute is Recompute.OPS else SelectiveUnit.ATTENTION_CORE
        prof = llama_profile(run.llama_config(), seq=run.seq, device_preset=run.device, gemm=gemm, model=name,
                             selective=unit, fused_cross_entropy=run.fused_cross_entropy)
        # an FP8 row: planner.cost.precision
        return at_precision(prof, cluster_for(run), run.precision, run.bf16_edge_blocks)
    return gpt_profile(layers=run.layers, hidden=run.hidden, heads=run.heads, seq=run.seq, vocab=run.vocab,
                       device_preset=run.device, gemm=gemm, attention="flash" if run.flash_attention else "materialised",
                       model=name)


def stage_blocks(run: PublishedRun, chunks: int) -> list[int] | None:
    """Transformer blocks per model chunk: the first and last as the row gives them (0 blocks with
    the embedding / head a slot of its own), the rest evenly; None where they do not divide evenly
    over more than one chunk per rank (Megatron's interleaved split needs them to)."""
    fixed = {}
    if run.embedding_stage or run.first_stage_layers:
        fixed[0] = 0 if run.embedding_stage else run.first_stage_layers
    if run.head_stage or run.last_stage_layers:
        fixed[chunks - 1] = 0 if run.head_stage else run.last_stage_layers
    free = [i for i in range(chunks) if i not in fixed]
    rest = run.layers - sum(fixed.values())
    if rest < 0 or (not free and rest):
        return None
    q, rem = divmod(rest, len(free)) if free else (0, 0)
    if rem and chunks > run.p:
        return None
    extra = iter([1] * rem + [0] * len(free))
    return [fixed[i] if i in fixed else q + next(extra) for i in range(chunks)]


def partition(run: PublishedRun, chunks: int) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """Stage start layers over ``chunks`` chunks (:func:`stage_blocks`; the embedding with the first,
    the LM head with the last: Megatron-LM's split), and per stage its fully and its selectively
    recomputed layers: every block at the row's level (every second block whole for torchtitan's
    "selective layer", the blocks' selective unit for its op-level policy)."""
    sizes = stage_blocks(run, chunks)
    if sizes is None:
        raise ValueError(f"{run.label}: {run.layers} blocks do not split over {chunks} chunks")
    starts = [0] + [1 + sum(sizes[:i]) for i in range(1, chunks)]
    stops = starts[1:] + [run.layers + 2]
    blocks = [[i for i in range(a, b) if 1 <= i <= run.layers] for a, b in zip(starts, stops)]
    none: list[list[int]] = [[] for _ in starts]
    full = {Recompute.FULL: [b[:run.recompute_layers] if run.recompute_layers else b for b in blocks],
            Recompute.EVERY_OTHER: [[i for i in b if i % 2 == 0] for b in blocks]}.get(run.recompute, none)
    selective = blocks if run.recompute in (Recompute.SELECTIVE, Recompute.OPS) else none
    return starts, full, selective


def request_for(run: PublishedRun, **kw: object) -> PlanRequest:
    return PlanRequest(global_batch=run.batch, num_devices=run.gpus, optimizer=run.optimizer,
                       stack=run.stack, **kw)  # type: ignore[arg-type]


def config_request(run: PublishedRun) -> PlanRequest:
    return request_for(run, tp_degrees=(run.t,), zero_stages=(ZeroStage(run.zero),), cp_degrees=(run.cp,),
                       sequence_parallel=(run.sequence_parallel,))


def config_options(run: PublishedRun, gemm: GemmModel, only: tuple[int, int] | None = None) -> list[Plan]:
    """The published configuration priced by the cost model and the simulator. Where the source
    gives the chunks per rank and the micro-batch (one option) that schedule; where it does not
    (several: interleaving only where M is a multiple of p and the blocks split evenly, micro-batches
    that leave M >= p), the faster of those that fit (a run that trained fit; the faster overall
    when none does). The one priced first, then the others. ``only``: just this (micro-batch,
    chunks per rank) option (a fit prices the option chosen at its start)."""
    prof, cluster, request = profile_for(run, gemm), cluster_for(run), config_request(run)
    out = []
    for b, v in itertools.product(run.microbatches or (run.microbatch,), run.chunks):
        if only is not None and (b, v) != only:
            continue
        m = run.batch // (run.d * b)
        if run.batch % (run.d * b) or m < run.p or (v > 1 and (run.p == 1 or m % run.p)) or stage_blocks(run, run.p * v) is None:
            continue  # 1F1B keeps M >= P; interleaving where M is a multiple of p
        starts, full, selective = partition(run, run.p * v)
        layout = Layout(num_stages=run.p * v, virtual_stages_per_rank=v, dp_degree=run.d, tp_degree=run.t,
                        cp_degree=run.cp, sequence_parallel=run.sequence_parallel, zero=ZeroStage(run.zero))
        schedule = ScheduleKind.INTERLEAVED_1F1B if v > 1 else ScheduleKind.ONE_F_ONE_B
        out.append(rebuild_plan(prof, cluster, request, layout=layout, boundaries=starts, recompute=full,
                                selective=selective, microbatch_size=b, schedule=schedule, solver=SolverKind.GIVEN))
    if not out:
        raise ValueError(f"{run.label}: no valid schedule among chunks {run.chunks}")
    fitting = [p for p in out if p.predicted.peak_memory_bytes <= usable_bytes(run)]
    best = min(fitting or out, key=lambda p: p.predicted.iteration_ms)
    return [best] + [p for p in out if p is not best]


def config_plan(run: PublishedRun, gemm: GemmModel) -> Plan:
    """The published configuration's plan (:func:`config_options`: the one priced)."""
    return config_options(run, gemm)[0]


def layer_ms(run: PublishedRun, gemm: GemmModel) -> tuple[float, float]:
    """Table 4's one layer: (forward, backward with the row's recomputation) ms."""
    cm = device_cost_model(profile_for(run, gemm), cluster_for(run), run.optimizer,
                           DeviceGroup(tp_degree=run.t, sequence_parallel=run.sequence_parallel), run.stack)
    fwd, bwd = cm.at_batch(run.microbatch).times_ms
    block = 1  # every block is the same
    rc = {Recompute.NONE: 0.0, Recompute.FULL: float(fwd[block]),
          Recompute.SELECTIVE: float(cm.at_batch(run.microbatch).core_ms[block])}[run.recompute]
    return float(fwd[block]), float(bwd[block]) + rc


def predicted_time(run: PublishedRun, gemm: GemmModel, only: tuple[int, int] | None = None) -> float:
    """Just the row's predicted time (:attr:`Priced.seconds`), as a fit needs it: a layer row's without
    pricing its whole model."""
    if run.metric is Metric.LAYER_MS:
        return sum(layer_ms(run, gemm))
    return config_options(run, gemm, only)[0].predicted.iteration_ms / 1e3


def price(run: PublishedRun, gemm: GemmModel, only: tuple[int, int] | None = None) -> Priced:
    """The row's figure as the cost model predicts it for the published configuration (``only``:
    :func:`config_options`)."""
    options = config_options(run, gemm, only)
    plan = options[0]
    usable = usable_bytes(run)
    fitting = tuple(p for p in options[1:] if p.predicted.peak_memory_bytes <= usable)
    notes = tuple(f"v={p.layout.virtual_stages_per_rank}{f' b={p.microbatch_size}' if run.microbatches else ''} would be "
                  f"{p.predicted.iteration_ms / 1e3:.4g} s but needs {p.predicted.peak_memory_bytes / GIB:.1f} GiB"
                  for p in options[1:] if p.predicted.iteration_ms < plan.predicted.iteration_ms and p not in fitting)
    secs = plan.predicted.iteration_ms / 1e3
    if run.metric is not Metric.LAYER_MS:
        figure = {Metric.TFLOPS: run.flops_per_iteration / secs / run.gpus / 1e12,
                  Metric.TOKENS_PER_S: run.tokens_per_iteration / secs / run.gpus}.get(run.metric, secs)
        return Priced(secs, figure, plan, usable, fitting, notes=notes)
    fwd, bwd = layer_ms(run, gemm)
    return Priced(fwd + bwd, fwd + bwd, plan, usable, fitting, fwd, bwd)


def published_time(run: PublishedRun) -> float:
    """The published figure as a time in the units of :attr:`Priced.seconds` (0: none)."""
    return run.published if run.metric is Metric.LAYER_MS else run.published_seconds()


def time_ratio(run: PublishedRun, priced: Priced) -> float:
    """Predicted / published time (> 1: predicted slower); nan for a row with no time."""
    pub = published_time(run)
    return priced.seconds / pub if pub else math.nan


def own_plan(run: PublishedRun, gemm: GemmModel, theirs: Priced) -> Plan:
    """The planner's own plan for the row's model, GPUs, batch and stack (default request) on
    the memory the published configuration ``theirs`` is held to: the usable memory, or its
    own peak where it does not fit (then both are priced on that much)."""
    cap = max(theirs.usable_bytes, theirs.peak_bytes)
    return solve(profile_for(run, gemm), cluster_for(run), request_for(run, memory_cap_bytes=cap))


def choice_of(plan: Plan) -> tuple[int, int]:
    """The (micro-batch, chunks per rank) option a configuration's plan is."""
    return plan.microbatch_size, plan.layout.virtual_stages_per_rank


# ---------------------------------------------------------------- fitting


def _nelder_mead(f, x0: list[float], steps: list[float], iters: int = 120) -> list[float]:  # type: ignore[no-untyped-def]
    """Minimise ``f`` from ``x0`` (Nelder & Mead 1965, standard coefficients)."""
    pts = [x0] + [[x + (s if i == j else 0.0) for j, x in enumerate(x0)] for i, s in enumerate(steps)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(len(pts)), key=lambda i: vals[i])
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centre = [sum(p[j] for p in pts[:-1]) / (len(pts) - 1) for j in range(len(x0))]

        def along(c: float, centre: list[float] = centre, worst: list[float] = pts[-1]) -> list[float]:
            return [centre[j] + c * (worst[j] - centre[j]) for j in range(len(x0))]

        xr = along(-1.0)
        fr = f(xr)
        if fr < vals[0]:
            xe = along(-2.0)
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = along(0.5)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [[(p[j] + pts[0][j]) / 2 for j in range(len(x0))] for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
        if max(vals) - min(vals) < 1e-6:
            break
    return pts[min(range(len(pts)), key=lambda i: vals[i])]


def ridge(device: str) -> float:
    """The roofline's ridge point of a device preset: peak FLOP/s / HBM bytes/s (FLOP/byte)."""
    preset = DEVICE_PRESETS[device]
    return preset.peak_bf16_tflops * 1e12 / (preset.hbm_gb_per_s * 1e9)


def models_of(e_max: float, half_a100: float, hbm: float, source: str, fitted_on: tuple[str, ...]) -> dict[str, GemmModel]:
    """Both devices' GEMM models from the three shared constants (module docstring): ``e_max`` the
    A100's, the H100's that x the ratio of their largest measured matmuls' fractions of peak
    (``MAMF_FRACTION``), ``I_half`` the A100's, the H100's scaled by the ridge points."""
    scale = ridge("h100-80gb") / ridge("a100-80gb")
    mamf = MAMF_FRACTION["h100-80gb"] / MAMF_FRACTION["a100-80gb"]
    return {device: GemmModel(max_efficiency=e_max * (mamf if device == "h100-80gb" else 1.0),
                              half_intensity=half_a100 * (scale if device == "h100-80gb" else 1.0),
                              memory_efficiency=hbm, source=source, fitted_on=fitted_on) for device in DEVICES}


def fit(rows: list[PublishedRun], without: str = "") -> dict[str, GemmModel]:
    """The three shared constants minimising the fit rows' squared log time ratios, each row priced
    at the option (micro-batch, chunks) the shipped constants choose for it; ``without``: the
    source left out (recorded in the models' source)."""
    start = DEVICE_GEMM["a100-80gb"]
    labels = tuple(r.label for r in rows)
    choice = {r.label: choice_of(price(r, DEVICE_GEMM[r.device]).plan) for r in rows}
    source = fit_source(without)

    def squash(v: float) -> float:
        return 1.0 / (1.0 + math.exp(-v))

    def model(x: list[float]) -> dict[str, GemmModel]:
        return models_of(squash(x[0]), math.exp(x[2]), squash(x[1]), source, labels)

    def loss(x: list[float]) -> float:
        try:
            models = model(x)
            return sum(math.log(predicted_time(r, models[r.device], choice[r.label]) / published_time(r)) ** 2
                       for r in rows)
        except (PlannerError, ValueError):
            return math.inf

    def logit(v: float) -> float:
        return math.log(v / (1.0 - v))

    x0 = [logit(start.max_efficiency), logit(start.memory_efficiency), math.log(start.half_intensity)]
    return model(_nelder_mead(loss, x0, [0.3, 0.5, 0.5], iters=80))


def fit_rows(rows: list[PublishedRun], without: str = "") -> list[PublishedRun]:
    return [r for r in rows if r.label in FIT_LABELS and r.publication != without]


def fit_all(rows: list[PublishedRun], jobs: int = 1) -> tuple[dict[str, GemmModel], dict[str, dict[str, GemmModel]]]:
    """The constants on every source's fit rows, and per source those fitted without it."""
    sources = list(dict.fromkeys(r.publication for r in rows))
    tasks = [("", fit_rows(rows))] + [(src, fit_rows(rows, src)) for src in sources]
    with ProcessPoolExecutor(jobs) if jobs > 1 else nullcontext() as pool:
        done = list(pool.map(_fit_task, tasks) if pool is not None else map(_fit_task, tasks))
    return done[0], dict(zip(sources, done[1:]))


def _fit_task(task: tuple[str, list[PublishedRun]]) -> dict[str, GemmModel]:
    without, rows = task
    return fit(rows, without)


def loso_model(run: PublishedRun, loso: dict[str, tuple[GemmModel, ...]]) -> GemmModel | None:
    """The leave-one-source-out fit (shipped, ``DEVICE_GEMM_LOSO``) that left the row's source out."""
    mark = f"without {run.publication};"
    left_out = next((m for m in loso.get(run.device, ()) if mark in m.source), None)
    if left_out is None and run.label not in FIT_LABELS and not any(
            r.publication == run.publication and r.label in FIT_LABELS for r in all_rows()):
        return DEVICE_GEMM[run.device]  # a source no fit has seen (the FP8 rows): every fit is out of its source
    return left_out


def shipped_text(models: dict[str, GemmModel], loso: dict[str, dict[str, GemmModel]]) -> str:
    """The fitted constants as ``planner/profiling/analytic/gemm.py`` holds them (lines of at most
    about 120 characters)."""
    def wrapped(text: str, indent: str) -> str:
        words, parts, line = text.split(" "), [], ""
        for w in words:
            if len(line) + len(w) > 96:
                parts.append(line)
                line = ""
            line += w + " "
        parts.append(line.rstrip())
        return ("\n" + indent).join(repr(p) for p in parts)

    def source_text(m: GemmModel, indent: str, without: str) -> str:
        if m.source == fit_source(without):
            return f"fit_source({without!r})" if without else "fit_source()"
        return f"({wrapped(m.source, indent + '        ')})"

    def one(m: GemmModel, indent: str, without: str = "") -> str:
        inner = indent + "    "
        rows, line = [], ""
        for label in m.fitted_on:
            if len(line) + len(label) > 90:
                rows.append(line)
                line = ""
            line += repr(label) + ", "
        rows.append(line)
        labels = ("\n" + inner + "           ").join(r.rstrip() for r in rows if r)
        return (f"GemmModel(\n{inner}max_efficiency={m.max_efficiency:.4f}, half_intensity={m.half_intensity:.2f}, "
                f"memory_efficiency={m.memory_efficiency:.4f},\n{inner}source={source_text(m, inner, without)},\n"
                f"{inner}fitted_on=({labels}),\n{indent})")
    lines = ["DEVICE_GEMM: dict[str, GemmModel] = {"] + [f"    {d!r}: {one(models[d], '    ')}," for d in DEVICES]
    lines += ["}", "DEVICE_GEMM_LOSO: dict[str, tuple[GemmModel, ...]] = {"]
    for d in DEVICES:
        lines.append(f"    {d!r}: (" + "".join(f"\n        {one(fits[d], '        ', src)}," for src, fits in loso.items()) + "\n    ),")
    return "\n".join(lines + ["}"])


# ---------------------------------------------------------------- one row


@dataclasses.dataclass(frozen=True)
class RowResult:
    """A row priced with the shipped constants and out of source (the fit that left its source out),
    the out-of-source prediction's input ranges (in :attr:`Priced.seconds`' units) and their names;
    the model's own error, once every source is priced (:meth:`with_model_error`), and the band it
    gives ((0, 0): none); the overhead terms of the configuration, and the planner's own plan (or
    why there is none)."""

    priced: Priced
    out: Priced | None
    ranges: tuple[tuple[float, float], ...]
    overheads: tuple[str, ...]
    ours: Plan | str | None
    seconds: float
    range_names: tuple[str, ...] = ()
    model_error: float = 0.0
    band: tuple[float, float] = (0.0, 0.0)

    def inputs_band(self) -> tuple[float, float]:
        """The out-of-source time's band from its input ranges alone (no model term)."""
        t = self.out.seconds if self.out is not None else 0.0
        return combine(t, list(self.ranges))

    def with_model_error(self, error: float) -> RowResult:
        """The band: the input ranges and +-``error`` of the out-of-source time, in quadrature."""
        if self.out is None:
            return self
        t = self.out.seconds
        return dataclasses.replace(self, model_error=error,
                                   band=combine(t, [*self.ranges, (t * (1 - error), t * (1 + error))]))


#: the band term of what the source leaves out (micro-batch, chunks per rank, recomputation)
UNKNOWNS = "settings the source leaves out"
#: the band term of the GEMM constants' leave-one-source-out spread (planner.cost.band)
GEMM_INPUT = "GEMM constants"


def unseen_fits(run: PublishedRun, loso: dict[str, tuple[GemmModel, ...]]) -> tuple[GemmModel, ...]:
    """The leave-one-source-out fits fitted on no row of ``run``'s source: for a source with fit
    rows only the one that left it out (the out-of-source prediction's own), for one without
    (the FP8 rows) every fit."""
    mine = {r.label for r in all_rows() if r.publication == run.publication}
    return tuple(m for m in loso.get(run.device, ()) if not mine.intersection(m.fitted_on))

Ranges = tuple[tuple[tuple[float, float], ...], tuple[str, ...]]


def band_of(run: PublishedRun, out: Priced, gemm: GemmModel,
            loso: dict[str, tuple[GemmModel, ...]]) -> tuple[Ranges, tuple[str, ...]]:
    """The out-of-source prediction's input ranges but the model's own error (module docstring)
    and their names, and its overhead terms, as text."""
    fits, unseen = loso.get(run.device, ()), unseen_fits(run, loso)
    if run.metric is Metric.LAYER_MS:  # the layer under each fit that never saw its source
        times = [price(run, m).seconds for m in unseen] + [out.seconds]
        return (((min(times), max(times)),), (GEMM_INPUT,)), ()
    plan = with_accounts(out.plan, profile_for(run, gemm), cluster_for(run), config_request(run))
    # the plan's band takes every fit; a row's band only those that never saw its source
    inputs = [i for i in plan.predicted.band.inputs
              if i.name != MODEL_ERROR_SOURCE and (i.name != GEMM_INPUT or len(unseen) == len(fits))]
    ranges, names = [(i.low_ms, i.high_ms) for i in inputs], [i.name for i in inputs]
    if 1 < len(unseen) < len(fits):  # some fits saw its source: the others', priced again
        times = [price(run, m).seconds * 1e3 for m in unseen] + [out.seconds * 1e3]
        ranges.append((min(times), max(times)))
        names.append(GEMM_INPUT)
    times = [p.predicted.iteration_ms for p in (out.plan, *out.options)]
    for level in run.recompute_options:  # a recomputation the source leaves open: its fitting options too
        if level is not run.recompute:
            alt = price(dataclasses.replace(run, recompute=level), gemm)
            times += [p.predicted.iteration_ms for p in (alt.plan, *alt.options) if alt.fits or p is not alt.plan]
    if len(times) > 1:  # what the source leaves out: every option that fits
        ranges.append((min(times), max(times)))
        names.append(UNKNOWNS)
    terms = tuple(f"{t.kind.value} {t.ms / 1e3:+.3g} s" for t in plan.predicted.overheads if abs(t.ms) >= 0.5e-3 * 1e3)
    return (tuple((lo / 1e3, hi / 1e3) for lo, hi in ranges), tuple(names)), terms


def price_row(run: PublishedRun, models: dict[str, GemmModel], loso: dict[str, tuple[GemmModel, ...]],
              plans: bool) -> RowResult:
    """One row (:class:`RowResult`)."""
    t0 = time.perf_counter()
    priced = price(run, models[run.device])
    gemm = loso_model(run, loso)
    out = price(run, gemm) if gemm is not None else None
    (ranges, names), terms = band_of(run, out, gemm, loso) if out is not None else (((), ()), ())
    ours: Plan | str | None = None
    if plans and run.metric is not Metric.OUT_OF_MEMORY:
        try:
            ours = own_plan(run, models[run.device], priced)
        except PlannerError as exc:
            ours = str(exc).splitlines()[0]
    return RowResult(priced, out, ranges, terms, ours, time.perf_counter() - t0, names)


def scores(rows: list[PublishedRun], results: list[RowResult]) -> list[tuple[str, float]]:
    """Per row with a published time, its source and its out-of-source error left after its input
    ranges (:func:`planner.cost.band.residual_score`)."""
    out = []
    for run, res in zip(rows, results):
        pub = published_time(run)
        if res.out is None or not pub:
            continue
        t = res.out.seconds
        lo, hi = res.inputs_band()
        out.append((run.publication, residual_score(pub / t - 1, (t - lo) / t, (hi - t) / t)))
    return out


def score_lines(rows: list[PublishedRun], results: list[RowResult]) -> list[str]:
    """``--scores``: per source, its rows' scores (:func:`scores`) largest first, each with the
    out-of-source deviation (published / predicted - 1) and the input ranges' sides it is left
    after; then the rank the :data:`BAND_COVERAGE` conformal quantile takes over every row."""
    by_source: dict[str, list[tuple[float, str]]] = {}
    timed = [(run, res) for run, res in zip(rows, results) if res.out is not None and published_time(run)]
    for (run, res), (src, score) in zip(timed, scores(rows, results)):  # scores() skips the same rows
        t = res.out.seconds if res.out is not None else 0.0
        lo, hi = res.inputs_band()
        by_source.setdefault(src, []).append(
            (score, f"{run.label} {100 * score:.1f} ({100 * (published_time(run) / t - 1):+.1f}% vs -{100 * (t - lo) / t:.1f}"
                    f"/+{100 * (hi - t) / t:.1f}%)"))
    out = [f"scores, {src}: " + ", ".join(text for _, text in sorted(v, key=lambda kv: -kv[0]))
           for src, v in by_source.items()]
    every = sorted((x for v in by_source.values() for x, _ in v), reverse=True)
    if every:
        rank = min(math.ceil((len(every) + 1) * BAND_COVERAGE), len(every))  # conformal_quantile's
        out.append(f"scores, every source: {', '.join(f'{100 * x:.1f}' for x in every)}; the {BAND_COVERAGE:.0%} conformal "
                   f"quantile: number {len(every) - rank + 1} of {len(every)} from the largest, "
                   f"{100 * conformal_quantile(every):.1f}%")
    return out


def model_errors(rows: list[PublishedRun], results: list[RowResult]) -> dict[str, float]:
    """Per source, the model's error out of source for its rows' bands: the :data:`BAND_COVERAGE`
    conformal quantile of the other sources' rows' scores (:func:`scores`); :data:`MODEL_ERROR`
    where no other source has a row."""
    scored = scores(rows, results)
    others = {src: [e for s, e in scored if s != src] for src in {r.publication for r in rows}}
    return {src: conformal_quantile(v) if v else MODEL_ERROR for src, v in others.items()}


def outside(run: PublishedRun, res: RowResult) -> str:
    """Why a row's published figure lies outside its band ("" when inside): the published time's
    deviation from the out-of-source prediction, the band's sides, and its largest terms."""
    pub, (lo, hi) = published_time(run), res.band
    if res.out is None or not pub or lo <= pub <= hi:
        return ""
    t = res.out.seconds
    up = pub > t
    side = [(n, (b - t) / t if up else (t - a) / t) for n, (a, b) in zip(res.range_names, res.ranges)]
    side = sorted([*side, ("model term", res.model_error)], key=lambda kv: -kv[1])
    terms = ", ".join(f"{n} {100 * v:.1f}%" for n, v in side[:3] if v > 5e-4)
    return (f"{run.label}: published {100 * (pub / t - 1):+.1f}% from the prediction, band "
            f"-{100 * (t - lo) / t:.1f}%/+{100 * (hi - t) / t:.1f}% ({'above' if up else 'below'}: {terms})")


# ---------------------------------------------------------------- the table


def describe_plan(p: Plan) -> str:
    full = sum(len(s.recompute) for s in p.stages)
    sel = sum(len(s.recompute_selective) for s in p.stages)
    return (f"{p.layout.describe(pipeline_ranks=True)}, {p.schedule.value}, b={p.microbatch_size}, "
            f"M={p.num_microbatches}, recompute {full} full + {sel} selective")


def pct(values: list[float]) -> str:
    """Median and worst of |values| (ratios - 1), in percent."""
    mags = [abs(v) for v in values]
    return f"median |error| {100 * statistics.median(mags):.1f}%, worst {100 * max(mags):.1f}%" if mags else "-"


@dataclasses.dataclass
class Tally:
    """What the summary lines count."""

    shipped: list[float] = dataclasses.field(default_factory=list)  # time ratio - 1, shipped constants
    out: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # per source, out of source
    inside: int = 0
    widths: list[float] = dataclasses.field(default_factory=list)
    claims: int = 0
    fits_as_claimed: int = 0
    plans: int = 0
    faster: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)

    def add(self, run: PublishedRun, res: RowResult) -> None:
        priced, out = res.priced, res.out
        if run.metric is not Metric.LAYER_MS:
            self.claims += 1
            ran = run.metric is not Metric.OUT_OF_MEMORY
            self.fits_as_claimed += priced.fits == ran
            if priced.fits != ran:
                self.notes.append(f"{run.label} {'does not fit' if ran else 'fits'} though it "
                                  f"{'ran' if ran else 'ran out of memory'}")
        pub = published_time(run)
        if pub:
            self.shipped.append(time_ratio(run, priced) - 1)
            if out is not None:
                self.out.setdefault(run.publication, []).append(time_ratio(run, out) - 1)
                lo, hi = res.band
                self.inside += lo <= pub <= hi
                self.widths.append((hi - lo) / out.seconds)
        if isinstance(res.ours, Plan):
            self.plans += 1
            rel = res.ours.predicted.iteration_ms / priced.plan.predicted.iteration_ms
            self.faster += rel <= 1 + 1e-9

    def summary(self, n_rows: int, n_sources: int) -> str:
        out = [v for vs in self.out.values() for v in vs]
        loso = (f"leave-one-source-out median {100 * statistics.median([abs(v) for v in out]):.1f}% worst "
                f"{100 * max(abs(v) for v in out):.1f}%, mean signed {100 * statistics.fmean(out):+.1f}%" if out
                else "leave-one-source-out -, mean signed -")
        width = f"{100 * statistics.median(self.widths):.1f}%" if self.widths else "-"
        timed = len(self.shipped)
        return (f"published runs: {n_rows} rows from {n_sources} sources, {pct(self.shipped)}, {loso}, "
                f"inside band {self.inside}/{timed} (median width {width}), fits {self.fits_as_claimed}/{self.claims}, "
                f"ours faster on {self.faster if self.plans else '-'}/{self.plans or '-'}")


def _line(run: PublishedRun, res: RowResult) -> str:
    priced, out = res.priced, res.out
    b, v = choice_of(priced.plan)
    ratio = time_ratio(run, priced)
    loso = f"{time_ratio(run, out):>6.3f}" if out is not None and published_time(run) else f"{'-':>6}"
    pub = published_time(run)
    band = f"{res.band[0] / pub:.3f}-{res.band[1] / pub:.3f}" if pub and res.band[1] else "-"
    rc = run.recompute.value[:6]
    mark = "*" if run.label in FIT_LABELS else " "
    figure = f"{run.published:>9.4g}" if run.metric is not Metric.OUT_OF_MEMORY else f"{'OOM':>9}"
    line = (f"{run.label + mark:<22} {run.t:>2} {run.p:>3} {run.d:>3} {run.cp:>2} {run.gpus:>5} {run.batch:>5} {b:>2} {v:>1} "
            f"{rc:<6} {run.metric.value[:16]:<16} {figure} {priced.predicted:>9.4g} {ratio:>6.3f} {loso} "
            f"{band:>11} {priced.peak_bytes / GIB:>5.1f} {'yes' if priced.fits else 'NO':>4} |")
    if isinstance(res.ours, str):
        line += f" {'-':>11}  no plan: {res.ours}"
    elif res.ours is not None:
        line += f" {res.ours.predicted.iteration_ms / priced.plan.predicted.iteration_ms:>11.3f}  {describe_plan(res.ours)}"
    return line + f" ({res.seconds:.1f} s)"


def _notes(run: PublishedRun, res: RowResult) -> str:
    priced = res.priced
    notes = list(priced.notes) + list(run.assumed)
    if res.overheads:
        notes.insert(0, "overheads: " + ", ".join(res.overheads))
    if not priced.fits:
        notes.insert(0, f"DOES NOT FIT: {priced.over_bytes / GIB:.2f} GiB over {priced.usable_bytes / GIB:.2f} GiB; "
                        f"{priced.reason}")
    if run.metric is Metric.LAYER_MS:
        notes.insert(0, f"fwd {priced.fwd_ms:.2f} / {run.published_fwd_ms} ms, bwd {priced.bwd_ms:.2f} / "
                        f"{run.published_bwd_ms} ms (predicted / published)")
    return f"{'':<22} assumed/notes: {'; '.join(notes)}" if notes else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="", help="comma-separated row labels (default: all)")
    ap.add_argument("--no-plan", action="store_true", help="skip the planner's own plans")
    ap.add_argument("--fit", action="store_true", help="fit the constants (on all sources, and leaving each out) first")
    ap.add_argument("--jobs", type=int, default=1, help="rows priced in this many processes at once (printed in order)")
    ap.add_argument("--scores", action="store_true", help="print each row's score behind the band's model term, by source")
    args = ap.parse_args()
    rows = all_rows()
    models = dict(DEVICE_GEMM)
    if args.fit:
        t0 = time.perf_counter()
        models, by_source = fit_all(rows, args.jobs)
        print(shipped_text(models, by_source))
        DEVICE_GEMM.update(models)  # the table below is priced with the new fits, bands included
        DEVICE_GEMM_LOSO.clear()
        DEVICE_GEMM_LOSO.update({d: tuple(f[d] for f in by_source.values()) for d in DEVICES})
        print(f"({time.perf_counter() - t0:.0f} s)\n")
    loso = dict(DEVICE_GEMM_LOSO)
    if args.rows:
        wanted = {x.strip() for x in args.rows.split(",")}
        rows = [r for r in rows if r.label in wanted]
    m = models["a100-80gb"]
    print(f"constants (both devices; the H100's I_half the A100's x the ridge-point ratio {ridge('h100-80gb') / ridge('a100-80gb'):.4f}): "
          f"e_max {m.max_efficiency:.4f}, I_half {m.half_intensity:.2f} FLOP/byte, HBM fraction {m.memory_efficiency:.4f}; "
          f"fitted on: {', '.join(m.fitted_on) or '(not fitted)'}")
    for fits in zip(*loso.values()) if loso else ():
        f = fits[0]
        print(f"  {f.source.split(';')[0].split(': ')[-1]}: e_max {f.max_efficiency:.4f}, I_half {f.half_intensity:.2f}, "
              f"HBM fraction {f.memory_efficiency:.4f}")
    print(f"fits: per-GPU peak + {RUNTIME_RESERVE_BYTES / GIB:.0f} GiB outside the allocator (the band's top) <= the memory "
          f"CUDA reports; * = a fit row; time ratios predicted / published (> 1: predicted slower), 'loso' out of "
          f"source, band its range\n")
    head = (f"{'row':<22} {'t':>2} {'p':>3} {'d':>3} {'cp':>2} {'N':>5} {'B':>5} {'b':>2} {'v':>1} {'rc':<6} {'metric':<16} "
            f"{'published':>9} {'predicted':>9} {'ratio':>6} {'loso':>6} {'band':>11} {'GiB':>5} {'fits':>4} | "
            f"{'ours/theirs':>11}  our plan")
    print(head)
    print("-" * len(head))
    tally = Tally()
    work = partial(price_row, models=models, loso=loso, plans=not args.no_plan)
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else nullcontext() as pool:
        results = []
        for i, res in enumerate(pool.map(work, rows) if pool is not None else map(work, rows)):
            results.append(res)
            print(f"priced {i + 1}/{len(rows)}: {rows[i].label}", file=sys.stderr, flush=True)
    errors = model_errors(rows, results)  # every source priced: each row's band from the others' errors
    misses = []
    for run, res in zip(rows, results):
        res = res.with_model_error(errors[run.publication])
        tally.add(run, res)
        print(_line(run, res), flush=True)
        notes = _notes(run, res)
        if notes:
            print(notes)
        misses.append(outside(run, res))
    print()
    for src, errs in tally.out.items():
        print(f"leave-one-source-out, {src} ({len(errs)} rows): {pct(errs)}, mean signed {100 * statistics.fmean(errs):+.1f}%")
    scored = [e for _, e in scores(rows, results)]
    if scored:
        measured = conformal_quantile(scored)
        print(f"the band's model term (planner.cost.band.MODEL_ERROR: the {BAND_COVERAGE:.0%} conformal quantile of "
              f"the errors left after each row's input ranges): {100 * measured:.1f}% over these {len(scored)} rows, "
              f"{100 * MODEL_ERROR:.1f}% shipped; each source's rows take the other sources': "
              + ", ".join(f"{src} {100 * e:.1f}%" for src, e in sorted(errors.items())))
        if args.fit and not args.rows:
            print(f"MODEL_ERROR = {measured:.3f}  # planner/cost/band.py")
        if args.scores:
            print("\n".join(score_lines(rows, results)))
    print(f"outside the band: {'; '.join(m for m in misses if m) or 'none'}")
    print(f"memory claims not met: {'; '.join(tally.notes) or 'none'}")
    print(f"\n{tally.summary(len(rows), len({r.publication for r in rows}))}")
    if not args.rows:  # the mixture-of-experts rows: their own table (benchmarks/published_moe.py)
        print()
        published_moe.report(plans=not args.no_plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
