"""Published training runs priced by the cost model, and the planner's own plan beside each.

Every row of Narayanan et al. 2021 Table 1, Korthikanti et al. 2022 Tables 4 and 5 and the
Megatron-LM README table (``benchmarks/published_rows.py``; the numbers and what each source
leaves out: ``../shared/reference/published_runs/README.md``) is priced with its published
configuration forced -- t, p, d, micro-batch, schedule and chunks, recomputation and sequence
parallelism as published, and the stack it ran on (what it overlapped,
``planner.artifacts.stack``); what the source leaves out is assumed and printed -- and compared
with the published figure: TFLOP/s per GPU (the source's own FLOP count / our predicted
iteration time / GPUs), iteration seconds, or one layer's forward + backward ms.

``fits`` (issue 18's memory check, folded in from the former ``published_memory.py``): the
configuration's per-GPU peak (the simulator's, the largest over devices: weights, gradients and
optimizer state as the run's optimizer keeps them, the activations of the micro-batches in
flight, recompute workspace and send/receive buffers) within what the device's allocator can
hand out (:func:`usable_bytes`: the memory the CUDA runtime reports, 79.14 GiB on an
A100-SXM4-80GB and 79.11 GiB on an H100 80GB, less 1 GiB the process holds outside PyTorch's
allocator), printed in GiB; a row that does not fit is named in its notes with the GiB over and the memory
terms of its tightest device (its chunks summed). Korthikanti et al. 2022 Table 3's configurations are the
Table 5 "present work" rows (sequence parallelism and selective recomputation of every block's
attention core, materialised attention as their Table 2 counts it, 18 bytes per parameter);
the Megatron-LM README rows run FlashAttention, no recomputation, the distributed optimizer
(ZeRO-1 over d, fp32 gradients: 6 + 12 / d bytes per parameter) at the faster of micro-batches 1,
2 and 4 and, with p > 1, of 1F1B and 2 chunks per rank that fits (the table gives neither; as the
1T row's chunks per rank and the Narayanan rows' schedule), their tensor-parallel collectives
hidden behind GEMMs at the cost the h100 preset's ``overlap_compute_loss`` says. Table 4's
rows time one layer: their ``fits`` is the whole 22B model at that layout, which the source
does not claim ran.

Constants: the GEMM model of each device (``planner.profiling.analytic.gemm``: at most three
constants, its largest GEMMs' fraction of peak, the intensity at half of it, the achieved HBM
fraction) is fitted on at most a third of that device's rows (``FIT_ROWS``, marked ``*``);
every other row is out of sample. ``--fit`` refits them (Nelder-Mead on the squared log
ratios of the fit rows) and prints them. The shipped H100 e_max and HBM fraction are the fit of
its rows as priced here (each at its faster micro-batch and schedule, its hidden tensor-parallel
collectives charged the preset's ``overlap_compute_loss``), its I_half the shipped A100's scaled
by the ridge points (``benchmarks/RESULTS.md`` section 39). The shipped A100 constants are the fit
of its rows as they were priced in section 10; ``--fit`` now moves them (to e_max 0.6874, I_half
82.86, HBM fraction 0.6486 on 2026-12-06), not shipped: they would move every A100 profile and
plan, and with them the H100's I_half.

Then, per row, the planner's own plan for the same GPUs, batch and stack (default request:
t, p, d, ZeRO, micro-batch, schedule with chunks, partition and recomputation searched), held to
the memory the published configuration is held to (:func:`own_plan`: the usable memory, or the
configuration's own peak where that is more -- Table 4's one-layer rows, whose whole-model
layout never ran -- not the default 10% headroom, which would compare a plan on 71 GiB with a
run on 77): its predicted time against the published configuration's, both under the same
model ("ours/theirs" <= 1: ours is no slower).

Recomputation as published (:func:`partition`): full, every transformer block recomputed;
selective (Korthikanti et al.'s "present work" and Table 4's selective rows), every block's
attention core (QK^T, softmax, dropout, attention over V) recomputed in its backward
(``rebuild_plan(..., selective=...)``, ``PlanStage.recompute_selective``); Table 4's layer
backward then includes the core's forward again (``CostModel.core_ms``).

Last line: ``published runs: N rows, median |error| X%, worst Y%, fits F/N, ours faster on K/N``
("faster": no slower, within 1e-9); then the mixture-of-experts rows' own table and line
(``benchmarks/published_moe.py``).

Run: ``python benchmarks/published_runs.py [--rows LABEL,...] [--no-plan] [--fit] [--jobs N]``
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
from planner.artifacts.kinds import ScheduleKind, SolverKind, ZeroStage
from planner.artifacts.layout import DeviceGroup, Layout
from planner.artifacts.plan import Plan, PlanStage
from planner.artifacts.profile import Profile
from planner.artifacts.request import PlanRequest
from planner.cost.tensor_parallel import device_cost_model
from planner.profiling.analytic.common import DEVICE_PRESETS
from planner.profiling.analytic.gemm import DEVICE_GEMM, GemmModel
from planner.profiling.analytic.gpt import gpt_profile
from planner.solve import plan as solve
from planner.solve.build import rebuild_plan

#: the rows each device's constants are fitted on (at most a third of the device's rows)
FIT_ROWS: dict[str, tuple[str, ...]] = {
    "a100-80gb": ("K4 baseline", "K4 seq-par", "N1 1.7B", "N10 1008B", "K5 175B full"),
    "h100-80gb": ("M 1.7B", "M 32B", "M 462B"),
}

GIB = 1024**3
#: memory a training process holds outside PyTorch's caching allocator: the CUDA context, cuBLAS
#: workspaces, NCCL's buffers. A public H100 out-of-memory report reads 79.11 GiB total, 77.78 allocated,
#: 0.4 reserved but unallocated and ~0.15 free: ~0.8 GiB outside the allocator; 1 GiB assumed.
RUNTIME_RESERVE_BYTES = GIB


def usable_bytes(run: PublishedRun) -> int:
    """What the row's tensors may take on one GPU: the device memory the CUDA runtime reports (the
    cluster preset's, ``planner.artifacts.cluster``) less :data:`RUNTIME_RESERVE_BYTES`."""
    return PRESETS[run.preset].device_memory_bytes - RUNTIME_RESERVE_BYTES


@dataclasses.dataclass(frozen=True)
class Priced:
    """A row priced: the predicted figure in the row's metric, the configuration's plan (for
    its time and memory), and Table 4's forward and backward."""

    predicted: float
    plan: Plan
    usable_bytes: int = dataclasses.field(metadata={"doc": "what the tensors may take per GPU (:func:`usable_bytes`)"})
    fwd_ms: float = 0.0
    bwd_ms: float = 0.0
    notes: tuple[str, ...] = ()  # faster schedule options that do not fit

    @property
    def peak_bytes(self) -> int:
        """Per-GPU peak memory of the published configuration (the simulator's)."""
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
        """Why it does not fit ("" when it does): the terms of the tightest stage."""
        return "" if self.fits else tightest(self.plan)


def tightest(plan: Plan) -> str:
    """The tightest device of a plan (a pipeline rank: its chunks' memory summed, as the
    simulator's per-GPU peak does) and its memory terms, largest first."""
    layout = plan.layout
    ranks = range(layout.pipeline_size)
    rank = max(ranks, key=lambda r: sum(plan.stages[i].memory_total_bytes for i in layout.stage_indices(r)))
    chunks = [plan.stages[i] for i in layout.stage_indices(rank)]
    ids = ", ".join(str(c.stage_idx) for c in chunks)
    where = f"stage {ids}" if len(chunks) == 1 else f"pipeline rank {rank} (chunks {ids})"
    return f"{where}: " + memory_terms(chunks)


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


@lru_cache(maxsize=64)
def profile_for(run: PublishedRun, gemm: GemmModel) -> Profile:
    return gpt_profile(layers=run.layers, hidden=run.hidden, heads=run.heads, seq=run.seq, vocab=run.vocab,
                       device_preset=run.device, gemm=gemm, attention="flash" if run.flash_attention else "materialised",
                       model=f"{run.source}: {run.label}")


def partition(run: PublishedRun, chunks: int) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """The layers split evenly over ``chunks`` stages (embedding with the first, LM head with the
    last: Megatron-LM's split): the stage start layers, and per stage its fully and its
    selectively recomputed layers (every transformer block at the row's level, none else)."""
    q, rem = divmod(run.layers, chunks)
    sizes = [q + (1 if i < rem else 0) for i in range(chunks)]
    starts = [0] + [1 + sum(sizes[:i]) for i in range(1, chunks)]
    stops = starts[1:] + [run.layers + 2]
    blocks = [[i for i in range(a, b) if 1 <= i <= run.layers] for a, b in zip(starts, stops)]
    none: list[list[int]] = [[] for _ in starts]
    full = blocks if run.recompute is Recompute.FULL else none
    selective = blocks if run.recompute is Recompute.SELECTIVE else none
    return starts, full, selective


def request_for(run: PublishedRun, **kw: object) -> PlanRequest:
    return PlanRequest(global_batch=run.batch, num_devices=run.gpus, optimizer=run.optimizer,
                       stack=run.stack, **kw)  # type: ignore[arg-type]


def config_plan(run: PublishedRun, gemm: GemmModel) -> Plan:
    """The published configuration's plan (:func:`config_options`: the one priced)."""
    return config_options(run, gemm)[0]


def config_options(run: PublishedRun, gemm: GemmModel) -> list[Plan]:
    """The published configuration priced by the cost model and the simulator, layers split
    evenly (:func:`partition`). Where the source gives the chunks per rank and the micro-batch
    (one option) that schedule; where it does not (several options: interleaved only where M is a
    multiple of p, micro-batches that leave M >= p), the faster of those that fit (a run
    that trained fit; the faster overall when none does, then reported as not fitting). The one
    priced first, then the other options."""
    prof, cluster = profile_for(run, gemm), cluster_for(run)
    request = request_for(run, tp_degrees=(run.t,), zero_stages=(ZeroStage(run.zero),),
                          sequence_parallel=(run.sequence_parallel,))
    out = []
    for b, v in itertools.product(run.microbatches or (run.microbatch,), run.chunks):
        m = run.batch // (run.d * b)
        if run.batch % (run.d * b) or m < run.p or (v > 1 and (run.p == 1 or m % run.p or run.layers % (run.p * v))):
            continue  # 1F1B keeps M >= P; interleaving where M is a multiple of p
        starts, full, selective = partition(run, run.p * v)
        layout = Layout(num_stages=run.p * v, virtual_stages_per_rank=v, dp_degree=run.d, tp_degree=run.t,
                        sequence_parallel=run.sequence_parallel, zero=ZeroStage(run.zero))
        schedule = ScheduleKind.INTERLEAVED_1F1B if v > 1 else ScheduleKind.ONE_F_ONE_B
        out.append(rebuild_plan(prof, cluster, request, layout=layout, boundaries=starts,
                                recompute=full, selective=selective, microbatch_size=b,
                                schedule=schedule, solver=SolverKind.GIVEN))
    if not out:
        raise ValueError(f"{run.label}: no valid schedule among chunks {run.chunks}")
    fitting = [p for p in out if p.predicted.peak_memory_bytes <= usable_bytes(run)]
    best = min(fitting or out, key=lambda p: p.predicted.iteration_ms)
    return [best] + [p for p in out if p is not best]


def price(run: PublishedRun, gemm: GemmModel) -> Priced:
    """The row's figure as the cost model predicts it for the published configuration."""
    options = config_options(run, gemm)
    plan = options[0]
    notes = tuple(f"v={p.layout.virtual_stages_per_rank}{f' b={p.microbatch_size}' if run.microbatches else ''} would be "
                  f"{p.predicted.iteration_ms / 1e3:.4g} s but needs "
                  f"{p.predicted.peak_memory_bytes / GIB:.1f} GiB" for p in options[1:]
                  if p.predicted.iteration_ms < plan.predicted.iteration_ms)
    secs, usable = plan.predicted.iteration_ms / 1e3, usable_bytes(run)
    if run.metric is Metric.TFLOPS:
        return Priced(run.flops_per_iteration / secs / run.gpus / 1e12, plan, usable, notes=notes)
    if run.metric is Metric.ITERATION_S:
        return Priced(secs, plan, usable, notes=notes)
    cm = device_cost_model(profile_for(run, gemm), cluster_for(run), run.optimizer,
                           DeviceGroup(tp_degree=run.t, sequence_parallel=run.sequence_parallel), run.stack)
    fwd, bwd = cm.layer_times(run.microbatch)
    block = 1  # every block is the same
    rc = {Recompute.NONE: 0.0, Recompute.FULL: float(fwd[block]),
          Recompute.SELECTIVE: float(cm.core_ms(run.microbatch)[block])}[run.recompute]
    return Priced(float(fwd[block] + bwd[block]) + rc, plan, usable, float(fwd[block]), float(bwd[block]) + rc)


def own_plan(run: PublishedRun, gemm: GemmModel, theirs: Priced) -> Plan:
    """The planner's own plan for the row's model, GPUs, batch and stack (default request) on
    the memory the published configuration ``theirs`` is held to: the usable memory, or its
    own peak where it does not fit (then both are priced on that much)."""
    cap = max(theirs.usable_bytes, theirs.peak_bytes)
    return solve(profile_for(run, gemm), cluster_for(run), request_for(run, memory_cap_bytes=cap))


def ratio(run: PublishedRun, priced: Priced) -> float:
    """Predicted / published, for time and throughput alike (> 1: the model predicts more)."""
    return priced.predicted / run.published


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
        if max(vals) - min(vals) < 1e-7:
            break
    return pts[min(range(len(pts)), key=lambda i: vals[i])]


def ridge(device: str) -> float:
    """The roofline's ridge point of a device preset: peak FLOP/s / HBM bytes/s (FLOP/byte)."""
    preset = DEVICE_PRESETS[device]
    return preset.peak_bf16_tflops * 1e12 / (preset.hbm_gb_per_s * 1e9)


def fit(device: str, rows: list[PublishedRun], half_intensity: float | None = None, derived: str = "") -> GemmModel:
    """The device's constants minimising the fit rows' squared log ratios (see module
    docstring); with ``half_intensity`` given (``derived`` says whence) only the other two."""
    start = DEVICE_GEMM[device]

    def logit(v: float) -> float:
        return math.log(v / (1.0 - v))

    def squash(v: float) -> float:
        return 1.0 / (1.0 + math.exp(-v))

    labels = ", ".join(r.label for r in rows)

    def model(x: list[float]) -> GemmModel:
        half = math.exp(x[2]) if half_intensity is None else half_intensity
        fitted = "e_max and the HBM fraction" + (" and I_half" if half_intensity is None else f"; I_half {derived}")
        return GemmModel(max_efficiency=squash(x[0]), half_intensity=half, memory_efficiency=squash(x[1]),
                         source=f"benchmarks/published_runs.py --fit: {fitted}; fitted on {labels}",
                         fitted_on=tuple(r.label for r in rows))

    def loss(x: list[float]) -> float:
        try:
            gemm = model(x)
            return sum(math.log(ratio(r, price(r, gemm))) ** 2 for r in rows)
        except (PlannerError, ValueError):
            return math.inf

    x0 = [logit(start.max_efficiency), logit(start.memory_efficiency), math.log(start.half_intensity)]
    steps = [0.3, 0.5, 0.5]
    n = 3 if half_intensity is None else 2
    return model(_nelder_mead(loss, x0[:n], steps[:n]))


def fit_all(rows: list[PublishedRun]) -> dict[str, GemmModel]:
    """Every device's constants: the A100's three on its fit rows; the H100's largest-GEMM
    efficiency and HBM fraction on its fit rows, its half-saturation intensity the A100's scaled
    by the ratio of the two devices' ridge points (the roofline's knee moves with peak / HBM;
    three constants on the three H100 rows allowed would interpolate them exactly)."""
    models = {}
    for device in ("a100-80gb", "h100-80gb"):
        fit_rows = [r for r in rows if r.label in FIT_ROWS[device]]
        if device == "a100-80gb":
            models[device] = fit(device, fit_rows)
        else:
            a100 = models["a100-80gb"]
            scale = ridge(device) / ridge("a100-80gb")
            models[device] = fit(device, fit_rows, a100.half_intensity * scale,
                                 f"= the A100's {a100.half_intensity:.2f} x the ridge-point ratio {scale:.4f}")
    return models


# ---------------------------------------------------------------- the table


def describe_plan(p: Plan) -> str:
    full = sum(len(s.recompute) for s in p.stages)
    sel = sum(len(s.recompute_selective) for s in p.stages)
    return (f"{p.layout.describe(pipeline_ranks=True)}, {p.schedule.value}, b={p.microbatch_size}, "
            f"M={p.num_microbatches}, recompute {full} full + {sel} selective")


def error_summary(errors: list[float]) -> str:
    return f"median |error| {100 * statistics.median(errors):.1f}%, worst {100 * max(errors):.1f}%" if errors else "-"



def price_row(run: PublishedRun, models: dict[str, GemmModel], plans: bool) -> tuple[Priced, Plan | str | None, float]:
    """One row priced, and the planner's own plan (or why there is none), and the seconds both took."""
    t0 = time.perf_counter()
    priced = price(run, models[run.device])
    ours: Plan | str | None = None
    if plans:
        try:
            ours = own_plan(run, models[run.device], priced)
        except PlannerError as exc:
            ours = str(exc).splitlines()[0]
    return priced, ours, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="", help="comma-separated row labels (default: all)")
    ap.add_argument("--no-plan", action="store_true", help="skip the planner's own plans")
    ap.add_argument("--fit", action="store_true", help="refit each device's constants on FIT_ROWS first")
    ap.add_argument("--jobs", type=int, default=1, help="rows priced in this many processes at once (printed in order)")
    args = ap.parse_args()
    rows = all_rows()
    models = dict(DEVICE_GEMM)
    if args.fit:
        t0 = time.perf_counter()
        models = fit_all(rows)
        for device, m in models.items():
            print(f"fitted {device}: GemmModel(max_efficiency={m.max_efficiency!r}, half_intensity={m.half_intensity!r}, "
                  f"memory_efficiency={m.memory_efficiency!r}, source={m.source!r}, fitted_on={m.fitted_on!r})")
        print(f"({time.perf_counter() - t0:.0f} s)")
    if args.rows:
        wanted = {x.strip() for x in args.rows.split(",")}
        rows = [r for r in rows if r.label in wanted]
    for device, m in models.items():
        print(f"{device}: e_max {m.max_efficiency:.4f}, I_half {m.half_intensity:.2f} FLOP/byte, HBM fraction "
              f"{m.memory_efficiency:.4f}; fitted on: {', '.join(m.fitted_on) or '(not fitted)'}")
    usable = sorted({f"{d} {(PRESETS[r.preset].device_memory_bytes) / GIB:.2f} GiB" for r in rows for d in [r.device]})
    print(f"fits: per-GPU peak <= device memory as CUDA reports it ({', '.join(usable)}) less "
          f"{RUNTIME_RESERVE_BYTES / GIB:.0f} GiB outside the allocator; * = a fit row, the rest out of sample\n")
    head = (f"{'row':<17} {'t':>2} {'p':>3} {'d':>3} {'N':>5} {'B':>5} {'b':>2} {'v':>1} {'rc':<5} {'metric':<16} "
            f"{'published':>9} {'predicted':>9} {'ratio':>6} {'GiB':>5} {'fits':>4} | {'ours/theirs':>11}  our plan")
    print(head)
    print("-" * len(head))
    ratios, fits, faster = [], 0, 0
    fit_err: list[float] = []
    out_err: list[float] = []
    over: list[str] = []
    slower: list[str] = []
    priced_all: list[Priced] = []
    work = partial(price_row, models=models, plans=not args.no_plan)
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else nullcontext() as pool:
        results = pool.map(work, rows) if pool is not None else map(work, rows)
        for run, (priced, ours, seconds) in zip(rows, results):
            priced_all.append(priced)
            r = ratio(run, priced)
            ratios.append(r)
            fits += priced.fits
            in_fit = run.label in models[run.device].fitted_on
            (fit_err if in_fit else out_err).append(abs(r - 1))
            if abs(r - 1) > 0.10:
                over.append(f"{run.label} {100 * (r - 1):+.1f}%")
            mark = "*" if in_fit else " "
            v = priced.plan.layout.virtual_stages_per_rank
            b = priced.plan.microbatch_size
            line = (f"{run.label + mark:<17} {run.t:>2} {run.p:>3} {run.d:>3} {run.gpus:>5} {run.batch:>5} {b:>2} "
                    f"{v:>1} {run.recompute.value[:5]:<5} {run.metric.value[:16]:<16} {run.published:>9.4g} "
                    f"{priced.predicted:>9.4g} {r:>6.3f} {priced.peak_bytes / GIB:>5.1f} {'yes' if priced.fits else 'NO':>4} |")
            if not args.no_plan:
                if isinstance(ours, str):
                    line += f" {'-':>11}  no plan: {ours}"
                elif ours is not None:
                    rel = ours.predicted.iteration_ms / priced.plan.predicted.iteration_ms
                    faster += rel <= 1 + 1e-9
                    if rel > 1 + 1e-9:
                        slower.append(f"{run.label} {rel:.3f}")
                    line += f" {rel:>11.3f}  {describe_plan(ours)}"
            print(line + f" ({seconds:.1f} s)", flush=True)
            notes = list(priced.notes) + list(run.assumed)
            if not priced.fits:
                notes.insert(0, f"DOES NOT FIT: {priced.over_bytes / GIB:.2f} GiB over {priced.usable_bytes / GIB:.2f} GiB; "
                                f"{priced.reason}")
            if run.metric is Metric.LAYER_MS:
                notes.insert(0, f"fwd {priced.fwd_ms:.2f} / {run.published_fwd_ms} ms, bwd {priced.bwd_ms:.2f} / "
                                f"{run.published_bwd_ms} ms (predicted / published)")
            if notes:
                print(f"{'':<17} assumed/notes: {'; '.join(notes)}")
    errors = [abs(x - 1) for x in ratios]
    n = len(rows)
    print(f"\nfit rows ({len(fit_err)}): {error_summary(fit_err)}; out of sample ({len(out_err)}): {error_summary(out_err)}")
    print(f"over 10%: {', '.join(over) or 'none'}")
    print("do not fit: " + (", ".join(f"{run.label} by {p.over_bytes / GIB:.2f} GiB" for run, p in
                                             zip(rows, priced_all) if not p.fits) or "none"))
    if not args.no_plan:
        print(f"ours slower (ours/theirs > 1): {', '.join(slower) or 'none'}")
    print(f"\npublished runs: {n} rows, median |error| {100 * statistics.median(errors):.1f}%, "
          f"worst {100 * max(errors):.1f}%, fits {fits}/{n}, ours faster on {faster if not args.no_plan else '-'}/{n}")
    if not args.rows:  # the mixture-of-experts rows: their own table (benchmarks/published_moe.py)
        print()
        published_moe.report(plans=not args.no_plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
