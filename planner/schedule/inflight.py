"""A layout's schedule, and the micro-batches each stage holds at its peak under it.

:func:`layout_schedule` is the one entry from a :class:`~planner.artifacts.layout.Layout` to its
per-rank orders: replicated per stage or not, one chunk per rank or interleaved.
:func:`inflight_counts` gives, per stage, the micro-batches whose activations one device of it
holds at its peak (DESIGN.md sec. 5): M for GPipe, min(P - s, M) for 1F1B; for interleaved
1F1B counted on the schedule itself (forwards done minus backwards done, per chunk, along its
rank's order); replicated per stage, each copy's share: M / R_s for GPipe, its 1F1B warm-up
(:func:`planner.schedule.build.replicated_warmup`).

Zero-bubble schedules (backward split into I and W, Qi et al. 2024): a micro-batch is in flight
from its forward until its W, so :func:`inflight_counts` is the peak of forwards done minus W
passes done, counted on the rank's order. Not all of them are whole at that peak: those past their
I hold only what W needs (the weight GEMMs' inputs). :func:`held_counts` walks each stage's order
and gives, at its peak, ``(whole, pending)``: micro-batches holding all their activations (after F,
before I) and those past I waiting for W. On every order the planner builds (ZB-H1, ZB-H2, ZBV:
a test walks them all for P <= 16, M <= 69) one point of the walk has both the most whole
micro-batches and the most in flight, so with W keeping no more than the micro-batch saved that
point is the stage's peak in bytes whatever the two sizes: ``whole x act + pending x keep``,
exact (:func:`held_bytes`; the paper's ``p M_B`` accounting, every micro-batch priced whole, is an
upper bound the planner no longer uses). Where W keeps more than a micro-batch saved (a stage that
recomputes: W's inputs come back in its I), a point with more micro-batches past I can hold more:
:attr:`Held.states` are the walk's points no other exceeds in both counts, one of them the peak.
The DP (:mod:`planner.solve.chain_dp`), the plan's
stages (:mod:`planner.solve.build`), hence the simulator's stage memory and the runtime's check
all read these counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from planner.artifacts.caches import register_function
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import Layout
from planner.schedule.actions import ActionKind, Schedule
from planner.schedule.build import build_replicated_schedule, build_schedule, interleaved_ops, replicated_warmup
from planner.schedule.rules import check_schedule_rules
from planner.schedule.zero_bubble import split_ops


def layout_schedule(kind: ScheduleKind, layout: Layout, num_microbatches: int) -> Schedule:
    """One ordered tuple of actions per pipeline rank of one pipeline replica of ``layout``
    (per device when replicated per stage)."""
    if layout.stage_replicas:
        return build_replicated_schedule(kind, layout.stage_replicas, num_microbatches)
    return build_schedule(kind, layout.num_stages, num_microbatches, layout.virtual_stages_per_rank)


def inflight_counts(kind: ScheduleKind, layout: Layout, num_microbatches: int) -> tuple[int, ...]:
    """Micro-batches one device of each stage holds at its peak (see the module docstring)."""
    return stage_inflight(kind, layout.num_stages, num_microbatches, layout.virtual_stages_per_rank,
                          layout.stage_replicas)


def stage_inflight(
    kind: ScheduleKind, num_stages: int, num_microbatches: int, virtual_stages_per_rank: int = 1,
    replicas: tuple[int, ...] = (),
) -> tuple[int, ...]:
    """:func:`inflight_counts` by shape (``replicas``: each stage's copies, or () for one)."""
    if replicas and max(replicas) > 1:
        if kind is ScheduleKind.GPIPE:
            return tuple(num_microbatches // d for d in replicas)
        return tuple(replicated_warmup(tuple(replicas), s, num_microbatches) for s in range(len(replicas)))
    if kind is ScheduleKind.GPIPE:
        return tuple(num_microbatches for _ in range(num_stages))
    if kind is ScheduleKind.ONE_F_ONE_B:
        return tuple(min(num_stages - s, num_microbatches) for s in range(num_stages))
    return tuple(x + y for x, y, _ in _counted(kind, num_stages, num_microbatches, virtual_stages_per_rank))


@dataclass(frozen=True, slots=True)
class Held:
    """What one device of a stage holds at its peak: ``whole`` micro-batches with all their
    activations, ``pending`` past their input-gradient pass holding only W's inputs. The fields
    after ``frontier`` are derived from the first three when the record is built (read, not
    asked: every stage's record is built once per schedule shape, :func:`held_counts`)."""

    whole: int
    pending: int = 0
    #: the walk's points no other exceeds in both counts, (whole, pending) each (empty: the above;
    #: derived from the same walk, so not compared)
    frontier: tuple[tuple[int, int], ...] = field(default=(), compare=False)
    #: micro-batches in flight at the peak: ``whole + pending``
    inflight: int = field(init=False, compare=False)
    #: the most micro-batches held whole at any point of the walk (of :attr:`states`): ``whole``
    #: unless the schedule splits the backward; under ZB-H1, ZBV, DualPipe-V and DualPipe
    #: ``min(M, n - s)`` on every order the planner builds (``n`` stages or chunks), under ZB-H2
    #: ``min(M, 2 (n - s))``, those whole just before the stage's first I (tests/test_held_counts.py
    #: compares): the memory floor's count (:func:`planner.solve.rank_memory.held_whole`)
    most_whole: int = field(init=False, compare=False)
    #: (whole, pending) pairs one of which holds the stage's peak in bytes, whatever the two
    #: sizes: the walk's points that no other exceeds in both counts (``frontier``, or the peak
    #: alone). The peak of the count is it where W keeps no more than a micro-batch saved; where
    #: W keeps more (a stage that recomputes: W's inputs come back in its I and stay until its
    #: W), another can be.
    states: tuple[tuple[int, int], ...] = field(init=False, compare=False)
    #: ``whole`` whole and the most past I of any point: one state above all :attr:`states`
    #: (this record itself where that is its only state, so ``dataclasses.asdict`` does not apply)
    conservative: Held = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        whole, pending, put = self.whole, self.pending, object.__setattr__
        put(self, "inflight", whole + pending)
        if not self.frontier:  # the peak its only state (every stage of a schedule not splitting the backward)
            put(self, "states", ((whole, pending),))
            put(self, "most_whole", whole)
            put(self, "conservative", self)
            return
        states = self.frontier
        put(self, "states", states)
        put(self, "most_whole", max(w for w, _ in states))
        most = max(p for _, p in states)
        above = ((whole, most),)
        put(self, "conservative", self if states == above else Held(whole, most, above))


def held_counts(kind: ScheduleKind, layout: Layout, num_microbatches: int) -> tuple[Held, ...]:
    """Per stage, :class:`Held` at its peak, walked on the schedule's own order (module docstring;
    ``pending`` is 0 unless the schedule splits the backward; :attr:`Held.inflight` is
    :func:`inflight_counts`)."""
    return _held(kind, layout.num_stages, num_microbatches, layout.virtual_stages_per_rank, layout.stage_replicas)


@lru_cache(maxsize=4096)  # per shape, as _counted
def _held(kind: ScheduleKind, num_stages: int, num_microbatches: int, v: int,
          replicas: tuple[int, ...]) -> tuple[Held, ...]:
    if not kind.splits_backward or replicas:
        return tuple(Held(k) for k in stage_inflight(kind, num_stages, num_microbatches, v, replicas))
    return tuple(Held(w, p, f) for w, p, f in _counted(kind, num_stages, num_microbatches, v))


register_function("schedule.inflight.held", _held,
                  key="(schedule, stages, micro-batches, chunks per rank, replicas per stage)")


def held_bytes(held: Held, act_bytes: float, keep_bytes: float) -> float:
    """A stage's in-flight bytes at its peak: ``whole x act + pending x keep`` (``keep``: what a
    micro-batch past its I keeps for its W; module docstring), the larger of :attr:`Held.states`."""
    return max(w * act_bytes + p * keep_bytes for w, p in held.states)


def weight_pending_counts(kind: ScheduleKind, layout: Layout, num_microbatches: int) -> tuple[int, ...]:
    """Per stage, of the :func:`inflight_counts` micro-batches at the peak, how many have run
    their input-gradient pass and wait for their weight-gradient pass (0 unless the schedule
    splits the backward; see the module docstring)."""
    if not kind.splits_backward or layout.stage_replicas:
        return tuple(0 for _ in range(layout.num_stages))
    return tuple(y for _, y, _ in _counted(kind, layout.num_stages, num_microbatches, layout.virtual_stages_per_rank))


@lru_cache(maxsize=4096)  # per shape: a search over 1,024 devices asks for ~1,000
def _counted(
    kind: ScheduleKind, num_stages: int, num_microbatches: int, v: int,
) -> tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]:
    """Per stage, (micro-batches holding all their activations, micro-batches past I waiting
    for W) at the peak of their sum, the larger first count among peaks of equal sum, and the
    walk's points no other exceeds in both counts (:attr:`Held.states`)."""
    if kind is ScheduleKind.INTERLEAVED_1F1B:
        return tuple((n, 0, ()) for n in _interleaved_peaks(num_stages, num_microbatches, v))
    check_schedule_rules(kind, num_stages, num_microbatches, v)
    return _walked(kind, num_stages, min(num_microbatches, 2 * num_stages))


@lru_cache(maxsize=1024)  # per shape walked: every M past 2n shares one
def _walked(kind: ScheduleKind, num_stages: int, num_microbatches: int) -> tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]:
    """:func:`_counted` of a split schedule, on its order walked. :func:`_counted` walks at most
    ``2n`` micro-batches (``n`` stages or chunks): past those each order's steady phase only
    repeats its step, whose points are walked already, and its warm-up and cool-down are the
    same, so the points, hence the peak and the front, are those of ``2n`` (ZB-H1 from ``n``,
    ZB-H2 and the V schedules from ``2P``; tests/test_held_counts.py compares every stage, kind,
    ``P`` to 32 and ``M`` past ``2n`` with the walk of ``M``; a walk of ``M`` costs ``M``)."""
    whole = [0] * num_stages
    pending = [0] * num_stages
    points: list[set[tuple[int, int]]] = [set() for _ in range(num_stages)]  # after each F or I
    forward, b_input, b_weight = ActionKind.FORWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT
    for order in split_ops(kind, num_stages, num_microbatches):  # the orders as plain values: no Action made
        for s, act, _ in order:
            if act is forward:
                whole[s] += 1
            elif act is b_input:
                whole[s] -= 1
                pending[s] += 1
            elif act is b_weight:
                pending[s] -= 1
                continue
            else:
                whole[s] -= 1
                continue
            points[s].add((whole[s], pending[s]))
    # a W or a whole backward only lowers a count (the point before it is above it): the peak and
    # the points no other exceeds in both counts are among those after an F or an I
    return tuple(_peak_and_front(p) for p in points)


def _peak_and_front(points: set[tuple[int, int]]) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """Of one stage's points: the peak of the count (the larger first count among equal sums; (0,
    0) before any), and the points no other exceeds in both counts, the first count descending."""
    w, p = max(points | {(0, 0)}, key=lambda pt: (pt[0] + pt[1], pt[0]))
    front: list[tuple[int, int]] = []
    for pt in sorted(points, reverse=True):  # first count descending, the second descending among equals
        if not front or pt[1] > front[-1][1]:
            front.append(pt)
    return w, p, tuple(front)


register_function("schedule.inflight.walked", _walked, key="(schedule, stages, micro-batches walked)")
register_function("schedule.inflight.counted", _counted, key="(schedule, stages, micro-batches, chunks per rank)")


def _interleaved_peaks(num_stages: int, num_microbatches: int, v: int) -> tuple[int, ...]:
    """Per stage, the peak of forwards done minus backwards done along its rank's interleaved
    order (the count :func:`_counted` makes on the Actions, made on the order's arrays): the
    orders of :func:`~planner.schedule.build.interleaved_ops`, every rank's at once. Op ``i``
    of a rank runs a forward then a backward, so a chunk's count peaks just after a forward:
    at ``F(i) - B(i - 1)`` (forwards done through op ``i``, backwards through op ``i - 1``)."""
    check_schedule_rules(ScheduleKind.INTERLEAVED_1F1B, num_stages, num_microbatches, v)
    ranks = num_stages // v
    forward, backward = interleaved_ops(np.arange(ranks)[:, None], ranks, v, num_microbatches)
    peaks = [0] * num_stages
    for c in range(v):
        mine = backward == c
        held = np.cumsum(forward == c, axis=1) - (np.cumsum(mine, axis=1) - mine)
        for rank, high in enumerate(np.maximum(held.max(axis=1), 0).tolist()):
            peaks[c * ranks + rank] = int(high)
    return tuple(peaks)
