"""Plain-text plan tables for the terminal (``planner plan``, ``planner show``)."""

from __future__ import annotations

from planner.artifacts.plan import ParetoPoint, Plan

GIB = 1024**3


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def _layers(stage) -> str:
    first, last = stage.layer_names[0], stage.layer_names[-1]
    span = f"{stage.layer_start}-{stage.layer_stop - 1}"
    return f"{span} ({first}..{last})" if first != last else f"{span} ({first})"


def _ranks(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def format_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    right = right if right is not None else set(range(1, len(headers)))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def format_plan(plan: Plan) -> str:
    """The plan as a table: one row per stage, then the predicted totals."""
    p = plan.predicted
    prov = plan.provenance
    head = (
        f"plan for {prov.model} on {prov.cluster_name} ({plan.num_devices} devices) by solver {prov.solver!r}\n"
        + (
            f"P={plan.num_stages} stages x D={plan.dp_degree} replicas, schedule {plan.schedule.value}, "
            if plan.virtual_stages_per_rank == 1
            else f"{plan.num_stages} stages on P={plan.num_stages // plan.virtual_stages_per_rank} pipeline ranks "
            f"({plan.virtual_stages_per_rank} each) x D={plan.dp_degree} replicas, schedule {plan.schedule.value}, "
        )
        + f"M={plan.num_microbatches} micro-batches of {plan.microbatch_size} (global batch {plan.global_batch})"
    )
    headers = ["stage", "layers", "ranks", "recompute", "fwd ms", "bwd ms", "rc ms", "send ms", "allred ms",
               "params GiB", "grads GiB", "optim GiB", "activ GiB", "other GiB", "total GiB"]
    rows = []
    for s in plan.stages:
        m = s.memory
        rows.append([
            str(s.stage_idx), _layers(s), _ranks(s.ranks), str(len(s.recompute)),
            f"{s.fwd_ms:.3f}", f"{s.bwd_ms:.3f}", f"{s.recompute_ms:.3f}", f"{s.send_fwd_ms:.3f}",
            f"{s.allreduce_ms:.3f}", _gib(m.param_bytes), _gib(m.grad_bytes), _gib(m.optimizer_bytes),
            _gib(m.activation_bytes), _gib(m.recompute_workspace_bytes + m.buffer_bytes), _gib(s.memory_total_bytes),
        ])
    table = format_table(headers, rows, right=set(range(3, len(headers))))
    cap = plan.stages[0].memory_cap_bytes
    tail = (
        f"iteration {p.iteration_ms:.2f} ms | throughput {p.throughput_samples_per_s:.1f} samples/s | "
        f"peak memory {_gib(p.peak_memory_bytes)} GiB of {_gib(cap)} GiB cap\n"
        f"bubble {max(0.0, p.bubble_fraction):.1%} | exposed all-reduce {p.exposed_allreduce_ms:.2f} ms | "
        f"lower bound {p.lower_bound_ms:.2f} ms (bound/time {p.lower_bound_ms / p.iteration_ms if p.iteration_ms else 0:.3f})"
    )
    if p.me_reference:
        tail += f"\nME index {p.me_index:.2f} against the {p.me_reference}"
    return f"{head}\n\n{table}\n\n{tail}"


def format_pareto(points: tuple[ParetoPoint, ...]) -> str:
    headers = ["iteration ms", "peak GiB", "P", "D", "mb", "schedule", "recomputed layers"]
    rows = [
        [f"{q.iteration_ms:.2f}", _gib(q.peak_memory_bytes), str(q.num_stages), str(q.dp_degree),
         str(q.microbatch_size), q.schedule.value, str(q.num_recomputed_layers)]
        for q in points
    ]
    return "Pareto front (iteration time vs peak memory):\n" + format_table(headers, rows, right={0, 1, 2, 3, 4, 6})
