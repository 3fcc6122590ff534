"""Each pipeline schedule's rules: the shapes (stages, micro-batches, chunks per rank, copies per
stage) it runs, as the runtime that runs it checks them (torch.distributed.pipelining's schedule
classes, DeepSeek's ``dualpipe.py``). The orders themselves are :mod:`planner.schedule.build`'s;
the search asks these rules of the shapes it considers, the orders and the replay check them
before they walk a shape.
"""

from __future__ import annotations

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind

__all__ = ["check_schedule_rules"]

#: the schedules that run one stage per rank
_ONE_PER_RANK = (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1, ScheduleKind.ZB_H2)


def check_schedule_rules(
    kind: ScheduleKind, num_stages: int, num_microbatches: int, virtual_stages_per_rank: int = 1,
    replicas: tuple[int, ...] = (),
) -> None:
    """Raise :class:`PlannerInputError` naming the values if ``kind`` cannot run this shape:
    ``num_stages`` stages of ``virtual_stages_per_rank`` per rank over ``num_microbatches``, or,
    with ``replicas`` (each stage's copies, one rank each), a pipeline replicated per stage."""
    if replicas:
        _check_replicated(kind, replicas, num_microbatches)
        return
    if num_stages < 1:
        raise PlannerInputError(f"num_stages must be >= 1 (got {num_stages})")
    if num_microbatches < 1:
        raise PlannerInputError(f"num_microbatches must be >= 1 (got {num_microbatches})")
    if virtual_stages_per_rank < 1:
        raise PlannerInputError(f"virtual_stages_per_rank must be >= 1 (got {virtual_stages_per_rank})")
    v_class = {ScheduleKind.ZBV: "torch's ScheduleZBVZeroBubble", ScheduleKind.DUALPIPE_V: "torch's ScheduleDualPipeV",
               ScheduleKind.DUALPIPE: "DeepSeek's dualpipe.py per copy"}
    if kind in v_class and (virtual_stages_per_rank != 2 or num_stages % 2):
        raise PlannerInputError(
            f"{kind.value} runs two chunks per rank in a V: virtual_stages_per_rank must be 2 and num_stages even "
            f"(got {num_stages} stages, {virtual_stages_per_rank} per rank), as {v_class[kind]}"
        )
    if kind in (ScheduleKind.DUALPIPE_V, ScheduleKind.DUALPIPE) and num_microbatches < num_stages:
        raise PlannerInputError(
            f"{kind.value} needs num_microbatches >= num_stages (got M={num_microbatches} < {num_stages} chunks), "
            f"as {v_class[kind]}"
        )
    if kind in _ONE_PER_RANK and virtual_stages_per_rank != 1:
        raise PlannerInputError(
            f"{kind.value} runs one stage per rank: virtual_stages_per_rank must be 1 "
            f"(got {virtual_stages_per_rank}); use {ScheduleKind.INTERLEAVED_1F1B.value}"
        )
    if kind is ScheduleKind.ONE_F_ONE_B and num_microbatches < num_stages:
        raise PlannerInputError(
            f"1f1b needs num_microbatches >= num_stages (got M={num_microbatches} < P={num_stages}), "
            "as torch's Schedule1F1B; use gpipe or more micro-batches"
        )
    if kind is ScheduleKind.ZB_H1:
        rounds = max(1, num_microbatches // num_stages)
        if num_microbatches % rounds:
            raise PlannerInputError(
                f"zb-h1 needs num_microbatches a multiple of the number of rounds max(1, M // P) = {rounds} "
                f"(got M={num_microbatches}, P={num_stages}), as torch's ScheduleInterleavedZeroBubble"
            )
    if kind is ScheduleKind.INTERLEAVED_1F1B:
        if num_stages % virtual_stages_per_rank:
            raise PlannerInputError(
                f"interleaved-1f1b needs num_stages divisible by virtual_stages_per_rank "
                f"(got {num_stages} stages, {virtual_stages_per_rank} per rank)"
            )
        ranks = num_stages // virtual_stages_per_rank
        rounds = max(1, num_microbatches // ranks)
        if num_microbatches % rounds:
            raise PlannerInputError(
                f"interleaved-1f1b needs num_microbatches a multiple of the number of rounds "
                f"max(1, M // P) = {rounds} (got M={num_microbatches}, P={ranks} ranks), "
                "as torch's ScheduleInterleaved1F1B"
            )



def _check_replicated(kind: ScheduleKind, replicas: tuple[int, ...], num_microbatches: int) -> None:
    """Per-stage replication's rules (each copy runs GPipe or 1F1B over its share of the micro-batches)."""
    if min(replicas) < 1:
        raise PlannerInputError(f"replicas must be >= 1 per stage (got {list(replicas)})")
    if kind not in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B):
        raise PlannerInputError(f"per-stage replication runs gpipe or 1f1b (one stage per rank), not {kind.value}")
    bad = [d for d in replicas if num_microbatches % d]
    if num_microbatches < 1 or bad:
        raise PlannerInputError(
            f"per-stage replication needs num_microbatches a multiple of every stage's replicas "
            f"(got M={num_microbatches}, replicas {list(replicas)})"
        )
