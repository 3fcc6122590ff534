"""The stage tables' vectorised recompute prices (issue 24): the least recompute time of a stage
priced for many stages at once (:func:`planner.solve.recompute.level_covers` + :func:`level_cover_costs`) is the one
:func:`choose_recompute` finds, bit for bit, and the least over every choice of levels
(brute force); a table's layers, chosen afterwards, reach that price."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.artifacts.cluster import PRESETS
from planner.cost import CostModel
from planner.profiling.analytic.gpt import gpt3_profile
from planner.solve.prices import StageTable
from planner.solve.prices import fits as prices_fits
from planner.solve.prices import layers as prices_layers
from planner.solve.prices.layers import level_cover_costs
from planner.solve.recompute import choose_recompute, level_covers
from tests.chains import chain_profile, layer_dicts, shared_pairs, small_cluster

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: a layer kind: (fwd ms, saved bytes, input bytes, core ms, core bytes)
kinds = st.tuples(st.floats(0.1, 5.0), st.floats(0.0, 100.0), st.floats(0.0, 30.0), st.floats(0.05, 2.0),
                  st.sampled_from([0.0, 0.0, 5.0, 20.0, 60.0]))


def brute_force(layers: list[tuple[float, float, float, float, float]], inflight: int, excess: float) -> float:
    """The least recompute ms over every level per layer (none, full, selective where it has a
    core) whose freed bytes cover the excess plus the largest recomputed working set."""
    best = math.inf
    for levels in itertools.product((0, 1, 2), repeat=len(layers)):
        gain = ms = ws = 0.0
        ok = True
        for (f, saved, inp, core_ms, core), level in zip(layers, levels):
            if level == 1:
                ok &= inflight * (saved - inp) > 0
                gain, ms, ws = gain + inflight * (saved - inp), ms + f, max(ws, saved)
            elif level == 2:
                ok &= core > 0
                gain, ms, ws = gain + inflight * core, ms + core_ms, max(ws, core)
        if ok and gain >= excess + ws:
            best = min(best, ms)
    return best


@SETTINGS
@given(
    runs=st.lists(st.tuples(kinds, st.integers(1, 3)), min_size=1, max_size=3),
    inflight=st.integers(1, 4),
    excesses=st.lists(st.floats(0.001, 500.0), min_size=1, max_size=6),
)
def test_vectorised_price_is_choose_recompute_and_least(runs, inflight, excesses):
    layers = [kind for kind, count in runs for _ in range(count)]
    if not any(kind[4] > 0 for kind in layers):
        return  # without a selective level the 0/1 cover runs, one stage at a time
    covers = level_covers(runs, inflight)  # kinds: (fwd ms, saved, input, core ms, core bytes)
    assert covers is not None  # a handful of kinds: exact
    rows = [c for _ in excesses for c in covers]
    targets = np.array([e + c.workspace_bytes for e in excesses for c in covers])
    costs = level_cover_costs(rows, targets).reshape(len(excesses), len(covers)) if covers else None
    for at, excess in enumerate(excesses):
        got = math.inf if costs is None else float(costs[at].min())
        want = choose_recompute(
            fwd_ms=[k[0] for k in layers], saved_bytes=[k[1] for k in layers], input_bytes=[k[2] for k in layers],
            first_layer=0, inflight=inflight, excess_bytes=excess, core_ms=[k[3] for k in layers],
            core_bytes=[k[4] for k in layers])
        assert got == want.time_ms  # the same floats, so the same plans
        oracle = brute_force(layers, inflight, excess)
        assert (got == oracle == math.inf) or math.isclose(got, oracle, rel_tol=1e-9)


@SETTINGS
@given(
    stages=st.lists(st.lists(st.tuples(kinds, st.integers(1, 40)), min_size=1, max_size=3), min_size=2, max_size=8),
    inflight=st.integers(1, 4),
    excess=st.floats(0.001, 5000.0),
)
def test_rows_priced_by_size_class_cost_what_one_block_does(stages, inflight, excess):
    """Rows of very different sizes (full-layer counts 1-120, fronts of 1 to dozens of points)
    priced in size classes (:func:`planner.solve.prices.layers._size_classes`, as a call with large
    padded arrays is) cost what one padded block gives, bit for bit."""
    from planner.solve.prices import layers as prices_covers  # the covers live beside the layers

    rows = []
    for runs in stages:
        covers = level_covers(runs, inflight)  # kinds: (fwd ms, saved, input, core ms, core bytes)
        rows += list(covers or ())
    if len(rows) < 2:
        return
    targets = np.array([excess * (1 + k % 3) + c.workspace_bytes for k, c in enumerate(rows)])
    kept = prices_covers._CLASS_MIN_ELEMENTS
    try:
        prices_covers._CLASS_MIN_ELEMENTS = 1 << 60  # one block, padded to the largest row
        whole = level_cover_costs(rows, targets)
        prices_covers._CLASS_MIN_ELEMENTS = 0  # always by size class
        assert len(prices_covers._size_classes(np.array([len(c.front_ms) for c in rows]),
                                           np.array([int(c.params[1]) + 1 for c in rows]))) >= 1
        by_class = level_cover_costs(rows, targets)
    finally:
        prices_covers._CLASS_MIN_ELEMENTS = kept
    assert by_class.tolist() == whole.tolist()


def test_gpt3_table_prices_are_its_recompute_choices():
    """Every stage a GPT-3 table prices with recomputation costs its compute plus
    :func:`choose_recompute`'s time, and its chosen layers are that choice's."""
    cm = CostModel(gpt3_profile("gpt3-1.3b", "a100-80gb"), PRESETS["a100-80gb-x8"])
    table = StageTable(cm, 4, 20e9)
    priced = 0
    for inflight in (1, 3, 8):
        t = table.table(inflight)
        excess = table.static + inflight * table.act - table.cap
        for i, j in zip(*np.nonzero(np.isfinite(t) & table.valid & (excess > 0))):
            i, j = int(i), int(j)
            choice = choose_recompute(
                fwd_ms=table.fwd[i:j].tolist(), saved_bytes=table.saved[i:j].tolist(),
                input_bytes=table.inputs[i:j].tolist(), first_layer=i, inflight=inflight,
                excess_bytes=float(excess[i, j]), core_ms=table.core_ms[i:j].tolist(), core_bytes=table.core[i:j].tolist())
            assert t[i, j] == table.compute[i, j] + choice.time_ms
            assert table.recompute_of(inflight, i, j) == choice.layers
            assert table.selective_of(inflight, i, j) == choice.selective
            priced += 1
    assert priced > 100  # the cap binds: many stages need recomputation


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds_drawn=st.lists(st.tuples(st.floats(0.5, 4.0), st.floats(1e6, 40e6), st.floats(0.05, 0.9), st.floats(0.05, 0.6)),
                         min_size=2, max_size=3),
    order=st.lists(st.integers(0, 2), min_size=6, max_size=18),
    inflight=st.integers(1, 6),
    cap_mb=st.floats(5.0, 200.0),
)
def test_stages_known_by_content_price_as_stages_known_by_runs(kinds_drawn, order, inflight, cap_mb):
    """A chain of a few kinds of layer in any order (a grouped transformer's one- and two-block
    groups): every stage's price keyed by what it holds (each kind's layers, in the order the
    kinds first appear) is the price keyed by its runs of layers, bit for bit, and
    :func:`choose_recompute`'s; stages at different places with the same layers share rows."""
    layers = []
    for k in order:
        f, saved, core_frac, core_ms = kinds_drawn[k % len(kinds_drawn)]
        layers.append({"fwd": f, "bwd": 2 * f, "params": 1000, "saved": saved, "inp": saved / 8, "out": saved / 8,
                       "core": saved * core_frac, "core_ms": f * core_ms})
    got = {}
    kept = prices_layers.CONTENT_KINDS
    for limit in (kept, 0):
        prices_layers._LAYERS.clear()
        prices_layers.CONTENT_KINDS = limit
        try:  # a cost model of its own: tables share their layers' covers per cost model
            table = StageTable(CostModel(chain_profile(layers), small_cluster(8)), 1, cap_mb * 1e6)
            priced = table.table(inflight).copy()  # (its layers' kinds built as it prices, at this limit)
            kinds = prices_layers.layers_of(table.fwd, table.saved, table.inputs, table.core, table.core_ms)
        finally:
            prices_layers.CONTENT_KINDS = kept
        got[limit] = (priced, len(kinds.rows), kinds.by_content)
        excess = table.static + inflight * table.act - table.cap
        for i, j in zip(*np.nonzero(np.isfinite(got[limit][0]) & table.valid & (excess > 0))):
            i, j = int(i), int(j)
            want = choose_recompute(
                fwd_ms=table.fwd[i:j].tolist(), saved_bytes=table.saved[i:j].tolist(),
                input_bytes=table.inputs[i:j].tolist(), first_layer=i, inflight=inflight,
                excess_bytes=float(excess[i, j]), core_ms=table.core_ms[i:j].tolist(), core_bytes=table.core[i:j].tolist())
            assert got[limit][0][i, j] == table.compute[i, j] + want.time_ms
            assert (table.recompute_of(inflight, i, j), table.selective_of(inflight, i, j)) == (want.layers, want.selective)
    prices_layers._LAYERS.clear()
    by_content, by_runs = got[kept], got[0]
    assert by_content[2] and not by_runs[2]
    assert np.array_equal(by_content[0], by_runs[0])
    assert by_content[1] <= by_runs[1]  # never more covers worked out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=layer_dicts(7, levels=True), data=st.data(), inflight=st.integers(1, 70), scale=st.floats(0.3, 3.0))
def test_cap_views_say_what_the_stage_bytes_say(layers, data, inflight, scale):
    """:class:`planner.solve.prices.capview.CapView`: a stage fits as it is with ``k`` micro-batches in
    flight exactly where its bytes ``static + k act`` are within the cap, evaluated as before (bit
    for bit on the comparison, ties at the cap included), and might fit at its leanest wherever
    every layer at its leanest level would bring it within the cap (never the other way); the
    longest stages of each alike. Caps around one stage's own bytes at ``k`` (the boundary, and
    the float just below it). Fails with the count's settling removed (the division's rounding
    alone misplaces the boundary)."""
    cm = CostModel(chain_profile(layers), small_cluster(8))
    b = data.draw(st.sampled_from([1, 2, 3]))
    L = cm.num_layers
    i = data.draw(st.integers(0, L - 1))
    j = data.draw(st.integers(i + 1, L))
    table = StageTable(cm, b, 1e9)
    own = float(table.static[i, j] + inflight * table.act[i, j])
    lengths = np.arange(L + 1)[None, :] - np.arange(L + 1)[:, None]
    for cap in (own, float(np.nextafter(own, 0.0)), own * scale):
        bytes_ok = table.valid & (table.static + inflight * table.act - cap <= 0)
        leanest = table.valid & (inflight * table.gain >= table.static + inflight * table.act - cap)
        # the table's own cap (its view, here on any chain), and a cap it is asked besides (a
        # chunk's share: worked out alone)
        kept = prices_fits.VIEW_MIN_LAYERS
        prices_fits.VIEW_MIN_LAYERS = 0
        try:
            tables = (StageTable(cm, b, cap), StageTable(cm, b, 2 * cap + 1.0))
            assert tables[0]._view(cap) is not None and tables[1]._view(cap) is None
            for t in tables:
                assert np.array_equal(t.could_fit(inflight, cap, recompute=False), bytes_ok)
                assert np.array_equal(np.isfinite(t.base(inflight, cap)), bytes_ok)
                assert not np.any(leanest & ~t.could_fit(inflight, cap))
                assert t.longest(inflight, cap, recompute=False) == int(np.max(bytes_ok * lengths))
                assert t.longest(inflight, cap) >= int(np.max(leanest * lengths))
        finally:
            prices_fits.VIEW_MIN_LAYERS = kept


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=layer_dicts(7, levels=True), data=st.data(), inflight=st.integers(1, 70), pending=st.integers(0, 3))
def test_memory_binds_nowhere_where_every_stage_fits_as_it_is(layers, data, inflight, pending):
    """:func:`planner.solve.floors.binds_nowhere` (read from a table's arrays) says ``k``
    micro-batches fit every stage without recomputation exactly where the table's own fit test
    (:meth:`~planner.solve.prices.fits.StageFits.could_fit` without recomputation) holds on every
    stage, held copies too; caps at the largest stage's bytes at ``inflight`` (the boundary), the
    float below, and tenfold."""
    from planner.solve.floors import binds_nowhere

    cm = CostModel(chain_profile(layers), small_cluster(8))
    b = data.draw(st.sampled_from([1, 2, 3]))
    probe = StageTable(cm, b, 1e9).held(pending)
    most = float(np.max(np.where(probe.valid, probe.static + inflight * probe.act, -np.inf)))
    below = float(np.nextafter(most, -np.inf))
    for cap in (most, below, 10 * most):
        t = StageTable(cm, b, cap).held(pending)
        for k in (inflight - 1, inflight, inflight + 1, 2 * inflight):
            assert binds_nowhere(t, k) == bool(np.all(t.could_fit(k, recompute=False) | ~t.valid)), (cap, k)
    assert binds_nowhere(StageTable(cm, b, most).held(pending), inflight)
    assert not binds_nowhere(StageTable(cm, b, below).held(pending), inflight)


def test_tables_sharing_their_layers_parts_price_as_tables_built_alone():
    """Tables of one cost model and micro-batch size share what the sharding does not change
    (times, activation bytes, recompute choices: ``planner.solve.prices.fixed``), each its own static
    bytes: a table built after others of other shardings prices every stage and chooses every
    recomputation as the same table built alone (a cost model of its own), ZeRO 3 included."""
    from planner.artifacts.kinds import ZeroStage
    from planner.artifacts.layout import Sharding

    profile = gpt3_profile("gpt3-1.3b", "a100-80gb")
    shardings = [Sharding(), Sharding(ZeroStage.OPTIMIZER, 4), Sharding(ZeroStage.PARAMETERS, 4)]
    cm = CostModel(profile, PRESETS["a100-80gb-x8"])
    together = [StageTable(cm, 4, 12e9, sharding=s) for s in shardings]
    assert together[0].act is together[1].act and together[0]._cache is together[2]._cache
    assert not np.array_equal(together[0].static, together[1].static)
    for inflight in (1, 4):
        for s, table in zip(shardings, together):
            got = table.table(inflight)
            alone = StageTable(CostModel(profile, PRESETS["a100-80gb-x8"]), 4, 12e9, sharding=s)
            want = alone.table(inflight)
            assert np.array_equal(got, want)
            priced = np.argwhere(np.isfinite(want) & (alone.static + inflight * alone.act > alone.cap))
            assert len(priced) > 0
            for i, j in priced.tolist():
                assert table.choice_of(inflight, i, j) == alone.choice_of(inflight, i, j)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.floats(-1e12, 1e12), st.sampled_from([0.0, 1.5, math.inf, -math.inf])), max_size=40),
       as_int=st.booleans(), rows=st.sampled_from([1, 2]))
def test_distinct_is_numpys_unique(values, as_int, rows):
    """``planner.solve.arrays.distinct`` (the search's ``np.unique`` without importing
    ``numpy.ma``) gives ``np.unique``'s values, dtype and order, flattening a matrix."""
    from planner.solve.arrays import distinct

    a = np.array(values[: len(values) // rows * rows], dtype=float)
    if as_int:
        a = np.nan_to_num(a, posinf=1e12, neginf=-1e12).astype(np.int64)
    a = a.reshape(rows, -1)
    got, want = distinct(a), np.unique(a)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=layer_dicts(8, levels=True), data=st.data(), b=st.sampled_from([1, 2, 3]))
def test_cost_models_stage_matrices_are_its_per_stage_methods(layers, data, b):
    """The cost model's vectorised per-stage sums (:class:`planner.cost.prefix.PrefixSums`, what
    the stage tables are built from) equal its per-stage methods at every stage ``[i, j)``, bit
    for bit: parameters (a tied tensor counted once), F + B, activation bytes without
    recomputation (a shared storage counted once), buffers."""
    from planner.artifacts.profile import TiedParams

    later = [d["saved"] - (d.get("core") or 0.0) for d in layers]  # what a profile lets layers share
    earlier = list(later)
    shared = []
    for a, z, v in data.draw(shared_pairs(len(layers))):
        v = min(v, later[a], earlier[z])
        later[a] -= v
        earlier[z] -= v
        shared.append((a, z, v))
    prof = chain_profile(layers, shared=shared)
    L = prof.num_layers
    if L >= 3 and data.draw(st.booleans()):  # a tied tensor over two or three layers
        tied = tuple(sorted(data.draw(st.sets(st.integers(0, L - 1), min_size=2, max_size=3))))
        count = min(prof.layers[t].param_count for t in tied)
        prof = dataclasses.replace(prof, tied=(TiedParams(name="tie", layers=tied, param_count=count, param_bytes=4 * count),))
    cm = CostModel(prof, small_cluster(8), gather_bytes_per_sample=data.draw(st.sampled_from([0.0, 3e5])))
    params, sums = cm.stage_param_matrix(), cm.at_batch(b, stages=True).stages
    assert sums is not None
    for i in range(L):
        for j in range(i + 1, L + 1):
            assert params[i, j] == cm.stage_param_count(i, j)
            assert sums.compute_ms[i, j] == cm.stage_fwd_ms(i, j, b) + cm.stage_bwd_ms(i, j, b)
            assert sums.activation_bytes[i, j] == cm.activation_bytes(i, j, (), b)
            assert sums.buffer_bytes[i, j] == cm.buffer_bytes(i, j, b)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=layer_dicts(7), data=st.data(), b=st.sampled_from([1, 2]))
def test_stage_extras_are_the_cost_models_per_stage_terms(layers, data, b):
    """:func:`planner.solve.prices.stage_extras` (``c_s + X_s - Z_s`` per stage, the DP's terms
    beside the stage times) against the cost model's per-stage methods the oracles read
    (``boundary_transfer_ms``, ``stage_exposed_sync_ms``, ``stage_bubble_fill_ms``): equal to
    within ``DP_REL_TOL`` (``Z_s`` is a prefix of products there and ``np.dot`` here), under
    every ZeRO stage, with and without a split backward, a V placement's turn included."""
    from planner.artifacts.kinds import ChunkPlacement, ScheduleKind, ZeroStage
    from planner.artifacts.layout import Layout
    from planner.solve.prices import stage_extras
    from tests.chains import DP_REL_TOL

    for d in layers:
        d["wfrac"] = 0.4
    cm = CostModel(chain_profile(layers), small_cluster(8))
    L = cm.num_layers
    P = data.draw(st.integers(1, min(4, L)))
    zero = data.draw(st.sampled_from(list(ZeroStage)))
    v = 2 if P % 2 == 0 and data.draw(st.booleans()) else 1
    layout = Layout(num_stages=P, dp_degree=data.draw(st.sampled_from([1, 2])), zero=zero, virtual_stages_per_rank=v,
                    placement=ChunkPlacement.V if v == 2 else ChunkPlacement.LOOP)
    schedule = data.draw(st.sampled_from([ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_H1]))
    table = StageTable(cm, b, 1e12, sharding=layout.sharding(0), fsdp_line=cm.fsdp_line(layout))
    extras = stage_extras(table, layout, schedule)
    for s in range(P):
        for i in range(L):
            for j in range(i + 1, L + 1):
                want = 2.0 * cm.boundary_transfer_ms(j, b, s, layout) if s < P - 1 else 0.0
                want += cm.stage_exposed_sync_ms(i, j, s, layout, b)
                if schedule.splits_backward:
                    want -= cm.stage_bubble_fill_ms(i, j, b)
                assert math.isclose(extras[s][i, j], want, rel_tol=DP_REL_TOL, abs_tol=1e-9), (s, i, j)


def test_the_oracles_import_nothing_from_the_dp_or_its_prices():
    """The brute force and the CP-SAT model (and every planner module they import, followed
    through) import nothing from :mod:`planner.solve.chain_dp` nor :mod:`planner.solve.prices`:
    their stage costs come from the cost model, so that DP = brute force checks the prices."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def imports(module: str) -> set[str]:
        path = root / Path(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("planner"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    is_module = (root / Path(*full.split("."))).with_suffix(".py").exists() or \
                        (root / Path(*full.split(".")) / "__init__.py").exists()
                    out.add(full if is_module else node.module)
        return out

    for oracle in ("planner.solve.bruteforce", "planner.solve.ilp"):
        seen, todo = set(), [oracle]
        while todo:
            module = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            todo.extend(imports(module))
        bad = sorted(m for m in seen if m == "planner.solve.chain_dp" or m.startswith("planner.solve.prices"))
        assert not bad, f"{oracle} reaches {bad}"
        assert "planner.solve.chain" in seen and "planner.cost.model" in seen


def test_a_table_carries_its_question_and_refuses_a_bad_batch():
    """A stage table's question is what it was built for (the oracles read nothing else), and a
    table with no sample per micro-batch is refused, naming the field and the value."""
    import pytest

    from planner.artifacts.kinds import ZeroStage
    from planner.artifacts.layout import Sharding
    from planner.solve.chain import StageQuestion

    cm = CostModel(chain_profile([{"fwd": 1.0, "bwd": 2.0, "params": 10, "saved": 1e6, "inp": 1e5, "out": 1e5}] * 4),
                   small_cluster(4))
    table = StageTable(cm, 2, 5e8, (2,), allow_recompute=False, sharding=Sharding(ZeroStage.OPTIMIZER, 2))
    assert table.question == StageQuestion(cost_model=cm, microbatch_size=2, cap_bytes=5e8, fixed_boundaries=(2,),
                                           allow_recompute=False, sharding=Sharding(ZeroStage.OPTIMIZER, 2))
    assert table.question.question is table.question
    assert [(i, j) for i in range(5) for j in range(5) if table.valid[i, j]] == \
        [(i, j) for i in range(5) for j in range(5) if table.question.stage_valid(i, j)]
    with pytest.raises(ValueError, match=r"StageTable\.microbatch_size must be at least 1 \(got 0\)"):
        StageTable(cm, 0, 1.0)
