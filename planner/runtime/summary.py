"""What a run prints when it ends: its RunReport as text (losses, measured beside predicted per
stage, one micro-batch's activations, the model state per rank). ``planner run`` prints it after
torchrun exits; a run launched with ``torchrun ... -m planner.runtime`` prints it from rank 0."""

from __future__ import annotations

from planner.artifacts.kinds import ZeroStage
from planner.artifacts.report import RunReport
from planner.artifacts.text_table import format_table

__all__ = ["format_microbatch_memory", "format_model_state", "format_report"]


def format_report(report: RunReport) -> str:
    """Measured beside predicted, per step and per stage."""
    steps = ", ".join(f"{s.loss:.4f}" for s in report.steps)
    lay = report.layout
    if lay.replicated_per_stage:
        copies = "+".join(str(lay.replicas_of(s)) for s in range(lay.num_stages))
        layout = f"{lay.num_stages} stages replicated per stage ({copies} processes)"
    else:
        layout = f"{lay.num_stages} stages x {lay.dp_degree} replicas"
    if lay.cp_degree > 1:
        layout += f" x {lay.cp_degree} context-parallel"
    if lay.tp_degree > 1:
        layout += f" x {lay.tp_degree} tensor-parallel{' (sequence parallel)' if lay.sequence_parallel else ''}"
    head = (
        f"ran {layout}, {report.schedule.value}, "
        f"M={report.num_microbatches} x {report.microbatch_size} on {report.world_size} {report.backend} processes"
        f"{' (emulated compute)' if report.emulate else ''}\n"
        f"losses per step: {steps}\n"
        f"iteration: measured {report.iteration_ms:.1f} ms (median after {report.warmup_steps} warm-up), "
        f"predicted {report.iteration_ms_predicted:.1f} ms, error {100 * report.iteration_rel_error:+.1f}%"
    )
    rows = [
        [
            str(s.stage_idx), f"{s.compute_ms:.1f}", f"{s.compute_ms_predicted:.1f}", f"{100 * s.compute_rel_error:+.1f}%",
            f"{s.idle_ms:.1f}", str(s.saved_bytes_peak), str(s.activation_bytes_predicted),
            f"{100 * s.activation_rel_error:+.2f}%",
        ]
        for s in report.stages
    ]
    headers = ["stage", "compute ms", "predicted", "err", "idle ms", "saved bytes", "predicted", "err"]
    return (head + "\n\n" + format_table(headers, rows) + "\n\n" + format_microbatch_memory(report) + "\n\n"
            + format_model_state(report))


def format_microbatch_memory(report: RunReport) -> str:
    """One micro-batch's activations per stage: the hooks' count against the plan, and the
    allocator's own count against the hooks' count of the same storages."""
    head = ("activations of one micro-batch per stage: saved = the saved-tensor hooks' count (once per storage), "
            "predicted = the plan's; allocator = bytes a forward left allocated, its output excepted (torch.profiler "
            "memory events on CPU, torch.cuda.memory_allocated on GPU), beside the hooks' count of those storages")
    rows = [
        [
            str(s.stage_idx), str(s.saved_bytes_per_microbatch), str(s.activation_bytes_per_microbatch_predicted),
            _err(s.microbatch_rel_error, s.activation_bytes_per_microbatch_predicted),
            str(s.allocator_bytes_per_microbatch) if s.allocator_bytes_per_microbatch >= 0 else "-",
            str(s.allocator_hook_bytes_per_microbatch),
            _err(s.allocator_rel_error, max(0, s.allocator_bytes_per_microbatch)),
        ]
        for s in report.stages
    ]
    headers = ["stage", "saved bytes", "predicted", "err", "allocator bytes", "hooks", "err"]
    return head + "\n\n" + format_table(headers, rows)


def _err(rel_error: float, predicted: int) -> str:
    return f"{100 * rel_error:+.1f}%" if predicted else "-"


def format_model_state(report: RunReport) -> str:
    """Optimizer state and gradient bytes per rank, measured beside predicted. The runtime
    runs fp SGD or AdamW, not the plan's optimizer kind, so the prediction takes the plan's
    parameter count with the runtime optimizer's bytes per parameter."""
    per_param = report.optimizer_state_bytes_per_param
    zero = report.layout.zero
    sharding = {ZeroStage.NONE: "none", ZeroStage.OPTIMIZER: "optimizer state",
                ZeroStage.GRADIENTS: "optimizer state and gradients",
                ZeroStage.PARAMETERS: "optimizer state, gradients and parameters"}[zero]
    head = (
        f"model state per rank, ZeRO {int(zero)} (sharded: {sharding}); predicted = the plan's stage parameters "
        f"/ shards x {per_param} B/param, the runtime's {report.optimizer.value} {report.dtype.value} optimizer state "
        f"(not the plan's optimizer kind); gradients x element size, / shards with ZeRO 2"
    )
    rows = [
        [
            str(s.stage_idx), str(s.optimizer_shards), str(s.optimizer_state_bytes), str(s.optimizer_state_bytes_predicted),
            _err(s.optimizer_state_rel_error, s.optimizer_state_bytes_predicted), str(s.grad_bytes_after_sync),
            str(s.grad_bytes_predicted), _err(s.grad_rel_error, s.grad_bytes_predicted),
        ]
        for s in report.stages
    ]
    headers = ["stage", "shards", "optimizer bytes", "predicted", "err", "grad bytes after sync", "predicted", "err"]
    return head + "\n\n" + format_table(headers, rows)
