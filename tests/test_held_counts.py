"""Micro-batches each stage holds at its peak under the zero-bubble schedules, walked on the
schedule's own order (:func:`planner.schedule.held_counts`): whole ones (after F, before I) and
those past I holding only W's inputs, against counts walked by hand; and the peak point that
makes ``whole x act + pending x keep`` exact (one point of each walk has both the most whole
micro-batches and the most in flight)."""

from __future__ import annotations

import pytest

from planner.artifacts.kinds import ChunkPlacement, ScheduleKind
from planner.artifacts.layout import Layout
from planner.schedule import ActionKind, Held, build_schedule, held_bytes, held_counts

H1, H2, ZBV, DPV = ScheduleKind.ZB_H1, ScheduleKind.ZB_H2, ScheduleKind.ZBV, ScheduleKind.DUALPIPE_V


def _layout(kind: ScheduleKind, ranks: int) -> Layout:
    if kind in (ZBV, DPV):
        return Layout(num_stages=2 * ranks, virtual_stages_per_rank=2, placement=ChunkPlacement.V)
    return Layout(num_stages=ranks)


# By hand, ZB-H1 rank r (M >= P): P - 1 - r warm-up forwards, then per step k one F, one I and,
# from step r on, one W. Just after step r's F it has run P - r + r forwards and r I's, no W:
# P - r whole and r past I, (P - r, r); later steps hold no more of either.
@pytest.mark.parametrize(("kind", "ranks", "m", "expected"), [
    (H1, 2, 4, [(2, 0), (1, 1)]),
    (H1, 2, 8, [(2, 0), (1, 1)]),
    (H1, 4, 4, [(4, 0), (3, 1), (2, 2), (1, 3)]),
    (H1, 4, 8, [(4, 0), (3, 1), (2, 2), (1, 3)]),
    # ZB-H2 rank r warms up 2 (P - r) - 1 forwards: rank 1 of 2 holds 2 whole, then its W lags one step
    (H2, 2, 4, [(4, 0), (2, 1)]),
    (H2, 2, 8, [(4, 0), (2, 1)]),
    (H2, 4, 8, [(8, 0), (6, 1), (4, 2), (2, 3)]),
    # ZBV: every chunk runs its W right after its I at its peak: nothing pending there
    (ZBV, 2, 4, [(4, 0), (3, 0), (2, 0), (1, 0)]),
    (ZBV, 2, 8, [(4, 0), (3, 0), (2, 0), (1, 0)]),
    (ZBV, 4, 8, [(8, 0), (7, 0), (6, 0), (5, 0), (4, 0), (3, 0), (2, 0), (1, 0)]),
    # DualPipe-V rank r: 2 (P - 1 - r) + r + 1 forwards of chunk r before its first backward, and
    # chunk 2P - 1 - r's r + 1, then its I, W, F turns (P - 1 - r of them) keep that count: chunk s
    # holds 2P - s whole at its peak, ZBV's counts; its steady phase's backwards are whole (B)
    (DPV, 2, 4, [(4, 0), (3, 0), (2, 0), (1, 0)]),
    (DPV, 2, 8, [(4, 0), (3, 0), (2, 0), (1, 0)]),
    (DPV, 4, 8, [(8, 0), (7, 0), (6, 0), (5, 0), (4, 0), (3, 0), (2, 0), (1, 0)]),
])
def test_held_counts_by_hand(kind: ScheduleKind, ranks: int, m: int, expected: list[tuple[int, int]]) -> None:
    assert held_counts(kind, _layout(kind, ranks), m) == tuple(Held(w, p) for w, p in expected)


def _walk(kind: ScheduleKind, ranks: int, m: int) -> dict[int, list[tuple[int, int]]]:
    """Per stage, (whole, pending) after every action of its rank's order."""
    v = 2 if kind in (ZBV, DPV) else 1
    out: dict[int, list[tuple[int, int]]] = {}
    state: dict[int, tuple[int, int]] = {}
    for order in build_schedule(kind, ranks * v, m, v):
        for a in order:
            w, p = state.get(a.stage_idx, (0, 0))
            if a.kind is ActionKind.FORWARD:
                w += 1
            elif a.kind is ActionKind.BACKWARD_INPUT:
                w, p = w - 1, p + 1
            elif a.kind is ActionKind.BACKWARD_WEIGHT:
                p -= 1
            else:  # a whole backward (DualPipe-V's steady phase)
                w -= 1
            state[a.stage_idx] = (w, p)
            out.setdefault(a.stage_idx, []).append((w, p))
    return out


@pytest.mark.parametrize("kind", [H1, H2, ZBV, DPV])
def test_held_peak_is_the_byte_peak_of_every_walk(kind: ScheduleKind) -> None:
    """For W keeping ``keep <= act``, no point of any stage's walk holds more bytes than
    :func:`held_bytes` of :func:`held_counts` (P up to 8, M up to 24, several ratios), and the
    held point is on the walk."""
    for ranks in range(1, 9):
        for m in range(1, 25):
            try:
                held = held_counts(kind, _layout(kind, ranks), m)
            except Exception:  # the schedule's own rules refuse this shape
                continue
            for s, points in _walk(kind, ranks, m).items():
                h = held[s]
                assert (h.whole, h.pending) in points, (kind, ranks, m, s)
                for act, keep in ((1.0, 1.0), (1.0, 0.41), (1.0, 0.0), (3.0, 2.9)):
                    peak = max(w * act + p * keep for w, p in points)
                    assert held_bytes(h, act, keep) == pytest.approx(peak), (kind, ranks, m, s, act, keep)


def test_one_pass_schedules_hold_whole_micro_batches_only() -> None:
    assert held_counts(ScheduleKind.ONE_F_ONE_B, Layout(num_stages=4), 8) == tuple(Held(k) for k in (4, 3, 2, 1))
    assert held_counts(ScheduleKind.GPIPE, Layout(num_stages=2), 8) == (Held(8), Held(8))


def _first_input_whole(kind: ScheduleKind, n: int, m: int) -> tuple[int, ...]:
    """Per stage (``n`` stages, or chunks for the V schedules), the micro-batches it holds whole
    just before its first ``I``, read off its rank's order by hand: ZB-H1 ``min(M, P - s)`` (its
    warm-up forwards and the first step's); ZB-H2 ``min(M, 2 (P - s))``; ZBV (``2P`` chunks)
    ``min(M, 2P - s)``, the first chunk ``r`` after its ``2 (P - r) - 1`` warm-up and ``r + 1``
    more forwards, the second ``2P - 1 - r`` after its ``r + 1``; DualPipe-V (its first backward
    of a chunk a whole ``B`` or an ``I``) the same: the first chunk after its ``2P - 1 - r``
    forwards of steps 1-2 and the steady phase's first, the second after its ``r + 1``."""
    if kind is H2:
        return tuple(min(m, 2 * (n - s)) for s in range(n))
    return tuple(min(m, n - s) for s in range(n))


@pytest.mark.parametrize("kind", [H1, H2, ZBV, DPV])
def test_most_whole_is_the_count_before_the_first_input_pass(kind: ScheduleKind) -> None:
    """:attr:`Held.most_whole` (the memory floor's counts) is the most whole micro-batches of any
    point of each stage's walk (walked here on the Actions), and on these orders those whole
    just before the stage's first I, counted by hand (P <= 12, M <= 40)."""
    from planner.artifacts.errors import PlannerInputError

    compared = 0
    for ranks in range(1, 13):
        for m in range(1, 41):
            try:
                walked = _walk(kind, ranks, m)
            except PlannerInputError:
                continue  # a shape the schedule's rules refuse
            compared += 1
            most = [max(w for w, _ in walked[s]) for s in range(len(walked))]
            layout = _layout(kind, ranks)
            assert [h.most_whole for h in held_counts(kind, layout, m)] == most, (ranks, m)
            assert list(_first_input_whole(kind, layout.num_stages, m)) == most, (ranks, m)
    assert compared > 200


@pytest.mark.parametrize("kind", [H1, H2, ZBV, DPV, ScheduleKind.ONE_F_ONE_B, ScheduleKind.INTERLEAVED_1F1B])
def test_held_fields_are_the_counts_read_off_the_walk(kind: ScheduleKind) -> None:
    """:class:`Held`'s derived fields, built with the record: in flight ``whole + pending``, the
    states the walk's frontier (or the peak alone), the conservative record ``whole`` whole and the
    most past I of any state (its own conservative record itself); the interleaved counts equal
    :func:`inflight_counts` too."""
    from planner.schedule import inflight_counts

    layout = (Layout(num_stages=8, virtual_stages_per_rank=2) if kind is ScheduleKind.INTERLEAVED_1F1B
              else _layout(kind, 4))
    held = held_counts(kind, layout, 12)
    assert tuple(h.inflight for h in held) == inflight_counts(kind, layout, 12)
    for h in held:
        assert h.inflight == h.whole + h.pending
        assert h.states == (h.frontier or ((h.whole, h.pending),))
        assert h.most_whole == max(w for w, _ in h.states) >= h.whole
        most = max(p for _, p in h.states)
        c = h.conservative
        assert (c.whole, c.pending, c.states) == (h.whole, most, ((h.whole, most),))
        assert c.conservative is c
    assert held_counts(kind, layout, 12) is held  # built once per shape
    recomputing = Held(3, 1, ((3, 1), (2, 4)))  # a stage whose W keeps more than it saved
    assert recomputing.conservative == Held(3, 4) and recomputing.conservative is not recomputing


@pytest.mark.parametrize("kind", [H1, H2, ZBV, DPV, ScheduleKind.DUALPIPE])
def test_counts_past_two_n_micro_batches_are_those_of_two_n(kind: ScheduleKind) -> None:
    """The counts walk at most ``2n`` micro-batches (``n`` stages or chunks): for every ``M``
    past that, walking all ``M`` gives the same peak, the same front on every stage (P <= 12;
    the speed50 session compared P <= 16, 24 and 32 with M to 3n + 2 and 6n + 1 as well)."""
    from planner.artifacts.errors import PlannerInputError
    from planner.schedule.inflight import _counted, _walked

    v = 2 if kind in (ZBV, DPV, ScheduleKind.DUALPIPE) else 1
    compared = 0
    for ranks in range(1, 13):
        n = ranks * v
        for m in (2 * n + 1, 2 * n + 2, 3 * n + 1, 4 * n, 5 * n + 3, 6 * n):
            try:
                capped = _counted(kind, n, m, v)
            except PlannerInputError:
                continue  # a shape the schedule's rules refuse
            assert capped == _walked.__wrapped__(kind, n, m), (ranks, m)
            compared += 1
    assert compared >= 30
