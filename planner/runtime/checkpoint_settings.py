"""The run settings a checkpoint records and a resume must match.

**Settings** (:func:`compare_settings`): on ``--resume`` every difference between the run and
the checkpoint is refused with one line (exit 2): dtype, optimizer, seed, global batch,
micro-batching, the layout and the stage boundaries; the learning rate too, unless
``--allow-resume-change lr``, which applies the new one to every optimizer and says so; and
``--steps`` at or below the steps already done.
"""

from __future__ import annotations

from typing import Any

from planner.artifacts.errors import PlannerInputError

__all__ = ["CHANGEABLE", "compare_settings", "run_settings_record"]

#: settings a resume may change when asked (--allow-resume-change)
CHANGEABLE = ("lr",)


def run_settings_record(options: Any, plan: Any) -> dict[str, Any]:
    """What a checkpoint records of the run (``options``: RuntimeOptions, ``plan``: Plan)."""
    return {
        "lr": options.lr,
        "dtype": options.dtype.value,
        "optimizer": options.optimizer.value,
        "seed": options.seed,
        "global_batch": plan.global_batch,
        "num_microbatches": plan.num_microbatches,
        "microbatch_size": plan.microbatch_size,
        "layout": plan.layout.describe(),
        "stages": [[s.layer_start, s.layer_stop] for s in plan.stages],
        "model_fingerprint": plan.provenance.fingerprint_sha256,
    }


_FLAGS = {"lr": "--lr", "dtype": "--dtype", "optimizer": "--optimizer", "seed": "--seed"}


def compare_settings(
    source: str, saved: dict[str, Any], run: dict[str, Any], allowed: tuple[str, ...], completed_steps: int, num_steps: int
) -> list[str]:
    """Refuse (:class:`PlannerInputError`, one line) the first difference between the saved
    settings and the run's that is not in ``allowed``, or ``num_steps`` <= ``completed_steps``;
    return one line per allowed difference, which the caller applies."""
    if num_steps <= completed_steps:
        raise PlannerInputError(
            f"--resume: {source} has {completed_steps} completed steps and --steps is {num_steps}: nothing to train "
            f"(--steps counts from the start of the run; pass --steps > {completed_steps})"
        )
    applied = []
    for key, value in run.items():
        if key not in saved or saved[key] == value or (key == "model_fingerprint" and not (saved[key] and value)):
            continue
        flag = _FLAGS.get(key)
        if key in allowed:
            applied.append(f"--resume: {key} {saved[key]} in {source} -> {value} ({flag}), applied to every optimizer")
            continue
        if flag is None:
            raise PlannerInputError(
                f"--resume: {source} was written under another plan: {key} {saved[key]!r} there, {value!r} now"
            )
        hint = f", or --allow-resume-change {key} to train on with {value}" if key in CHANGEABLE else ""
        raise PlannerInputError(
            f"--resume: {source} was trained with {flag} {saved[key]} but this run has {flag} {value}; "
            f"pass {flag} {saved[key]}{hint}"
        )
    return applied
