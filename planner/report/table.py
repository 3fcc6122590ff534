"""Plain-text plan tables for the terminal (``planner plan``, ``planner show``)."""

from __future__ import annotations

from planner.artifacts.host import OffloadMode
from planner.artifacts.kinds import Objective, OverheadKind, ZeroStage
from planner.artifacts.plan import Plan, PlanStage
from planner.artifacts.plan_summary import OverheadTerm, ParetoPoint, Prediction
from planner.artifacts.text_table import format_table

GIB = 1024**3


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def _layers(stage: PlanStage) -> str:
    first, last = stage.layer_names[0], stage.layer_names[-1]
    span = f"{stage.layer_start}-{stage.layer_stop - 1}"
    return f"{span} ({first}..{last})" if first != last else f"{span} ({first})"


def recompute_text(stage: PlanStage) -> str:
    """The stage's recomputed layers: their number, ``full + selective sel`` when some layers
    recompute only their attention core."""
    if not stage.recompute_selective:
        return str(len(stage.recompute))
    return f"{len(stage.recompute)} + {len(stage.recompute_selective)} sel"


def _ranks(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def zero_label(zero: ZeroStage) -> str:
    """``no ZeRO`` or ``ZeRO-1``."""
    return f"ZeRO-{int(zero)}" if zero else "no ZeRO"


def sync_name(zero: ZeroStage) -> str:
    """The gradient synchronisation a plan runs: ``all-reduce``, or under ZeRO
    ``reduce-scatter + all-gather``; under ZeRO 3 (whose per-layer gathers and reduce-scatters
    are in the stages' forward and backward times) the tied-gradient exchange only."""
    if zero is ZeroStage.PARAMETERS:
        return "sync after backward (FSDP gathers in fwd/bwd)"
    return "reduce-scatter + all-gather" if zero else "all-reduce"


def pareto_label(q: ParetoPoint) -> str:
    """A Pareto point as figures and tables name it: its layout (T, P, D, ZeRO; Layout.describe),
    micro-batch size, schedule and recomputed layers, e.g. ``T=2 (seq-par) x P=1 x D=4, ZeRO-1,
    mb 1, 1f1b, rc 0``."""
    return f"{q.layout.describe()}, mb {q.microbatch_size}, {q.schedule.value}, rc {q.num_recomputed_layers}"


def format_plan(plan: Plan) -> str:
    """The plan as a table: one row per stage, then the predicted totals."""
    p = plan.predicted
    prov = plan.provenance
    layout = f"{plan.layout.describe(pipeline_ranks=True)}, schedule {plan.schedule.value}, "
    head = (
        f"plan for {prov.model} on {prov.cluster_name} ({plan.num_devices} devices) by solver {prov.solver.value!r}\n"
        + layout
        + f"M={plan.num_microbatches} micro-batches of {plan.microbatch_size} (global batch {plan.global_batch})\n"
        + f"stack {plan.stack.describe()}"
    )
    fewer = devices_note(plan)
    if fewer:
        head += "\n" + fewer
    sync = "sync ms" if plan.layout.zero else "allred ms"
    moe = any(s.alltoall_ms for s in plan.stages)
    off = plan.offload is not OffloadMode.NONE
    headers = ["stage", "layers", "ranks", "recompute", *(["offload"] if off else []), "fwd ms", "bwd ms", "rc ms",
               "send ms", *(["a2a ms"] if moe else []), sync, "params GiB", "grads GiB", "optim GiB", "activ GiB",
               "other GiB", "total GiB", *(["host GiB"] if off else [])]
    rows = []
    for s in plan.stages:
        m = s.memory
        rows.append([
            str(s.stage_idx), _layers(s), _ranks(s.ranks), recompute_text(s), *([str(len(s.offload_layers))] if off else []),
            f"{s.fwd_ms:.3f}", f"{s.bwd_ms:.3f}", f"{s.recompute_ms:.3f}", f"{s.send_fwd_ms:.3f}",
            *([f"{s.alltoall_ms:.3f}"] if moe else []),
            f"{s.allreduce_ms:.3f}", _gib(m.param_bytes), _gib(m.grad_bytes), _gib(m.optimizer_bytes),
            _gib(m.activation_bytes), _gib(m.recompute_workspace_bytes + m.buffer_bytes), _gib(s.memory_total_bytes),
            *([_gib(s.host_memory_bytes)] if off else []),
        ])
    table = format_table(headers, rows, right=set(range(3, len(headers))))
    if off:
        table += "\n" + offload_note(plan)
    if any(s.recompute_selective for s in plan.stages):
        table += ("\nrecompute: layers recomputed whole + layers whose attention core only is recomputed (sel, "
                  "Korthikanti et al. 2022 selective recomputation" + ("; an MoE layer's sel: its experts' activation and "
                  "its norms, Megatron-Core's --recompute-modules moe_act layernorm)" if moe else ")"))
    if moe:
        table += "\n" + alltoall_note(plan)
    cap = plan.stages[0].memory_cap_bytes
    exposed = f"exposed {sync_name(plan.layout.zero)}"
    band = p.band
    span = f" ({band.iteration_low_ms:.2f}-{band.iteration_high_ms:.2f})" if band.known else ""
    tail = (
        f"iteration {p.iteration_ms:.2f} ms{span} | throughput {p.throughput_samples_per_s:.1f} samples/s | "
        f"peak memory {_gib(p.peak_memory_bytes)} GiB of {_gib(cap)} GiB cap\n"
        + band_text(p)
        + f"bubble {max(0.0, p.bubble_fraction):.1%} | {exposed} {p.exposed_allreduce_ms:.2f} ms"
        + (f" | optimizer step {max(s.optimizer_ms for s in plan.stages):.2f} ms" if any(s.optimizer_ms for s in plan.stages) else "")
        + "\n"
        + format_bounds(p)
    )
    if p.me_reference:
        tail += f"\nME index {p.me_index:.2f} against the {p.me_reference}"
    return f"{head}\n\n{table}\n\n{tail}"


def offload_note(plan: Plan) -> str:
    """What the plan keeps in host memory (planner.cost.offload)."""
    parts = []
    if plan.offload.optimizer:
        parts.append("optimizer state and master weights on the host, the step there (optimizer step: gradients "
                     "down, CPU Adam, weights up)")
    if plan.offload.activations:
        parts.append("offload column: layers whose saved activations go to the host after their forward and come "
                     "back before their backward (their copies' exposed part in bwd ms)")
    return f"offload {plan.offload.value}: " + "; ".join(parts) + "; host GiB: host memory per device"


def alltoall_note(plan: Plan) -> str:
    """The mixture-of-experts dispatch and combine of a plan: per micro-batch on each pipeline
    rank (its chunks summed), the busiest rank's, and its share of that rank's compute."""
    lay = plan.layout
    per_rank = []
    for rank in range(lay.pipeline_size if not lay.stage_replicas else lay.num_stages):
        stages = [plan.stages[i] for i in (lay.stage_indices(rank) if not lay.stage_replicas else (rank,))]
        a2a = sum(s.alltoall_ms for s in stages)
        per_rank.append((a2a, a2a / max(1e-12, sum(s.fwd_ms + s.bwd_ms for s in stages))))
    a2a, share = max(per_rank)
    return (f"a2a ms: the experts' token dispatch and combine (all-to-all, {plan.stack.moe.dispatcher.value}) on the "
            f"critical path, per micro-batch, part of fwd + bwd ms; busiest pipeline rank {a2a:.2f} ms per micro-batch "
            f"({share:.0%} of its compute), {a2a * plan.num_microbatches / 1e3:.2f} s per iteration")


def band_text(p: Prediction) -> str:
    """The band's inputs, whether the plan fits at its top, and the overhead terms, one line each
    ("" when none was worked out)."""
    lines = []
    band = p.band
    if band.known:
        top, device = band.peak_memory_high_bytes, band.device_memory_bytes
        fits = f"{'fits' if top <= device else 'does NOT fit'} the device's {_gib(device)} GiB" if device else ""
        lines.append(f"band from: {', '.join(f'{i.name} {i.low_ms:.0f}-{i.high_ms:.0f} ms' for i in band.inputs) or 'none'}"
                     f"; memory at its top {_gib(top)} GiB per device{': ' + fits if fits else ''}")
    if p.overheads:
        terms = (f"{o.kind.value} {o.ms:.2f} ms{_why(o)}".replace(" -0.00 ms", " 0.00 ms") for o in p.overheads)  # no -0.00
        lines.append("overheads in the iteration: " + ", ".join(terms) + " (sources: the plan JSON)")
    return "".join(line + "\n" for line in lines)


def _why(term: OverheadTerm) -> str:
    """What the sign of the NCCL term means ("" for the other terms): NCCL's collectives inside a
    node pay its NVLink step latency (3.4 us), the alpha-beta ring the link's small-message latency
    per step; across nodes NCCL's network steps (14 us, x 1.4) cost more (:mod:`planner.cost.overheads`)."""
    if term.kind is not OverheadKind.NCCL_COLLECTIVES or not round(term.ms, 2):
        return ""
    return (" (NCCL's NVLink step latency below the alpha-beta ring's)" if term.ms < 0
            else " (NCCL's network step latency above the alpha-beta ring's)")


def devices_note(plan: Plan) -> str:
    """Why a plan occupies fewer devices than were available ("" when it uses them all)."""
    n = plan.devices_available
    if not n or plan.num_devices >= n:
        return ""
    text = f"uses {plan.num_devices} of {n} devices: "
    by_time = plan.provenance.request.objective is Objective.TIME
    best = plan.predicted.all_devices_ms
    if not best:
        return text + f"no plan found on all {n} meets the request"
    better = "faster than any plan" if by_time else f"better by the objective ({plan.provenance.request.objective.value}) than the plans"
    return text + f"{better} on all {n} (best on {n}: {best:.2f} ms)"


def format_bounds(p: Prediction) -> str:
    """The two bounds, each named for what it bounds, and the FLOP figures where they mean
    something: with the device's peak known (the MFU beside them), not on a CPU cluster, whose
    preset states no peak (the line read "model 2.819e-06 PFLOP per iteration, 0.0 TFLOP/s")."""
    t = p.iteration_ms
    parts = []
    if p.machine_bound_ms > 0:
        parts.append(f"machine bound {p.machine_bound_ms:.2f} ms (any plan on these devices; limit/time "
                     f"{p.machine_bound_ms / t if t else 0:.3f})")
    parts.append(f"partition bound {p.partition_bound_ms:.2f} ms (this plan's own stages; "
                 f"{p.partition_bound_ms / t if t else 0:.3f} of time)")
    line = " | ".join(parts)
    if p.achieved_tflops_per_device > 0 and p.mfu > 0:
        line += (f"\nmodel {p.model_flops_per_iteration / 1e15:.4g} PFLOP per iteration, "
                 f"{p.achieved_tflops_per_device:.1f} TFLOP/s per device, MFU {p.mfu:.1%} of "
                 f"{p.device_peak_tflops:.0f} TFLOP/s")
    return line


def format_pareto(points: tuple[ParetoPoint, ...]) -> str:
    off = any(q.offload is not OffloadMode.NONE for q in points)
    headers = ["iteration ms", "peak GiB", "T", "P", "D", "mb", "schedule", "zero", "recomputed layers",
               *(["offload"] if off else [])]
    rows = [
        [f"{q.iteration_ms:.2f}", _gib(q.peak_memory_bytes),
         f"{q.tp_degree}{'s' if q.sequence_parallel else ''}{f' cp{q.cp_degree}' if q.cp_degree > 1 else ''}",
         str(q.num_stages),
         "|".join(map(str, q.stage_replicas)) if q.stage_replicas else str(q.dp_degree),
         str(q.microbatch_size), q.schedule.value, str(int(q.zero)), str(q.num_recomputed_layers),
         *([q.offload.value] if off else [])]
        for q in points
    ]
    return "Pareto front (iteration time vs peak memory):\n" + format_table(headers, rows, right={0, 1, 2, 3, 4, 5, 7})
