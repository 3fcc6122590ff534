"""The chain problem as an OR-Tools CP-SAT model (``--solver ilp``).

Same objective and constraints as :mod:`planner.solve.chain_dp`, for cross-checks and for
side constraints the DP cannot express. It reads only the
:class:`~planner.solve.chain.StageQuestion` it is handed and prices from the cost model's
per-layer arrays and per-stage methods, never from the DP's stage tables (it imports nothing
from :mod:`planner.solve.chain_dp` nor :mod:`planner.solve.prices`). Per configuration (P, D, b,
M, schedule):

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
- zero-bubble schedules (ZB-H1, ZB-H2): each stage's memory at the schedule's held counts
  (:func:`planner.schedule.held_counts`): ``k_s`` whole micro-batches as above plus ``p_s``
  past their I, each keeping W's inputs ``min(sum x keep, saved)`` (the min as a choice, the
  second only where storages are shared); and ``Z_s = min(2 W_s, F_s + B_s)`` subtracted
  (``z_s`` bounded by both, maximised), as the DP's extras (not under ZeRO 3);
- under ZeRO 3 (:mod:`planner.cost.fsdp`): ``T_s`` is ``sum x base + sum first head + sum last
  tail + sum single solo + recompute`` (``single[s, l]``: stage ``s`` is layer ``l`` alone), the
  state row ``kappa = w + g + o`` (over ``D``, so times ``D``: integer) plus ``D ws3_s`` with
  ``ws3_s >= u (w + g) N_l x[s, l]`` (the gathered working set), and no ``X_s``.

Times are rounded to nanoseconds and bytes to whole bytes, so the model's optimum can differ
from the DP's float optimum only by that rounding; the returned objective is re-priced in
floats from the model's partition. The order in which variables and constraints are made is
part of the model (one worker, seed 0: the same model gives the same solution).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ortools.sat.python import cp_model

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import ScheduleKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.cost import grad_group_line, link_of, p2p_ms
from planner.cost.fsdp import FsdpTerms, units_in_flight
from planner.schedule import Held, held_counts
from planner.solve.chain import ChainSolution, PricedStages, StageQuestion

NS_PER_MS = 1_000_000
TIME_LIMIT_S = 60.0


def _ns(v: float) -> int:
    return int(round(v * NS_PER_MS))


class _ChainModel:
    """The CP-SAT model of one configuration (module docstring), its variables and constraints
    made in the order listed there. OR-Tools' stubs type linear expressions more narrowly than
    its API accepts (sums of products with Python ints): the model is built untyped."""

    def __init__(self, q: StageQuestion, layout: Layout, held: Sequence[Held], split: bool = False):
        self.q, self.layout, self.held, self.split = q, layout, held, split
        self.ks = [h.whole for h in held]
        cm, b = q.cost_model, q.microbatch_size
        self.L, self.P = cm.num_layers, layout.num_stages
        self.fwd, self.bwd = cm.at_batch(b).times_ms
        self.saved = [float(v) for v in cm.at_batch(b).saved_bytes]
        self.keep = [v * float(f) for v, f in zip(self.saved, cm.wgrad_saved_fraction)]  # W's inputs per layer
        self.inp = [float(v) * b for v in cm.input_per_sample]
        self.core, self.core_ms = [float(v) for v in cm.at_batch(b).core_bytes], cm.at_batch(b).core_ms
        # what recomputing a layer adds (under ZeRO 3 less what runs beside its collectives)
        self.rc_prices = cm.layout_recompute_prices(b, layout, 0)
        self.cut = [float(c) * b for c in cm.cut_bytes_per_sample]
        # bytes of model state per parameter, ZeRO-sharded as the question says: a fraction with the
        # shard count as denominator, so the memory rows are multiplied by ``scale`` to stay integer
        self.scale = q.sharding.ranks if q.sharding.zero else 1
        self.kappa = int(round(sum(cm.state_bytes_per_param(q.sharding)) * self.scale))
        self.m: Any = cp_model.CpModel()
        self._placement()
        self._ends()

    def both(self, a: Any, c: Any, name: str) -> Any:
        """A new bool equal to ``a and c``."""
        v = self.m.new_bool_var(name)
        self.m.add_bool_and([a, c]).only_enforce_if(v)
        self.m.add_bool_or([a.Not(), c.Not()]).only_enforce_if(v.Not())
        return v

    def _placement(self) -> None:
        """``x``, ``r``, ``q``: each layer on one stage, stages contiguous, non-empty and starting
        at the fixed boundaries."""
        m, L, P, cm = self.m, self.L, self.P, self.q.cost_model
        recompute = self.q.allow_recompute
        self.x = [[m.new_bool_var(f"x{s}_{l}") for l in range(L)] for s in range(P)]
        self.r = [m.new_bool_var(f"r{l}") for l in range(L)] if recompute else None
        self.qs = ({l: m.new_bool_var(f"q{l}") for l in range(L) if cm.has_core[l] and self.core[l] > 0}
                   if recompute else {})
        if self.r is not None:
            for l, ql in self.qs.items():
                m.add(self.r[l] + ql <= 1)
        for l in range(L):
            m.add_exactly_one(self.x[s][l] for s in range(P))
        stage_of = [sum(s * self.x[s][l] for s in range(P)) for l in range(L)]
        m.add(stage_of[0] == 0)
        m.add(stage_of[L - 1] == P - 1)
        for l in range(1, L):
            m.add(stage_of[l] - stage_of[l - 1] >= 0)
            m.add(stage_of[l] - stage_of[l - 1] <= 1)
        for f in fixed_starts(self.q):
            m.add(stage_of[f] - stage_of[f - 1] == 1)

    def _ends(self) -> None:
        """``first[s][l]`` / ``last[s][l]``: stage ``s`` starts / ends at layer ``l`` (None where it cannot)."""
        x, L, P, both = self.x, self.L, self.P, self.both
        self.first: list[list[Any]] = [
            [x[s][l] if l == 0 else (both(x[s][l], x[s - 1][l - 1], f"f{s}_{l}") if s > 0 else None) for l in range(L)]
            for s in range(P)]
        self.last: list[list[Any]] = [
            [x[s][l] if l == L - 1 else (both(x[s][l], x[s + 1][l + 1], f"e{s}_{l}") if s < P - 1 else None)
             for l in range(L)] for s in range(P)]

    def stage_time(self, s: int, z: list[Any], y: dict[int, Any], terms: FsdpTerms | None) -> Any:
        """``T_s`` in nanoseconds: compute (ZeRO 3's F' + B' where ``terms``) plus recomputation."""
        x, L, first, last = self.x[s], self.L, self.first[s], self.last[s]
        if terms is None:
            t = sum(int(round((self.fwd[l] + self.bwd[l]) * NS_PER_MS)) * x[l] for l in range(L))
        else:
            t = sum(_ns(terms.base[l]) * x[l] for l in range(L))
            t += sum(_ns(terms.head[l]) * first[l] for l in range(L) if first[l] is not None)
            t += sum(_ns(terms.tail[l]) * last[l] for l in range(L) if last[l] is not None)
            t += sum(_ns(terms.solo[l]) * self.both(first[l], last[l], f"one{s}_{l}")
                     for l in range(L) if first[l] is not None and last[l] is not None)
        if self.r is not None:
            rc_fwd, rc_core = self.rc_prices
            t += sum(int(round(rc_fwd[l] * NS_PER_MS)) * z[l] for l in range(L))
            t += sum(int(round(rc_core[l] * NS_PER_MS)) * yl for l, yl in y.items())
        return t

    def tie_duplicates(self, s: int) -> list[tuple[int, Any]]:
        """Per tied tensor, (its parameters, its copies on stage ``s`` beyond the first)."""
        dup_terms = []
        for i, tie in enumerate(self.q.cost_model.profile.tied):
            inside = [self.x[s][l] for l in tie.layers]
            # duplicates on this stage: (count inside - 1)^+ copies, linearised with a bool "any inside"
            any_in = self.m.new_bool_var(f"tie{i}_{s}")
            self.m.add_max_equality(any_in, inside)
            dup_terms.append((tie.param_count, sum(inside) - any_in))
        return dup_terms

    def exposure(self, s: int, dup_terms: list[tuple[int, Any]]) -> Any | None:
        """``X_s`` (None where the stage has no gradient group): ``X_s >= AR_s - (backward of the
        layers before stage s, and of its own where the stack overlaps the reduction with it),
        X_s >= 0`` (:meth:`planner.cost.CostModel.stage_exposed_sync_ms`)."""
        cm, layout, L = self.q.cost_model, self.layout, self.L
        per_byte, fixed = grad_group_line(cm.cluster, layout, s)
        if not (per_byte or fixed):
            return None
        _, bwd_prefix = cm.at_batch(self.q.microbatch_size).prefix_ms
        overlap = cm.stack.reduce_overlap(self.q.sharding.zero is not ZeroStage.NONE)
        ns_per_param = per_byte * cm.post_backward_sync_bytes_per_param(self.q.sharding.zero) * NS_PER_MS
        ar = sum(int(round(int(cm.param_count[l]) * ns_per_param)) * self.x[s][l] for l in range(L))
        ar -= sum(int(round(c * ns_per_param)) * d for c, d in dup_terms)
        hiding = s + 1 if overlap else s
        before = sum(
            int(round((bwd_prefix[l + 1] - bwd_prefix[l]) * NS_PER_MS)) * self.x[p][l] for p in range(hiding) for l in range(L)
        )
        e_s = self.m.new_int_var(0, 10**15, f"x_ar{s}")
        self.m.add(e_s >= ar + int(round(fixed * NS_PER_MS)) - before)
        return e_s

    def buffers(self, s: int) -> Any:
        """Stage ``s``'s buffers: context parallelism's gathered K/V, and the boundary tensors in and out."""
        cm, b, L, first, last, cut = self.q.cost_model, self.q.microbatch_size, self.L, self.first[s], self.last[s], self.cut
        mem = int(round(cm.gather_bytes_per_sample * b))  # context parallelism: one layer's gathered K/V
        mem += sum(int(round(2 * cut[l])) * first[l] for l in range(L) if first[l] is not None)
        mem += sum(int(round(2 * cut[l + 1])) * last[l] for l in range(L) if last[l] is not None)
        return mem

    def activations(self, s: int, z: list[Any], y: dict[int, Any]) -> Any:
        """Stage ``s``'s activations with ``k_s`` micro-batches in flight, plus the recompute working set."""
        cm, L, k, x, r = self.q.cost_model, self.L, self.ks[s], self.x[s], self.r
        act = sum(int(round(k * self.saved[l])) * x[l] for l in range(L))
        for i, pair in enumerate(cm.profile.shared_saved):  # a storage both layers save: once, unless the
            on_both = self.both(x[pair.first], x[pair.second], f"sh{s}_{i}")  # first is fully recomputed
            if r is not None:
                on_both = self.both(on_both, r[pair.first].Not(), f"shk{s}_{i}")
            act -= int(round(k * pair.at(self.q.microbatch_size))) * on_both
        if r is not None:
            act -= sum(int(round(k * (self.saved[l] - self.inp[l]))) * z[l] for l in range(L))
            act -= sum(int(round(k * self.core[l])) * yl for l, yl in y.items())
            ws = self.m.new_int_var(0, int(max(self.saved, default=0)) + 1, f"ws{s}")
            for l in range(L):
                self.m.add(ws >= int(round(self.saved[l])) * z[l])
            for l, yl in y.items():
                self.m.add(ws >= int(round(self.core[l])) * yl)
            act += ws
        return act

    def pending(self, s: int, pending: int) -> Any:
        """``pending`` micro-batches past their I, each keeping W's inputs: ``min(sum x keep,
        saved without recomputation)`` (:meth:`CostModel.keep_bytes`; the second only where a
        storage is shared, else never the smaller), 0 without any."""
        if not pending:
            return 0
        cm, L, x = self.q.cost_model, self.L, self.x[s]
        keep = sum(int(round(pending * self.keep[l])) * x[l] for l in range(L))
        if not cm.profile.shared_saved:
            return keep
        plain = sum(int(round(pending * self.saved[l])) * x[l] for l in range(L))
        for i, pair in enumerate(cm.profile.shared_saved):
            plain -= int(round(pending * pair.at(self.q.microbatch_size))) * self.both(x[pair.first], x[pair.second],
                                                                                       f"pk{s}_{i}_{pending}")
        low = self.m.new_int_var(0, int(pending * sum(self.saved)) + 1, f"keep{s}_{pending}")
        smaller = self.m.new_bool_var(f"keepmin{s}_{pending}")  # the solver takes the smaller: memory only binds
        self.m.add(low >= keep).only_enforce_if(smaller)
        self.m.add(low >= plain).only_enforce_if(smaller.Not())
        return low

    def fill(self, s: int) -> Any:
        """``Z_s = min(2 W_s, F_s + B_s)`` in nanoseconds, what a zero-bubble stage's W passes fill
        of the pipeline's fill and drain (:meth:`CostModel.stage_bubble_fill_ms`): subtracted, so
        the solver takes it at the smaller of the two."""
        cm, L, x = self.q.cost_model, self.L, self.x[s]
        z = self.m.new_int_var(0, 10**15, f"fill{s}")
        self.m.add(z <= sum(int(round(2 * self.bwd[l] * cm.wgrad_fraction[l] * NS_PER_MS)) * x[l] for l in range(L)))
        self.m.add(z <= sum(int(round((self.fwd[l] + self.bwd[l]) * NS_PER_MS)) * x[l] for l in range(L)))
        return z

    def transfer(self, s: int) -> Any:
        """``c_s``: the forward + backward transfer after stage ``s`` (not the last)."""
        cm, layout = self.q.cost_model, self.layout
        bw, lat = link_of(cm.cluster, layout.rank_of(stage_idx=s), layout.rank_of(stage_idx=s + 1))
        return sum(
            int(round(2 * p2p_ms(self.cut[l + 1], bandwidth_gb_per_s=bw, latency_us=lat) * NS_PER_MS)) * self.last[s][l]
            for l in range(self.L - 1)
        )

    def stage(self, s: int, t_max: Any, terms: FsdpTerms | None, unit_bytes: float) -> tuple[Any, Any | None]:
        """Stage ``s``'s time variable (bounding ``t_max``), its memory row, and its ``X_s``."""
        m, L, x = self.m, self.L, self.x[s]
        z: list[Any] = [self.both(x[l], self.r[l], f"z{s}_{l}") for l in range(L)] if self.r is not None else [None] * L
        y = {l: self.both(x[l], ql, f"y{s}_{l}") for l, ql in self.qs.items()}
        t = self.stage_time(s, z, y, terms)  # (its variables before t_s: the order is the model's)
        t_s = m.new_int_var(0, 10**15, f"t{s}")
        m.add(t_s == t)
        m.add(t_max >= t_s)
        params = sum(int(self.q.cost_model.param_count[l]) * x[l] for l in range(L))
        dup_terms = self.tie_duplicates(s)
        state = params * self.kappa - sum(c * self.kappa * d for c, d in dup_terms)
        mem = 0
        if terms is not None:
            ws3 = m.new_int_var(0, int(unit_bytes * max(self.q.cost_model.param_count.max(), 0)) + 1, f"ws3_{s}")
            for l in range(L):
                m.add(ws3 >= int(unit_bytes * self.q.cost_model.param_count[l]) * x[l])
            mem += ws3
        e_s = self.exposure(s, dup_terms) if terms is None else None
        mem += self.buffers(s)
        act = self.activations(s, z, y)
        m.add(state + self.scale * (mem + act + self.pending(s, self.held[s].pending)) <= int(self.q.cap_bytes) * self.scale)
        return t_s, e_s

    def build(self) -> None:
        """Every stage's rows and the objective ``sum T_s + sum c_s + sum X_s + (M - 1) T_max``."""
        cm, layout = self.q.cost_model, self.layout
        t_max = self.m.new_int_var(0, 10**15, "tmax")
        terms = cm.fsdp_terms(self.q.microbatch_size, cm.fsdp_line(layout)) if self.q.fsdp else None
        unit_bytes = units_in_flight(cm.stack.fsdp_prefetch) * (cm.weight_bytes_per_param + cm.grad_bytes_per_param)
        times, comms, exposures = [], [], []
        for s in range(self.P):
            t_s, e_s = self.stage(s, t_max, terms, unit_bytes)
            times.append(t_s)
            if e_s is not None:
                exposures.append(e_s)
            if self.split and terms is None:
                exposures.append(-self.fill(s))
            if s < self.P - 1:
                comms.append(self.transfer(s))
        self.t_max, self.times, self.comms, self.exposures = t_max, times, comms, exposures

    def solve(self, num_microbatches: int) -> tuple[Any, Any]:
        """(solver, status) of minimising J with ``num_microbatches`` micro-batches."""
        self.m.minimize(sum(self.times) + sum(self.comms) + sum(self.exposures) + (num_microbatches - 1) * self.t_max)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1  # deterministic
        solver.parameters.random_seed = 0
        solver.parameters.max_time_in_seconds = TIME_LIMIT_S
        return solver, solver.solve(self.m)


def solve_chain_ilp(
    table: PricedStages, *, layout: Layout, num_microbatches: int, schedule: ScheduleKind, held: Sequence[Held] = (),
) -> ChainSolution | None:
    """The least J of one configuration as a CP-SAT model (one stage per rank: GPipe and 1F1B;
    a zero-bubble stage's memory at the schedule's held counts, whole and past I, as the DP
    prices it: :func:`planner.schedule.held_counts`, or ``held`` where given). Reads only
    ``table.question``."""
    q = table.question
    cm, P, M, b = q.cost_model, layout.num_stages, num_microbatches, q.microbatch_size
    L = cm.num_layers
    if cm.has_experts:
        raise PlannerInputError("solver 'ilp' does not price routed experts (their state and gradients on their own "
                                "group): plan mixture-of-experts profiles with --solver dp or brute-force")
    if P > L:
        return None
    model = _ChainModel(q, layout, held or held_counts(schedule, layout, M), schedule.splits_backward)
    model.build()
    solver, status = model.solve(M)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    x, r, qs = model.x, model.r, model.qs
    stages = [next(s for s in range(P) if solver.value(x[s][l])) for l in range(L)]
    bounds = tuple(l for l in range(L) if l == 0 or stages[l] != stages[l - 1])
    stops = list(bounds[1:]) + [L]
    recompute = tuple(
        tuple(l for l in range(a, z) if r is not None and solver.value(r[l])) for a, z in zip(bounds, stops)
    )
    selective = tuple(tuple(l for l in range(a, z) if l in qs and solver.value(qs[l])) for a, z in zip(bounds, stops))
    t_float = [
        sum(cm.stage_times_ms(a, z, b, s, layout)) + cm.recompute_ms(recompute[s], b, selective[s], layout, s)
        for s, (a, z) in enumerate(zip(bounds, stops))
    ]
    comm = sum(2 * cm.boundary_transfer_ms(z, b, s, layout) for s, z in enumerate(stops))
    exposed = sum(cm.stage_exposed_sync_ms(a, z, s, layout, b) for s, (a, z) in enumerate(zip(bounds, stops)))
    fill = sum(cm.stage_bubble_fill_ms(a, z, b) for a, z in zip(bounds, stops)) if model.split and not q.fsdp else 0.0
    objective = sum(t_float) + comm + exposed - fill + (M - 1) * max(t_float)
    return ChainSolution(objective, bounds, recompute, tuple(t_float), status == cp_model.OPTIMAL, selective)


def fixed_starts(q: StageQuestion) -> list[int]:
    """Layer indices where a stage must start (the question's fixed boundaries inside the chain)."""
    L = q.cost_model.num_layers
    return [f for f in range(1, L) if not q.stage_valid(f - 1, f + 1)] if L > 1 else []
