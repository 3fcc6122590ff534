"""planner.solve.held and :meth:`StageFits.could_fit_every_state`, the check
:func:`planner.solve.optimum.solve_config` makes before solving a zero-bubble configuration,
against the two solves it spares (the peak's optimum, checked at every held state, then the
conservative counts'): where it says no partition might fit, neither solve has a plan; and
``solve_config`` gives what the two solves give, on every zero-bubble configuration of cases
where memory binds."""

from __future__ import annotations

import random

from planner.artifacts.cluster import PRESETS
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind
from planner.artifacts.layout import DeviceGroup
from planner.artifacts.request import PlanRequest
from planner.profiling.analytic.gpt import gpt_profile
from planner.schedule import held_counts

GIB = 2**30
SPLIT = (ScheduleKind.ZB_H1, ScheduleKind.ZB_H2, ScheduleKind.ZBV)


def _two_solves(table, c):
    """``solve_config`` without the check: the peak's optimum where it fits every held state,
    else the optimum at the conservative counts; and whether the peak had an optimum."""
    from planner.solve.chain_dp import solve_chain
    from planner.solve.held import fits_every_state

    sol = solve_chain(table, layout=c.layout, num_microbatches=c.num_microbatches, schedule=c.schedule)
    if sol is None:
        return None, False
    held = held_counts(c.schedule, c.layout, c.num_microbatches)
    caps = [table.cap_of(s) for s in range(len(held))]
    if fits_every_state(table.cm, held, sol, c.microbatch_size, [c.layout.sharding(s) for s in range(len(held))], caps):
        return sol, True
    return solve_chain(table, layout=c.layout, num_microbatches=c.num_microbatches, schedule=c.schedule,
                       held=tuple(h.conservative for h in held)), True


def _cases():
    """GPTs whose zero-bubble configurations recompute (caps of 2-8 GiB), one drawn per seed."""
    rng = random.Random(7)
    for _ in range(6):
        hidden = rng.choice([1024, 2048])
        profile = gpt_profile(layers=rng.randint(6, 16), hidden=hidden, heads=hidden // 128, seq=rng.choice([2048, 4096]),
                              vocab=32000, device_preset="h100-80gb")
        cluster = PRESETS["h100-80gb-x8"].with_devices(rng.choice([4, 8, 16]))
        request = PlanRequest(global_batch=rng.choice([16, 32, 64]), memory_cap_bytes=rng.choice([2, 3, 4, 6, 8]) * GIB,
                              schedules=SPLIT)
        yield profile, cluster, request


def _configs():
    """Every configuration (each variant) of the drawn cases: its stage table, held counts and itself."""
    from planner.cost.groups import base_cluster
    from planner.cost.tensor_parallel import device_cost_model
    from planner.solve.floors import ConfigFacts
    from planner.solve.problem import memory_cap_bytes
    from planner.solve.space import all_configs

    for profile, cluster, request in _cases():
        n = cluster.num_devices
        cm = device_cost_model(profile, base_cluster(cluster, n), request.optimizer, DeviceGroup(), request.stack)
        facts = ConfigFacts(cm, request, memory_cap_bytes(cm.cluster, request))
        for c0 in all_configs(cm, request, n):
            for c in facts.variants(c0):
                yield facts.table_of(c), held_counts(c.schedule, c.layout, c.num_microbatches), c


def test_no_partition_fits_every_state_where_the_check_says_so() -> None:
    from planner.solve.chain_dp import solve_chain
    from planner.solve.optimum import solve_config

    checked = refused = spared = solved = 0
    for table, held, c in _configs():
        if not any(len(h.states) > 1 for h in held):
            continue
        expected, peak = _two_solves(table, c)
        if not table.could_fit_every_state(held):
            assert expected is None, c
            refused += 1
            spared += peak  # the peak's optimum fits at its peak only
        got = solve_config(solve_chain, table, c)
        assert got == expected, c
        checked += 1
        solved += got is not None
    assert checked > 100 and spared > 5 and solved > 10, (checked, refused, spared, solved)


def _every_state_masks(table, held):  # type: ignore[no-untyped-def]
    """:meth:`StageFits.could_fit_every_state` over every one of each stage's states (not only its peak ones)."""
    import numpy as np

    from planner.solve.prices.fits import reaches

    fits = [np.logical_and.reduce([table.held(p).could_fit(w, table.cap_of(s)) for w, p in h.states])
            for s, h in enumerate(held)]
    return len(held) <= table.L and reaches(fits, table.L, len(held))


def test_peak_states_hold_the_heaviest_state() -> None:
    """:func:`planner.solve.prices.fits.peak_states` keeps, of each stage's held states, one at least as
    heavy as any, for any bytes per whole micro-batch (of either sign) and any keep >= 0, on every
    order that splits the backward; and it drops some (a ZBV chunk's, a DualPipe-V chunk's)."""
    from planner.artifacts.kinds import ChunkPlacement
    from planner.artifacts.layout import Layout
    from planner.solve.prices.fits import peak_states

    rng = random.Random(3)
    dropped = 0
    for kind in (*SPLIT, ScheduleKind.DUALPIPE_V):
        v = kind in (ScheduleKind.ZBV, ScheduleKind.DUALPIPE_V)
        for P in range(1, 7):
            layout = Layout(num_stages=2 * P, virtual_stages_per_rank=2, placement=ChunkPlacement.V) if v else Layout(num_stages=P)
            for M in range(2 * P if v else 1, 25):
                try:
                    held = held_counts(kind, layout, M)
                except PlannerInputError:  # a shape the schedule's rules refuse
                    continue
                for h in held:
                    peaks = peak_states(h.states)
                    assert set(peaks) <= set(h.states) and peaks[0] == h.states[0] and peaks[-1] == h.states[-1]
                    dropped += len(peaks) < len(h.states)
                    for _ in range(8):
                        act, keep = rng.randint(-50, 1000), rng.randint(0, 1000)
                        assert max(w * act + p * keep for w, p in peaks) == max(w * act + p * keep for w, p in h.states)
    assert dropped > 50


def test_the_check_over_peak_states_answers_as_over_every_state() -> None:
    """:meth:`StageFits.could_fit_every_state` (over each stage's peak states) answers as the same check over
    every held state, on every zero-bubble configuration of the drawn cases."""

    checked = refused = 0
    for table, held, c in _configs():
        got = table.could_fit_every_state(held)
        assert got == _every_state_masks(table, held), c
        checked += 1
        refused += not got
    assert checked > 100 and refused > 5, (checked, refused)
