"""The chain problem as an OR-Tools CP-SAT model (``--solver ilp``).

Same objective and constraints as :mod:`planner.solve.chain_dp`, for cross-checks and for
side constraints the DP cannot express. Per configuration (P, D, b, M, schedule):

- ``x[s, l]``: layer ``l`` on stage ``s`` (each layer on one stage; stage index
  non-decreasing by at most one per layer, so stages are contiguous and non-empty);
- ``r[l]``: layer ``l`` recomputed; ``z[s, l] = x[s, l] and r[l]``; ``q[l]``: layer ``l``'s
  attention core recomputed (selective, layers with a core; ``r[l] + q[l] <= 1``), ``y[s, l] =
  x[s, l] and q[l]``, which frees ``k_s C_l``, costs ``c_l`` and has working set ``C_l``;
- ``both[s, i]``: the two layers of ``Profile.shared_saved[i]`` on stage ``s``, the first not
  fully recomputed (their shared storage counted once: ``- k_s shared_i``);
- ``first[s, l]`` / ``last[s, l]``: stage ``s`` starts / ends at layer ``l`` (boundary buffers
  and transfers);
- memory of stage ``s`` (bytes, exact integers):
  ``kappa params - tied duplicates + 2 b (cut_in + cut_out) + k_s b (saved - sum_z (saved - input)) + ws_s <= cap``
  with ``ws_s >= b saved_l z[s, l]`` (the recompute working set); under ZeRO (stage ``z``
  over the ``D`` replicas) ``kappa = w + g + o / D`` (gradients whole at the peak, see
  planner.cost), and the row is multiplied by
  ``D`` to keep integer coefficients;
- ``T_s = sum x (f + b) + sum z f`` in integer nanoseconds, ``T_max >= T_s``;
- minimise ``sum_s T_s + sum_s c_s + (M - 1) T_max``;
- under ZeRO 3 (:mod:`planner.cost.fsdp`): ``T_s`` is ``sum x base + sum first head + sum last
  tail + sum single solo + recompute`` (``single[s, l]``: stage ``s`` is layer ``l`` alone), the
  state row ``kappa = w + g + o`` (over ``D``, so times ``D``: integer) plus ``D ws3_s`` with
  ``ws3_s >= u (w + g) N_l x[s, l]`` (the gathered working set), and no ``X_s``.

Times are rounded to nanoseconds and bytes to whole bytes, so the model's optimum can differ
from the DP's float optimum only by that rounding; the returned objective is re-priced in
floats from the model's partition.
"""

from __future__ import annotations

from typing import Any

from ortools.sat.python import cp_model

from planner.artifacts.kinds import ScheduleKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.cost import grad_group_line, link_of, p2p_ms
from planner.cost.fsdp import units_in_flight
from planner.schedule import inflight_counts
from planner.solve.chain_dp import ChainSolution, StageTable, exposed_allreduce_ms

NS_PER_MS = 1_000_000
TIME_LIMIT_S = 60.0


def solve_chain_ilp(
    table: StageTable, *, layout: Layout, num_microbatches: int, schedule: ScheduleKind
) -> ChainSolution | None:
    """The least J of one configuration as a CP-SAT model (one stage per rank: GPipe and 1F1B)."""
    cm, L, P, M, b = table.cm, table.L, layout.num_stages, num_microbatches, table.b
    if P > L:
        return None
    ks = inflight_counts(schedule, layout, M)
    fwd, bwd = cm.layer_times(b)
    saved = [float(v) for v in cm.saved_bytes(b)]
    inp = [float(v) * b for v in cm.input_per_sample]
    core, core_ms = [float(v) for v in cm.core_bytes(b)], cm.core_ms(b)
    cut = [float(c) * b for c in cm.cut_bytes_per_sample]
    # bytes of model state per parameter, ZeRO-sharded as the table says: a fraction with the
    # shard count as denominator, so the memory rows are multiplied by ``scale`` to stay integer
    scale = table.sharding.ranks if table.sharding.zero else 1
    kappa = int(round(table.kappa * scale))
    # OR-Tools' stubs type linear expressions more narrowly than its API accepts (sums of
    # products with Python ints): the model is built untyped
    m: Any = cp_model.CpModel()
    x = [[m.new_bool_var(f"x{s}_{l}") for l in range(L)] for s in range(P)]
    r = [m.new_bool_var(f"r{l}") for l in range(L)] if table.allow_recompute else None
    q = ({l: m.new_bool_var(f"q{l}") for l in range(L) if cm.has_core[l] and core[l] > 0}
         if table.allow_recompute else {})
    if r is not None:
        for l, ql in q.items():
            m.add(r[l] + ql <= 1)
    for l in range(L):
        m.add_exactly_one(x[s][l] for s in range(P))
    stage_of = [sum(s * x[s][l] for s in range(P)) for l in range(L)]
    m.add(stage_of[0] == 0)
    m.add(stage_of[L - 1] == P - 1)
    for l in range(1, L):
        m.add(stage_of[l] - stage_of[l - 1] >= 0)
        m.add(stage_of[l] - stage_of[l - 1] <= 1)
    for f in table_fixed(table):
        m.add(stage_of[f] - stage_of[f - 1] == 1)

    def both(a: Any, c: Any, name: str) -> Any:
        v = m.new_bool_var(name)
        m.add_bool_and([a, c]).only_enforce_if(v)
        m.add_bool_or([a.Not(), c.Not()]).only_enforce_if(v.Not())
        return v

    first: list[list[Any]] = [[x[s][l] if l == 0 else (both(x[s][l], x[s - 1][l - 1], f"f{s}_{l}") if s > 0 else None)
              for l in range(L)] for s in range(P)]
    last: list[list[Any]] = [[x[s][l] if l == L - 1 else (both(x[s][l], x[s + 1][l + 1], f"e{s}_{l}") if s < P - 1 else None)
             for l in range(L)] for s in range(P)]
    times, comms, exposures = [], [], []
    _, bwd_prefix = cm.time_prefix(b)
    overlap = cm.stack.reduce_overlap(table.sharding.zero is not ZeroStage.NONE)  # as StageTable.hidden_backward
    t_max = m.new_int_var(0, 10**15, "tmax")
    terms = cm.fsdp_terms(b, cm.fsdp_line(layout)) if table.fsdp else None
    unit_bytes = units_in_flight(cm.stack.fsdp_prefetch) * (cm.weight_bytes_per_param + cm.grad_bytes_per_param)

    def ns(v: float) -> int:
        return int(round(v * NS_PER_MS))

    for s in range(P):
        z: list[Any] = [both(x[s][l], r[l], f"z{s}_{l}") for l in range(L)] if r is not None else [None] * L
        y = {l: both(x[s][l], ql, f"y{s}_{l}") for l, ql in q.items()}
        if terms is None:
            t = sum(int(round((fwd[l] + bwd[l]) * NS_PER_MS)) * x[s][l] for l in range(L))
        else:
            t = sum(ns(terms.base[l]) * x[s][l] for l in range(L))
            t += sum(ns(terms.head[l]) * first[s][l] for l in range(L) if first[s][l] is not None)
            t += sum(ns(terms.tail[l]) * last[s][l] for l in range(L) if last[s][l] is not None)
            t += sum(ns(terms.solo[l]) * both(first[s][l], last[s][l], f"one{s}_{l}")
                     for l in range(L) if first[s][l] is not None and last[s][l] is not None)
        if r is not None:
            t += sum(int(round(fwd[l] * NS_PER_MS)) * z[l] for l in range(L))
            t += sum(int(round(core_ms[l] * NS_PER_MS)) * yl for l, yl in y.items())
        t_s = m.new_int_var(0, 10**15, f"t{s}")
        m.add(t_s == t)
        m.add(t_max >= t_s)
        times.append(t_s)
        params = sum(int(cm.param_count[l]) * x[s][l] for l in range(L))
        dup_terms = []
        for i, tie in enumerate(cm.profile.tied):
            inside = [x[s][l] for l in tie.layers]
            # duplicates on this stage: (count inside - 1)^+ copies, linearised with a bool "any inside"
            any_in = m.new_bool_var(f"tie{i}_{s}")
            m.add_max_equality(any_in, inside)
            dup_terms.append((tie.param_count, sum(inside) - any_in))
        state = params * kappa - sum(c * kappa * d for c, d in dup_terms)
        mem = 0
        if terms is not None:
            ws3 = m.new_int_var(0, int(unit_bytes * max(cm.param_count.max(), 0)) + 1, f"ws3_{s}")
            for l in range(L):
                m.add(ws3 >= int(unit_bytes * cm.param_count[l]) * x[s][l])
            mem += ws3
        # X_s >= AR_s - (backward of the layers before stage s, and of its own where the stack
        # overlaps the reduction with it: StageTable.hidden_backward), X_s >= 0 (see chain_dp)
        per_byte, fixed = grad_group_line(cm.cluster, layout, s)
        if (per_byte or fixed) and terms is None:
            ns_per_param = per_byte * table.sync_bytes_per_param * NS_PER_MS
            ar = sum(int(round(int(cm.param_count[l]) * ns_per_param)) * x[s][l] for l in range(L))
            ar -= sum(int(round(c * ns_per_param)) * d for c, d in dup_terms)
            hiding = s + 1 if overlap else s
            before = sum(
                int(round((bwd_prefix[l + 1] - bwd_prefix[l]) * NS_PER_MS)) * x[q][l] for q in range(hiding) for l in range(L)
            )
            e_s = m.new_int_var(0, 10**15, f"x_ar{s}")
            m.add(e_s >= ar + int(round(fixed * NS_PER_MS)) - before)
            exposures.append(e_s)
        mem += int(round(cm.gather_bytes_per_sample * b))  # context parallelism: one layer's gathered K/V
        mem += sum(int(round(2 * cut[l])) * first[s][l] for l in range(L) if first[s][l] is not None)
        mem += sum(int(round(2 * cut[l + 1])) * last[s][l] for l in range(L) if last[s][l] is not None)
        act = sum(int(round(ks[s] * saved[l])) * x[s][l] for l in range(L))
        for i, pair in enumerate(cm.profile.shared_saved):  # a storage both layers save: once, unless the
            on_both = both(x[s][pair.first], x[s][pair.second], f"sh{s}_{i}")  # first is fully recomputed
            if r is not None:
                on_both = both(on_both, r[pair.first].Not(), f"shk{s}_{i}")
            act -= int(round(ks[s] * pair.at(b))) * on_both
        if r is not None:
            act -= sum(int(round(ks[s] * (saved[l] - inp[l]))) * z[l] for l in range(L))
            act -= sum(int(round(ks[s] * core[l])) * yl for l, yl in y.items())
            ws = m.new_int_var(0, int(max(saved, default=0)) + 1, f"ws{s}")
            for l in range(L):
                m.add(ws >= int(round(saved[l])) * z[l])
            for l, yl in y.items():
                m.add(ws >= int(round(core[l])) * yl)
            act += ws
        m.add(state + scale * (mem + act) <= int(table.cap) * scale)
        if s < P - 1:
            bw, lat = link_of(cm.cluster, layout.rank_of(stage_idx=s), layout.rank_of(stage_idx=s + 1))
            comms.append(
                sum(
                    int(round(2 * p2p_ms(cut[l + 1], bandwidth_gb_per_s=bw, latency_us=lat) * NS_PER_MS)) * last[s][l]
                    for l in range(L - 1)
                )
            )
    m.minimize(sum(times) + sum(comms) + sum(exposures) + (M - 1) * t_max)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1  # deterministic
    solver.parameters.random_seed = 0
    solver.parameters.max_time_in_seconds = TIME_LIMIT_S
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    stages = [next(s for s in range(P) if solver.value(x[s][l])) for l in range(L)]
    bounds = tuple(l for l in range(L) if l == 0 or stages[l] != stages[l - 1])
    stops = list(bounds[1:]) + [L]
    recompute = tuple(
        tuple(l for l in range(a, z) if r is not None and solver.value(r[l])) for a, z in zip(bounds, stops)
    )
    selective = tuple(tuple(l for l in range(a, z) if l in q and solver.value(q[l])) for a, z in zip(bounds, stops))
    t_float = [
        sum(cm.stage_times_ms(a, z, b, s, layout)) + cm.recompute_ms(recompute[s], b, selective[s])
        for s, (a, z) in enumerate(zip(bounds, stops))
    ]
    comm = sum(2 * cm.boundary_transfer_ms(z, b, s, layout) for s, z in enumerate(stops))
    exposed = sum(exposed_allreduce_ms(cm, a, z, s, layout, b) for s, (a, z) in enumerate(zip(bounds, stops)))
    objective = sum(t_float) + comm + exposed + (M - 1) * max(t_float)
    return ChainSolution(objective, bounds, recompute, tuple(t_float), status == cp_model.OPTIMAL,
                         selective if any(selective) else ())


def table_fixed(table: StageTable) -> list[int]:
    """Layer indices where a stage must start (from the table's validity mask)."""
    L = table.L
    return [f for f in range(1, L) if not table.valid[f - 1, f + 1]] if L > 1 else []
