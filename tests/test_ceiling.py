"""The working-set ceiling (planner.solve.ceiling, issue 52 item 5): the estimate counted by hand
on a small case, a search over a ceiling lowered for the test coarsened into blocks (a valid
plan whose stages start at block starts, saying so), and a ceiling no chain fits refused in one
line with exit 3."""

from __future__ import annotations

import dataclasses

import pytest

from planner.artifacts.cluster import PRESETS
from planner.artifacts.errors import InfeasibleError
from planner.artifacts.kinds import ScheduleKind, SolverKind, ZeroStage
from planner.artifacts.plan import plan_from_json, plan_to_json
from planner.artifacts.request import PlanRequest
from planner.profiling.analytic.gpt import gpt_profile
from planner.solve.ceiling import (
    MATRICES_FIXED,
    MATRICES_PER_KEY,
    block_starts,
    bound_chain,
    table_keys,
    working_set_bytes,
)
from planner.solve.chain_dp import solve_chain
from planner.solve.search import search_plan
from planner.solve.settings import SETTINGS


def test_table_keys_counted_by_hand() -> None:
    """Two groups, global batch 4, GPipe only, ZeRO 0/1/3: (P, D) in (1, 2), (2, 1), (1, 1).
    D = 2 solves ZeRO 1 (its searched stage), 0 and 3 at micro-batch sizes 1 and 2: 6 keys; D = 1
    solves ZeRO 0 at 1, 2 and 4, of which 1 and 2 are D = 2's ZeRO 0 keys already: 1 more."""
    request = PlanRequest(global_batch=4, schedules=(ScheduleKind.GPIPE,),
                          zero_stages=(ZeroStage.NONE, ZeroStage.OPTIMIZER, ZeroStage.PARAMETERS))
    assert table_keys(4, (2,), request, SETTINGS) == 7
    assert table_keys(4, (2, 2, 1), request, SETTINGS) == 7 + 7 + 3  # per degree: one group has (1, 1) only
    # interleaving adds chunk counts 2, 3, 4 where P v <= the layers: P = 2 at v = 2 only (4 layers),
    # D = 1, ZeRO 0, b in 1, 2, 4: 3 keys more
    inter = dataclasses.replace(request, schedules=(ScheduleKind.GPIPE, ScheduleKind.INTERLEAVED_1F1B))
    assert table_keys(4, (2,), inter, SETTINGS) == 7 + 3


def test_block_starts_cut_every_k_layers() -> None:
    assert block_starts(8, 8) == list(range(8))  # every layer fits: no blocks
    assert block_starts(42, 10) == [0, 1, 6, 11, 16, 21, 26, 31, 36, 41]
    assert block_starts(42, 10, (20,)) == [0, 1, 7, 13, 19, 20, 25, 31, 37]  # a fixed boundary kept, k = 6
    with pytest.raises(ValueError):
        block_starts(42, 2, (20,))


def test_working_set_estimate_and_the_longest_chain_that_fits() -> None:
    assert working_set_bytes(3, 7) == 8 * 4 * 4 * (MATRICES_PER_KEY * 7 + MATRICES_FIXED)
    request = PlanRequest(global_batch=8)
    groups = (8, 4)
    keys = table_keys(100, groups, request, SETTINGS)
    ceiling = working_set_bytes(40, keys) + 1.0
    bound = bound_chain(100, groups, request, dataclasses.replace(SETTINGS, working_set_bytes=int(ceiling)))
    assert bound.max_chain == 40 and bound.keys == keys
    assert 41 > bound.max_chain >= 40
    roomy = bound_chain(100, groups, request, SETTINGS)  # the default ceiling holds every layer of 100
    assert roomy.max_chain == 100


def _case() -> tuple:
    profile = gpt_profile(layers=40, hidden=1024, heads=16, seq=1024, vocab=32000, device_preset="a100-80gb")
    request = PlanRequest(global_batch=16, schedules=(ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B),
                          tp_degrees=(1,), cp_degrees=(1,), num_stages=4)
    return profile, PRESETS["a100-80gb-x8"], request


def test_a_search_over_the_ceiling_is_coarsened_into_blocks() -> None:
    profile, cluster, request = _case()
    L = profile.num_layers
    full = search_plan(profile, cluster, request, solver=SolverKind.DP, chain_solver=solve_chain)
    assert full.provenance.search_notes == ()
    keys = table_keys(L, (8,), request, SETTINGS)
    blocks = 10
    low = dataclasses.replace(SETTINGS, working_set_bytes=int(working_set_bytes(blocks, keys)))
    coarse = search_plan(profile, cluster, request, solver=SolverKind.DP, chain_solver=solve_chain, settings=low)
    (line,) = coarse.provenance.search_notes
    assert "\n" not in line and f"as {blocks} blocks (the first layer, then every 5;" in line and "ceiling" in line
    # the blocks: the first layer (the embedding) alone, then every k layers, k = 5 for 10 blocks of 42
    starts = set(block_starts(L, blocks))
    assert starts == {0, *range(1, L, 5)}
    stages = sorted(coarse.stages, key=lambda s: s.layer_start)
    assert len(stages) > 1  # cuts to check
    assert {s.layer_start for s in stages} <= starts, ([s.layer_start for s in stages], sorted(starts))
    # a valid plan: the stages cover every layer once, in order, and it reads back as written
    assert [s.layer_start for s in stages[1:]] == [s.layer_stop for s in stages[:-1]]
    assert stages[0].layer_start == 0 and stages[-1].layer_stop == L
    assert coarse.predicted.peak_memory_bytes <= cluster.device_memory_bytes
    assert plan_from_json(plan_to_json(coarse)) == coarse
    assert coarse.predicted.iteration_ms >= full.predicted.iteration_ms * (1 - 1e-9)  # fewer cuts: never faster


def test_a_ceiling_no_chain_fits_is_refused_in_one_line() -> None:
    profile, cluster, request = _case()
    tiny = dataclasses.replace(SETTINGS, working_set_bytes=1024)
    with pytest.raises(InfeasibleError) as info:
        search_plan(profile, cluster, request, solver=SolverKind.DP, chain_solver=solve_chain, settings=tiny)
    message = str(info.value)
    assert info.value.exit_code == 3 and "\n" not in message
    assert "working-set ceiling" in message and "coarsen" in message


def test_planner_plan_turns_an_allocation_failure_into_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The safety net behind the estimate: an allocation that fails anyway is exit 3, one line."""
    import planner.solve as solve
    from planner.commands.cli import main

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError("Unable to allocate 30.6 MiB")

    monkeypatch.setattr(solve, "plan", out_of_memory)
    assert main(["plan", "--global-batch", "8"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ran out of memory" in err[0] and "coarsen" in err[0]


def test_planner_plan_says_so_on_stderr_and_in_the_plan(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Through the public API and the CLI at the default ceiling, the estimate raised (its fixed
    matrices) so that a 42-layer search must be coarsened to 4 blocks: the note survives the
    plan's rebuilding (recompute relaxed, accounts added) and is printed once on stderr."""
    import planner.solve.ceiling as ceiling
    from planner.artifacts.plan import load_plan
    from planner.artifacts.profile import save_profile
    from planner.commands.cli import main
    from planner.solve import plan

    monkeypatch.setattr(ceiling, "MATRICES_FIXED", 10**7)  # 8 x 25 x 1e7 bytes: 4 blocks fit 2 GiB, 5 do not
    profile, cluster, request = _case()
    chosen = plan(profile, cluster, request)
    (line,) = chosen.provenance.search_notes
    assert "as 4 blocks" in line
    path, out = tmp_path / "gpt.json", tmp_path / "plan.json"
    save_profile(profile, path)
    rc = main(["plan", "--profile", str(path), "--cluster", "a100-80gb-x8", "--global-batch", "16", "--stages", "4",
               "--tp", "1", "--cp", "1", "--schedules", "gpipe,1f1b", "--out", str(out)])
    assert rc == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if x.startswith("planner plan: note:")]
    assert notes == [f"planner plan: note: {line}"]
    assert load_plan(out).provenance.search_notes == (line,)
